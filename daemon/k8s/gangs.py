"""Gang recognition: pods with `schedulerName: muster` grouped into jobs, and their lifecycle.

Pure bookkeeping, no I/O: the adapter feeds pod changes in and gets events out.

Which gang a pod belongs to is read from the pod (`pods.pod_info`, its `Owner`).

The queue is the pods' label `muster.dev/queue`, else Kueue's `kueue.x-k8s.io/queue-name`,
else the owner's (the same labels on the Job, JobSet, MPIJob..., or a Volcano PodGroup's
`spec.queue`, read with its size), so a team moving from those
changes only `schedulerName`; else, with `namespace_queues`, the namespace's default
(its label or annotation `muster.dev/default-queue`): a gang with no queue of its own
waits for its namespace to be read once (`namespaces_to_fetch`, `set_namespace_queue`).

The size of a gang is the label `muster.dev/gang-size` when present, else, for
a job the log already knows (a new leader relisting the cluster), the number
of pods it was submitted with, else its owner's (Job parallelism, JobSet
replicas x parallelism, sum of the PyTorchJob or MPIJob replicas, a PodGroup's
`minMember`), which the adapter fetches and hands back with `set_size`. Owners
whose pods do not carry the owner's uid (PodGroups, MPIJobs) get it from that
lookup, so a re-created owner is still a new job. Only unknown gangs cost a lookup: a
relist of a cluster holding thousands of gangs must not fire thousands of
requests (they starved the new leader's event loop, and its lease lapsed).

Invariants:
- A gang is submitted once, when all its pods exist (`size` pods that are
  neither terminated nor being deleted), with a deterministic job id.
- Podsets are groups of identical requests within one role; gang pod names
  `PODSET-INDEX` are numbered in pod index order (completion index, replica
  index, then name), so the same pods always give the same JobSubmitted.
- Each admitted run reports JobStarted once; a gang ends once (JobFinished
  when every pod succeeded and, for a Job, `completions` pods did; JobFailed
  when a pod failed or was deleted by someone else). Pods muster evicted for a
  preemption are expected to go and report nothing; the gang waits for its
  replacements under the same job id.
- A Job's pod created after another succeeded (its next index) runs in that
  pod's slot of the admitted gang (`_take_successors`); pods of a recreating
  owner that come after its run ended are a new run, a new job (`_next_run`).
- A pod is its uid, not its name: a pod deleted and created again under the
  same name (an operator's `<job>-worker-0`, a user re-applying a manifest) is
  a new pod. The uids of a run's pods are retired when it ends, so its owner's
  pods made again under the same names are the next run. The log holds names,
  not uids: a relisting leader takes pods under an ended run's names for a new
  run when they wait unbound (`_new_to`), which no pod of an ended run does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from muster.daemon.k8s.owners import Sizing
from muster.daemon.k8s.pods import TERMINATED, UNOWNED, Owner, PodInfo, recreated
from muster.events.types import (
    Event,
    JobFailed,
    JobFinished,
    JobId,
    JobStarted,
    JobSubmitted,
    PodSet,
    QueueName,
    Topology,
)

__all__ = ["TERMINATED", "Gang", "Gangs", "KnownJob", "Tracked"]

ENDED = ("finished", "failed", "cancelled", "rejected")
"""Statuses of a job on the log that never runs again."""


class KnownJob(Protocol):
    """What the log already says about a job (a `projections.state.JobState` fits)."""

    @property
    def status(self) -> str: ...

    @property
    def started_at(self) -> int | None: ...

    @property
    def podsets(self) -> list[PodSet]: ...

    @property
    def placement(self) -> dict[str, str]: ...

    @property
    def pods(self) -> dict[str, str]: ...


@dataclass
class Gang:
    owner: Owner
    size: int | None = None
    pods: dict[str, PodInfo] = field(default_factory=dict)
    """Pods seen and not deleted, by `namespace/name`."""
    job_id: JobId | None = None
    podsets: list[PodSet] = field(default_factory=list)
    mapping: dict[str, str] = field(default_factory=dict)
    """Gang pod name `PODSET-INDEX` -> pod key, for the current run."""
    started: bool = False
    done: bool = False
    requeued: bool = False
    """Preempted: waiting for replacement pods to map onto the same podsets."""
    retired: set[str] = field(default_factory=set)
    """Uids of pods the log no longer counts for this gang's job, whose end is expected: pods muster
    evicted, and the pods of an earlier run still there when a new run began (`_next_run`)."""
    uid: str = ""
    """The owner's uid, learned from its lookup when its pods do not carry it."""
    queue: str = ""
    """The owner's queue (its queue label, a Volcano PodGroup's spec.queue), for pods that name none."""
    completions: int | None = None
    """A Job's successful pods needed in all (its `completions`, at least the gang's size); None: not
    read yet (a gang the log sized), or not a Job."""
    asked: bool = False
    """A lookup of the owner was asked for (each gang asks at most once)."""
    later_run: bool = False
    """This run began after an earlier run of the same owner ended (`_next_run`): its job id is salted."""
    max_runtime: int | None = None
    """The owner's time limit (a Job's `activeDeadlineSeconds`), for pods that declare none."""


@dataclass(frozen=True)
class Tracked:
    """What the gangs know of a job whose run goes on: its current pods and its owner (for `reconciling`)."""

    pods: Mapping[str, str]
    """Gang pod name -> pod key of the current run (replacements included; pods gone since included)."""
    owner: Owner


def _podsets(pods: list[PodInfo]) -> tuple[list[PodSet], dict[str, str]]:
    """Group `pods` (sorted) into podsets of identical requests per role; map gang pod names to pod keys."""
    groups: dict[tuple[str, tuple[tuple[str, int], ...], Topology | None], list[PodInfo]] = {}
    for p in pods:
        groups.setdefault((p.hint, tuple(sorted(p.requests.items())), p.topology), []).append(p)
    used: dict[str, int] = {}
    podsets: list[PodSet] = []
    mapping: dict[str, str] = {}
    for (hint, reqs, topology), members in groups.items():
        n = used.get(hint, 0)
        used[hint] = n + 1
        name = hint if n == 0 else f"{hint}-{n}"
        podsets.append(PodSet(name=name, count=len(members), requests=dict(reqs), topology=topology))
        for i, p in enumerate(members):
            mapping[f"{name}-{i}"] = p.key
    return podsets, mapping


def _shape(p: PodInfo) -> tuple[str, tuple[tuple[str, int], ...], Topology | None]:
    """What makes two pods interchangeable in a gang: role, requests, topology (`_podsets` groups by it)."""
    return (p.hint, tuple(sorted(p.requests.items())), p.topology)


def _as_placed(mapping: dict[str, str], pods: Mapping[str, PodInfo], placement: Mapping[str, str]) -> dict[str, str]:
    """`mapping` with every bound pod on the gang pod name the log placed on its node, within its podset.

    Sorting gives a relisting leader the submission's names, but a successor (`_take_successors`)
    took the name of the pod it succeeded, whatever its own order: its node says which.
    """
    out = dict(mapping)
    podsets: dict[str, list[str]] = {}
    for name in sorted(mapping):
        podsets.setdefault(name.rsplit("-", 1)[0], []).append(name)
    for names in podsets.values():
        keys = [mapping[n] for n in names]
        free = list(names)
        placed: dict[str, str] = {}
        for key in keys:
            node = pods[key].node if key in pods else ""
            on_node = next((n for n in free if node and placement.get(n) == node), None)
            if on_node is not None:
                free.remove(on_node)
                placed[key] = on_node
        for key in keys:
            if key not in placed:
                placed[key] = free.pop(0)
        out.update({name: key for key, name in placed.items()})
    return out


def _salt(gang: Gang, chosen: list[PodInfo]) -> str:
    """A pod group has no owner uid; its pods' uids tell a re-created group apart."""
    if gang.owner.kind != "Gang":
        return gang.uid
    return hashlib.sha256("".join(sorted(p.uid for p in chosen)).encode()).hexdigest()


def _new_to(ended: KnownJob, chosen: list[PodInfo]) -> bool:
    """Whether `chosen` are not the pods of the `ended` run: none has its name, or those that do wait unbound.

    The log names a run's pods, it does not hold their uids. A pod of an ended run is done, gone,
    or bound (survivors of a failed gang may run on); one that waits unbound under such a name
    was made again by its owner: a new pod (a rejected gang's pods, which wait by design, come
    back once as a new run, rejected again, and are that run on the next relist).
    """
    names = set(ended.pods.values())
    return all(p.active and not p.node for p in chosen if p.key in names)


def _first(values: Iterable[Any]) -> Any:
    for v in values:
        if v is not None:
            return v
    return None


class Gangs:
    """All gangs of muster pods; every method returns the events the change produced."""

    def __init__(
        self, *, known: Callable[[JobId], KnownJob | None] | None = None, namespace_queues: bool = False
    ) -> None:
        self._gangs: dict[Owner, Gang] = {}
        self._by_pod: dict[str, Owner] = {}
        self._by_job: dict[JobId, Owner] = {}
        self._known = known
        self.recheck: set[str] = set()
        """Pod keys whose `holds_capacity` may have changed without an event of their own."""
        self._ended: set[JobId] = set()
        self._wanted: list[Owner] = []
        self._unsized: set[Owner] = set()
        """Gangs waiting for their owner's size (`sizing()` is asked often, by every admission waiting)."""
        self.problems: list[str] = []
        """Reports of malformed pods, drained by the adapter's logger."""
        self._namespace_queues = namespace_queues
        self._ns_queue: dict[str, str] = {}
        """Namespace -> its default queue ("" for none), once read."""
        self._ns_wanted: list[str] = []
        self._ns_asked: set[str] = set()
        self.rebind: set[JobId] = set()
        """Admitted jobs whose gang took a successor pod (`_take_successors`): the adapter binds it."""

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
                known = self._known(owner.job_id()) if self._known is not None else None
                if known is not None:
                    gang.size = sum(ps.count for ps in known.podsets)  # as submitted: no lookup
                else:
                    gang.asked = True
                    self._wanted.append(owner)
                    self._unsized.add(owner)
        gang.pods[info.key] = info
        return self._evaluate(gang, at)

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
            where = f"while running on {info.node}" if info.node else "before it was bound"
            events += self._end(gang, JobFailed(at=at, job=gang.job_id, reason=f"pod {key} was deleted {where}"))
        else:
            events += self._evaluate(gang, at)
        self._collect(gang)
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
            gang.completions = max(gang.size, completions or 0)
            return self._evaluate(gang, at)
        if size is None or size < 1:
            gang.done = True
            self.recheck.update(gang.pods)
            return []
        gang.size = size
        if owner.kind == "Job":
            gang.completions = max(size, completions or 0)
        if not owner.uid:
            gang.uid = sizing.uid
        gang.queue = sizing.queue
        gang.max_runtime = sizing.max_runtime
        return self._evaluate(gang, at)

    def set_namespace_queue(self, namespace: str, queue: str, at: int) -> list[Event]:
        """The namespace's default queue ("" for none, or when it cannot be read): its waiting gangs go on."""
        self._ns_queue[namespace] = queue
        events: list[Event] = []
        for owner in sorted(self._gangs, key=lambda o: o.source):
            if owner.namespace == namespace and self._gangs[owner].job_id is None:
                events += self._evaluate(self._gangs[owner], at)
        return events

    def namespaces_to_fetch(self) -> list[str]:
        """Namespaces whose default queue a waiting gang needs, not asked for yet (each is returned once)."""
        out, self._ns_wanted = self._ns_wanted, []
        return out

    def owners_to_fetch(self) -> list[Owner]:
        """Owners whose size is needed and not asked for yet (each is returned once)."""
        out, self._wanted = self._wanted, []
        return out

    # ------------------------------------------------------------ effects

    def pods_of(self, job: JobId) -> dict[str, PodInfo] | None:
        """The current pod of every gang pod name of `job`, or None when the job is unknown here.

        During a requeue the mapping holds only the pods that exist.
        """
        owner = self._by_job.get(job)
        gang = self._gangs.get(owner) if owner is not None else None
        if gang is None:
            return None
        return {name: gang.pods[key] for name, key in gang.mapping.items() if key in gang.pods}

    def job_known(self, job: JobId) -> bool:
        """Whether `job`'s gang is known here (`pods_of` is not None), without building its pods."""
        owner = self._by_job.get(job)
        return owner is not None and owner in self._gangs

    def has_pod(self, key: str) -> bool:
        """Whether the pod `namespace/name` exists (seen and not deleted)."""
        return key in self._by_pod

    def pod(self, key: str) -> PodInfo | None:
        owner = self._by_pod.get(key)
        gang = self._gangs.get(owner) if owner is not None else None
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
        owner = self._by_pod.get(info.key)
        gang = self._gangs.get(owner) if owner is not None else None
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
        owner = self._by_job.get(job)
        gang = self._gangs.get(owner) if owner is not None else None
        if gang is None or gang.requeued:
            return False
        return all(key in gang.pods and (gang.pods[key].active or gang.pods[key].ran) for key in gang.mapping.values())

    def evicting(self, job: JobId) -> list[PodInfo]:
        """Mark the job preempted: its current pods are expected to go. Returns them."""
        owner = self._by_job.get(job)
        gang = self._gangs.get(owner) if owner is not None else None
        if gang is None:
            return []
        victims = sorted(gang.pods.values(), key=PodInfo.sort_key)
        gang.retired |= {p.uid for p in victims}
        self.recheck.update(p.key for p in victims)
        gang.started = False
        gang.requeued = True
        return victims

    def tracked(self, job: JobId) -> Tracked | None:
        """What reconciliation judges `job` by when its gang is tracked here and its run goes on (see `reconciling`)."""
        owner = self._by_job.get(job)
        gang = self._gangs.get(owner) if owner is not None else None
        if gang is None or gang.done:
            return None
        return Tracked(pods=dict(gang.mapping), owner=gang.owner)

    def owner_of(self, job: JobId) -> Owner | None:
        """The owner of `job`'s gang, when the job is known here."""
        return self._by_job.get(job)

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

    def recreates(self, job: JobId) -> bool:
        """Whether lost pods of `job` come back (see `recreated`); True for a job unknown here (no verdict)."""
        owner = self._by_job.get(job)
        return owner is None or recreated(owner)

    def fail(self, job: JobId, reason: str, at: int) -> list[Event]:
        """End the job with JobFailed unless it already ended."""
        owner = self._by_job.get(job)
        gang = self._gangs.get(owner) if owner is not None else None
        if gang is None:
            if job in self._ended:
                return []
            self._ended.add(job)
            return [JobFailed(at=at, job=job, reason=reason)]
        return self._end(gang, JobFailed(at=at, job=job, reason=reason))

    def vanished(self, job: JobId, remaining: Iterable[str], event: Event) -> list[Event]:
        """End `job` with `event`, found by reconciliation (its workload went while nobody watched).

        Whatever is left of it (`remaining` pod keys) holds its nodes outside the job's
        accounting from now on, like the survivors of a failed gang.
        """
        if job in self._ended:
            return []
        self._ended.add(job)
        owners = {self._by_pod[k] for k in remaining if k in self._by_pod}
        if job in self._by_job:
            owners.add(self._by_job[job])
        for owner in sorted(owners, key=lambda o: o.source):
            gang = self._gangs.get(owner)
            if gang is not None:
                self._close(gang)
                self._unsized.discard(owner)
        return [event]

    def forget(self, job: JobId) -> None:
        """The log ended the job (rejected, cancelled): report nothing more about it."""
        owner = self._by_job.get(job)
        gang = self._gangs.get(owner) if owner is not None else None
        self._ended.add(job)
        if gang is not None:
            self._close(gang)
            self._collect(gang)

    # ------------------------------------------------------------ internals

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
        if gang.size is None:
            return []
        if gang.done:
            return self._next_run(gang, at)
        events: list[Event] = []
        if gang.job_id is None:
            current = (p for p in gang.pods.values() if p.active and p.uid not in gang.retired)
            active = sorted(current, key=PodInfo.sort_key)
            chosen = active[: gang.size]
            if len(active) < gang.size:
                # A gang the log already knows may have run, even ended, while no adapter watched
                # (a leader failover): recognise it by all its pods, or its end is never reported
                # and the log holds its capacity forever.
                every = sorted(gang.pods.values(), key=PodInfo.sort_key)
                if self._known is None or len(every) < gang.size:
                    return []
                chosen = every[: gang.size]
                if self._known(gang.owner.job_id(_salt(gang, chosen))) is None:
                    return []
            if self._needs_namespace(gang, chosen):
                return []
            gang.podsets, gang.mapping = _podsets(chosen)
            gang.job_id = self._job_id(gang, chosen)
            self._by_job[gang.job_id] = gang.owner
            self.recheck.update(gang.pods)  # now the log can say whether it counts them (holds_capacity)
            known = self._known(gang.job_id) if self._known is not None else None
            if known is None:
                events.append(self._submission(gang, chosen, at))
            else:
                gang.started = known.started_at is not None
                if known.status in ENDED:
                    self._close(gang)
                    self._ended.add(gang.job_id)
                    return events
                if known.status == "admitted":
                    gang.mapping = _as_placed(gang.mapping, gang.pods, known.placement)
        elif gang.requeued:
            fresh = sorted(
                (p for p in gang.pods.values() if p.active and p.uid not in gang.retired), key=PodInfo.sort_key
            )
            if len(fresh) < gang.size:
                return events
            podsets, mapping = _podsets(fresh[: gang.size])
            if [(ps.name, ps.count, ps.requests) for ps in podsets] != [
                (ps.name, ps.count, ps.requests) for ps in gang.podsets
            ]:
                return events  # replacements do not fit the submitted shape; keep waiting
            gang.mapping = mapping
            gang.requeued = False
        assert gang.job_id is not None
        self._take_successors(gang)
        mapped = [gang.pods.get(key) for key in gang.mapping.values()]
        for p in mapped:
            if p is not None and p.phase == "Failed" and p.uid not in gang.retired:
                why = f": {p.reason}" if p.reason else ""
                return events + self._end(gang, JobFailed(at=at, job=gang.job_id, reason=f"pod {p.key} failed{why}"))
        present = [p for p in mapped if p is not None]
        if len(present) < len(mapped):
            return events
        if all(p.phase == "Succeeded" for p in present):
            if not self._completed(gang):
                return events  # the Job's next indexes are on their way: they run in these slots
            if not gang.started:
                events.append(JobStarted(at=at, job=gang.job_id))
                gang.started = True
            return events + self._end(gang, JobFinished(at=at, job=gang.job_id))
        if not gang.started and all(p.node and p.phase in ("Running", "Succeeded") for p in present):
            gang.started = True
            events.append(JobStarted(at=at, job=gang.job_id))
        return events

    def _job_id(self, gang: Gang, chosen: list[PodInfo]) -> JobId:
        """The job of this run: the owner's, or, for a later run of a recreating owner, salted by its pods.

        A later run is one that began while this adapter watched (`_next_run`), or, for a new leader
        relisting the cluster, pods of a run the log holds, or that are not those of the owner's job
        the log saw end (`_new_to`).
        """
        job = gang.owner.job_id(_salt(gang, chosen))
        uids = "".join(sorted(p.uid for p in chosen))
        run = JobId(f"{job}-r{hashlib.sha256(uids.encode()).hexdigest()[:6]}")
        if not gang.later_run and recreated(gang.owner) and self._known is not None:
            known = self._known(job)
            gang.later_run = (
                known is not None and known.status in ENDED and (self._known(run) is not None or _new_to(known, chosen))
            )
        return run if gang.later_run else job

    def _next_run(self, gang: Gang, at: int) -> list[Event]:
        """A recreating owner's new pods for a gang whose run ended are a new run, submitted as a new job.

        A Job whose pods were lost (a node gone) and did not come back before the admission that
        re-placed them gave up ends with JobFailed; its controller's replacements, arriving later,
        would otherwise pend forever. The log's rule is that an ended job never runs again, so
        the replacements are a new job (`_job_id`), once `size` pods that were never part of the
        ended run exist. What is left of the old run counts outside any job (`retired`).
        """
        if gang.size is None or gang.job_id is None or not recreated(gang.owner):
            return []
        fresh = [p for p in gang.pods.values() if p.active and p.uid not in gang.retired]
        if len(fresh) < gang.size:
            return []
        fresh_uids = {p.uid for p in fresh}
        gang.retired |= {p.uid for p in gang.pods.values() if p.uid not in fresh_uids}
        self._by_job.pop(gang.job_id, None)
        gang.job_id, gang.mapping, gang.podsets = None, {}, []
        gang.done = gang.started = gang.requeued = False
        gang.later_run = True
        self.recheck.update(gang.pods)
        return self._evaluate(gang, at)

    def _take_successors(self, gang: Gang) -> None:
        """A Job with completions > parallelism runs its next indexes in the slots its succeeded pods leave.

        As Kueue counts such a Job: the gang is `parallelism` pods, admitted once; the pod the Job
        controller creates after a success takes that pod's gang pod name and so its node (the
        adapter binds it: `rebind`), with no new submission and no second share of quota. A
        successor an earlier leader bound is found on its predecessor's node.
        """
        if gang.owner.kind != "Job" or gang.requeued or gang.job_id is None:
            return
        freed = [n for n, key in sorted(gang.mapping.items()) if key in gang.pods and gang.pods[key].ran]
        mapped = set(gang.mapping.values())
        waiting = sorted(
            (p for p in gang.pods.values() if p.active and p.key not in mapped and p.uid not in gang.retired),
            key=PodInfo.sort_key,
        )
        for name in freed:
            done = gang.pods[gang.mapping[name]]
            fits = [p for p in waiting if _shape(p) == _shape(done) and p.node in ("", done.node)]
            successor = next((p for p in fits if p.node), None) or next(iter(fits), None)
            if successor is None:
                continue
            waiting.remove(successor)
            gang.mapping[name] = successor.key
            if not successor.node:
                self.rebind.add(gang.job_id)

    def _completed(self, gang: Gang) -> bool:
        """Whether the owner needs no more pods: a Job counts its successful pods (distinct indexes) to completions."""
        if gang.owner.kind != "Job":
            return True
        if gang.completions is None:
            # Sized from the log (a new leader): only pods past the gang's size (more pods, a higher
            # index) say the Job may want more, so a relist of finished gangs costs no lookups.
            size = gang.size or 0
            beyond = len(gang.pods) > size or any((p.completion_index or 0) >= size for p in gang.pods.values())
            if gang.asked or beyond:
                self._ask_completions(gang)
                return False
            return True
        succeeded = {
            p.completion_index if p.completion_index is not None else p.uid
            for p in gang.pods.values()
            if p.phase == "Succeeded"
        }
        return len(succeeded) >= gang.completions

    def _ask_completions(self, gang: Gang) -> None:
        """Read a Job the log sized (a new leader's relist): how many successful pods it needs (once)."""
        if not gang.asked:
            gang.asked = True
            self._wanted.append(gang.owner)

    def _needs_namespace(self, gang: Gang, chosen: list[PodInfo]) -> bool:
        """Whether the gang names no queue and waits for its namespace's default (asked for here once)."""
        ns = gang.owner.namespace
        if not self._namespace_queues or ns in self._ns_queue or gang.queue or any(p.queue for p in chosen):
            return False
        if self._known is not None and self._known(gang.owner.job_id(_salt(gang, chosen))) is not None:
            return False  # already on the log: its queue is settled
        if ns not in self._ns_asked:
            self._ns_asked.add(ns)
            self._ns_wanted.append(ns)
        return True

    def _submission(self, gang: Gang, chosen: list[PodInfo], at: int) -> JobSubmitted:
        assert gang.job_id is not None
        first = chosen[0]
        return JobSubmitted(
            at=at,
            job=gang.job_id,
            queue=QueueName(
                _first(p.queue or None for p in chosen) or gang.queue or self._ns_queue.get(first.namespace, "")
            ),
            priority_class=_first(p.priority_class for p in chosen),
            podsets=gang.podsets,
            runtime=_first(p.runtime for p in chosen),
            checkpoint_every=_first(p.checkpoint_every for p in chosen),
            pods={name: key for name, key in gang.mapping.items()},
            source=first.owner.source,
            max_runtime=_first([*(p.max_runtime for p in chosen), gang.max_runtime]),
        )
