"""Reconciliation: the log's live jobs against the workloads and pods the cluster holds.

While an adapter watches, a gang's pods report its life as it happens (`gangs`). What
happened while none watched (a Job deleted with its pods, a pod group removed, the
daemon down for a day) is found here, by comparing every job the log holds as pending
or admitted, and that came from this cluster (`JobSubmitted.pods`/`source`), with the
pods and owner objects that exist. The adapter runs it once before its term starts
deciding (so a phantom job never holds its quota into the first cycle) and then every
`reconcile_seconds`.

A pod counts for a job only as one of its gang's, or of a gang that runs no job yet (`GangViews.may_hold`): a
job the log holds admitted whose pods the adapter runs as another job's, or leaves alone (its PodGroup gone, its
controller's job cancelled), has no gang here, so its admission binds nothing; judged by the pod names alone, it
held its quota for ever with nothing running (a phantom: GPUs "used" by nothing).

A job this adapter's gangs track is judged on what they know (`Tracked`): the pods of its current
run, which after a preemption are the replacements its controller made (other names than the
submission's), and its owner as read from its pods (a pod group's controller included). Judged by
the submission's pod names, a preempted pod group running on replacements looked gone and was
cancelled by the next pass while it ran.

`judge` is the policy, in one pure function:
- every pod of the job exists: nothing to say (the gang reports its own end);
- pods are missing and the job has an owner whose controller recreates them (Job,
  JobSet, a Kubeflow job): while that owner exists with the job's uid, nothing (its
  controller brings them back and the gang maps the replacements); once it is gone, being
  deleted, or re-created under the same name, `JobCancelled` with reason `WorkloadDeleted`. A
  labelled pod group whose pods name a controller (an operator's object of any kind) is judged
  the same by that controller, as its pods name it (`pods.controller_ref`), or, when none of its
  pods is left to name it (a new leader after a preemption), as the log names it
  (`JobSubmitted.controller`): a group preempted while its controller was deleted otherwise waited
  for replacements forever, a phantom job in its queue; and one whose controller lives keeps its
  job (its replacements are mapped onto it: `controllers.claim`), not cancelled for pods gone.
  A Volcano or coscheduling PodGroup whose pods name a controller is judged by the PodGroup object
  (the controller deletes it with its pods; the chart lets the adapter read it);
- pods are missing, the owner is there and runs another number of pods at once now (a waiting
  Job scaled down while no leader watched: its controller deleted the pods past its parallelism
  and makes none again): `JobCancelled` `Resized`, and its pods are a new job (`Gangs.vanished`);
- pods are missing and nothing recreates them (bare pods, alone or in a pod group, labelled or a
  PodGroup, whose pods name no controller: `pods.recreated`): all
  gone is `JobCancelled` (`WorkloadDeleted`), some gone is `JobFailed` (the gang can
  never be whole again).

Invariants:
- An owner that cannot be read (an API error other than 404) gives no verdict; the next
  pass asks again. Lookups share the adapter's limit on requests in flight.
- A verdict is a fact about the job (`fact:ended:<job>` on the log): the same end found by
  two passes, two terms, or the gang's own tracking is stored once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import anyio
import structlog

from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.errors import KubeError
from muster.daemon.k8s.gangruns import Tracked, run_of
from muster.daemon.k8s.owners import Sizing, fetch_owner, makes_no_pods, owner_sizing
from muster.daemon.k8s.pods import UNOWNED, Owner, recreated
from muster.daemon.k8s.resizing import resized
from muster.events.types import ControllerRef, Event, JobCancelled, JobFailed, JobId

__all__ = [
    "LiveJob",
    "OwnerRead",
    "Tracked",
    "Verdict",
    "find_vanished",
    "judge",
    "owner_makes_no_pods",
    "owner_of",
    "read_owner",
    "workload_deleted",
]

log = structlog.get_logger("muster.k8s.reconcile")

WORKLOAD_DELETED = "WorkloadDeleted"


class LiveJob(Protocol):
    """A job as the log holds it (`projections.state.JobState` fits)."""

    @property
    def id(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def pods(self) -> dict[str, str]: ...

    @property
    def source(self) -> str: ...

    @property
    def controller(self) -> ControllerRef | None: ...


@dataclass(frozen=True)
class Verdict:
    """A job found gone: the event that ends it and the pods of it that still exist."""

    job: JobId
    event: Event
    remaining: tuple[str, ...]
    resized: Sizing | None = None
    """The owner's new size, when the job ended because its owner was resized: its pods are a new job."""


def owner_of(source: str, controller: ControllerRef | None = None) -> Owner | None:
    """The owner named by a `JobSubmitted.source` (`Kind/namespace/name`), or None when it names none; a
    labelled pod group's with the `controller` the log names for it (`JobState.controller`)."""
    parts = source.split("/")
    if len(parts) != 3 or not all(parts):
        return None
    return Owner(parts[0], parts[1], parts[2], controlled=controller is not None, controller=controller)


class OwnerRead(NamedTuple):
    """What a read of a job's owner found."""

    exists: bool | None
    """Whether the owner the job's pods belong to is there (None: unreadable)."""
    ended: str = ""
    """Why an existing owner makes no pod again, ended or suspended (`owners.makes_no_pods`); "" if it does."""
    sizing: Sizing | None = None
    """The gang size an existing owner gives now (None for a labelled pod group's controller): a waiting gang
    whose owner was resized is submitted again (`Gangs.workload_read`)."""


def judge(
    job: LiveJob,
    present: Callable[[str], bool],
    owner_read: OwnerRead,
    at: int,
    tracked: Tracked | None = None,
) -> Verdict | None:
    """Whether `job` lost its workload (see the module docstring), given what a read of its owner found."""
    keys = _keys(job, tracked)
    missing = [k for k in keys if not present(k)]
    if not missing:
        return None
    remaining = tuple(k for k in keys if present(k))
    owner = _owner(job, tracked)
    job_id = JobId(job.id)
    if owner is not None and recreated(owner):
        if owner_read.exists is None:
            return None
        if owner_read.exists and not owner_read.ended:
            # pods missing while the owner is there: its controller makes them again, unless it was scaled down
            now = owner_read.sizing.size if owner_read.sizing is not None else None
            if job.status != "pending" or now is None or now < 1 or now == len(keys):
                return None
            return Verdict(job_id, resized(job_id, owner, now, len(keys), at), remaining, owner_read.sizing)
        if owner_read.exists:
            what = f"its pods are missing: {_shown(missing)}"
            return Verdict(job_id, owner_makes_no_pods(job_id, owner, owner_read.ended, at, what), remaining)
        return Verdict(job_id, workload_deleted(job_id, owner, at), remaining)
    if not remaining:
        return Verdict(job_id, workload_deleted(job_id, owner, at), ())
    reason = f"pods deleted while no scheduler watched, and nothing recreates them: {_shown(missing)}"
    return Verdict(job_id, JobFailed(at=at, job=job_id, reason=reason), remaining)


def _shown(keys: list[str]) -> str:
    return ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")


def _keys(job: LiveJob, tracked: Tracked | None) -> list[str]:
    return sorted(set((tracked.pods if tracked is not None else job.pods).values()))


def _owner(job: LiveJob, tracked: Tracked | None) -> Owner | None:
    return tracked.owner if tracked is not None else owner_of(job.source, job.controller)


def _same(owner: Owner, job: JobId, uid: str) -> bool:
    """Whether the object read (its `uid`) is the one `job`'s pods belong to, not one made again under its name.

    A Job's or JobSet's job id carries its uid; a pod group's controller is known by the uid its pods name.
    """
    if owner.reads_controller:
        assert owner.controller is not None
        return uid == owner.controller.uid or not owner.controller.uid
    return run_of(job, Owner(owner.kind, owner.namespace, owner.name, uid).job_id())


async def read_owner(client: KubeClient, owner: Owner, job: JobId, limiter: anyio.CapacityLimiter) -> OwnerRead:
    """Whether `job`'s owner (a pod group's: its controller) still exists to recreate its pods."""
    try:
        async with limiter:
            obj = await fetch_owner(client, owner)
    except KubeError as exc:
        # a pod group's controller is of a kind the chart grants no right to read unless told
        denied = owner.reads_controller and exc.status == 403
        hint = "grant get on it (chart: rbac.podGroupControllers)" if denied else ""
        log.warning(
            "cannot read a gang's owner; judging it next time",
            owner=owner.workload,
            error=exc.message,
            **({"hint": hint} if hint else {}),
        )
        return OwnerRead(None)
    meta = (obj or {}).get("metadata") or {}
    uid = str(meta.get("uid") or "")
    # being deleted (a finalizer, e.g. the orphan one, holds it): its controller recreates nothing;
    # same name, other uid: deleted and re-created, not the object the job's pods belong to
    if obj is None or meta.get("deletionTimestamp") or not _same(owner, job, uid):
        return OwnerRead(False)
    assert obj is not None
    return OwnerRead(True, makes_no_pods(obj), None if owner.reads_controller else owner_sizing(owner, obj))


def owner_makes_no_pods(job: JobId, owner: Owner, ended: str, at: int, what: str) -> JobFailed:
    """How a job ends whose owner is there but makes no pod again (`OwnerRead.ended`) while `what` is missing."""
    return JobFailed(at=at, job=job, reason=f"{owner.workload} is {ended}, so it makes no pod again; {what}")


def workload_deleted(job: JobId, owner: Owner | None, at: int) -> JobCancelled:
    """How a job whose workload is gone ends: cancelled, naming the owner that went (or its pods, when it has none)."""
    what = f"{owner.workload} is gone" if owner is not None and recreated(owner) else "its pods are gone"
    return JobCancelled(at=at, job=job, reason=f"{WORKLOAD_DELETED}: {what}")


def live_jobs(jobs: Iterable[LiveJob]) -> list[LiveJob]:
    """The jobs reconciliation looks at: pending or admitted, and made of this cluster's pods."""
    return [j for j in jobs if j.status in ("pending", "admitted") and j.pods]


async def find_vanished(
    client: KubeClient,
    jobs: list[LiveJob],
    holds: Callable[[JobId, str], bool],
    at: int,
    *,
    limiter: anyio.CapacityLimiter,
    tracked: Callable[[JobId], Tracked | None] = lambda _: None,
) -> list[Verdict]:
    """Judge `jobs` (already taken from the log, so no fold runs in between), reading owners where needed.

    `holds(job, key)`: whether the pod `key` exists as one of `job`'s (`GangViews.may_hold`): a pod under a name the
    log gives the job that another job's gang runs, or that the adapter leaves alone, is not. `tracked`: what the
    adapter's gangs know of a job (None: judged by the log alone).
    """
    known = {j.id: tracked(JobId(j.id)) for j in jobs}
    present = {j.id: functools.partial(holds, JobId(j.id)) for j in jobs}
    suspects = [j for j in jobs if any(not present[j.id](k) for k in _keys(j, known[j.id]))]
    alive: dict[str, OwnerRead] = {}

    async def look(job: LiveJob, owner: Owner) -> None:
        alive[job.id] = await read_owner(client, owner, JobId(job.id), limiter)

    async with anyio.create_task_group() as tg:
        for job in suspects:
            owner = _owner(job, known[job.id])
            # a labelled pod group has no object to read but its controller (the log names it)
            if owner is not None and recreated(owner) and (owner.kind not in UNOWNED or owner.reads_controller):
                tg.start_soon(look, job, owner)
    verdicts = []
    for job in suspects:
        verdict = judge(job, present[job.id], alive.get(job.id, OwnerRead(None)), at, known[job.id])
        if verdict is not None:
            verdicts.append(verdict)
    return verdicts
