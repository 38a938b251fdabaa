"""Trying one job in a cycle (`try_job`): admit the whole gang, preempt for it, or park it.

A job of a class that already failed on the unchanged view gets that class's
verdict; otherwise quota and placement are tried on the cycle's view, then a
victim search (`preemption`); a job that neither fits nor may preempt is
parked (`verdicts`). Admissions are written here (`JobAdmitted`, with the
policy version and the words that explain them).
"""

from __future__ import annotations

from typing import Literal

from msgspec import UNSET

from muster.events.types import JobAdmitted, JobId, NodeName, QueueName
from muster.projections.assignment import Admit, Evict, Wait, attempt
from muster.projections.cycle import Cycle, Verdict, capacity_reason
from muster.projections.flavors import summary, unassigned
from muster.projections.jobfacts import preemptible
from muster.projections.preemption import Victim, find_victims
from muster.projections.reservations import released_on_admission
from muster.projections.resources import fmt
from muster.projections.state import JobState
from muster.projections.verdicts import park, wake_rule

POLICY_VERSION = "muster/1"


def job_class(cycle: Cycle, job: JobState) -> tuple[object, ...] | None:
    """Jobs of one class get the same verdict on the same view (None: this job's verdict is its own)."""
    if (
        job.nominated
        or job.evicted_by is not None
        or job.idle_reclaimed_at is not None
        or cycle.idx.equal_in_queue(job.queue)
        or job.queue in cycle.heads.strict
        or cycle.fence.own_verdict(job)
    ):
        # its candidates depend on its own history (the jobs it spares, see `eviction`) or on its
        # own submission order (equal priorities, by seq); one reclaimed for idleness may evict no one
        # while its class may; in a strict_fifo queue the jobs after a refused head are held behind
        # it, not refused with it; a job that may use reserved room sees more than its class
        return None
    group = cycle.idx.group_of.get(job.id) or cycle.idx.group(job)
    return group[:4]  # the group less its limit rank (one verdict for any limit) and whose job it is


Outcome = Literal["admitted", "preempting", "parked", "held"]


"""What `try_job` did with a job: admitted it, evicted victims for it (the cycle ends), set it aside, or
left it behind the head of its strict_fifo queue (`queueing`)."""


def try_job(cycle: Cycle, job: JobState) -> Outcome:
    """Admit, preempt for, or park one job. Returns what happened."""
    if cycle.heads.blocker(job, cycle.placed) is not None:
        return "held"
    cls = cycle.tried_class = job_class(cycle, job)
    if cls is not None:
        known = cycle.failed_classes.get(cls)
        if known is not None:
            # a job just like it failed on this very view: so does this one, for the same reason
            park(cycle, job, known.reason, known.wake)
            return "parked"
    state, idx = cycle.state, cycle.idx
    # non-preemptible work never borrows, so no guarantee depends on evicting it
    allow_borrow = preemptible(state, job)
    if unassigned(state, job):
        return _take_step(cycle, job, cls, attempt(cycle, job, allow_borrow))
    quota_reason = idx.quota.blocking(job.queue, job.requests, allow_borrow)
    reason = quota_reason or ""
    if quota_reason is None:
        opened = cycle.fence.open(job)
        if cycle.could_place(job):
            borrowed = idx.quota.borrowed_by(job.queue, job.requests)
            placement, reason = cycle.place(job)
            cycle.fence.close(opened)
            if placement is not None:
                _admitted(cycle, job, placement, borrowed)
                return "admitted"
        else:
            cycle.fence.close(opened)
            reason = capacity_reason(job)
    result = find_victims(cycle, job, allow_borrow)
    if result.victims:
        _evict_for(cycle, job, result.victims)
        return "preempting"
    wake = wake_rule(cycle, job, allow_borrow, quota_reason is not None, result.quota_possible, result)
    if wake.freed_short is not None:
        wake.freed_short -= cycle.fence.held_gpus(job)  # it also sees the reserved room it may use
    if cls is not None:
        cycle.failed_classes[cls] = Verdict(reason, wake)
    park(cycle, job, reason, wake)
    return "parked"


def _evict_for(cycle: Cycle, job: JobState, victims: list[Victim]) -> None:
    """Evict the victims and hold the room they leave for `job` (the cycle ends)."""
    for victim in victims:
        cycle.preempt(victim, job.id)
    placement, _ = cycle.place(job)
    if placement is not None:
        cycle.take(job, placement)
    cycle.reserved = True


def _admitted(cycle: Cycle, job: JobState, placement: dict[str, str], borrowed: dict[str, int]) -> None:
    """Take the job's room and write its admission (`job` on its flavors, if its queue has them)."""
    cycle.take(job, placement)
    cycle.fence.release(job)
    explanation = "within nominal quota" if not borrowed else f"borrowing {fmt(borrowed)} from the cohort"
    if job.flavors:
        explanation = f"on flavors {summary(job.flavors)}, {explanation}"
    cycle.events.append(
        JobAdmitted(
            at=cycle.now,
            job=JobId(job.id),
            queue=QueueName(job.queue),
            placement={pod: NodeName(node) for pod, node in placement.items()},
            borrowed=borrowed,
            cycle=cycle.number,
            epoch=cycle.epoch,
            policy_version=POLICY_VERSION,
            explanation=explanation,
            flavors=job.flavors if job.flavors else UNSET,
        )
    )
    cycle.events.extend(released_on_admission(cycle.state, job, cycle.now, cycle.number, cycle.epoch))


def _take_step(cycle: Cycle, job: JobState, cls: tuple[object, ...] | None, step: Admit | Evict | Wait) -> Outcome:
    """Do what `assignment.attempt` says for a job of a queue with flavors."""
    if isinstance(step, Admit):
        _admitted(cycle, step.job, step.placement, step.borrowed)
        return "admitted"
    if isinstance(step, Evict):
        _evict_for(cycle, step.job, step.victims)
        return "preempting"
    if cls is not None:
        cycle.failed_classes[cls] = Verdict(step.reason, step.wake)
    park(cycle, job, step.reason, step.wake)
    return "parked"
