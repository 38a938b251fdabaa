"""The parking memo: woken by every fold that frees room, kept only once a cycle's record is folded, switchable."""

from __future__ import annotations

import pytest

from muster.events.types import (
    CohortConfigured,
    CycleSettled,
    Event,
    JobSubmitted,
    NodeAdded,
    NodeUpdated,
    PodSet,
    PreemptionPolicy,
    PriorityClassConfigured,
    QueueConfigured,
    SchedulerConfigured,
)
from muster.projections import parking
from muster.projections.cluster import fold
from muster.projections.index import index_of
from muster.projections.scheduler import decide
from muster.projections.state import ClusterState


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
    fold([_node({"gpu": 4})], state)  # still not enough room: judged again, nothing to decide
    settled = decide(state, 2)
    assert settled == [CycleSettled(at=2, judged=1, serial=1, cycle=2)]
    fold(settled, state)
    fold([_node({})], state)
    assert [type(e).__name__ for e in decide(state, 2)] == ["JobAdmitted"]


def _judged_log() -> ClusterState:
    """`j` waits for room with its reason already on the log, and nothing parked: a cycle judges it again."""
    state = fold(_terminating_pods_log())  # type: ignore[arg-type]
    state.jobs[
        "j"
    ].reason = "1 pod of gpu=8 do not fit on the schedulable nodes"  # as a folded JobInadmissible leaves it
    return state


def test_a_cycle_that_decided_nothing_keeps_its_verdicts_once_its_record_is_folded() -> None:
    """A cycle that judged a job and decided nothing writes a CycleSettled; folded, the job stays parked."""
    state = _judged_log()
    settled = decide(state, 1)
    assert settled == [CycleSettled(at=1, judged=1, serial=1, cycle=1)]
    fold(settled, state)  # type: ignore[arg-type]
    assert decide(state, 1) == []  # nothing to judge again: the verdict stands
    assert set(index_of(state).parking.parked) == {"j"} and state.settles == 1


def test_a_cycle_whose_record_is_not_folded_keeps_no_parked_verdict() -> None:
    """Parks of a cycle whose CycleSettled is not folded (refused, lost) are dropped: the job is judged again."""
    state = _judged_log()
    assert decide(state, 1) == [CycleSettled(at=1, judged=1, serial=1, cycle=1)]
    assert decide(state, 1) == [CycleSettled(at=1, judged=1, serial=1, cycle=1)]
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


def _borrowing_log(priority_class: str) -> list[Event]:
    """Queues qa, qb, qc of 8 GPUs in one cohort over three 8-GPU nodes; qa and qb full, `s` (16 GPUs, qa) waits."""
    policy = PreemptionPolicy(within_queue="LowerPriority", reclaim_within_cohort="LowerPriority")
    events: list[Event] = [
        SchedulerConfigured(at=0, levels=["rack"]),
        PriorityClassConfigured(at=0, name="low", value=0),
        PriorityClassConfigured(at=0, name="high", value=100),
        CohortConfigured(at=0, name="org"),
    ]
    for q in ("qa", "qb", "qc"):
        events.append(QueueConfigured(at=0, name=q, cohort="org", nominal={"gpu": 8}, preemption=policy))  # type: ignore[arg-type]
        events.append(NodeAdded(at=0, node=f"n-{q}", labels={"rack": "r0"}, capacity={"gpu": 8}))  # type: ignore[arg-type]
    for name, q in (("a0", "qa"), ("b0", "qb")):
        one = PodSet(name="w", count=1, requests={"gpu": 8})  # type: ignore[arg-type]
        events.append(JobSubmitted(at=0, job=name, queue=q, podsets=[one], priority_class="high"))  # type: ignore[arg-type]
    two = PodSet(name="w", count=2, requests={"gpu": 8})  # type: ignore[arg-type]
    events.append(JobSubmitted(at=1, job="s", queue="qa", podsets=[two], priority_class=priority_class))  # type: ignore[arg-type]
    return events


@pytest.mark.parametrize(
    ("priority_class", "woken"), [("low", False), ("high", True)], ids=["evicts-no-one", "may-evict"]
)
def test_a_new_borrower_wakes_only_jobs_that_may_evict_it(priority_class: str, woken: bool) -> None:
    """A new borrower in the cohort wakes a parked job that may evict it, not one that may evict no one."""
    state = fold(_borrowing_log(priority_class))  # type: ignore[arg-type]
    fold(decide(state, 1), state)
    assert state.jobs["s"].status == "pending" and "s" in index_of(state).parking.parked
    b1 = PodSet(name="w", count=1, requests={"gpu": 8})  # type: ignore[arg-type]
    fold([JobSubmitted(at=2, job="b1", queue="qb", podsets=[b1], priority_class="low")], state)  # type: ignore[list-item]
    fold(decide(state, 2), state)
    assert state.jobs["b1"].status == "admitted"  # qb borrows qc's room
    assert ("s" not in index_of(state).parking.parked) == woken
