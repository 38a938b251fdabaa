"""The size of a gang from its owner object: Job, JobSet, Kubeflow job (PyTorchJob, MPIJob, ...) or PodGroup.

`owner_sizing(owner, obj)` is pure; `fetch_sizing(client, owner)` reads the owner
from the API, `list_sizings(client, owners)` many owners of one kind and namespace
with one paged list. A missing owner (404), or one with another uid than the pods
name (deleted and re-created), has no size: None. An owner whose size cannot
be gang-scheduled (a PodGroup with `minMember: 0`, an MPIJob whose launcher
waits for running workers) has size 0 and a `problem` saying why. `fetch_owner`
also reads a labelled pod group's controller, an object of any kind (for
reconciliation; such a group is sized by its label, not by a lookup).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from muster.daemon.k8s.client import KubeClient, call_json
from muster.daemon.k8s.errors import NotFound
from muster.daemon.k8s.pods import (
    COSCHEDULING_POD_GROUP,
    DEFAULT_QUEUE_KEY,
    KUEUE_QUEUE_LABEL,
    QUEUE_LABEL,
    VOLCANO_POD_GROUP,
    Owner,
)

__all__ = [
    "API",
    "KUBEFLOW_GROUP",
    "OwnerApi",
    "Sizing",
    "api_of",
    "fetch_namespace_queue",
    "fetch_owner",
    "fetch_sizing",
    "job_pods",
    "jobset_size",
    "kubeflow_size",
    "list_sizings",
    "namespace_queue",
    "owner_sizing",
]

JOBSET_GROUP, JOBSET_VERSION = "jobset.x-k8s.io", "v1alpha2"
KUBEFLOW_GROUP, KUBEFLOW_VERSION = "kubeflow.org", "v1"


@dataclass(frozen=True)
class OwnerApi:
    """Where an owner kind is served: group, version, plural, and its kind in that group."""

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


API: dict[str, OwnerApi] = {
    "Job": OwnerApi("batch", "v1", "jobs", "Job"),
    "JobSet": OwnerApi(JOBSET_GROUP, JOBSET_VERSION, "jobsets", "JobSet"),
    "MPIJob": OwnerApi(KUBEFLOW_GROUP, "v2beta1", "mpijobs", "MPIJob"),
    VOLCANO_POD_GROUP: OwnerApi("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup"),
    COSCHEDULING_POD_GROUP: OwnerApi("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup"),
}


def api_of(owner: Owner) -> OwnerApi:
    """The API of `owner`'s kind; other Kubeflow jobs (PyTorchJob, TFJob, ...) are `kubeflow.org/v1`."""
    return API.get(owner.kind) or OwnerApi(KUBEFLOW_GROUP, KUBEFLOW_VERSION, owner.kind.lower() + "s", owner.kind)


@dataclass(frozen=True)
class Sizing:
    """What an owner lookup tells a gang: its size (None: the owner is gone), uid, queue, and any problem."""

    size: int | None
    uid: str = ""
    queue: str = ""
    problem: str = ""
    completions: int | None = None
    """A Job's successful pods needed in all (`spec.completions`; more than its size when the Job
    creates pods for its next indexes as others succeed)."""
    max_runtime: int | None = None
    """A Job's `activeDeadlineSeconds`: its declared time limit."""
    succeeded: int = 0
    """A Job's pods that succeeded (`status.succeeded`), those gone included: a new leader counts by it the
    slots of a preempted run whose pods succeeded and are gone (`gangruns.gone_finished`)."""


def _count(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def job_pods(spec: Mapping[str, Any]) -> int:
    """Pods a Job runs at once: parallelism (default 1), at most completions when set."""
    parallelism = _count(spec.get("parallelism"), 1)
    completions = spec.get("completions")
    if isinstance(completions, int) and not isinstance(completions, bool):
        return min(parallelism, completions)
    return parallelism


def jobset_size(jobset: Mapping[str, Any]) -> int:
    """Sum over replicated jobs of replicas x pods per job."""
    total = 0
    for rjob in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        if not isinstance(rjob, Mapping):
            continue
        job_spec = ((rjob.get("template") or {}).get("spec")) or {}
        total += _count(rjob.get("replicas"), 1) * job_pods(job_spec)
    return total


def kubeflow_size(job: Mapping[str, Any]) -> int:
    """Sum of the replicas of every replica type (`pytorchReplicaSpecs`, `mpiReplicaSpecs`, ...)."""
    spec = job.get("spec") or {}
    total = 0
    for key, replicas in spec.items():
        if key.endswith("ReplicaSpecs") and isinstance(replicas, Mapping):
            for rs in replicas.values():
                if isinstance(rs, Mapping):
                    total += _count(rs.get("replicas"), 1)
    return total


def owner_sizing(owner: Owner, obj: Mapping[str, Any]) -> Sizing:
    """The gang size, uid and queue `obj` (the owner as the API has it) gives; never raises on malformed input.

    The owner's queue: its label `muster.dev/queue`, else Kueue's `kueue.x-k8s.io/queue-name` (Kueue
    users label the Job, JobSet or MPIJob, not its pods), else a Volcano PodGroup's `spec.queue`.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return Sizing(0, problem=f"{owner.source}: malformed object")
    uid = str(meta.get("uid") or "")
    labels = meta.get("labels") or {}
    labels = labels if isinstance(labels, Mapping) else {}
    queue = str(labels.get(QUEUE_LABEL) or labels.get(KUEUE_QUEUE_LABEL) or "")
    if owner.kind == VOLCANO_POD_GROUP:
        queue = queue or str(spec.get("queue") or "")
    if owner.kind == "Job":
        completions = spec.get("completions")
        wanted = completions if isinstance(completions, int) and not isinstance(completions, bool) else None
        deadline = spec.get("activeDeadlineSeconds")
        limit = deadline if isinstance(deadline, int) and not isinstance(deadline, bool) else None
        status = obj.get("status")
        done = _count(status.get("succeeded"), 0) if isinstance(status, Mapping) else 0
        return Sizing(job_pods(spec), uid, queue, completions=wanted, max_runtime=limit, succeeded=done)
    if owner.kind == "JobSet":
        return Sizing(jobset_size(obj), uid, queue)
    if owner.kind in (VOLCANO_POD_GROUP, COSCHEDULING_POD_GROUP):
        size = _count(spec.get("minMember"), 0)
        if size < 1:
            why = f"spec.minMember {spec.get('minMember')!r} is not a positive gang size; its pods are ignored"
            return Sizing(0, uid, queue, f"{owner.source}: {why}")
        return Sizing(size, uid, queue)
    if owner.kind == "MPIJob" and spec.get("launcherCreationPolicy") == "WaitForWorkersReady":
        why = (
            "launcherCreationPolicy WaitForWorkersReady: its launcher waits for running workers,"
            " so it can never be one gang (use AtStartup); its pods are ignored"
        )
        return Sizing(0, uid, queue, f"{owner.source}: {why}")
    size = kubeflow_size(obj)
    if size < 1:
        return Sizing(0, uid, queue, f"{owner.source}: no replicas in its replica specs; its pods are ignored")
    return Sizing(size, uid, queue)


SUCCEEDED_CONDITIONS = ("Complete", "Completed", "Succeeded")
"""Owner conditions saying it ended with success."""
ENDED_CONDITIONS = (*SUCCEEDED_CONDITIONS, "Failed", "FailureTarget")
"""Owner conditions (a Job's, a JobSet's, a Kubeflow job's) after which it makes no pod again."""


def makes_no_pods(obj: Mapping[str, Any]) -> str:
    """Why an existing owner will not make a deleted pod again ("" when it will): it ended (a true
    Complete/Failed condition: a Job past its `activeDeadlineSeconds` deletes its pods and fails
    DeadlineExceeded) or it is suspended. A gang waiting for its replacement would wait for ever."""
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") in ENDED_CONDITIONS and c.get("status") == "True":
            return f"{c['type']} ({c['reason']})" if c.get("reason") else str(c["type"])
    if (obj.get("spec") or {}).get("suspend") is True:
        return "suspended"
    return ""


async def fetch_owner(client: KubeClient, owner: Owner) -> dict[str, Any] | None:
    """The owner object as the API has it (a labelled pod group's: the controller its pods name); None when
    it is gone (404). Raises KubeError for anything else (a controller's kind the server does not serve)."""
    try:
        if owner.reads_controller:
            c = owner.controller
            assert c is not None
            return await client.get_kind(c.api_version, c.kind, owner.namespace, c.name)
        if owner.kind == "Job":
            return await client.get_job(owner.namespace, owner.name)
        api = api_of(owner)
        return await client.get_custom(api.group, api.version, owner.namespace, api.plural, owner.name)
    except NotFound:
        return None


def sizing_of(owner: Owner, obj: Mapping[str, Any] | None) -> Sizing:
    """The gang size the owner object `obj` gives (None when it is gone, or another object of that name)."""
    if obj is None:
        return Sizing(None)
    uid = (obj.get("metadata") or {}).get("uid")
    if owner.uid and uid and uid != owner.uid:
        return Sizing(None)
    return owner_sizing(owner, obj)


async def fetch_sizing(client: KubeClient, owner: Owner) -> Sizing:
    """The owner's gang size (None when the owner is gone). Raises KubeError for anything else."""
    return sizing_of(owner, await fetch_owner(client, owner))


async def list_sizings(client: KubeClient, owners: list[Owner], *, page_size: int | None) -> list[Sizing]:
    """The sizes of `owners` (one kind, one namespace) from one paged list of that kind there.

    Cheaper than a GET each when many are wanted at once (a relist finding a thousand Jobs).
    An owner the list lacks is gone: the list is read after its pods were seen, and an owner
    exists before its pods. Raises KubeError when the list cannot be read.
    """
    api, namespace = api_of(owners[0]), owners[0].namespace
    found: dict[str, Mapping[str, Any]] = {}
    async for items, _ in client.list_namespaced(api.group, api.version, api.plural, namespace, page_size=page_size):
        found.update({str((obj.get("metadata") or {}).get("name")): obj for obj in items})
    return [sizing_of(owner, found.get(owner.name)) for owner in owners]


def namespace_queue(namespace: Mapping[str, Any]) -> str:
    """A namespace's default queue: its label, else its annotation, `muster.dev/default-queue` ("" for none)."""
    meta = namespace.get("metadata") or {}
    if not isinstance(meta, Mapping):
        return ""
    for key in ("labels", "annotations"):
        values = meta.get(key) or {}
        if isinstance(values, Mapping) and values.get(DEFAULT_QUEUE_KEY):
            return str(values[DEFAULT_QUEUE_KEY])
    return ""


async def fetch_namespace_queue(client: KubeClient, namespace: str) -> str:
    """The default queue of `namespace` ("" when it names none or is gone). Raises KubeError for anything else."""
    try:
        _, obj = await call_json(client.core.read_namespace, namespace, _request_timeout=client.request_seconds)
    except NotFound:
        return ""
    return namespace_queue(obj) if isinstance(obj, Mapping) else ""
