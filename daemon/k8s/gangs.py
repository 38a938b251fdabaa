"""Gang recognition: pods with `schedulerName: muster` grouped into jobs, and their lifecycle.

Pure bookkeeping, no I/O: the adapter feeds pod changes in and gets events out.

A pod belongs to one gang, decided at first sight, by (first match wins):
1. the labels `muster.dev/gang` (+ `muster.dev/gang-size`): an explicit pod group;
2. the annotation (or label) `scheduling.k8s.io/group-name`: a Volcano PodGroup;
3. the label `scheduling.x-k8s.io/pod-group`: a scheduler-plugins (coscheduling) PodGroup;
4. the label `jobset.sigs.k8s.io/jobset-name`: a JobSet (podset per replicated job);
5. the label `training.kubeflow.org/job-name`: a Kubeflow job such as a
   PyTorchJob (podset per replica type, master and worker), or an MPIJob
   (`training.kubeflow.org/operator-name: mpi-operator`, or owned by one: the
   launcher pod is owned by the launcher Job, the workers by the MPIJob);
6. a controller ownerReference of kind Job: a batch Job;
7. otherwise the pod alone is a gang of one.

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
  when every pod succeeded, JobFailed when a pod failed or was deleted by
  someone else). Pods muster evicted for a preemption are expected to go and
  report nothing; the gang waits for its replacements under the same job id.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from muster.daemon.k8s.objects import pod_requests
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

__all__ = [
    "Gang",
    "Gangs",
    "KnownJob",
    "Owner",
    "PodInfo",
    "pod_info",
    "recreated",
]

Obj = dict[str, Any]
Resources = dict[str, int]

GANG_LABEL = "muster.dev/gang"
GANG_SIZE_LABEL = "muster.dev/gang-size"
QUEUE_LABEL = "muster.dev/queue"
DEFAULT_QUEUE_KEY = "muster.dev/default-queue"
PODSET_LABEL = "muster.dev/podset"
CHECKPOINT_ANNOTATION = "muster.dev/checkpoint-every"
RUNTIME_ANNOTATION = "muster.dev/runtime"
MAX_RUNTIME_ANNOTATION = "muster.dev/max-runtime"
TOPOLOGY_REQUIRED_ANNOTATION = "muster.dev/topology-required"
TOPOLOGY_PREFERRED_ANNOTATION = "muster.dev/topology-preferred"

JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
JOBSET_RJOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
KUBEFLOW_JOB_LABEL = "training.kubeflow.org/job-name"
KUBEFLOW_TYPE_LABEL = "training.kubeflow.org/replica-type"
KUBEFLOW_INDEX_LABEL = "training.kubeflow.org/replica-index"
KUBEFLOW_ROLE_LABEL = "training.kubeflow.org/job-role"
KUBEFLOW_OPERATOR_LABEL = "training.kubeflow.org/operator-name"
MPI_OPERATOR = "mpi-operator"
VOLCANO_GROUP_KEY = "scheduling.k8s.io/group-name"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

TERMINATED = ("Succeeded", "Failed")
VOLCANO_POD_GROUP = "VolcanoPodGroup"
COSCHEDULING_POD_GROUP = "CoschedulingPodGroup"
UNOWNED = ("Pod", "Gang")
"""Owner kinds with no object to read: every other kind is sized by a lookup of its owner."""


@dataclass(frozen=True)
class Owner:
    """Who a gang belongs to; `uid` tells apart two owners that had the same name."""

    kind: str
    namespace: str
    name: str
    uid: str = ""
    controlled: bool = False
    """A labelled pod group whose pods name a controller (an operator of the user's own) in ownerReferences."""

    @property
    def source(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"

    def job_id(self, salt: str = "") -> JobId:
        """`namespace/kind/name`, plus a short uid (or `salt`) suffix so a recreated owner is a new job."""
        base = f"{self.namespace}/{self.kind.lower()}/{self.name}"
        suffix = (self.uid or salt)[:8]
        return JobId(f"{base}-{suffix}" if suffix else base)


def recreated(owner: Owner) -> bool:
    """Whether a controller recreates the gang's pods when they are lost (evicted, their node gone).

    A Job, JobSet or Kubeflow job has one, and so has a labelled pod group whose pods name a
    controller; bare pods and an uncontrolled pod group have none: once their pods are gone, the
    job can never run again.
    """
    return owner.kind not in UNOWNED or owner.controlled


@dataclass(frozen=True)
class PodInfo:
    """The facts of one pod that gang tracking needs."""

    key: str
    namespace: str
    name: str
    uid: str
    scheduler: str
    node: str
    phase: str
    deleting: bool
    requests: Resources
    owner: Owner
    hint: str
    order: tuple[int, int, int]
    size_label: int | None
    queue: str
    priority_class: str | None
    runtime: int | None
    checkpoint_every: int | None
    topology: Topology | None
    grace_seconds: int | None
    reason: str
    problems: tuple[str, ...] = ()
    max_runtime: int | None = None
    """The declared time limit: the annotation, else the pod's own `activeDeadlineSeconds`."""

    @property
    def active(self) -> bool:
        """Neither terminated nor on its way out."""
        return not self.deleting and self.phase not in TERMINATED

    @property
    def ran(self) -> bool:
        """Bound and done with success: its part of the gang's run is over, not lost.

        A leader killed between the bindings of one gang leaves it partly bound;
        its bound pods may finish before the next leader binds the rest.
        """
        return bool(self.node) and self.phase == "Succeeded" and not self.deleting

    def sort_key(self) -> tuple[str, tuple[int, int, int], str]:
        return (self.hint, self.order, self.name)


_DNS = re.compile(r"[^a-z0-9]+")
_DURATION = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _name(text: str, default: str) -> str:
    cleaned = _DNS.sub("-", text.lower()).strip("-")
    return cleaned or default


def _int(value: Any) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def _seconds(value: Any, what: str, problems: list[str]) -> int | None:
    if value is None:
        return None
    m = _DURATION.match(str(value))
    if not m:
        problems.append(f"{what}: {value!r} is not a duration (examples: 3600, 90m, 2h)")
        return None
    return int(m.group(1)) * _UNITS[m.group(2)]


def _max_runtime(annotations: Mapping[str, Any], spec: Mapping[str, Any], problems: list[str]) -> int | None:
    """The declared time limit: the `muster.dev/max-runtime` annotation, else the pod's `activeDeadlineSeconds`."""
    if annotations.get(MAX_RUNTIME_ANNOTATION) is not None:
        return _seconds(annotations[MAX_RUNTIME_ANNOTATION], MAX_RUNTIME_ANNOTATION, problems)
    return _int(spec.get("activeDeadlineSeconds"))


def _controller(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = meta.get("ownerReferences") or []
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return ref
    return None


def pod_info(pod: Obj) -> PodInfo:
    """Read a pod (any scheduler); never raises on malformed input, reports it in `problems`."""
    problems: list[str] = []
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    labels: Mapping[str, Any] = meta.get("labels") or {}
    annotations: Mapping[str, Any] = meta.get("annotations") or {}
    ns = str(meta.get("namespace") or "default")
    name = str(meta.get("name") or "")
    uid = str(meta.get("uid") or "")
    ref = _controller(meta)

    hint = str(labels.get(PODSET_LABEL) or "")
    volcano_group = annotations.get(VOLCANO_GROUP_KEY) or labels.get(VOLCANO_GROUP_KEY)
    if labels.get(GANG_LABEL):
        owner = Owner("Gang", ns, str(labels[GANG_LABEL]), controlled=ref is not None)
    elif volcano_group:
        owner = Owner(VOLCANO_POD_GROUP, ns, str(volcano_group))
    elif labels.get(COSCHEDULING_GROUP_LABEL):
        owner = Owner(COSCHEDULING_POD_GROUP, ns, str(labels[COSCHEDULING_GROUP_LABEL]))
    elif labels.get(JOBSET_NAME_LABEL):
        owner = Owner("JobSet", ns, str(labels[JOBSET_NAME_LABEL]), str(labels.get(JOBSET_UID_LABEL) or ""))
        hint = hint or str(labels.get(JOBSET_RJOB_LABEL) or "")
    elif labels.get(KUBEFLOW_JOB_LABEL):
        kind = str(ref.get("kind")) if ref is not None and ref.get("kind") else "PyTorchJob"
        if kind == "MPIJob" or labels.get(KUBEFLOW_OPERATOR_LABEL) == MPI_OPERATOR:
            # the launcher pod's controller is the launcher Job, whose uid is not the MPIJob's
            owner = Owner("MPIJob", ns, str(labels[KUBEFLOW_JOB_LABEL]))
        else:
            owner = Owner(kind, ns, str(labels[KUBEFLOW_JOB_LABEL]), str(ref.get("uid") or "") if ref else "")
        hint = hint or str(labels.get(KUBEFLOW_TYPE_LABEL) or labels.get(KUBEFLOW_ROLE_LABEL) or "")
    elif ref is not None and ref.get("kind") == "Job":
        owner = Owner("Job", ns, str(ref.get("name") or ""), str(ref.get("uid") or ""))
    else:
        owner = Owner("Pod", ns, name, uid)

    size_label: int | None = None
    if GANG_SIZE_LABEL in labels:
        size_label = _int(labels[GANG_SIZE_LABEL])
        if size_label is None or size_label < 1:
            problems.append(f"{GANG_SIZE_LABEL}: {labels[GANG_SIZE_LABEL]!r} is not a positive integer")
            size_label = None
    if owner.kind == "Gang" and size_label is None and not problems:
        problems.append(f"label {GANG_LABEL} needs {GANG_SIZE_LABEL}")

    order = (
        _int(labels.get(JOBSET_JOB_INDEX_LABEL)) or 0,
        _int(annotations.get(COMPLETION_INDEX) or labels.get(COMPLETION_INDEX)) or 0,
        _int(labels.get(KUBEFLOW_INDEX_LABEL)) or 0,
    )
    required = annotations.get(TOPOLOGY_REQUIRED_ANNOTATION)
    preferred = annotations.get(TOPOLOGY_PREFERRED_ANNOTATION)
    topology = Topology(required=str(required), preferred=None) if required else None
    if preferred:
        topology = Topology(required=str(required) if required else None, preferred=str(preferred))
    reason = str(status.get("reason") or status.get("message") or "")
    statuses = status.get("containerStatuses")
    for cs in statuses if isinstance(statuses, list) else ():
        term = (cs.get("state") or {}).get("terminated") if isinstance(cs, Mapping) else None
        if isinstance(term, Mapping) and term.get("exitCode") not in (None, 0):
            reason = reason or f"container {cs.get('name')} exited with {term.get('exitCode')} ({term.get('reason')})"
    return PodInfo(
        key=f"{ns}/{name}",
        namespace=ns,
        name=name,
        uid=uid,
        scheduler=str(spec.get("schedulerName") or "default-scheduler"),
        node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        requests=pod_requests(pod, problems),
        owner=owner,
        hint=_name(hint, "pod"),
        order=order,
        size_label=size_label,
        queue=str(labels.get(QUEUE_LABEL) or labels.get(KUEUE_QUEUE_LABEL) or ""),
        priority_class=str(spec["priorityClassName"]) if spec.get("priorityClassName") else None,
        runtime=_seconds(annotations.get(RUNTIME_ANNOTATION), RUNTIME_ANNOTATION, problems),
        checkpoint_every=_seconds(annotations.get(CHECKPOINT_ANNOTATION), CHECKPOINT_ANNOTATION, problems),
        topology=topology,
        grace_seconds=_int(spec.get("terminationGracePeriodSeconds")),
        reason=reason,
        max_runtime=_max_runtime(annotations, spec, problems),
        problems=tuple(problems),
    )


class KnownJob(Protocol):
    """What the log already says about a job (a `projections.cluster.JobState` fits)."""

    @property
    def status(self) -> str: ...

    @property
    def started_at(self) -> int | None: ...

    @property
    def podsets(self) -> list[PodSet]: ...

    @property
    def placement(self) -> dict[str, str]: ...


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
    evicting: set[str] = field(default_factory=set)
    """Uids of pods muster evicted; their end is expected."""
    uid: str = ""
    """The owner's uid, learned from its lookup when its pods do not carry it."""
    queue: str = ""
    """The owner's queue (its queue label, a Volcano PodGroup's spec.queue), for pods that name none."""
    max_runtime: int | None = None
    """The owner's time limit (a Job's `activeDeadlineSeconds`), for pods that declare none."""


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


def _salt(gang: Gang, chosen: list[PodInfo]) -> str:
    """A pod group has no owner uid; its pods' uids tell a re-created group apart."""
    if gang.owner.kind != "Gang":
        return gang.uid
    return hashlib.sha256("".join(sorted(p.uid for p in chosen)).encode()).hexdigest()


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
            and info.uid not in gang.evicting
            and key in gang.mapping.values()
            and info.phase not in TERMINATED
        ):
            where = f"while running on {info.node}" if info.node else "before it was bound"
            events += self._end(gang, JobFailed(at=at, job=gang.job_id, reason=f"pod {key} was deleted {where}"))
        else:
            events += self._evaluate(gang, at)
        self._collect(gang)
        return events

    def set_size(
        self, owner: Owner, size: int | None, at: int, *, uid: str = "", queue: str = "", max_runtime: int | None = None
    ) -> list[Event]:
        """The owner's gang size, or None when the owner is gone (its pods will be garbage-collected).

        `uid`, `queue` and `max_runtime` are the owner's as its lookup found them (used when the pods lack them).
        A size below 1 (a PodGroup with `minMember: 0`) leaves the pods alone, like a gone owner.
        """
        self._unsized.discard(owner)
        gang = self._gangs.get(owner)
        if gang is None or gang.size is not None:
            return []
        if size is None or size < 1:
            gang.done = True
            self.recheck.update(gang.pods)
            return []
        gang.size = size
        if not owner.uid:
            gang.uid = uid
        gang.queue = queue
        gang.max_runtime = max_runtime
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
        if gang.done or info.uid in gang.evicting:
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
        gang.evicting |= {p.uid for p in victims}
        self.recheck.update(p.key for p in victims)
        gang.started = False
        gang.requeued = True
        return victims

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
                gang.done = True
                self.recheck.update(gang.pods)
                self._unsized.discard(owner)
        return [event]

    def forget(self, job: JobId) -> None:
        """The log ended the job (rejected, cancelled): report nothing more about it."""
        owner = self._by_job.get(job)
        gang = self._gangs.get(owner) if owner is not None else None
        self._ended.add(job)
        if gang is not None:
            gang.done = True
            self.recheck.update(gang.pods)
            self._collect(gang)

    # ------------------------------------------------------------ internals

    def _end(self, gang: Gang, event: Event) -> list[Event]:
        if gang.done:
            return []
        gang.done = True
        self.recheck.update(gang.pods)
        if gang.job_id is not None:
            self._ended.add(gang.job_id)
        return [event]

    def _collect(self, gang: Gang) -> None:
        """Drop a finished gang once its last pod is gone (its job id stays known)."""
        if gang.done and not gang.pods:
            self._gangs.pop(gang.owner, None)
            self._unsized.discard(gang.owner)

    def _evaluate(self, gang: Gang, at: int) -> list[Event]:
        if gang.done or gang.size is None:
            return []
        events: list[Event] = []
        if gang.job_id is None:
            active = sorted((p for p in gang.pods.values() if p.active), key=PodInfo.sort_key)
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
            gang.job_id = gang.owner.job_id(_salt(gang, chosen))
            self._by_job[gang.job_id] = gang.owner
            self.recheck.update(gang.pods)  # now the log can say whether it counts them (holds_capacity)
            known = self._known(gang.job_id) if self._known is not None else None
            if known is None:
                events.append(self._submission(gang, chosen, at))
            else:
                gang.started = known.started_at is not None
                if known.status in ("finished", "failed", "cancelled", "rejected"):
                    gang.done = True
                    self._ended.add(gang.job_id)
                    return events
        elif gang.requeued:
            fresh = sorted(
                (p for p in gang.pods.values() if p.active and p.uid not in gang.evicting), key=PodInfo.sort_key
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
        mapped = [gang.pods.get(key) for key in gang.mapping.values()]
        for p in mapped:
            if p is not None and p.phase == "Failed" and p.uid not in gang.evicting:
                why = f": {p.reason}" if p.reason else ""
                return events + self._end(gang, JobFailed(at=at, job=gang.job_id, reason=f"pod {p.key} failed{why}"))
        present = [p for p in mapped if p is not None]
        if len(present) < len(mapped):
            return events
        if all(p.phase == "Succeeded" for p in present):
            if not gang.started:
                events.append(JobStarted(at=at, job=gang.job_id))
                gang.started = True
            return events + self._end(gang, JobFinished(at=at, job=gang.job_id))
        if not gang.started and all(p.node and p.phase in ("Running", "Succeeded") for p in present):
            gang.started = True
            events.append(JobStarted(at=at, job=gang.job_id))
        return events

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
