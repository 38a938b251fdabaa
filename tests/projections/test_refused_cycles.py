"""A cycle whose decisions never reach the log (refused by the fence) is decided again in full."""

from __future__ import annotations

from muster.events.types import (
    JobFinished,
    JobSubmitted,
    NodeAdded,
    PodSet,
    QueueConfigured,
    SchedulerConfigured,
)
from muster.projections.cluster import fold
from muster.projections.index import index_of
from muster.projections.scheduler import decide


def _log() -> list[object]:
    return [
        SchedulerConfigured(at=0, levels=["rack"]),
        QueueConfigured(at=0, name="q", nominal={"gpu": 16}),
        NodeAdded(at=0, node="n0", labels={"rack": "r0"}, capacity={"gpu": 8}),
        NodeAdded(at=0, node="n1", labels={"rack": "r0"}, capacity={"gpu": 8}),
        JobSubmitted(at=1, job="huge", queue="q", podsets=[PodSet(name="w", count=1, requests={"gpu": 10**9})]),
    ]


def test_a_refused_cycle_leaves_no_parked_verdict() -> None:
    """Deciding again on the state a refused cycle left (nothing folded) repeats every decision, waits included."""
    state = fold(_log())  # type: ignore[arg-type]
    first = decide(state, 2)
    assert [(type(e).__name__, e.job) for e in first] == [("JobInadmissible", "huge")]
    assert decide(state, 2) == first
    assert [(type(e).__name__, e.job, e.at) for e in decide(state, 3)] == [("JobInadmissible", "huge", 3)]


def test_a_folded_cycle_keeps_its_parked_verdict() -> None:
    """Once a cycle's JobInadmissible is folded, the job stays parked: the next cycle decides nothing."""
    state = fold(_log())  # type: ignore[arg-type]
    first = decide(state, 2)
    fold(first, state)  # type: ignore[arg-type]
    assert decide(state, 3) == []
    assert "huge" in index_of(state).parking.parked


def _two_gangs() -> list[object]:
    return [
        SchedulerConfigured(at=0, levels=["rack"]),
        QueueConfigured(at=0, name="q", nominal={"gpu": 16}, borrowing_limit={"gpu": 0}),
        NodeAdded(at=0, node="n0", labels={"rack": "r0"}, capacity={"gpu": 8}),
        NodeAdded(at=0, node="n1", labels={"rack": "r1"}, capacity={"gpu": 8}),
        JobSubmitted(at=1, job="a", queue="q", podsets=[PodSet(name="w", count=1, requests={"gpu": 8})]),
        JobSubmitted(at=1, job="b", queue="q", podsets=[PodSet(name="w", count=2, requests={"gpu": 4})]),
    ]


def test_a_refused_admission_gives_its_nodes_and_quota_back() -> None:
    """Deciding again on the state a refused cycle left admits the same gangs on the same nodes."""
    state = fold(_two_gangs())  # type: ignore[arg-type]
    first = decide(state, 2)
    assert [(type(e).__name__, e.job) for e in first] == [("JobAdmitted", "a"), ("JobAdmitted", "b")]
    assert decide(state, 2) == first


def _capacity(state: object) -> list[tuple[str, dict[str, int], bool]]:
    idx = index_of(state)  # type: ignore[arg-type]
    hosts = idx.topology.by_level[-1]
    return [(h.name, {k: v for k, v in h.host_free.items() if v}, h.schedulable) for h in hosts]


def test_folded_decisions_leave_the_index_as_a_fresh_one_finds_it() -> None:
    """Once a cycle's admissions and a gang's end are folded, the synced index holds what a new index holds."""
    log = _two_gangs()
    state = fold(log)  # type: ignore[arg-type]
    decisions = decide(state, 2)
    fold(decisions, state)  # type: ignore[arg-type]
    finished = JobFinished(at=3, job="a")
    fold([finished], state)  # type: ignore[list-item]
    assert decide(state, 3) == []
    fresh = fold([*log, *decisions, finished])  # type: ignore[list-item]
    assert _capacity(state) == _capacity(fresh)
    assert index_of(state).quota.queues["q"].usage == index_of(fresh).quota.queues["q"].usage == {"gpu": 8}
