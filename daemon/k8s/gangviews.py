"""What the adapter asks of the gangs it tracks: read-only answers over `gangs.Gangs`'s tables.

The applier (are a job's pods all there, where are they), the reporter, the translator (does a
bound pod hold capacity the log does not count) and reconciliation (`tracked`) ask these; `Gangs`
changes the tables as pods come and go. Nothing here changes them.
"""

from __future__ import annotations

from collections.abc import Callable

from muster.daemon.k8s.gangruns import Gang, KnownJob, Tracked
from muster.daemon.k8s.pods import TERMINATED, Owner, PodInfo, recreated
from muster.events.types import JobId

__all__ = ["GangViews"]


class GangViews:
    """The gangs' tables (by owner, pod and job) and the questions answered from them."""

    def __init__(self, known: Callable[[JobId], KnownJob | None] | None) -> None:
        self._gangs: dict[Owner, Gang] = {}
        self._by_pod: dict[str, Owner] = {}
        self._by_job: dict[JobId, Owner] = {}
        self._known = known
        """What the log says of a job (None: no view of the log)."""
        self._ended: set[JobId] = set()
        self._unsized: set[Owner] = set()
        """Gangs waiting for their owner's size (`sizing()` is asked often, by every admission waiting)."""

    def _on_log(self, job: JobId) -> KnownJob | None:
        """What the log says of `job` (None: not on it, or no view of the log here)."""
        return self._known(job) if self._known is not None else None

    def _gang_of(self, job: JobId) -> Gang | None:
        owner = self._by_job.get(job)
        return self._gangs.get(owner) if owner is not None else None

    def _gang_of_pod(self, key: str) -> Gang | None:
        owner = self._by_pod.get(key)
        return self._gangs.get(owner) if owner is not None else None

    def pods_of(self, job: JobId) -> dict[str, PodInfo] | None:
        """The current pod of every gang pod name of `job`, or None when the job is unknown here.

        During a requeue the mapping holds only the pods that exist.
        """
        gang = self._gang_of(job)
        if gang is None:
            return None
        return {
            name: gang.pods[key] for name, key in gang.mapping.items() if key in gang.pods and name not in gang.finished
        }

    def job_known(self, job: JobId) -> bool:
        """Whether `job`'s gang is known here (`pods_of` is not None), without building its pods."""
        owner = self._by_job.get(job)
        return owner is not None and owner in self._gangs

    def has_pod(self, key: str) -> bool:
        """Whether the pod `namespace/name` exists (seen and not deleted)."""
        return key in self._by_pod

    def may_hold(self, job: JobId, key: str) -> bool:
        """Whether the pod `namespace/name` exists and is `job`'s, or may become its: its gang runs `job`, or no job
        yet (still forming: sized, matched to the log). A pod another job's gang runs, or one left alone (its owner
        gone, its controller's job cancelled), is not `job`'s whatever its name (reconciliation: `reconciling`)."""
        gang = self._gang_of_pod(key)
        return gang is not None and (gang.job_id == job or (gang.job_id is None and not gang.done))

    def pod(self, key: str) -> PodInfo | None:
        gang = self._gang_of_pod(key)
        return gang.pods.get(key) if gang is not None else None

    def holds_capacity(self, info: PodInfo) -> bool:
        """Whether this bound pod holds capacity the log does not count for its job.

        The fold stops counting a job's pods at its JobPreempted/JobFinished/JobFailed,
        but an evicted pod holds its node until it is gone, and the other pods of a
        failed gang may run on: those count like other schedulers' pods (`reserved`).
        With a view of the log, so does a pod bound where the log did not place it.
        """
        if not info.node or info.phase in TERMINATED:
            return False
        gang = self._gang_of_pod(info.key)
        if gang is None:
            return False
        if gang.done or info.uid in gang.retired:
            return True
        if self._known is None:
            return False
        # Bound by nobody we know (a user's nodeName, another tool, a leader whose decision never
        # reached the log): unless the log places this very pod on this node, the log does not
        # count it, so it counts as foreign usage.
        known = self._known(gang.job_id) if gang.job_id is not None else None
        if known is None or known.status != "admitted":
            return True
        names = [name for name, key in gang.mapping.items() if key == info.key]
        return not names or known.placement.get(names[0]) != info.node

    def ended(self, job: JobId) -> bool:
        """Whether this adapter saw the job end (or was told it ended)."""
        return job in self._ended

    def sizing(self) -> bool:
        """Whether some gang still waits for its owner's size: a job unknown here now may be one of them."""
        return bool(self._unsized)

    def complete(self, job: JobId) -> bool:
        """Whether every gang pod name of `job` has a live pod, or one that ran (bindings can be applied)."""
        gang = self._gang_of(job)
        if gang is None or gang.requeued:
            return False
        return all(
            name in gang.finished or (key in gang.pods and (gang.pods[key].active or gang.pods[key].ran))
            for name, key in gang.mapping.items()
        )

    def finished(self, job: JobId) -> set[str]:
        """Gang pod names of `job` whose pod succeeded before a preemption took it: nothing is bound there."""
        gang = self._gang_of(job)
        return set(gang.finished) if gang is not None else set()

    def tracked(self, job: JobId) -> Tracked | None:
        """What reconciliation judges `job` by when its gang is tracked here and its run goes on (see `reconciling`)."""
        gang = self._gang_of(job)
        if gang is None or gang.done:
            return None
        pods = {name: key for name, key in gang.mapping.items() if name not in gang.finished}  # done: not expected
        return Tracked(pods=pods, owner=gang.owner)

    def owner_of(self, job: JobId) -> Owner | None:
        """The owner of `job`'s gang, when the job is known here."""
        return self._by_job.get(job)

    def recreates(self, job: JobId) -> bool:
        """Whether lost pods of `job` come back (see `recreated`); True for a job unknown here (no verdict)."""
        owner = self._by_job.get(job)
        return owner is None or recreated(owner)
