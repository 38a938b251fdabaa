"""The parking memo: woken by every fold that frees room, kept only once a cycle's decisions are folded, switchable."""

from __future__ import annotations

from muster.events.types import (
    Event,
    JobSubmitted,
    NodeAdded,
    NodeUpdated,
    PodSet,
    QueueConfigured,
    SchedulerConfigured,
)
from muster.projections import parking
from muster.projections.cluster import fold
from muster.projections.index import index_of
from muster.projections.scheduler import decide


def _node(reserved: dict[str, int]) -> NodeUpdated:
    labels = {"rack": "r0"}
    return NodeUpdated(at=2, node="n0", labels=labels, capacity={"gpu": 8}, reserved=reserved)  # type: ignore[arg-type]


def _terminating_pods_log() -> list[Event]:
    return [
        SchedulerConfigured(at=0, levels=["rack"]),
        QueueConfigured(at=0, name="q", nominal={"gpu": 8}),  # type: ignore[arg-type]
        NodeAdded(at=0, node="n0", labels={"rack": "r0"}, capacity={"gpu": 8}, reserved={"gpu": 8}),  # type: ignore[arg-type]
        JobSubmitted(at=1, job="j", queue="q", podsets=[PodSet(name="w", count=1, requests={"gpu": 8})]),  # type: ignore[arg-type]
    ]


def test_pods_leaving_a_node_wake_a_job_parked_on_capacity() -> None:
    """A job parked because foreign or terminating pods held the GPUs is admitted once a NodeUpdated gives them back."""
    state = fold(_terminating_pods_log())  # type: ignore[arg-type]
    waits = decide(state, 1)
    assert [type(e).__name__ for e in waits] == ["JobInadmissible"]
    fold(waits, state)
    assert decide(state, 2) == []
    fold([_node({"gpu": 4})], state)  # still not enough room: parked or not, nothing to decide
    assert decide(state, 2) == []
    fold([_node({})], state)
    assert [type(e).__name__ for e in decide(state, 2)] == ["JobAdmitted"]


def test_a_cycle_that_decided_nothing_keeps_no_parked_verdict() -> None:
    """Parks of a cycle with no decision to fold are dropped: the parked set depends on the log, not on idle cycles."""
    state = fold(_terminating_pods_log())  # type: ignore[arg-type]
    state.jobs[
        "j"
    ].reason = "1 pod of gpu=8 do not fit on the schedulable nodes"  # as a folded JobInadmissible leaves it
    assert decide(state, 1) == []
    assert decide(state, 1) == []
    assert "j" not in index_of(state).parking.parked


def test_the_switch_really_switches() -> None:
    """On, a folded verdict keeps its job parked; off, nothing stays parked (so turning it off compares two paths)."""
    state = fold(_terminating_pods_log())  # type: ignore[arg-type]
    fold(decide(state, 1), state)
    assert set(index_of(state).parking.parked) == {"j"}
    parking.PARKING = False
    try:
        assert index_of(state).parking.parked == {}
    finally:
        parking.PARKING = True
