"""Gang recognition: pods with `schedulerName: muster` grouped into jobs, and their lifecycle.

Pure bookkeeping, no I/O: the adapter feeds pod changes in and gets events out.

Which gang a pod belongs to is read from the pod (`pods.pod_info`, its `Owner`).

The queue is the pods' label `muster.dev/queue`, else Kueue's `kueue.x-k8s.io/queue-name`,
else the owner's (the same labels on the Job, JobSet, MPIJob..., or a Volcano PodGroup's
`spec.queue`, read with its size), so a team moving from those
changes only `schedulerName`; else, with `namespace_queues`, the namespace's default
(its label or annotation `muster.dev/default-queue`): a gang with no queue of its own
waits for its namespace to be read once (`asking`: `namespaces_to_fetch`, `set_namespace_queue`).

The size of a gang is the label `muster.dev/gang-size` when present, else, for
a job the log already knows (a new leader relisting the cluster), the number
of pods it was submitted with, else its owner's (Job parallelism, JobSet
replicas x parallelism, sum of the PyTorchJob or MPIJob replicas, a PodGroup's
`minMember`), which the adapter fetches (`asking`: `owners_to_fetch`) and hands back with `set_size`. Owners
whose pods do not carry the owner's uid (PodGroups, MPIJobs) get it from that
lookup, so a re-created owner is still a new job. Only unknown gangs cost a lookup: a
relist of a cluster holding thousands of gangs must not fire thousands of
requests (they starved the new leader's event loop, and its lease lapsed).

What one run is made of (its podsets, successors, submission) is `gangruns`; which job a run is
(the log's, a controller's, a new one), `forming`; what the gangs wait to read, `asking`; what a pod
someone deleted from a run means, `deletions`; what an owner's new size means, `resizing`. Here is
which gang each pod belongs to, and when each run is submitted, started and ended.

Invariants:
- A gang is submitted once, when all its pods exist (`size` pods that are
  neither terminated nor being deleted), with a deterministic job id (`forming`).
- Each admitted run reports JobStarted once; a gang ends once (JobFinished
  when every pod succeeded and, for a Job, `completions` pods did; JobFailed
  when a pod failed or was deleted by someone else; JobCancelled `WorkloadDeleted`
  when the user deleted a gang's workload: `deletions`). Pods muster evicted for a
  preemption are expected to go and report nothing; the gang waits for its
  replacements under the same job id. So does a gang whose owner is there to make a pod someone
  deleted again (`workload_read`); bound, the replacement takes the deleted pod's slot and node
  (`vacated`). Only a pod group nothing recreates (bare pods: `pods.recreated`) fails so.
- A pod of a preempted run that succeeded, before its eviction or in its grace period, finished its slot
  (`Gang.finished`): its owner makes no pod for it again, so the gang waits for replacements of the other slots
  only (`refill_slots`), its re-admission binds nothing there, and a run whose every pod succeeded so is over:
  the job ends JobFinished (`finished_before_eviction`). The eviction leaves a pod that succeeded (`evicted`),
  so a new leader finds that slot done from the pod (`finished_when_relisted`).
- A Job's pod created after another succeeded (its next index) runs in that
  pod's slot of the admitted gang (`take_successors`); pods of a recreating
  owner that come after its run ended are a new run, a new job (`_next_run`).
- Pods of a labelled pod group's controller that no job on the log holds are judged by the
  controller's jobs on the log (`forming`, `controllers.claim`); those left alone are told why
  (`stopped`).
- A waiting gang whose owner runs another number of pods at once now ends `Resized` and its pods are
  a new job at the new size; an admitted gang keeps its size, and a pod its owner makes beyond it is
  told so (an `Ignored` Warning): the rules are `resizing`'s.
- A pod is its uid, not its name (`forming`): the uids of a run's pods are retired when it ends,
  so its owner's pods made again under the same names are the next run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from muster.daemon.k8s.asking import Asks
from muster.daemon.k8s.deletions import WorkloadCheck, owner_ended, pod_lost
from muster.daemon.k8s.forming import ClaimOf, Forming, StoppedRun
from muster.daemon.k8s.gangruns import (
    ENDED,
    Gang,
    KnownJob,
    Tracked,
    as_placed,
    evicted,
    fill_gone_slots,
    finished_before_eviction,
    finished_when_relisted,
    note_finished,
    replaced,
    runs_no_successors,
    submission,
    take_successors,
)
from muster.daemon.k8s.gangviews import GangViews
from muster.daemon.k8s.owners import Sizing
from muster.daemon.k8s.pods import TERMINATED, UNOWNED, Owner, PodInfo, recreated, reruns
from muster.daemon.k8s.reconciling import OwnerRead
from muster.daemon.k8s.resizing import (
    beyond_admitted,
    resized,
    resized_to,
    shrink,
    take_size,
    wants_recount,
    was_resized,
)
from muster.events.types import Event, JobFailed, JobFinished, JobId, JobStarted

__all__ = ["TERMINATED", "Gang", "Gangs", "IgnoredGang", "KnownJob", "StoppedRun", "Tracked"]


@dataclass(frozen=True)
class IgnoredGang:
    """Pods left alone because their owner is gone or cannot be one gang (the adapter tells them why)."""

    why: str
    pods: tuple[PodInfo, ...]


class Gangs(GangViews):
    """All gangs of muster pods; every change returns the events it produced (the questions: `GangViews`)."""

    def __init__(
        self,
        *,
        known: Callable[[JobId], KnownJob | None] | None = None,
        namespace_queues: bool = False,
        claim: ClaimOf | None = None,
    ) -> None:
        """`known`: what the log says of a job; `claim`: what the log says of a controller's pods no job
        holds (`controllers.ControllerJobs.claim`); both None without a view of the log."""
        super().__init__(known)
        self.recheck: set[str] = set()
        """Pod keys whose `holds_capacity` may have changed without an event of their own."""
        self._asks = Asks(namespace_queues=namespace_queues)
        """What the gangs wait to read (owners, namespaces' default queues), and the queues read."""
        self._forming = Forming(known, claim, self._asks)
        self.problems: list[str] = []
        """Reports of malformed pods, drained by the adapter's logger."""
        self.rebind: set[JobId] = set()
        """Admitted jobs whose gang took a successor pod (`take_successors`): the adapter binds it."""
        self._losing_seen: set[JobId] = set()
        """Pod groups found losing by the last reconciliation pass (`settle_deletions`)."""
        self.deletions: list[WorkloadCheck] = []
        """Waiting jobs a pod of which was deleted: the adapter reads their owner (`workload_read`)."""
        self.stopped: list[StoppedRun] = []
        """Pods of a controller whose job a user cancelled, left alone: the adapter tells them why."""
        self.ignored: list[IgnoredGang] = []
        """Pods whose owner is gone or cannot be one gang, left alone: the adapter tells them why."""

    # ------------------------------------------------------------ inputs

    def pod_changed(self, info: PodInfo, at: int) -> list[Event]:
        owner = self._by_pod.get(info.key)
        if owner is None:
            owner = info.owner
            self._by_pod[info.key] = owner
            if info.problems:
                self.problems.append(f"pod {info.key}: " + "; ".join(info.problems))
        gang = self._gangs.get(owner)
        if gang is None:
            gang = self._gangs[owner] = Gang(owner=owner)
            if info.size_label is not None:
                gang.size = info.size_label
            elif owner.kind == "Pod":
                gang.size = 1
            elif owner.kind not in UNOWNED:
                known = self._on_log(owner.job_id())
                if known is not None and not was_resized(known):
                    gang.size = sum(ps.count for ps in known.podsets)  # as submitted: no lookup
                else:
                    self._asks.owner(gang)
                    self._unsized.add(owner)
        gang.pods[info.key] = info
        if wants_recount(gang, info):
            self._asks.recount(owner)
        events = self._evaluate(gang, at)
        why = beyond_admitted(gang, info, self._on_log)
        if why is not None:
            self.ignored.append(IgnoredGang(why, (info,)))
        return events

    def pod_deleted(self, key: str, at: int) -> list[Event]:
        owner = self._by_pod.pop(key, None)
        gang = self._gangs.get(owner) if owner is not None else None
        if gang is None:
            return []
        info = gang.pods.pop(key, None)
        events: list[Event] = []
        if (
            info is not None
            and gang.job_id is not None
            and not gang.done
            and not gang.requeued
            and info.uid not in gang.retired
            and key in gang.mapping.values()
            and info.phase not in TERMINATED
        ):
            lost = pod_lost(gang, info, at)
            if isinstance(lost, WorkloadCheck):
                self.deletions.append(lost)
            elif lost is not None:
                events += self._end(gang, lost)
        else:
            events += self._evaluate(gang, at)
        self._collect(gang)
        return events

    def workload_read(self, job: JobId, read: OwnerRead, at: int) -> list[Event]:
        """The adapter read the owner of `job` (see `deletions`, asked only for owners that recreate their pods):
        the job ends (`deletions.owner_ended`), or ends `Resized`, or waits for the deleted pod's replacement,
        which takes its place (a bound run's, on its node: `rebind`); a bound run scaled down goes on without it."""
        gang = self._gang_of(job)
        if gang is None or gang.done or not gang.losing:
            return []
        ending = owner_ended(gang, read, at)
        if ending is not None:
            return self._end(gang, ending)
        again = self._resized(gang, read.sizing, at)
        if again is not None:
            return again  # the pod went because its owner was scaled down: it makes no replacement
        if not shrink(gang, read.sizing):
            gang.losing = ""
            gang.requeued = not gang.vacated  # a bound run keeps its slots: the replacement takes the deleted one
        return self._evaluate(gang, at)  # its replacement may be there already, or its other pods done

    def settle_deletions(self, at: int) -> list[Event]:
        """Pod groups with no owner to read that lost some of their waiting pods and kept the others for a
        whole pass (called by each reconciliation pass): a pod was deleted from a workload still there.

        A user deleting a group deletes its pods one by one (`kubectl delete -l` sends a request each): a
        pass in between must not end it, so a group is settled by the first pass that finds it losing again.
        """
        events: list[Event] = []
        seen, self._losing_seen = self._losing_seen, set()
        for owner in sorted(self._gangs, key=lambda o: o.source):
            gang = self._gangs[owner]
            if not gang.losing or gang.done or gang.job_id is None or recreated(owner):
                continue
            if gang.job_id in seen:
                events += self._end(gang, JobFailed(at=at, job=gang.job_id, reason=gang.losing))
            else:
                self._losing_seen.add(gang.job_id)
        return events

    def set_size(self, owner: Owner, sizing: Sizing, at: int) -> list[Event]:
        """What the owner's lookup found (`Sizing`); a size of None means the owner is gone (its pods
        will be garbage-collected).

        Its uid, queue and time limit are used when the pods lack them; `completions` is a Job's
        successful pods needed in all. A size below 1 (a PodGroup with `minMember: 0`) leaves the
        pods alone, like a gone owner. A gang sized already (from the log) asked only for its Job's
        completions.
        """
        self._unsized.discard(owner)
        gang = self._gangs.get(owner)
        if gang is None:
            return []
        size, completions = sizing.size, sizing.completions
        if gang.size is not None:
            again = self._resized(gang, sizing, at)
            if again is not None:
                return again
            gang.completions = max(gang.size, completions or 0)
            gang.succeeded = sizing.succeeded
            return self._evaluate(gang, at)
        if size is None or size < 1:
            gang.done = True
            self.recheck.update(gang.pods)
            why = sizing.problem or f"{owner.source} is not there (deleted, or its kind not served by this cluster)"
            self.ignored.append(IgnoredGang(why, tuple(sorted(gang.pods.values(), key=PodInfo.sort_key))))
            return []
        gang.size = size
        if owner.kind == "Job":
            gang.completions, gang.succeeded = max(size, completions or 0), sizing.succeeded
        if not owner.uid:
            gang.uid = sizing.uid
        gang.queue = sizing.queue
        gang.max_runtime = sizing.max_runtime
        return self._evaluate(gang, at)

    def set_namespace_queue(self, namespace: str, queue: str, at: int) -> list[Event]:
        """The namespace's default queue ("" for none, or when it cannot be read): its waiting gangs go on."""
        self._asks.set_namespace_queue(namespace, queue)
        events: list[Event] = []
        for owner in sorted(self._gangs, key=lambda o: o.source):
            if owner.namespace == namespace and self._gangs[owner].job_id is None:
                events += self._evaluate(self._gangs[owner], at)
        return events

    def namespaces_to_fetch(self) -> list[str]:
        """Namespaces whose default queue a waiting gang needs, not asked for yet (each is returned once)."""
        return self._asks.namespaces()

    def owners_to_fetch(self) -> list[Owner]:
        """Owners whose size is needed and not asked for yet (each is returned once)."""
        return self._asks.owners()

    # ------------------------------------------------------------ effects and endings

    def evicting(self, job: JobId) -> list[PodInfo]:
        """Mark the job preempted: its current pods are expected to go, but those that succeeded (`evicted`).
        Returns the pods to evict."""
        gang = self._gang_of(job)
        if gang is None:
            return []
        victims = evicted(gang)
        gang.retired |= {p.uid for p in gang.pods.values()}  # the log counts none of them now
        self.recheck.update(gang.pods)
        gang.started = False
        gang.requeued = True
        gang.vacated.clear()  # every slot is taken again, by the replacements' re-admission
        return victims

    def nodes_lost(self, nodes: set[str], at: int) -> list[Event]:
        """These nodes were deleted: end the gangs running there whose pods nothing recreates (`recreated`)."""
        if not nodes:
            return []
        events: list[Event] = []
        for owner in sorted(self._gangs, key=lambda o: o.source):
            gang = self._gangs[owner]
            if gang.job_id is None or gang.done or gang.requeued or recreated(owner):
                continue
            lost = sorted(p.key for p in gang.pods.values() if p.node in nodes and p.active)
            if lost:
                shown = ", ".join(lost[:5]) + (f" and {len(lost) - 5} more" if len(lost) > 5 else "")
                where = ", ".join(sorted({gang.pods[k].node for k in lost}))
                reason = f"node {where} was deleted with pods {shown}; nothing recreates them"
                events += self._end(gang, JobFailed(at=at, job=gang.job_id, reason=reason))
        return events

    def fail(self, job: JobId, reason: str, at: int) -> list[Event]:
        """End the job with JobFailed unless it already ended."""
        gang = self._gang_of(job)
        if gang is None:
            if job in self._ended:
                return []
            self._ended.add(job)
            return [JobFailed(at=at, job=job, reason=reason)]
        return self._end(gang, JobFailed(at=at, job=job, reason=reason))

    def vanished(self, job: JobId, remaining: Iterable[str], event: Event, resize: Sizing | None = None) -> list[Event]:
        """End `job` with `event`, found by reconciliation (its workload went while nobody watched).

        Whatever is left of it (`remaining` pod keys) holds its nodes outside the job's
        accounting from now on, like the survivors of a failed gang; but the pods of a waiting job
        whose owner was resized (`resize`: its new size) are submitted again at that size, a new job.
        """
        if job in self._ended:
            return []
        self._ended.add(job)
        owners = {self._by_pod[k] for k in remaining if k in self._by_pod}
        if job in self._by_job:
            owners.add(self._by_job[job])
        events = [event]
        for owner in sorted(owners, key=lambda o: o.source):
            gang = self._gangs.get(owner)
            if gang is not None and resize is not None and resize.size and gang.job_id in (None, job):
                take_size(gang, resize)
                events += self._evaluate(gang, event.at)
            elif gang is not None:
                self._close(gang)
                self._unsized.discard(owner)
        return events

    def forget(self, job: JobId) -> None:
        """The log ended the job (rejected, cancelled): report nothing more about it."""
        gang = self._gang_of(job)
        self._ended.add(job)
        if gang is not None:
            self._close(gang)
            self._collect(gang)

    # ------------------------------------------------------------ internals

    def _resized(self, gang: Gang, sizing: Sizing | None, at: int) -> list[Event] | None:
        """A waiting gang whose owner's size changed (`resizing.resized_to`): its job ends `Resized` and its pods
        are submitted again at the new size; None when it keeps its size."""
        size = resized_to(gang, sizing, self._on_log)
        if size is None or sizing is None or gang.job_id is None:
            return None
        self._ended.add(gang.job_id)
        ended = resized(gang.job_id, gang.owner, size, gang.size or 0, at)
        take_size(gang, sizing)
        return [ended, *self._evaluate(gang, at)]

    def _end(self, gang: Gang, event: Event) -> list[Event]:
        if gang.done:
            return []
        self._close(gang)
        if gang.job_id is not None:
            self._ended.add(gang.job_id)
        return [event]

    def _close(self, gang: Gang) -> None:
        """The gang's run is over: its pods (by uid: a pod made again under a name of it is new) are retired."""
        gang.done = True
        gang.retired |= {gang.pods[key].uid for key in gang.mapping.values() if key in gang.pods}
        self.recheck.update(gang.pods)

    def _collect(self, gang: Gang) -> None:
        """Drop a finished gang once its last pod is gone (its job id stays known)."""
        if gang.done and not gang.pods:
            self._gangs.pop(gang.owner, None)
            self._unsized.discard(gang.owner)

    def _evaluate(self, gang: Gang, at: int) -> list[Event]:
        """What the gang's pods say now: a run forming is matched to the log's job or submitted (`_form`), a
        preempted one takes its replacements (`gangruns.replaced`), a run going on starts or ends (`_judge`)."""
        if gang.size is None:
            return []
        if gang.done:
            return self._next_run(gang, at)
        if gang.job_id is None:
            return self._form(gang, gang.size, at)
        if gang.requeued:
            note_finished(gang)
            if finished_before_eviction(gang):
                # the preemption came as the run ended: no replacement comes (its owner counts its pods
                # done), so waiting for one would fail the re-admission "pods gone before binding"
                gang.requeued = False
                return self._end(gang, JobFinished(at=at, job=gang.job_id))
            if not replaced(gang, gang.size):
                return []
        return self._judge(gang, gang.job_id, at)

    def _form(self, gang: Gang, size: int, at: int) -> list[Event]:
        """A run with no job yet: once its pods are there, its job (`forming`) is submitted when new, or takes up
        the log's where the log left it (a new leader's relist); pods left alone are told why (`stopped`)."""
        formed = self._forming.form(gang, size)
        if isinstance(formed, StoppedRun):
            self.recheck.update(gang.pods)
            self.stopped.append(formed)
            return []
        if formed is None:
            return []
        job, known, chosen = formed.job, formed.known, formed.chosen
        gang.job_id = job
        self._by_job[job] = gang.owner
        self.recheck.update(gang.pods)  # now the log can say whether it counts them (holds_capacity)
        if known is None:
            return [submission(gang, chosen, at, formed.namespace_queue), *self._judge(gang, job, at)]
        gang.started = known.started_at is not None
        if known.status in ENDED:
            self._close(gang)
            self._ended.add(job)
            return []
        fill_gone_slots(gang, known)
        if known.status == "admitted":
            gang.mapping = as_placed(gang.mapping, gang.pods, known.placement)
        finished_when_relisted(gang, known)
        if finished_before_eviction(gang):
            return self._end(gang, JobFinished(at=at, job=job))
        return self._judge(gang, job, at)

    def _judge(self, gang: Gang, job: JobId, at: int) -> list[Event]:
        """A run with its job: successors take the slots pods left (`take_successors`); a pod failed ends it; every
        pod there bound and running starts it (once); every pod succeeded, and its owner needing no more, ends it."""
        if take_successors(gang):
            self.rebind.add(job)
        mapped = [
            gang.pods.get(key)
            for name, key in gang.mapping.items()
            if name not in gang.shrunk and name not in gang.finished
        ]
        for p in mapped:
            if p is not None and p.phase == "Failed" and p.uid not in gang.retired:
                why = f": {p.reason}" if p.reason else ""
                return self._end(gang, JobFailed(at=at, job=job, reason=f"pod {p.key} failed{why}"))
        present = [p for p in mapped if p is not None]
        if len(present) < len(mapped):
            return []
        events: list[Event] = []
        if all(p.phase == "Succeeded" for p in present):
            if not self._completed(gang):
                return []  # the Job's next indexes are on their way: they run in these slots
            if not gang.started:
                events.append(self._started(job, at))
                gang.started = True
            return events + self._end(gang, JobFinished(at=at, job=job))
        if not gang.started and all(p.node and p.phase in ("Running", "Succeeded") for p in present):
            gang.started = True
            events.append(self._started(job, at))
        return events

    def _started(self, job: JobId, at: int) -> JobStarted:
        """The job's current run started (the log's count of its preemptions names the run)."""
        known = self._known(job) if self._known is not None else None
        return JobStarted(at=at, job=job, run=known.preemptions if known is not None else 0)

    def _next_run(self, gang: Gang, at: int) -> list[Event]:
        """A recreating owner's new pods for a gang whose run ended are a new run, submitted as a new job.

        A Job whose pods were lost (a node gone) and did not come back before the admission that
        re-placed them gave up ends with JobFailed; its controller's replacements, arriving later,
        would otherwise pend forever. The log's rule is that an ended job never runs again, so
        the replacements are a new job (`forming`), once `size` pods that were never part of the
        ended run exist. What is left of the old run counts outside any job (`retired`). Pods left
        alone for a controller whose job its user cancelled (`forming.StoppedRun`) are followed the same way: pods
        made after them are judged again (by a controller made again, they are a new job).
        """
        if gang.size is None or (gang.job_id is None and gang.stopped is None) or not reruns(gang.owner):
            return []
        fresh = [p for p in gang.pods.values() if p.active and p.uid not in gang.retired]
        if len(fresh) < gang.size:
            return []
        fresh_uids = {p.uid for p in fresh}
        gang.retired |= {p.uid for p in gang.pods.values() if p.uid not in fresh_uids}
        if gang.job_id is not None:
            self._by_job.pop(gang.job_id, None)
        gang.job_id, gang.mapping, gang.podsets, gang.vacated = None, {}, [], {}
        gang.shrunk, gang.finished = set(), {}
        gang.done = gang.started = gang.requeued = gang.recount = False
        gang.later_run = gang.stopped is None
        gang.stopped = None
        self.recheck.update(gang.pods)
        return self._evaluate(gang, at)

    def _completed(self, gang: Gang) -> bool:
        """Whether the owner needs no more pods: a Job counts its successful pods (distinct indexes) to completions."""
        if gang.owner.kind != "Job":
            return True
        if gang.completions is None:
            # Sized from the log (a new leader): only pods past the gang's size say the Job may want more,
            # so a relist of finished gangs costs no lookups.
            if gang.asked or not runs_no_successors(gang):
                self._asks.owner(gang)  # how many successful pods it needs
                return False
            return True
        succeeded = {
            p.completion_index if p.completion_index is not None else p.uid
            for p in [*gang.pods.values(), *gang.finished.values()]  # finished: deleted by a preemption since
            if p is not None and p.phase == "Succeeded"
        }
        gone = sum(1 for p in gang.finished.values() if p is None)  # counted by its Job, no pod left
        return len(succeeded) + gone >= gang.completions
