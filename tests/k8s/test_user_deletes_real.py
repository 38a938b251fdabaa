"""A waiting gang's workload deleted by its user while the daemon watches, on a real API server.

The user's deletion of a Job, a JobSet, a pod group or a lone pod is a cancellation
(`JobCancelled` `WorkloadDeleted`), not a failure: before, the first pod's deletion event
ended the job `JobFailed` ("pod X was deleted before it was bound"), and chargeback and
`muster jobs` called the user's own deletion a failure. A pod deleted out of a workload
that is still there still fails its gang, unless a pod group's controller is there to make it
again: the replacement takes its place. The server runs no garbage collector: the
tests delete the owner, then its pods, as the collector would.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kubekit import Kube, admitted, running_adapter, submitted
from kubernetes_asyncio.client import ApiClient

from muster.events.types import Event, JobCancelled, JobFailed, JobSubmitted, QueueConfigured, QueueName
from muster.projections.cluster import fold

Deletion = Callable[[], Awaitable[None]]


async def waiting_job(kube: Kube) -> tuple[str, Deletion]:
    _, pods = await kube.job("train", 2, gpus=1)

    async def delete() -> None:
        await kube.batch.delete_namespaced_job("train", kube.ns)
        for p in pods:
            await kube.delete_pod(p["metadata"]["name"])

    return f"WorkloadDeleted: Job/{kube.ns}/train is gone", delete


async def waiting_jobset(kube: Kube) -> tuple[str, Deletion]:
    _, pods = await kube.jobset("train", 2, 1, gpus=1)

    async def delete() -> None:
        await kube.delete_jobset("train")
        for p in pods:
            await kube.delete_pod(p["metadata"]["name"])

    return f"WorkloadDeleted: JobSet/{kube.ns}/train is gone", delete


async def waiting_group(kube: Kube) -> tuple[str, Deletion]:
    pods = await kube.gang("g", 3)

    async def delete() -> None:  # as `kubectl delete pods -l muster.dev/gang=g`: one request a pod
        for p in pods:
            await kube.delete_pod(p["metadata"]["name"])

    return "WorkloadDeleted: its pods are gone", delete


async def waiting_pod(kube: Kube) -> tuple[str, Deletion]:
    await kube.pod("solo", gpus=1, labels={"muster.dev/queue": "q"})
    return "WorkloadDeleted: its pods are gone", lambda: kube.delete_pod("solo")


@pytest.mark.parametrize(
    "make", [waiting_job, waiting_jobset, waiting_group, waiting_pod], ids=["job", "jobset", "pod-group", "pod"]
)
async def test_a_waiting_workload_deleted_by_its_user_is_cancelled_not_failed(
    api: ApiClient, kube: Kube, make: Callable[[Kube], Awaitable[tuple[str, Deletion]]]
) -> None:
    """The job of a pending workload its user deletes ends once, JobCancelled WorkloadDeleted, with no JobFailed."""
    await kube.node("n1")
    reason, delete = await make(kube)
    async with running_adapter(api, reconcile_seconds=3600) as (adapter, events):
        sub = await submitted(events)
        await delete()
        await events.wait_for(lambda e: bool(e.of(JobCancelled)))
        await adapter.reconcile()  # a pass after the deletion finds nothing more to say
    assert [(c.job, c.reason) for c in events.of(JobCancelled)] == [(sub.job, reason)]
    assert events.of(JobFailed) == []


async def test_a_pod_deleted_from_a_waiting_job_still_there_fails_it(api: ApiClient, kube: Kube) -> None:
    """A pending Job's pod deleted while the Job exists: JobFailed naming the pod, as before."""
    await kube.node("n1")
    await kube.job("train", 2, gpus=1)
    async with running_adapter(api, reconcile_seconds=3600) as (_, events):
        sub = await submitted(events)
        key = sorted(sub.pods.values())[0]
        await kube.delete_pod(key.split("/")[1])
        await events.wait_for(lambda e: bool(e.of(JobFailed)))
    assert [(f.job, f.reason) for f in events.of(JobFailed)] == [
        (sub.job, f"pod {key} was deleted before it was bound")
    ]
    assert events.of(JobCancelled) == []


async def test_a_pod_deleted_from_a_waiting_group_that_keeps_the_others_fails_it_after_a_whole_pass(
    api: ApiClient, kube: Kube
) -> None:
    """One pod of a pending pod group deleted, the others kept: JobFailed naming it, from the second pass on."""
    await kube.node("n1")
    await kube.gang("g", 3)
    async with running_adapter(api, reconcile_seconds=3600) as (adapter, events):
        sub = await submitted(events)
        key = f"{kube.ns}/g-1"
        await kube.delete_pod("g-1")
        await adapter.caught_up("pods", await _server_version(kube))
        await adapter.reconcile()  # the user may be deleting the others: one pass waits
        assert events.of(JobFailed) == []
        await adapter.reconcile()
    assert [(f.job, f.reason) for f in events.of(JobFailed)] == [
        (sub.job, f"pod {key} was deleted before it was bound")
    ]
    assert events.of(JobCancelled) == []


async def _server_version(kube: Kube) -> int:
    """The server's current resourceVersion of pods in the test's namespace."""
    listed: Any = await kube.core.list_namespaced_pod(kube.ns)
    return int(listed.metadata.resource_version)


@pytest.mark.parametrize("suffix", ["", "-r1"], ids=["same-name", "new-name"])
async def test_a_pod_deleted_from_a_waiting_controlled_group_is_replaced_in_its_place(
    api: ApiClient, kube: Kube, suffix: str
) -> None:
    """A pending pod group's pod deleted while its controller (an operator's Trainer) is there: the replacement
    the controller makes takes its place, and the job's admission binds it with the others (before, the job
    ended JobFailed at once and its pods waited unbound for ever)."""
    node = await kube.node("n1")
    _, pods = await kube.controlled_gang("train", 2, gpus=1)
    log: list[Event] = [QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})]
    async with running_adapter(api, state=lambda: fold(log), reconcile_seconds=3600) as (adapter, events):
        sub = await submitted(events)
        log.append(sub)
        await kube.delete_pod("train-1")
        [replacement] = await kube.recreate([pods[1]], suffix=suffix)
        await adapter.caught_up("pods", int(replacement["metadata"]["resourceVersion"]))
        admission = admitted(sub, node, at=2)
        log.append(admission)
        await adapter.ready(admission)  # as the daemon applies an admission: once its pods are there
        assert (await adapter.apply(admission)).outcome == "applied"
        assert events.of(JobFailed) == []
        assert [await kube.pod_node(p) for p in ("train-0", "train-1" + suffix)] == [node, node]
    assert events.of(JobCancelled) == [] and events.of(JobSubmitted) == [sub]
