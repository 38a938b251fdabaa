"""A cycle whose decisions never reach the log (refused by the fence) is decided again in full.

Also for the jobs of a removed node (`index.orphans`): they stay orphans until the log ends or
evicts them, so the cycle after a refused one evicts them again, byte for byte as a replica
folding the log afresh (a new leader, replay, audit) decides; one that ended meanwhile is not
evicted; a deposed leader's eviction, fenced by the fold, is decided again by the new leader.
"""

from __future__ import annotations

import msgspec
from logkit import Log, job

from muster.events.types import (
    Event,
    JobAdmitted,
    JobFinished,
    JobPreempted,
    JobSubmitted,
    LeaderElected,
    NodeAdded,
    NodeRemoved,
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


def _orphaned() -> Log:
    """Job `a` (8 GPUs) admitted on n0, then n0 removed: `a` is an orphan the next cycle evicts."""
    log = Log()
    log.add(job("a", 8, at=1))
    (admitted,) = log.cycle(1)
    assert isinstance(admitted, JobAdmitted)
    log.add(NodeRemoved(at=2, node="n0"))
    return log


def _encoded(events: list[Event]) -> list[bytes]:
    return [msgspec.json.encode(e) for e in events]


def test_a_refused_eviction_of_an_orphan_is_decided_again_in_the_next_cycle() -> None:
    """The refused cycle's JobPreempted (NodeFailure) comes again, byte for byte as a fresh fold decides it."""
    log = _orphaned()
    (first,) = decide(log.state, 2)  # refused: nothing of it is folded
    assert isinstance(first, JobPreempted) and (first.job, first.reason) == ("a", "NodeFailure")
    assert index_of(log.state).orphans == {"a"} and log.state.jobs["a"].status == "admitted"
    log.add(job("b", 1, at=3))  # what the other writer appended, which made the fence refuse the cycle
    again = decide(log.state, 3)
    assert [(type(e).__name__, getattr(e, "job", "")) for e in again] == [("JobPreempted", "a")]
    assert _encoded(again) == _encoded(decide(fold(log.events), 3))


def test_an_orphan_that_ended_while_its_eviction_was_refused_is_not_evicted() -> None:
    """The fact that beat the refused cycle ends `a`: it leaves the orphans and the next cycle evicts no one."""
    log = _orphaned()
    decide(log.state, 2)  # refused
    log.add(JobFinished(at=3, job="a"), job("b", 8, at=3))
    again = decide(log.state, 3)
    assert index_of(log.state).orphans == set()
    assert not [e for e in again if isinstance(e, JobPreempted)]
    assert _encoded(again) == _encoded(decide(fold(log.events), 3))


def test_a_deposed_leaders_eviction_fenced_by_the_fold_is_decided_by_the_new_leader() -> None:
    """A JobPreempted of epoch 1 folded after epoch 2 was elected changes nothing: epoch 2's cycle evicts `a`."""
    log = _orphaned()
    (stale,) = decide(log.state, 2)
    log.add(LeaderElected(at=3, epoch=2, holder="b"), stale)
    assert log.state.fenced == 1 and index_of(log.state).orphans == {"a"}
    again = log.cycle(3)
    assert [(type(e).__name__, getattr(e, "job", ""), getattr(e, "epoch", 0)) for e in again] == [
        ("JobPreempted", "a", 2)
    ]
    assert log.state.jobs["a"].status == "pending" and index_of(log.state).orphans == set()
