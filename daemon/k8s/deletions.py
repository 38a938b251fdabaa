"""A pod of a run deleted by someone other than muster: the rules, over one `Gang`.

No I/O and no state beyond the `Gang` given (as `gangruns`): `gangs.Gangs` asks these when such a
pod goes (`pod_lost`) and when the adapter has read its owner (`owner_ended`), and turns their
answers into events.

Invariants:
- Its user deleting the workload (the Job, JobSet..., or every pod of a pod group, a lone pod,
  running or not) cancels the job, `WorkloadDeleted`.
- A pod deleted from a workload still there is made again by its owner (the Job controller,
  JobSet's child Jobs, a training operator, a pod group's controller), and the gang waits for it,
  as a preempted gang waits for its replacements: the replacement takes the deleted pod's place
  (its admission binds it there; a bound run's, on the deleted pod's node: `Gang.vacated`). Ending
  it JobFailed instead retired the other pods with the run, and the replacement alone was no gang:
  they all waited unbound for ever.
- Whether a workload with an owner object is gone takes a read of that object (`WorkloadCheck`):
  its pods go after it, one deletion event at a time, so the first does not tell. Gone ends the job
  WorkloadDeleted; unreadable, as a pod deleted from it (`Gang.losing`); there but ended (a Job past
  its `activeDeadlineSeconds`, failed or complete) or suspended, it makes no pod again: the job
  fails, naming why, rather than wait for ever.
- A pod deleted from a pod group nothing recreates (bare pods: `pods.recreated`) fails the job, at
  once when bound, else once a reconciliation pass finds it still losing (`Gangs.settle_deletions`);
  a group without an owner object is gone when its last pod is.
"""

from __future__ import annotations

from dataclasses import dataclass

from muster.daemon.k8s.gangruns import Gang
from muster.daemon.k8s.owners import SUCCEEDED_CONDITIONS
from muster.daemon.k8s.pods import Owner, PodInfo, recreated
from muster.daemon.k8s.reconciling import OwnerRead, owner_makes_no_pods, workload_deleted
from muster.events.types import Event, JobFailed, JobFinished, JobId

__all__ = ["WorkloadCheck", "owner_ended", "pod_lost"]


@dataclass(frozen=True)
class WorkloadCheck:
    """A waiting job a pod of which was deleted, and what to read to learn whether its workload is gone."""

    job: JobId
    owner: Owner
    owned_by: JobId
    """The job id the owner's uid gives (`reconciling.read_owner` compares it): a later run's is salted."""


def pod_lost(gang: Gang, info: PodInfo, at: int) -> Event | WorkloadCheck | None:
    """Someone deleted `info`, a pod of the gang's run: the event that ends the job now, or the read of its owner
    to ask first (once while the gang is losing), or None (it waits: `Gang.losing` says why it would end)."""
    assert gang.job_id is not None
    where = f"while running on {info.node}" if info.node else "before it was bound"
    reason = f"pod {info.key} was deleted {where}"
    bound = bool(info.node) or gang.started
    if not recreated(gang.owner):
        if not any(key in gang.pods for key in gang.mapping.values()):
            # its last pod: the workload is gone, running or not, as reconciliation judges it (`judge`)
            return workload_deleted(gang.job_id, gang.owner, at)
        if bound:
            return JobFailed(at=at, job=gang.job_id, reason=reason)
        gang.losing = gang.losing or reason
        return None
    if bound:
        gang.vacated.update((name, info) for name, key in gang.mapping.items() if key == info.key)
    check = None if gang.losing else WorkloadCheck(gang.job_id, gang.owner, gang.owner.job_id(gang.uid))
    gang.losing = gang.losing or reason
    return check


def owner_ended(gang: Gang, read: OwnerRead, at: int) -> Event | None:
    """The event a read of a losing gang's owner ends its job with: gone, unreadable, or there but making no pod
    again; None when it is there to make the deleted pod again (or it was resized: `resizing`)."""
    assert gang.job_id is not None
    if read.exists is None:
        return JobFailed(at=at, job=gang.job_id, reason=gang.losing)
    if not read.exists:
        return workload_deleted(gang.job_id, gang.owner, at)
    if read.ended.startswith(SUCCEEDED_CONDITIONS) and gang.started and _rest_succeeded(gang):
        # its pod went as it was scaled down, the others succeeded, and it completed: a success
        return JobFinished(at=at, job=gang.job_id)
    if read.ended:
        return owner_makes_no_pods(gang.job_id, gang.owner, read.ended, at, gang.losing)
    return None


def _rest_succeeded(gang: Gang) -> bool:
    """Whether every pod of the run that is still there succeeded (and one is)."""
    rest = [gang.pods[key] for key in gang.mapping.values() if key in gang.pods]
    return bool(rest) and all(p.phase == "Succeeded" for p in rest)
