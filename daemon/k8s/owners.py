"""The size of a gang from its owner object: Job, JobSet or Kubeflow job (PyTorchJob and kin).

`gang_size(owner_object)` is pure; `fetch_size(client, owner)` reads the owner
from the API. A missing owner (404), or one with another uid than the pods
name (deleted and re-created), has no size: None.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.errors import NotFound
from muster.daemon.k8s.gangs import Owner

__all__ = ["KUBEFLOW_GROUP", "fetch_owner", "fetch_size", "job_pods", "jobset_size", "kubeflow_size"]

JOBSET_GROUP, JOBSET_VERSION = "jobset.x-k8s.io", "v1alpha2"
KUBEFLOW_GROUP, KUBEFLOW_VERSION = "kubeflow.org", "v1"


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
    """Sum of the replicas of every replica type (`pytorchReplicaSpecs`, `tfReplicaSpecs`, ...)."""
    spec = job.get("spec") or {}
    total = 0
    for key, replicas in spec.items():
        if key.endswith("ReplicaSpecs") and isinstance(replicas, Mapping):
            for rs in replicas.values():
                if isinstance(rs, Mapping):
                    total += _count(rs.get("replicas"), 1)
    return total


async def fetch_owner(client: KubeClient, owner: Owner) -> dict[str, Any] | None:
    """The owner object as the API has it; None when it is gone (404). Raises KubeError for anything else."""
    try:
        if owner.kind == "Job":
            return await client.get_job(owner.namespace, owner.name)
        if owner.kind == "JobSet":
            return await client.get_custom(JOBSET_GROUP, JOBSET_VERSION, owner.namespace, "jobsets", owner.name)
        plural = owner.kind.lower() + "s"
        return await client.get_custom(KUBEFLOW_GROUP, KUBEFLOW_VERSION, owner.namespace, plural, owner.name)
    except NotFound:
        return None


async def fetch_size(client: KubeClient, owner: Owner) -> int | None:
    """The owner's gang size; None when the owner is gone. Raises KubeError for anything else."""
    obj = await fetch_owner(client, owner)
    if obj is None:
        return None
    uid = (obj.get("metadata") or {}).get("uid")
    if owner.uid and uid and uid != owner.uid:
        return None
    if owner.kind == "Job":
        return job_pods(obj.get("spec") or {})
    if owner.kind == "JobSet":
        return jobset_size(obj)
    return kubeflow_size(obj)
