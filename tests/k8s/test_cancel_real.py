"""`muster cancel` on a real API server: the daemon suspends the cancelled Job or JobSet (a merge patch on a
built-in kind and on a custom resource alike), and the job's quota is free again; a pod group's controller
that makes the deleted pods again does not run the job again."""

from __future__ import annotations

from typing import Any

from kubekit import Kube, admitted, eventually, log_of, running_adapter, running_daemon, submitted
from kubernetes_asyncio.client import ApiClient, BatchV1Api, CustomObjectsApi
from msgspec import UNSET

from muster.events.store import EventStore
from muster.events.types import Event, JobAdmitted, JobCancelled, JobSubmitted, QueueConfigured, QueueName
from muster.projections.cluster import fold


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


async def _cancelled_events(kube: Kube, kind: str, name: str) -> bool:
    """Whether the object has muster's Warning `Cancelled` Event (as `kubectl describe` lists it)."""
    listed: Any = await kube.core.list_namespaced_event(
        kube.ns, field_selector=f"involvedObject.kind={kind},involvedObject.name={name}"
    )
    return any(e.reason == "Cancelled" and e.type == "Warning" for e in listed.items)


async def _told_cancelled(kube: Kube, pod: str) -> bool:
    """Whether the pod shows the pod group's status `Cancelled` (condition `muster.dev/Admitted`) and its Event."""
    obj = await kube.get_pod(pod) or {}
    conditions = (obj.get("status") or {}).get("conditions") or []
    shown = any(c.get("type") == "muster.dev/Admitted" and c.get("reason") == "Cancelled" for c in conditions)
    return shown and await _cancelled_events(kube, "Pod", pod)


async def test_a_cancelled_controlled_pod_group_is_not_run_again_by_its_controller(api: ApiClient, kube: Kube) -> None:
    """`muster cancel` deletes a pod group's pods; those its controller (an operator's Trainer) makes again are no
    new job: they stay unbound, told why on them and on the Trainer, also by the next leader, which reads the
    controller from the log (before, they ran again as a new job)."""
    node = await kube.node("n1", gpus=8)
    trainer, pods = await kube.controlled_gang("train", 2, gpus=4)
    log: list[Event] = [QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})]
    async with running_adapter(api, state=lambda: fold(log), reconcile_seconds=3600) as (adapter, events):
        sub = await submitted(events)
        assert sub.controller is not UNSET and sub.controller.uid == trainer["metadata"]["uid"]
        admission = admitted(sub, node)
        log += [sub, admission]
        assert (await adapter.apply(admission)).ok
        cancel = JobCancelled(at=2, job=sub.job, reason="Cancelled: by muster cancel")
        log.append(cancel)
        assert (await adapter.apply(cancel)).detail == "deleted 2 pod(s)"
        await eventually(lambda: kube.gone("train-0", "train-1"))
        await kube.recreate(pods)  # the operator makes them again, under the same names
        await eventually(lambda: _told_cancelled(kube, "train-0"))
        await eventually(lambda: _told_cancelled(kube, "train-1"))
        assert await _cancelled_events(kube, "Trainer", "train")
        assert events.of(JobSubmitted) == [sub]
    async with running_adapter(api, state=lambda: fold(log), reconcile_seconds=3600) as (_, events):
        assert not events.of(JobSubmitted)  # its relist was pushed before it reported started
    assert [await kube.pod_node(p) for p in ("train-0", "train-1")] == ["", ""]


async def test_a_cancelled_controlled_pod_group_stays_cancelled_across_a_change_of_leader(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """The whole daemon: `muster cancel` of a pod group whose controller makes its pods again; the next daemon to
    lead, started after that, submits and binds nothing of them either (it reads the controller from the log)."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})])
    await kube.node("n1", gpus=8)
    _, pods = await kube.controlled_gang("train", 2, gpus=2)
    async with running_daemon(store, api):
        sub = await _cancel_when_admitted(store)
        await eventually(lambda: kube.gone("train-0", "train-1"), seconds=30)
        await kube.recreate(pods)
        await eventually(lambda: _told_cancelled(kube, "train-1"), seconds=30)
    async with running_daemon(store, api):  # its first term began: its relist is on the log
        assert await log_of(store, JobSubmitted) == [sub]
    assert [await kube.pod_node(p) for p in ("train-0", "train-1")] == ["", ""]
