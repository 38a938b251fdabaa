"""A cycle that decides nothing but judges jobs is recorded (`CycleSettled`): its verdicts stand; audit checks it."""

from __future__ import annotations

from replaykit import memory_log, sim, sim_until

from muster.events.types import CycleSettled, JobFinished, JobId
from muster.projections.cluster import evolve
from muster.projections.index import index_of
from muster.projections.scheduler import decide
from muster.projections.state import ClusterState
from muster.replay.audit import audit

# `w` needs 8 GPUs in one rack and waits; `c` takes 2 GPUs on n0; at 100 `a1` leaves n0: GPUs freed there reach
# what `w` lacked in r0 when it was parked, so it is woken and judged again, and still does not fit (c holds 2)
WOKEN = """\
topology:
  levels: [rack]
nodes:
  - {name: n0, labels: {rack: r0}, capacity: {gpu: 8}}
  - {name: n1, labels: {rack: r1}, capacity: {gpu: 8}}
queues:
  - {name: q, nominal: {gpu: 32}}
timeline:
  - {at: 0, submit: {job: a1, queue: q, podsets: [{name: w, count: 1, requests: {gpu: 6}}], runtime: 100}}
  - {at: 0, submit: {job: b1, queue: q, podsets: [{name: w, count: 1, requests: {gpu: 6}}], runtime: 1000}}
  - at: 10
    submit: {job: w, queue: q, podsets: [{name: w, count: 2, requests: {gpu: 4}, topology: {required: rack}}]}
  - {at: 50, submit: {job: c, queue: q, podsets: [{name: w, count: 1, requests: {gpu: 2}}], runtime: 1000}}
"""


def _before_the_release() -> ClusterState:
    """The simulator's state (with its parking memo) at 99, and then `a1`'s end at 100 folded."""
    state = sim_until(WOKEN, 99).state
    return evolve(state, JobFinished(at=100, job=JobId("a1")))


def test_the_cycle_that_judged_a_woken_job_is_recorded() -> None:
    """The release at 100 wakes `w`, which still waits: that instant's only decision is a CycleSettled of 1 job."""
    events = sim(WOKEN).events
    at_100 = [e for e in events if e.at == 100 and hasattr(e, "cycle")]
    assert at_100 == [CycleSettled(at=100, judged=1, serial=1, cycle=4)]
    admitted = [e for e in events if type(e).__name__ == "JobAdmitted" and e.job == "w"]  # type: ignore[attr-defined]
    assert [(a.at, a.cycle) for a in admitted] == [(1000, 4)]  # the next cycle that decides has its number


def test_a_folded_record_keeps_the_verdict_and_a_missing_one_does_not() -> None:
    """After the record is folded the next instant judges no one; without it, `w` is judged (and recorded) again."""
    settled = CycleSettled(at=100, judged=1, serial=1, cycle=4)
    state = _before_the_release()
    assert decide(state, 100) == [settled]
    evolve(state, settled)
    assert decide(state, 500) == []  # nothing judged: a judged job would be parked, and so recorded
    assert set(index_of(state).parking.parked) == {"w"}
    lost = _before_the_release()  # the record refused or lost: the verdict does not stand
    assert decide(lost, 100) == [settled]
    assert decide(lost, 500) == [CycleSettled(at=500, judged=1, serial=1, cycle=4)]


async def test_audit_re_derives_the_record() -> None:
    """`muster audit` re-derives the CycleSettled like any decision: 0 differ, no unrecorded settling cycle."""
    events = sim(WOKEN).events
    report = await audit(memory_log(events))
    assert report.differ == 0 and not report.unrecorded and report.settled_unchecked == 0
    assert report.identical == sum(1 for e in events if getattr(e, "cycle", 0))
    tampered = [
        CycleSettled(at=e.at, judged=2, serial=1, cycle=4) if isinstance(e, CycleSettled) else e for e in events
    ]
    assert (await audit(memory_log(tampered))).differ == 1
