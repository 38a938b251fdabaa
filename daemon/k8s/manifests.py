"""Kubernetes objects as their controllers would write them, for the demo and the tests.

Builders of Nodes, Pods and gang owners (batch Job, JobSet, PyTorchJob, MPIJob,
Volcano and coscheduling PodGroups), and of the pods each owner's controller
creates, with the labels, annotations and ownerReferences the real controllers
set (Job: controller ownerReference and `batch.kubernetes.io/job-completion-index`;
JobSet: `jobset.sigs.k8s.io/*` labels, pods owned by child Jobs; Kubeflow
training operator: `training.kubeflow.org/*` labels, pods owned by the
PyTorchJob; mpi-operator v2beta1: `training.kubeflow.org/job-role`, workers
owned by the MPIJob, the launcher pod by the launcher Job; PodGroups: the
Volcano annotation `scheduling.k8s.io/group-name` or the coscheduling label
`scheduling.x-k8s.io/pod-group` on pods a user's own controller owns).
Plain dicts; nothing here talks to an API server.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "job",
    "job_pods",
    "jobset",
    "jobset_pods",
    "mpijob",
    "mpijob_launcher",
    "mpijob_pods",
    "node",
    "pod",
    "pod_group",
    "pod_group_pods",
    "pytorchjob",
    "pytorchjob_pods",
]

Obj = dict[str, Any]


def node(
    name: str,
    *,
    gpus: int = 8,
    cpu: str = "96",
    memory: str = "1Ti",
    labels: Mapping[str, str] | None = None,
    ready: bool = True,
    taints: list[Obj] | None = None,
    unschedulable: bool = False,
) -> Obj:
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "900Gi"}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    spec: Obj = {}
    if taints:
        spec["taints"] = list(taints)
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": spec,
        "status": {
            "allocatable": allocatable,
            "capacity": dict(allocatable),
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(
    name: str,
    namespace: str = "default",
    *,
    scheduler: str = "muster",
    gpus: int = 0,
    cpu: str | None = None,
    memory: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owner: Obj | None = None,
    node_name: str | None = None,
    priority_class: str | None = None,
    phase: str | None = None,
    grace_seconds: int | None = None,
) -> Obj:
    limits: Obj = {}
    requests: Obj = {}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    if cpu:
        requests["cpu"] = cpu
    if memory:
        requests["memory"] = memory
    spec: Obj = {
        "schedulerName": scheduler,
        "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits, "requests": requests}}],
    }
    if node_name:
        spec["nodeName"] = node_name
    if priority_class:
        spec["priorityClassName"] = priority_class
    if grace_seconds is not None:
        spec["terminationGracePeriodSeconds"] = grace_seconds
    meta: Obj = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
    if annotations:
        meta["annotations"] = dict(annotations)
    if owner:
        meta["ownerReferences"] = [owner]
    obj: Obj = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def _ref(obj: Obj) -> Obj:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _meta(name: str, namespace: str, labels: Mapping[str, str] | None = None) -> Obj:
    return {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "labels": dict(labels or {})}


def job(name: str, namespace: str = "default", *, parallelism: int = 1, completions: int | None = None) -> Obj:
    spec: Obj = {"parallelism": parallelism, "completionMode": "Indexed"}
    if completions is not None:
        spec["completions"] = completions
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(name, namespace), "spec": spec}


def job_pods(owner: Obj, indexes: Iterable[int] | None = None, **pod_args: Any) -> list[Obj]:
    """The pods the Job controller creates: one per index up to parallelism, owned by the Job.

    `indexes`: the pods of these completion indexes instead (those it creates as earlier ones succeed).
    """
    spec = owner["spec"]
    count = min(spec.get("parallelism", 1), spec.get("completions") or spec.get("parallelism", 1))
    name, ns = owner["metadata"]["name"], owner["metadata"]["namespace"]
    extra_labels = dict(pod_args.pop("labels", None) or {})
    extra_annotations = dict(pod_args.pop("annotations", None) or {})
    out = []
    for i in range(count) if indexes is None else indexes:
        labels = {
            "batch.kubernetes.io/job-name": name,
            "batch.kubernetes.io/controller-uid": owner["metadata"]["uid"],
            "batch.kubernetes.io/job-completion-index": str(i),
            **extra_labels,
        }
        annotations = {"batch.kubernetes.io/job-completion-index": str(i), **extra_annotations}
        pod_name = f"{name}-{i}-{uuid.uuid4().hex[:5]}"
        out.append(pod(pod_name, ns, labels=labels, annotations=annotations, owner=_ref(owner), **pod_args))
    return out


def jobset(name: str, namespace: str = "default", *, replicated: list[tuple[str, int, int]]) -> Obj:
    """`replicated`: (replicated job name, replicas, parallelism of each child Job)."""
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": _meta(name, namespace),
        "spec": {
            "replicatedJobs": [
                {"name": rj, "replicas": replicas, "template": {"spec": {"parallelism": par, "completions": par}}}
                for rj, replicas, par in replicated
            ]
        },
    }


def jobset_pods(owner: Obj, *, requests: Mapping[str, Mapping[str, Any]] | None = None, **pod_args: Any) -> list[Obj]:
    """The pods of every child Job (`<jobset>-<rjob>-<index>`), labelled as the JobSet controller does.

    `requests` gives per replicated job the `pod()` resource arguments (gpus, cpu, memory).
    """
    name, ns, uid = owner["metadata"]["name"], owner["metadata"]["namespace"], owner["metadata"]["uid"]
    rjobs = owner["spec"]["replicatedJobs"]
    global_replicas = sum(rj["replicas"] for rj in rjobs)
    out = []
    global_index = 0
    for rj in rjobs:
        for j in range(rj["replicas"]):
            child: Obj = {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": f"{name}-{rj['name']}-{j}", "uid": str(uuid.uuid4())},
            }
            for i in range(rj["template"]["spec"]["parallelism"]):
                labels = {
                    "jobset.sigs.k8s.io/jobset-name": name,
                    "jobset.sigs.k8s.io/jobset-uid": uid,
                    "jobset.sigs.k8s.io/replicatedjob-name": rj["name"],
                    "jobset.sigs.k8s.io/replicatedjob-replicas": str(rj["replicas"]),
                    "jobset.sigs.k8s.io/job-index": str(j),
                    "jobset.sigs.k8s.io/job-global-index": str(global_index),
                    "jobset.sigs.k8s.io/global-replicas": str(global_replicas),
                    "batch.kubernetes.io/job-completion-index": str(i),
                    **(pod_args.get("labels") or {}),
                }
                args = {**pod_args, **(requests or {}).get(rj["name"], {}), "labels": labels}
                pod_name = f"{child['metadata']['name']}-{i}-{uuid.uuid4().hex[:5]}"
                out.append(pod(pod_name, ns, owner=_ref(child), **args))
            global_index += 1
    return out


def pytorchjob(name: str, namespace: str = "default", *, masters: int = 1, workers: int = 1) -> Obj:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _meta(name, namespace),
        "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": masters}, "Worker": {"replicas": workers}}},
    }


def pytorchjob_pods(
    owner: Obj, *, requests: Mapping[str, Mapping[str, Any]] | None = None, **pod_args: Any
) -> list[Obj]:
    """The pods the training operator creates (`<job>-master-0`, `<job>-worker-N`), owned by the PyTorchJob.

    `requests` gives per replica type (`master`, `worker`) the `pod()` resource arguments.
    """
    name, ns = owner["metadata"]["name"], owner["metadata"]["namespace"]
    out = []
    for rtype, rs in owner["spec"]["pytorchReplicaSpecs"].items():
        kind = rtype.lower()
        for i in range(rs.get("replicas", 1)):
            labels = {
                "training.kubeflow.org/job-name": name,
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
                "training.kubeflow.org/replica-type": kind,
                "training.kubeflow.org/replica-index": str(i),
                **(pod_args.get("labels") or {}),
            }
            if kind == "master":
                labels["training.kubeflow.org/job-role"] = "master"
            args = {**pod_args, **(requests or {}).get(kind, {}), "labels": labels}
            out.append(pod(f"{name}-{kind}-{i}", ns, owner=_ref(owner), **args))
    return out


def mpijob(name: str, namespace: str = "default", *, workers: int = 1, policy: str | None = None) -> Obj:
    """A Kubeflow MPIJob (v2beta1): one launcher and `workers` workers; `policy` its launcherCreationPolicy."""
    spec: Obj = {
        "slotsPerWorker": 1,
        "mpiReplicaSpecs": {"Launcher": {"replicas": 1}, "Worker": {"replicas": workers}},
    }
    if policy is not None:
        spec["launcherCreationPolicy"] = policy
    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": _meta(name, namespace), "spec": spec}


def mpijob_launcher(owner: Obj) -> Obj:
    """The launcher Job the mpi-operator creates (`<mpijob>-launcher`, controlled by the MPIJob)."""
    name, ns = owner["metadata"]["name"], owner["metadata"]["namespace"]
    meta = {**_meta(f"{name}-launcher", ns, {"app": name}), "ownerReferences": [_ref(owner)]}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {"parallelism": 1, "completions": 1}}


def mpijob_pods(
    owner: Obj,
    launcher_job: Obj | None = None,
    *,
    requests: Mapping[str, Mapping[str, Any]] | None = None,
    **pod_args: Any,
) -> list[Obj]:
    """The pods of an MPIJob as the mpi-operator creates them: the launcher's (owned by `launcher_job`) and workers.

    Labels `training.kubeflow.org/{operator-name,job-name,job-role}` on every pod, `replica-index` on workers;
    workers `<mpijob>-worker-N` owned by the MPIJob. `requests` per role (`launcher`, `worker`).
    """
    name, ns = owner["metadata"]["name"], owner["metadata"]["namespace"]
    launcher_job = launcher_job or mpijob_launcher(owner)
    extra = dict(pod_args.pop("labels", None) or {})

    def labels(role: str) -> dict[str, str]:
        return {
            "training.kubeflow.org/operator-name": "mpi-operator",
            "training.kubeflow.org/job-name": name,
            "training.kubeflow.org/job-role": role,
            **extra,
        }

    launcher_labels = {
        **labels("launcher"),
        "batch.kubernetes.io/job-name": launcher_job["metadata"]["name"],
        "batch.kubernetes.io/controller-uid": launcher_job["metadata"]["uid"],
    }
    args = {**pod_args, **(requests or {}).get("launcher", {})}
    out = [pod(f"{name}-launcher-{uuid.uuid4().hex[:5]}", ns, labels=launcher_labels, owner=_ref(launcher_job), **args)]
    for i in range(owner["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]):
        worker = {**labels("worker"), "training.kubeflow.org/replica-index": str(i)}
        args = {**pod_args, **(requests or {}).get("worker", {})}
        out.append(pod(f"{name}-worker-{i}", ns, labels=worker, owner=_ref(owner), **args))
    return out


def pod_group(
    name: str, namespace: str = "default", *, min_member: Any = 1, queue: str | None = None, volcano: bool = True
) -> Obj:
    """A PodGroup: Volcano's (`scheduling.volcano.sh/v1beta1`, with `spec.queue`) or coscheduling's (x-k8s.io)."""
    spec: Obj = {"minMember": min_member}
    if volcano and queue is not None:
        spec["queue"] = queue
    api = "scheduling.volcano.sh/v1beta1" if volcano else "scheduling.x-k8s.io/v1alpha1"
    return {"apiVersion": api, "kind": "PodGroup", "metadata": _meta(name, namespace), "spec": spec}


def pod_group_pods(group: Obj, count: int, *, owner: Obj | None = None, **pod_args: Any) -> list[Obj]:
    """`count` pods in `group`, as a user's controller (`owner`, e.g. a Job) or the user makes them.

    Volcano's pods carry the annotation `scheduling.k8s.io/group-name`; coscheduling's the label
    `scheduling.x-k8s.io/pod-group`. Neither names the PodGroup in an ownerReference.
    """
    name, ns = group["metadata"]["name"], group["metadata"]["namespace"]
    labels = dict(pod_args.pop("labels", None) or {})
    annotations = dict(pod_args.pop("annotations", None) or {})
    if group["apiVersion"].startswith("scheduling.volcano.sh/"):
        annotations["scheduling.k8s.io/group-name"] = name
    else:
        labels["scheduling.x-k8s.io/pod-group"] = name
    ref = _ref(owner) if owner is not None else None
    return [pod(f"{name}-{i}", ns, labels=labels, annotations=annotations, owner=ref, **pod_args) for i in range(count)]
