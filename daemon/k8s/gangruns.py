"""One gang's run: its record (`Gang`), and the pure rules that turn its pods into a job.

No I/O and no state beyond the `Gang` given: `gangs.Gangs` keeps every gang and decides when
a run is submitted, started and ended; these say what the run is made of.

Invariants:
- Podsets are groups of identical requests within one role; gang pod names
  `PODSET-INDEX` are numbered in pod index order (completion index, replica
  index, then name), so the same pods always give the same JobSubmitted
  (`podsets_of`, `submission`).
- A relisting leader names a run's bound pods as the log placed them (`as_placed`),
  so a successor keeps the name of the pod it succeeded.
- A Job's pod created after another succeeded (its next index) runs in that
  pod's slot of the admitted gang (`take_successors`), with no new submission.
- A pod group has no owner uid: its pods' uids tell a re-created group apart (`salt`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from msgspec import UNSET

from muster.daemon.k8s.pods import Owner, PodInfo
from muster.events.types import JobId, JobSubmitted, PodSet, QueueName, Topology

__all__ = [
    "ENDED",
    "Gang",
    "KnownJob",
    "Tracked",
    "as_placed",
    "evicted",
    "fill_gone_slots",
    "finished_before_eviction",
    "finished_when_relisted",
    "first_set",
    "gone_finished",
    "new_to",
    "note_finished",
    "podsets_of",
    "preempted_since_started",
    "queue_of",
    "refill_slots",
    "replaced",
    "runs_no_successors",
    "salt",
    "same_shape",
    "shape_of",
    "submission",
    "take_successors",
]

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

    @property
    def reason(self) -> str: ...

    @property
    def preemptions(self) -> int: ...


@dataclass
class Gang:
    """One gang of pods (by owner) and its current run: the job, its podsets, which pod holds which slot."""

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
    """Waiting for replacement pods to map onto the same podsets: preempted, or a waiting pod group that lost
    a pod while its controller is there (`Gangs.workload_read`)."""
    retired: set[str] = field(default_factory=set)
    """Uids of pods the log no longer counts for this gang's job, whose end is expected: pods muster
    evicted, and the pods of an earlier run still there when a new run began (`_next_run`)."""
    stopped: JobId | None = None
    """The job a user cancelled whose controller made this gang's current pods again (`controllers.Stopped`):
    they are left alone; pods made later are judged again (`Gangs._next_run`)."""
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
    losing: str = ""
    """A pod of the run was deleted by someone: the JobFailed reason it ends with if its owner cannot be read,
    while that read is on its way (`Gangs.workload_read`; a pod group nothing recreates: `settle_deletions`)."""
    shrunk: set[str] = field(default_factory=set)
    """Gang pod names of a bound run whose pod went as its owner was scaled down: no replacement comes, and
    the run ends without them (`resizing.shrink`)."""
    recount: bool = False
    """A pod beyond the waiting run's size came: its owner's size was asked for again (`resizing.wants_recount`)."""
    vacated: dict[str, PodInfo] = field(default_factory=dict)
    """Gang pod name -> the pod deleted from it while the run was bound, its owner there to make it again: the
    replacement takes that name, and so the node the log placed it on (`take_successors`)."""
    beyond: set[str] = field(default_factory=set)
    """Uids of pods made beyond the admitted run's size, told they wait (`resizing.beyond_admitted`): once each."""
    finished: dict[str, PodInfo | None] = field(default_factory=dict)
    """Gang pod name -> the pod of the preempted run seen succeeded there (bound; before its eviction, or in its
    grace period): that slot's work is done, its owner makes no pod for it again, and the re-admission binds
    nothing there (`note_finished`; a new leader's: `finished_when_relisted`, and None for a pod gone that its
    Job counts succeeded: `gone_finished`)."""
    succeeded: int | None = None
    """A Job's pods that succeeded as its last read said (`Sizing.succeeded`); None: not read."""


@dataclass(frozen=True)
class Tracked:
    """What the gangs know of a job whose run goes on: its current pods and its owner (for `reconciling`)."""

    pods: Mapping[str, str]
    """Gang pod name -> pod key of the current run (replacements included; pods gone since included)."""
    owner: Owner


def podsets_of(pods: list[PodInfo]) -> tuple[list[PodSet], dict[str, str]]:
    """Group `pods` (sorted) into podsets of identical requests per role; map gang pod names to pod keys."""
    groups: dict[tuple[str, tuple[tuple[str, int], ...], Topology | None], list[PodInfo]] = {}
    for p in pods:
        groups.setdefault(shape_of(p), []).append(p)
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


def shape_of(p: PodInfo) -> tuple[str, tuple[tuple[str, int], ...], Topology | None]:
    """What makes two pods interchangeable in a gang: role, requests, topology (`podsets_of` groups by it,
    a successor takes the slot of a pod of its shape)."""
    return (p.hint, tuple(sorted(p.requests.items())), p.topology)


def same_shape(a: Iterable[PodSet], b: Iterable[PodSet]) -> bool:
    """Whether two runs' podsets are the same gang (names, counts, requests): replacement pods of this
    shape take the places of a job's pods (a requeued gang's, or a job a new leader adopts: `controllers`)."""
    return [(ps.name, ps.count, ps.requests) for ps in a] == [(ps.name, ps.count, ps.requests) for ps in b]


def as_placed(mapping: dict[str, str], pods: Mapping[str, PodInfo], placement: Mapping[str, str]) -> dict[str, str]:
    """`mapping` with every bound pod on the gang pod name the log placed on its node, within its podset.

    Sorting gives a relisting leader the submission's names, but a successor (`take_successors`)
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


def salt(gang: Gang, chosen: list[PodInfo]) -> str:
    """A pod group has no owner uid; its pods' uids tell a re-created group apart."""
    if gang.owner.kind != "Gang":
        return gang.uid
    return _pods_digest(chosen)


def _pods_digest(pods: list[PodInfo]) -> str:
    """A run told apart by its pods: a digest of their uids, whatever their order."""
    return hashlib.sha256("".join(sorted(p.uid for p in pods)).encode()).hexdigest()


def later_run(job: JobId, chosen: list[PodInfo]) -> JobId:
    """The job id of a later run of `job`'s owner (its pods made again after a run ended): salted by its pods."""
    return JobId(f"{job}-r{_pods_digest(chosen)[:6]}")


def run_of(job: JobId, own: JobId) -> bool:
    """Whether `job` is `own` or one of its later runs (`later_run`)."""
    return job == own or job.startswith(f"{own}-r")


def new_to(ended: KnownJob, chosen: list[PodInfo]) -> bool:
    """Whether `chosen` are not the pods of the `ended` run: none has its name, or those that do wait unbound.

    The log names a run's pods, it does not hold their uids. A pod of an ended run is done, gone,
    or bound (survivors of a failed gang may run on); one that waits unbound under such a name
    was made again by its owner: a new pod (a rejected gang's pods, which wait by design, come
    back once as a new run, rejected again, and are that run on the next relist).
    """
    names = set(ended.pods.values())
    return all(p.active and not p.node for p in chosen if p.key in names)


def first_set(values: Iterable[Any]) -> Any:
    """The first of `values` that is not None (None when all are): the first pod that sets a setting."""
    for v in values:
        if v is not None:
            return v
    return None


def take_successors(gang: Gang) -> bool:
    """Pods that take over slots of an admitted run, which returns whether one waits for a binding.

    A Job with completions > parallelism runs its next indexes in the slots its succeeded pods leave.
    As Kueue counts such a Job: the gang is `parallelism` pods, admitted once; the pod the Job
    controller creates after a success takes that pod's gang pod name and so its node (the
    adapter binds it: `rebind`), with no new submission and no second share of quota. A
    successor an earlier leader bound is found on its predecessor's node. The replacement of a
    bound pod someone deleted while its owner is there (`vacated`) takes its slot the same way, as
    a new leader's relist takes it (`as_placed`): the log still holds the slot's capacity.
    """
    if gang.requeued or gang.job_id is None or gang.losing:
        return False
    unbound = False
    ran = [
        n
        for n, key in gang.mapping.items()
        # a preempted run's finished slot is not freed: its re-admission binds nothing there (`Gang.finished`)
        if gang.owner.kind == "Job" and key in gang.pods and gang.pods[key].ran and n not in gang.finished
    ]
    freed = sorted({*ran, *(n for n in gang.vacated if gang.mapping.get(n) not in gang.pods)})
    mapped = set(gang.mapping.values())
    waiting = sorted(
        (p for p in gang.pods.values() if p.active and p.key not in mapped and p.uid not in gang.retired),
        key=PodInfo.sort_key,
    )
    for name in freed:
        done = gang.pods.get(gang.mapping[name]) or gang.vacated[name]
        fits = [p for p in waiting if shape_of(p) == shape_of(done) and p.node in ("", done.node)]
        successor = next((p for p in fits if p.node), None) or next(iter(fits), None)
        if successor is None:
            continue
        waiting.remove(successor)
        gang.mapping[name] = successor.key
        gang.vacated.pop(name, None)
        if not successor.node:
            unbound = True
    return unbound


def queue_of(gang: Gang, chosen: list[PodInfo], namespace_queue: str) -> QueueName:
    """The run's queue: the first of its pods that names one, else its owner's, else its namespace's default."""
    return QueueName(first_set(p.queue or None for p in chosen) or gang.queue or namespace_queue)


def submission(gang: Gang, chosen: list[PodInfo], at: int, namespace_queue: str) -> JobSubmitted:
    """The run's JobSubmitted: the pods' settings (the first pod that sets one), else the owner's; the queue
    falls back to the namespace's default (`namespace_queue`, "" for none). A labelled pod group's
    controller, as its first pod names it, goes on the log with it (`JobSubmitted.controller`)."""
    assert gang.job_id is not None
    first = chosen[0]
    return JobSubmitted(
        at=at,
        job=gang.job_id,
        queue=queue_of(gang, chosen, namespace_queue),
        priority_class=first_set(p.priority_class for p in chosen),
        podsets=gang.podsets,
        runtime=first_set(p.runtime for p in chosen),
        checkpoint_every=first_set(p.checkpoint_every for p in chosen),
        pods={name: key for name, key in gang.mapping.items()},
        source=first.owner.source,
        max_runtime=first_set([*(p.max_runtime for p in chosen), gang.max_runtime]),
        controller=first.owner.controller or UNSET,
    )


def note_finished(gang: Gang) -> None:
    """Remember which slots' pods of the preempted run succeeded (`Gang.finished`): bound and Succeeded, also one
    that succeeded in the grace period of its eviction (its owner counts it succeeded all the same: a Job's
    controller makes no pod for it again, so its gang must not wait for one)."""
    for name, key in gang.mapping.items():
        pod = gang.pods.get(key)
        if pod is not None and pod.node and pod.phase == "Succeeded":
            gang.finished.setdefault(name, pod)


def finished_when_relisted(gang: Gang, known: KnownJob) -> None:
    """A relisting leader's `Gang.finished`, which the leader that evicted the run held in its memory alone: a
    job the log says was preempted and has not started since keeps the pods of its slots that succeeded (its
    eviction leaves them: `evicted`), and those slots are done. Without this the new leader waited for a pod in
    every slot, one its owner never makes: the job held its quota for ever, its replacements unbound."""
    if preempted_since_started(known) and runs_no_successors(gang):
        note_finished(gang)


def runs_no_successors(gang: Gang) -> bool:
    """Whether the gang's owner makes no pod beyond its slots' (a Job's completions at most its size, so no
    successor: `take_successors`): as its read says (`Gang.completions`), else, unread (a gang the log sized), as
    no pod past its size (more pods, a higher index) says otherwise."""
    size = gang.size or 0
    if gang.completions is not None:
        return gang.completions <= size
    return len(gang.pods) <= size and all((p.completion_index or 0) < size for p in gang.pods.values())


def preempted_since_started(known: KnownJob) -> bool:
    """Whether the log's job was preempted and has not started since (waiting, or admitted again and not bound)."""
    return bool(known.preemptions) and known.started_at is None and known.status in ("pending", "admitted")


def gone_finished(gang: Gang, known: KnownJob, present: list[PodInfo]) -> int:
    """How many slots of a preempted run not started since a relisting leader takes as done though no pod of them
    is left: its Job, as read (`Gang.succeeded`), counts more pods succeeded than the pods there that did (the
    eviction took one that succeeded unseen, or in its grace period). 0 for any other owner, or a Job that runs
    successors (its count holds earlier indexes too)."""
    if gang.owner.kind != "Job" or gang.succeeded is None or not preempted_since_started(known):
        return 0
    if not runs_no_successors(gang):
        return 0
    return max(0, gang.succeeded - sum(1 for p in present if p.phase == "Succeeded"))


def fill_gone_slots(gang: Gang, known: KnownJob) -> None:
    """Name the slots of the log's job that no pod there took (`gone_finished` of them): done, nothing bound there;
    the run keeps the log's podsets (its replacements fill the others)."""
    if len(gang.mapping) >= sum(ps.count for ps in known.podsets):
        return
    gang.podsets = list(known.podsets)
    for name in sorted(set(known.pods) - set(gang.mapping)):
        gang.mapping[name] = known.pods[name]
        gang.finished[name] = None


def evicted(gang: Gang) -> list[PodInfo]:
    """The pods a preemption of the run deletes: all but those of its `finished` slots (`note_finished` first).

    A pod that succeeded holds no node and its owner makes no pod for it again; left in place (as a Job
    suspended by Kueue keeps its succeeded pods), it tells a new leader its slot is done (`finished_when_relisted`).
    """
    note_finished(gang)
    done = {p.uid for p in gang.finished.values() if p is not None}
    return sorted((p for p in gang.pods.values() if p.uid not in done), key=PodInfo.sort_key)


def finished_before_eviction(gang: Gang) -> bool:
    """Whether every pod of the preempted run succeeded and its owner needs no more (a Job's `completions`):
    the run is over, and the job finished, whatever the preemption meant to take from it."""
    all_succeeded = bool(gang.mapping) and set(gang.mapping) <= set(gang.finished)
    return all_succeeded and (gang.completions or 0) <= (gang.size or 0)


def replaced(gang: Gang, size: int) -> bool:
    """Whether a preempted run's replacements are there, mapped onto its slots (then it waits no more): one in
    every slot that did not finish (`refill_slots`), else `size` pods of the submitted shape (`same_shape`)."""
    fresh = sorted((p for p in gang.pods.values() if p.active and p.uid not in gang.retired), key=PodInfo.sort_key)
    if gang.finished:  # replacements come for the slots whose pods were evicted unfinished only
        refill = refill_slots(gang, fresh)
        if refill is None:
            return False
        gang.mapping.update(refill)
    else:
        if len(fresh) < size:
            return False
        podsets, mapping = podsets_of(fresh[:size])
        if not same_shape(podsets, gang.podsets):
            return False  # replacements do not fit the submitted shape; keep waiting
        gang.mapping = mapping
    gang.requeued = False
    return True


def refill_slots(gang: Gang, fresh: list[PodInfo]) -> dict[str, str] | None:
    """The replacements (`fresh`, sorted) in the slots of a preempted run that are not `finished`, each in a
    slot of its podset's requests and topology; None until every such slot has one."""
    podsets = {ps.name: ps for ps in gang.podsets}
    left = list(fresh)
    refill: dict[str, str] = {}
    for name in sorted(n for n in gang.mapping if n not in gang.finished):
        ps = podsets.get(name.rsplit("-", 1)[0])
        pod = next(
            (p for p in left if ps is not None and (dict(p.requests), p.topology) == (ps.requests, ps.topology)), None
        )
        if pod is None:
            return None
        left.remove(pod)
        refill[name] = pod.key
    return refill
