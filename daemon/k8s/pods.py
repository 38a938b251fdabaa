"""What muster reads from a pod: the gang it belongs to (its `Owner`), its requests, hints and settings.

Pure, no I/O; `pod_info(pod)` never raises on malformed input (it reports it in `problems`).

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
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from muster.daemon.k8s.objects import pod_requests
from muster.events.types import ControllerRef, JobId, Topology

__all__ = ["POD_GROUPS", "Owner", "PodInfo", "controller_ref", "pod_info", "recreated", "reruns"]

Obj = dict[str, Any]
Resources = dict[str, int]

GANG_LABEL = "muster.dev/gang"
GANG_SIZE_LABEL = "muster.dev/gang-size"
QUEUE_LABEL = "muster.dev/queue"
DEFAULT_QUEUE_KEY = "muster.dev/default-queue"
PODSET_LABEL = "muster.dev/podset"
FLAVOR_GATE = "muster.dev/flavor"
"""A scheduling gate a pod may carry for muster alone: muster lifts it at binding, adding the node labels
of the pod's flavors to its nodeSelector (which the API server lets grow only while the pod is gated)."""
FLAVOR_LABEL = "muster.dev/flavor"
"""The label muster gives a pod admitted on flavors at binding: their names."""
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
STATUS_CONDITION = "muster.dev/Admitted"
"""The pod condition holding the gang's status on the pods of a pod group or a lone pod (`reporting`)."""

TERMINATED = ("Succeeded", "Failed")
VOLCANO_POD_GROUP = "VolcanoPodGroup"
COSCHEDULING_POD_GROUP = "CoschedulingPodGroup"
UNOWNED = ("Pod", "Gang")
"""Owner kinds with no object to read: every other kind is sized by a lookup of its owner."""
POD_GROUPS = (*UNOWNED, VOLCANO_POD_GROUP, COSCHEDULING_POD_GROUP)
"""Owner kinds that make no pods themselves: the gang's pods are made by the user (bare) or by the controller
they name in their ownerReferences (`Owner.controlled`)."""


@dataclass(frozen=True)
class Owner:
    """Who a gang belongs to; `uid` tells apart two owners that had the same name."""

    kind: str
    namespace: str
    name: str
    uid: str = ""
    controlled: bool = False
    """A pod group (`POD_GROUPS`) whose pods name a controller in ownerReferences (an operator of the user's
    own, a Volcano Job, a batch Job): it makes them again when they are lost (`recreated`)."""
    controller: ControllerRef | None = field(default=None, compare=False)
    """That controller, as its pod names it (`controller_ref`), on the log with the job (`JobSubmitted.controller`).
    A labelled pod group has no object of its own: reconciliation reads its controller in its place
    (`reads_controller`); once it is gone, nothing recreates the group's pods. Not part of the gang's
    identity: the pods of one group are one gang whatever they name (the gang's `Owner` is its first pod's)."""

    @property
    def reads_controller(self) -> bool:
        """Whether the object that tells if the workload is there is the controller its pods name: a labelled
        pod group's (a PodGroup object is read itself: the controller deletes it with its pods)."""
        return self.kind == "Gang" and self.controller is not None

    @property
    def source(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"

    @property
    def workload(self) -> str:
        """The object whose deletion ends the gang's job, as users name it: the controller of a pod group."""
        c = self.controller
        if c is None or not self.reads_controller:
            return self.source
        return f"{c.kind}/{self.namespace}/{c.name} (the controller of pod group {self.name})"

    def job_id(self, salt: str = "") -> JobId:
        """`namespace/kind/name`, plus a short uid (or `salt`) suffix so a recreated owner is a new job."""
        base = f"{self.namespace}/{self.kind.lower()}/{self.name}"
        suffix = (self.uid or salt)[:8]
        return JobId(f"{base}-{suffix}" if suffix else base)


def recreated(owner: Owner) -> bool:
    """Whether a controller recreates the gang's pods when they are lost (deleted, evicted, their node gone).

    A Job, JobSet or Kubeflow job has one, and so has a pod group (labelled, Volcano or coscheduling
    PodGroup) whose pods name a controller; bare pods, alone or in a pod group, have none: a PodGroup
    object makes no pods (neither Volcano nor coscheduling recreates a bare pod), so once one is gone the
    gang can never be whole again, and its job ends rather than wait for ever holding its quota. The one
    rule for a pod deleted (`deletions.pod_lost`), evicted (`applying`), lost with its node
    (`Gangs.nodes_lost`) or found missing (`reconciling.judge`).
    """
    return owner.controlled if owner.kind in POD_GROUPS else True


def reruns(owner: Owner) -> bool:
    """Whether pods of `owner` made after its run ended can be its next run (`Gangs._next_run`), a new job.

    Those of an owner that recreates pods (`recreated`), and of a PodGroup: its job id is the PodGroup's uid,
    whoever makes its pods, so pods made in it again (by its user, once the ended run's are gone) are told
    apart as a later run. A lone pod's or an uncontrolled labelled group's pods are a new gang by themselves.
    """
    return recreated(owner) or owner.kind in (VOLCANO_POD_GROUP, COSCHEDULING_POD_GROUP)


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
    completion_index: int | None = None
    """An Indexed Job's pod: the index it completes (its successor after a success has the next one)."""
    gated: bool = False
    """It has `spec.schedulingGates` other than muster's (`FLAVOR_GATE`): nobody may bind it yet."""
    flavor_gate: bool = False
    """It has muster's own gate, which muster lifts at binding."""
    max_runtime: int | None = None
    """The declared time limit: the annotation, else the pod's own `activeDeadlineSeconds`."""
    told: bool = False
    """It shows `PodScheduled=False` from muster (a leader told it why it waits)."""
    shown: tuple[str, str] | None = None
    """The gang's status as a leader wrote it on the pod (`muster.dev/Admitted`): (reason, message)."""

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


def controller_ref(meta: Mapping[str, Any], namespace: str) -> ControllerRef | None:
    """The controller a pod names in its ownerReferences (the one with `controller: true`), or None."""
    ref = _controller(meta)
    if ref is None:
        return None
    api_version, kind, name, uid = (str(ref.get(k) or "") for k in ("apiVersion", "kind", "name", "uid"))
    return ControllerRef(api_version=api_version, kind=kind, namespace=namespace, name=name, uid=uid)


def _pod_group(kind: str, namespace: str, name: Any, meta: Mapping[str, Any]) -> Owner:
    """A pod group's owner; its pods may name the controller that makes them (`recreated`), which goes on the log."""
    controller = controller_ref(meta, namespace)
    return Owner(kind, namespace, str(name), controlled=controller is not None, controller=controller)


def _gate_names(gates: Any) -> list[str]:
    """The names of a pod's scheduling gates (an unnamed or malformed one counts as someone else's)."""
    if not isinstance(gates, list):
        return []
    return [str(g.get("name")) if isinstance(g, dict) and g.get("name") else "?" for g in gates]


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
    gates = _gate_names(spec.get("schedulingGates"))
    volcano_group = annotations.get(VOLCANO_GROUP_KEY) or labels.get(VOLCANO_GROUP_KEY)
    if labels.get(GANG_LABEL):
        owner = _pod_group("Gang", ns, labels[GANG_LABEL], meta)
    elif volcano_group:
        owner = _pod_group(VOLCANO_POD_GROUP, ns, volcano_group, meta)
    elif labels.get(COSCHEDULING_GROUP_LABEL):
        owner = _pod_group(COSCHEDULING_POD_GROUP, ns, labels[COSCHEDULING_GROUP_LABEL], meta)
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
    max_runtime = _max_runtime(annotations, spec, problems)  # before `problems` is frozen below
    told, shown = _muster_conditions(status.get("conditions"))
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
        problems=tuple(problems),
        completion_index=_int(annotations.get(COMPLETION_INDEX) or labels.get(COMPLETION_INDEX)),
        gated=any(g != FLAVOR_GATE for g in gates),
        flavor_gate=FLAVOR_GATE in gates,
        max_runtime=max_runtime,
        told=told,
        shown=shown,
    )


def _muster_conditions(conditions: Any) -> tuple[bool, tuple[str, str] | None]:
    """What a leader of muster wrote on the pod: PodScheduled=False with its message, and the gang's status
    (`reporting`); read from the pod, so a new leader's reporter knows what its predecessor said."""
    told, shown = False, None
    for c in conditions if isinstance(conditions, list) else ():
        if not isinstance(c, Mapping):
            continue
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            told = str(c.get("message") or "").startswith("muster")
        elif c.get("type") == STATUS_CONDITION:
            shown = (str(c.get("reason") or ""), str(c.get("message") or ""))
    return told, shown
