"""What a new term owes the cluster: the decisions of earlier terms, whether its replica started warm or cold.

A leader may die between storing a decision and applying it, and a user's
cancel may be folded while no term runs. So at the start of every term the
new leader applies again, for every job, the decision the cluster must
reflect now (idempotent in the cluster, which answers `noop` where it already
does, without a request):

- an admitted job: its admission (bind the gang where the log placed it);
- a pending job that was evicted: its eviction (its pods must be gone), only
  where pods of it still hold nodes (its replacements wait unbound: those
  must stay);
- a job a user cancelled: the cancel (its workload must stop), only where
  the cluster still holds pods of it (the log keeps every cancelled job).

The list is derived from the fold (`ClusterState`), so a replica that
started from a snapshot owes exactly what one that folded the whole log
owes. Where the fold since this replica started holds the decision itself
(`exact`), that event is applied; otherwise it is rebuilt from the state.
The state keeps all that applying needs (placement, queue, borrowed quota,
the preemptor, a cancel's reason) but not why a job was evicted: a rebuilt
eviction infers it from its preemptor and nodes (`_eviction_reason`); only
the Kubernetes Event users read of an eviction that was never applied says it.

Each eviction's preemptor also waits for the victims' pods to be gone
before it is bound (`victims`), also when the eviction was decided before
the snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from muster.daemon.cancels import by_user
from muster.events.types import (
    Event,
    JobAdmitted,
    JobCancelled,
    JobId,
    JobPreempted,
    NodeName,
    PreemptionReason,
    QueueName,
)
from muster.projections.state import ClusterState, JobState

__all__ = ["owed", "victims"]


def owed(state: ClusterState, exact: Mapping[str, Event], holds: Callable[[str], bool]) -> list[Event]:
    """The decision each job's cluster must reflect now, in job order.

    `exact`: job -> its last admission or eviction as folded (applied as it is when it matches the state);
    `holds(job)`: whether pods of the job still hold nodes (an eviction or a user's cancel is owed only then).
    """
    out: list[Event] = []
    for job_id, job in sorted(state.jobs.items()):
        known = exact.get(job_id)
        if job.status == "admitted":
            out.append(known if isinstance(known, JobAdmitted) else _admission(job))
        elif job.status == "pending" and job.preemptions and holds(job_id):
            out.append(known if isinstance(known, JobPreempted) else _eviction(state, job))
        elif job.status == "cancelled" and holds(job_id):
            cancel = JobCancelled(at=job.finished_at or 0, job=JobId(job_id), reason=job.reason)
            if by_user(cancel):
                out.append(cancel)
    return out


def victims(state: ClusterState) -> dict[str, set[str]]:
    """Pending preemptor -> the jobs evicted for it that still wait (its binding waits for their pods to go)."""
    out: dict[str, set[str]] = {}
    for job_id, job in sorted(state.jobs.items()):
        preemptor = state.jobs.get(job.evicted_by) if job.evicted_by is not None else None
        if job.status == "pending" and preemptor is not None and preemptor.status == "pending":
            out.setdefault(preemptor.id, set()).add(job_id)
    return out


def _admission(job: JobState) -> JobAdmitted:
    """The job's admission as the cluster needs it to bind the gang again (epoch 0: an earlier term)."""
    return JobAdmitted(
        at=job.admitted_at or 0,
        job=JobId(job.id),
        queue=QueueName(job.queue),
        placement={pod: NodeName(node) for pod, node in job.placement.items()},
        borrowed=dict(job.borrowed),
    )


def _eviction(state: ClusterState, job: JobState) -> JobPreempted:
    preemptor = JobId(job.evicted_by) if job.evicted_by is not None else None
    return JobPreempted(
        at=job.preempted_at or 0, job=JobId(job.id), preemptor=preemptor, reason=_eviction_reason(state, job)
    )


def _eviction_reason(state: ClusterState, job: JobState) -> PreemptionReason:
    """The fold keeps who evicted a job, not why: a preemptor of its own queue, one of its cohort, or none."""
    preemptor = state.jobs.get(job.evicted_by) if job.evicted_by is not None else None
    if preemptor is not None:
        return "WithinQueue" if preemptor.queue == job.queue else "ReclaimWithinCohort"
    nodes = [state.nodes.get(node) for node in job.placement.values()]
    return "IdleReclaim" if all(node is not None and node.ready for node in nodes) else "NodeFailure"
