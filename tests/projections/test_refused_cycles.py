"""A cycle whose decisions never reach the log (refused by the fence) is decided again in full."""

from __future__ import annotations

from muster.events.types import JobSubmitted, NodeAdded, PodSet, QueueConfigured, SchedulerConfigured
from muster.projections.cluster import fold
from muster.projections.index import forget_verdicts
from muster.projections.scheduler import decide


def _log() -> list[object]:
    return [
        SchedulerConfigured(at=0, levels=["rack"]),
        QueueConfigured(at=0, name="q", nominal={"gpu": 16}),
        NodeAdded(at=0, node="n0", labels={"rack": "r0"}, capacity={"gpu": 8}),
        NodeAdded(at=0, node="n1", labels={"rack": "r0"}, capacity={"gpu": 8}),
        JobSubmitted(at=1, job="huge", queue="q", podsets=[PodSet(name="w", count=1, requests={"gpu": 10**9})]),
    ]


def test_forgetting_a_refused_cycle_gives_the_same_decisions_again() -> None:
    """After `forget_verdicts`, deciding again on the unchanged state repeats every decision, waits included."""
    state = fold(_log())  # type: ignore[arg-type]
    first = decide(state, 2)
    assert [(type(e).__name__, e.job) for e in first] == [("JobInadmissible", "huge")]
    forget_verdicts(state)
    assert decide(state, 2) == first
