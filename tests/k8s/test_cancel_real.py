"""`muster cancel` on a real API server: the daemon suspends the cancelled Job or JobSet (a merge patch on a
built-in kind and on a custom resource alike), and the job's quota is free again."""

from __future__ import annotations

from typing import Any

from kubekit import Kube, eventually, log_of, running_daemon
from kubernetes_asyncio.client import ApiClient, BatchV1Api, CustomObjectsApi

from muster.events.store import EventStore
from muster.events.types import JobAdmitted, JobCancelled, JobSubmitted, QueueConfigured, QueueName


async def _cancel_when_admitted(store: EventStore) -> JobSubmitted:
    async def admitted() -> bool:
        return bool(await log_of(store, JobAdmitted))

    await eventually(admitted, seconds=30)
    [sub] = await log_of(store, JobSubmitted)
    await store.append([JobCancelled(at=1, job=sub.job, reason="Cancelled: by muster cancel")])
    return sub


async def test_a_cancelled_job_is_suspended(api: ApiClient, kube: Kube, store: EventStore) -> None:
    """The daemon patches `spec.suspend: true` on the cancelled Job; the Job object stays."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})])
    await kube.node("n1", gpus=8)
    await kube.job("train", 2, gpus=2)
    batch = BatchV1Api(api)
    async with running_daemon(store, api):
        await _cancel_when_admitted(store)

        async def suspended() -> bool:
            job: Any = await batch.read_namespaced_job("train", kube.ns)
            return bool(job.spec.suspend)

        await eventually(suspended, seconds=30)


async def test_a_cancelled_jobset_is_suspended(api: ApiClient, kube: Kube, store: EventStore) -> None:
    """A JobSet, a custom resource, is suspended by the same merge patch (no strategic merge for CRDs)."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})])
    await kube.node("n1", gpus=8)
    await kube.jobset("sweep", 2, 1, gpus=1)
    custom = CustomObjectsApi(api)
    async with running_daemon(store, api):
        await _cancel_when_admitted(store)

        async def suspended() -> bool:
            obj: Any = await custom.get_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", kube.ns, "jobsets", "sweep"
            )
            return bool(obj.get("spec", {}).get("suspend"))

        await eventually(suspended, seconds=30)
