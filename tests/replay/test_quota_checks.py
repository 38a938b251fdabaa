"""A gang that quota blocks is checked, not tried, when releases in its tree add up to what it lacked (`parking`).

The cohort stays full while small jobs take every GPU given back: the gang's
release wake fires, the check at its turn finds it still short, and it stays
parked in the block it was parked in (no cycle judges it), until quota really
has room. Decisions are those of a run without the memo, and `muster audit`
re-derives a log whose checks ran in cycles it never sees (the daemon decides
after every event; audit only at the recorded cycles).
"""

from __future__ import annotations

from replaykit import memory_log

from muster.events.codec import encode
from muster.events.types import (
    CohortConfigured,
    CycleSettled,
    Event,
    JobAdmitted,
    JobFinished,
    JobId,
    JobSubmitted,
    NodeAdded,
    PodSet,
    PreemptionPolicy,
    QueueConfigured,
    SchedulerConfigured,
)
from muster.projections import parking
from muster.projections.cluster import evolve
from muster.projections.index import index_of
from muster.projections.scheduler import decide
from muster.projections.state import ClusterState
from muster.replay.audit import audit

POLICY = PreemptionPolicy(within_queue="LowerPriority", reclaim_within_cohort="LowerPriority")


def _submit(at: int, job: str, queue: str, gpus: int, pods: int = 1) -> JobSubmitted:
    podset = PodSet(name="w", count=pods, requests={"gpu": gpus})  # type: ignore[arg-type]
    return JobSubmitted(at=at, job=JobId(job), queue=queue, podsets=[podset])  # type: ignore[arg-type]


def _end(at: int, job: str) -> JobFinished:
    return JobFinished(at=at, job=JobId(job))


def _external() -> list[Event]:
    """qa and qb (8 GPUs each, one cohort) full of 4-GPU jobs; `g` (qa, 16 GPUs) waits while `s1`-`s4` take
    every 4 GPUs given back; the last ends leave the cohort empty at 600."""
    events: list[Event] = [SchedulerConfigured(at=0, levels=["rack"]), CohortConfigured(at=0, name="org")]
    for q in ("qa", "qb"):
        events.append(QueueConfigured(at=0, name=q, cohort="org", nominal={"gpu": 8}, preemption=POLICY))  # type: ignore[arg-type]
    for i in range(4):
        events.append(NodeAdded(at=0, node=f"n{i}", labels={"rack": "r0"}, capacity={"gpu": 8}))  # type: ignore[arg-type]
    events += [
        _submit(0, "a1", "qa", 4),
        _submit(0, "a2", "qa", 4),
        _submit(0, "b1", "qb", 4),
        _submit(0, "b2", "qb", 4),
    ]
    events += [_submit(10, "g", "qa", 8, pods=2)]
    events += [_submit(20, f"s{i}", "qa", 4) for i in range(1, 5)]
    events += [_end(100, "a1"), _end(150, "b1"), _end(200, "s1"), _end(250, "a2")]
    events += [_end(400, "s2"), _end(400, "s3"), _end(500, "s4"), _end(600, "b2")]
    return events


def _daemon_log() -> tuple[list[Event], list[int]]:
    """The log a daemon writes deciding after every event it folds (until a cycle decides nothing), and the
    stamp of `g`'s block after each of those cycles (0: not parked)."""
    state = ClusterState()
    log: list[Event] = []
    stamps: list[int] = []
    for event in _external():
        block = index_of(state).parking.parked.get("g")  # what the last cycle left parked, its record folded
        stamps.append(block.stamp if block is not None else 0)
        log.append(event)
        evolve(state, event)
        while True:
            decided = decide(state, event.at)
            if not decided:
                break
            log.extend(decided)
            for d in decided:
                evolve(state, d)
    return log, stamps


def _decisions(log: list[Event]) -> list[bytes]:
    return [encode(e) for e in log if getattr(e, "cycle", 0) and not isinstance(e, CycleSettled)]


def test_a_gang_short_of_quota_is_not_judged_while_others_take_what_is_given_back() -> None:
    """Releases reach what `g` lacked while small jobs refill the cohort: it stays in its first block, then runs."""
    log, stamps = _daemon_log()
    admitted = {e.job: e.at for e in log if isinstance(e, JobAdmitted)}
    assert admitted["s1"] == 100 and admitted["s4"] == 250 and admitted["g"] == 600
    parked = [s for s in stamps if s]
    # parked once, when first judged at 10; 16 GPUs given back by 250 woke its check, not a try
    assert len(set(parked)) == 1 and len(parked) == 12


def test_the_checked_log_decides_as_without_the_memo_and_audits_clean() -> None:
    """The same decisions with the memo off; audit re-derives every recorded cycle, checks in unrecorded ones aside."""
    log, _ = _daemon_log()
    parking.PARKING = False
    try:
        without, _ = _daemon_log()
    finally:
        parking.PARKING = True
    assert _decisions(log) == _decisions(without)


async def test_audit_of_a_log_with_checks_in_unrecorded_cycles_finds_no_difference() -> None:
    """`muster audit` decides only at the recorded cycles and re-derives every one, CycleSettled included."""
    log, _ = _daemon_log()
    report = await audit(memory_log(log))
    assert report.differ == 0 and not report.unrecorded
    assert report.identical == sum(1 for e in log if getattr(e, "cycle", 0))
