"""Which job a run of pods is: once its pods are there, the log's, a controller's, or a new one.

Pure bookkeeping, no I/O: `gangs.Gangs` asks `Forming.form` about a gang whose run has no job yet;
the answer is the run's job (`Formed`: what the log says of it, or None for a new one to submit),
pods left alone (`StoppedRun`), or None while the run waits: for its pods, or for a read it asked
for here (`asking.Asks`: its Job's completions, its namespace's default queue).

Invariants:
- A run's pods are the first `size` of its owner's active pods not retired (`PodInfo.sort_key`), and
  its job id is deterministic: the owner's (`Owner.job_id`), salted for a pod group by its pods' uids,
  or, for a later run of a recreating owner, by its pods (`gangruns.later_run`).
- A pod is its uid, not its name: a pod deleted and created again under the same name (an
  operator's `<job>-worker-0`, a user re-applying a manifest) is a new pod. The log holds names, not
  uids: a relisting leader takes pods under an ended run's names for a new run when they wait
  unbound (`gangruns.new_to`), which no pod of an ended run does.
- A gang the log knows may have run, even ended, while no adapter watched (a leader failover): it
  is recognised by all its pods, ended ones too, or its end is never reported and the log holds its
  capacity for ever. A Job whose run the log says was preempted and has not started since is read
  first: its completions say which slots are done (`gangruns.gone_finished`).
- Pods of a labelled pod group's controller that no job on the log holds are judged by the
  controller's jobs on the log (`controllers.claim`): the replacements of its waiting job are that
  job's pods (`Adopt`); those it makes after its user cancelled its job are left alone (`Stopped`).
- A gang naming no queue (its pods, its owner) waits for its namespace's default queue, read once,
  unless the log holds its job already (its queue is settled).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from muster.daemon.k8s.asking import Asks
from muster.daemon.k8s.controllers import Adopt, Claim, Stopped
from muster.daemon.k8s.gangruns import (
    ENDED,
    Gang,
    KnownJob,
    gone_finished,
    later_run,
    new_to,
    podsets_of,
    preempted_since_started,
    queue_of,
    salt,
)
from muster.daemon.k8s.pods import PodInfo, reruns
from muster.events.types import ControllerRef, JobId, PodSet

__all__ = ["ClaimOf", "Formed", "Forming", "StoppedRun"]

ClaimOf = Callable[[str, ControllerRef, str, list[PodSet]], Claim]
"""What pods of a source and queue naming a controller are when no job on the log holds them (`controllers`)."""


@dataclass(frozen=True)
class Formed:
    """A run that has its job: what the log says of it (None: a new job, to submit), its pods, and its
    namespace's default queue (the queue of a run that names none)."""

    job: JobId
    known: KnownJob | None
    chosen: list[PodInfo]
    namespace_queue: str


@dataclass(frozen=True)
class StoppedRun:
    """Pods left alone because their controller's job was cancelled by its user (the adapter tells them why)."""

    stopped: Stopped
    pods: tuple[PodInfo, ...]


class Forming:
    """Says which job a gang's run is, from the log (`known`) and a controller's jobs on it (`claim`)."""

    def __init__(self, known: Callable[[JobId], KnownJob | None] | None, claim: ClaimOf | None, asks: Asks) -> None:
        """`known`: what the log says of a job; `claim`: what the log says of a controller's pods no job holds;
        both None without a view of the log. `asks`: where the reads a run waits for are asked."""
        self._known = known
        self._claim: ClaimOf = claim or (lambda source, controller, queue, podsets: None)
        self._asks = asks

    def form(self, gang: Gang, size: int) -> Formed | StoppedRun | None:
        """The job of the gang's run once `size` of its pods are there (its podsets and mapping set); its pods
        left alone (the gang is done); or None while it waits."""
        current = (p for p in gang.pods.values() if p.active and p.uid not in gang.retired)
        active = sorted(current, key=PodInfo.sort_key)
        chosen = active[:size]
        if len(active) < size:
            # recognise a gang the log knows by all its pods (see the invariants)
            every = sorted(gang.pods.values(), key=PodInfo.sort_key)
            if self._known is None or not every or (len(every) < size and gang.owner.kind != "Job"):
                return None  # only a Job's count can make a gang whole with fewer pods (`gone_finished`)
            chosen = every[:size]
            on_log = self._known(gang.owner.job_id(salt(gang, chosen)))
            if on_log is None or self._read_first(gang, on_log):
                return None
            if len(every) + gone_finished(gang, on_log, every) < size:
                return None
        if self._needs_namespace(gang, chosen):
            return None
        gang.podsets, gang.mapping = podsets_of(chosen)
        job = self._job_id(gang, chosen)
        known = self._known(job) if self._known is not None else None
        ns_queue, controller = self._asks.namespace_queue(chosen[0].namespace), chosen[0].owner.controller
        claimed = None
        # a PodGroup's job id is its object's uid: its controller's replacements are that job's already
        if known is None and controller is not None and gang.owner.reads_controller:
            claimed = self._claim(gang.owner.source, controller, queue_of(gang, chosen, ns_queue), gang.podsets)
        if isinstance(claimed, Stopped):
            return _stop(gang, chosen, claimed)
        if isinstance(claimed, Adopt) and self._known is not None:
            job, known = claimed.job, self._known(claimed.job)
        if known is not None and self._read_first(gang, known):
            return None
        return Formed(job, known, chosen, ns_queue)

    def _job_id(self, gang: Gang, chosen: list[PodInfo]) -> JobId:
        """The job of this run: the owner's, or, for a later run of a recreating owner, salted by its pods.

        A later run is one that began while this adapter watched (`Gangs._next_run`), or, for a new leader
        relisting the cluster, pods of a run the log holds, or that are not those of the owner's job
        the log saw end (`new_to`).
        """
        job = gang.owner.job_id(salt(gang, chosen))
        run = later_run(job, chosen)
        if not gang.later_run and reruns(gang.owner) and self._known is not None:
            known = self._known(job)
            gang.later_run = (
                known is not None and known.status in ENDED and (self._known(run) is not None or new_to(known, chosen))
            )
        return run if gang.later_run else job

    def _read_first(self, gang: Gang, known: KnownJob) -> bool:
        """Whether the gang of a Job whose run the log says was preempted and has not started since waits for a read
        of its Job (asked here, once) before its run is formed: its completions say which of its pods' slots are
        done (`finished_when_relisted`), its count which are done with no pod left (`gone_finished`). Unread, a pod
        of an earlier index that succeeded looked like a slot of the preempted run done, and the job ended early."""
        if gang.owner.kind != "Job" or gang.completions is not None or not preempted_since_started(known):
            return False
        self._asks.owner(gang)  # its completions
        return True

    def _needs_namespace(self, gang: Gang, chosen: list[PodInfo]) -> bool:
        """Whether the gang names no queue and waits for its namespace's default (asked for here once)."""
        ns = gang.owner.namespace
        if not self._asks.default_unread(ns) or gang.queue or any(p.queue for p in chosen):
            return False
        if self._known is not None and self._known(gang.owner.job_id(salt(gang, chosen))) is not None:
            return False  # already on the log: its queue is settled
        self._asks.namespace(ns)
        return True


def _stop(gang: Gang, chosen: list[PodInfo], stopped: Stopped) -> StoppedRun:
    """Leave the pods of a controller whose job its user cancelled alone (`controllers.Stopped`): no job, no
    binding; the adapter tells them why (`Gangs.stopped`). Pods it makes after these are judged again
    (`Gangs._next_run`)."""
    gang.podsets, gang.mapping = [], {}
    gang.stopped = stopped.job
    gang.done = True
    gang.retired |= {p.uid for p in chosen}
    return StoppedRun(stopped, tuple(chosen))
