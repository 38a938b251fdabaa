"""A cycle whose decisions never reach the log (refused by the fence) is decided again in full."""

from __future__ import annotations

from muster.events.types import JobSubmitted, NodeAdded, PodSet, QueueConfigured, SchedulerConfigured
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
