"""A waiting Job whose parallelism its user changes, on a real API server.

The gang's size is the Job's parallelism when its pods were first seen. Scaled down, the Job
controller deletes its pods past the new parallelism and makes none again; scaled up, it makes
more. Before, the first gang waited for ever for the deleted pod, and the pods of the second
beyond the gang waited unbound for ever, neither with a word. Now, as Kueue makes a Job's
Workload again when the Job changes before admission, the waiting job is cancelled (`Resized`)
and its pods are submitted again at the new size. A running Job scaled up keeps its admitted size, and
the pod its controller makes beyond it is told why it waits. The test plays the Job controller.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubekit import MERGE, Kube, eventually, log_of, running_adapter, running_daemon, submitted
from kubernetes_asyncio.client import ApiClient

from muster.events.store import EventStore
from muster.events.types import (
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobStarted,
    JobSubmitted,
    QueueConfigured,
    QueueName,
)

Obj = dict[str, Any]


async def scale(kube: Kube, job: Obj, parallelism: int) -> None:
    """Set the Job's parallelism and completions, as its user does (`kubectl scale` sets parallelism)."""
    patch = {"spec": {"parallelism": parallelism, "completions": parallelism}}
    await kube.batch.patch_namespaced_job(job["metadata"]["name"], kube.ns, patch, _content_type=MERGE)


async def test_a_waiting_job_scaled_down_runs_at_its_new_size(api: ApiClient, kube: Kube, store: EventStore) -> None:
    """A Job of 3 x 8 GPUs waits on a queue of 16; scaled to 2 (its controller deletes the third pod) it is
    cancelled `Resized` and its two pods, submitted again as a new job, are admitted and bound."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 16})])
    await kube.node("n1", gpus=8)
    await kube.node("n2", gpus=8)
    job, pods = await kube.job("train", 3, gpus=8)
    async with running_daemon(store, api):
        first = await eventually(lambda: log_of(store, JobSubmitted))
        await scale(kube, job, 2)
        await kube.delete_pod(pods[2]["metadata"]["name"])
        await eventually(lambda: _all_bound(kube, pods[:2]), seconds=30)
    [old] = first
    [cancelled] = await log_of(store, JobCancelled)
    assert (cancelled.job, cancelled.reason) == (
        old.job,
        f"Resized: Job/{kube.ns}/train runs 2 pods at once now, not 3; its pods are submitted again as a new job",
    )
    [_, new] = await log_of(store, JobSubmitted)
    assert new.job.startswith(f"{old.job}-r")
    assert sorted(new.pods.values()) == sorted(f"{kube.ns}/{p['metadata']['name']}" for p in pods[:2])
    assert [a.job for a in await log_of(store, JobAdmitted)] == [new.job]
    assert await log_of(store, JobFailed) == []


async def test_a_waiting_job_scaled_up_is_submitted_again_with_its_new_pods(api: ApiClient, kube: Kube) -> None:
    """A waiting Job of 2 scaled to 3 (its controller makes the third pod): the job of 2 is cancelled `Resized`
    and the three pods are one new job (before: the third waited unbound for ever, unseen)."""
    await kube.node("n1")
    job, pods = await kube.job("train", 2, gpus=1)
    async with running_adapter(api, reconcile_seconds=3600) as (_adapter, events):
        old = await submitted(events)
        await scale(kube, job, 3)
        [third] = await kube.job_pods(job, [2], gpus=1, labels={"muster.dev/queue": "q"})
        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 2)
    [cancelled] = events.of(JobCancelled)
    assert (cancelled.job, cancelled.reason.split(";")[0]) == (
        old.job,
        f"Resized: Job/{kube.ns}/train runs 3 pods at once now, not 2",
    )
    new = events.of(JobSubmitted)[1]
    assert sorted(new.pods.values()) == sorted(f"{kube.ns}/{p['metadata']['name']}" for p in [*pods, third])
    assert events.of(JobFailed) == []


async def test_a_pod_deleted_from_a_waiting_job_of_the_same_size_still_waits_for_its_replacement(
    api: ApiClient, kube: Kube
) -> None:
    """A pod deleted from a waiting Job whose parallelism did not change: no resize, the job waits for the
    controller's replacement and keeps its id."""
    await kube.node("n1")
    job, pods = await kube.job("train", 2, gpus=1)
    async with running_adapter(api, reconcile_seconds=3600) as (adapter, events):
        sub = await submitted(events)
        await kube.delete_pod(pods[1]["metadata"]["name"])
        [again] = await kube.job_pods(job, [1], gpus=1, labels={"muster.dev/queue": "q"})
        await adapter.caught_up("pods", int(again["metadata"]["resourceVersion"]))
        await adapter.reconcile()
    assert events.of(JobSubmitted) == [sub]
    assert events.of(JobCancelled) == [] and events.of(JobFailed) == []


async def _all_bound(kube: Kube, pods: list[Obj]) -> bool:
    return all([await kube.pod_node(p["metadata"]["name"]) for p in pods])


async def test_a_job_scaled_down_while_no_daemon_ran_is_resized_by_the_next(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """A waiting Job scaled down (its third pod deleted) while no daemon ran: the next daemon's first
    reconciliation cancels its job `Resized` and its two pods run as a new job (before: a phantom 3-pod job
    waited for ever, and its pods with it)."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 16})])
    await kube.node("n1", gpus=8)
    await kube.node("n2", gpus=8)
    job, pods = await kube.job("train", 3, gpus=8)
    async with running_daemon(store, api):
        [old] = await eventually(lambda: log_of(store, JobSubmitted))
    await scale(kube, job, 2)
    await kube.delete_pod(pods[2]["metadata"]["name"])
    async with running_daemon(store, api):
        await eventually(lambda: _all_bound(kube, pods[:2]), seconds=30)
    [cancelled] = await log_of(store, JobCancelled)
    assert (cancelled.job, cancelled.reason.split(";")[0]) == (
        old.job,
        f"Resized: Job/{kube.ns}/train runs 2 pods at once now, not 3",
    )
    [_, new] = await log_of(store, JobSubmitted)
    assert [a.job for a in await log_of(store, JobAdmitted)] == [new.job]


async def test_a_resized_jobs_new_run_is_bound_by_the_next_daemon(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """A Job scaled down while waiting: its new job of 2 still waits for room when the daemon stops; the next
    daemon, room there, admits and binds it (before: it sized the gang from the cancelled job of 3, never found
    the new job's pods, and the job was admitted with its pods unbound for ever)."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 16})])
    await kube.node("n1", gpus=8)
    job, pods = await kube.job("train", 3, gpus=8)
    async with running_daemon(store, api):
        await eventually(lambda: log_of(store, JobSubmitted))
        await scale(kube, job, 2)
        await kube.delete_pod(pods[2]["metadata"]["name"])
        await eventually(lambda: len_of(store, JobSubmitted, 2))
    await kube.node("n2", gpus=8)
    async with running_daemon(store, api):
        await eventually(lambda: _all_bound(kube, pods[:2]), seconds=30)
    [_, new] = await log_of(store, JobSubmitted)
    assert [a.job for a in await log_of(store, JobAdmitted)] == [new.job]
    assert len(await log_of(store, JobCancelled)) == 1


async def len_of(store: EventStore, cls: type, count: int) -> bool:
    return len(await log_of(store, cls)) == count


@pytest.mark.parametrize("completed_first", [False, True], ids=["deleted-first", "completed-first"])
async def test_a_running_job_scaled_down_finishes_when_its_remaining_pods_succeed(
    api: ApiClient, kube: Kube, store: EventStore, completed_first: bool
) -> None:
    """A running Job of 2 scaled to 1 (its controller deletes the second pod, which may linger terminating until
    the Job completed): it runs on and, its pod succeeded and the Job Complete, its job is JobFinished (before:
    it waited for a replacement and ended JobFailed "Job/ns/x is Complete (...), so it makes no pod again", a
    success billed as a failure)."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})])
    await kube.node("n1", gpus=8)
    job, pods = await kube.job("train", 2, gpus=1)
    names = [p["metadata"]["name"] for p in pods]
    complete = {"type": "Complete", "status": "True", "reason": "CompletionsReached"}
    status = {"status": {"conditions": [{**complete, "lastProbeTime": None, "lastTransitionTime": None}]}}
    async with running_daemon(store, api):
        await eventually(lambda: _all_bound(kube, pods))
        for name in names:
            await kube.set_phase(name, "Running")
        [sub] = await log_of(store, JobSubmitted)
        await eventually(lambda: _of_job(store, JobStarted, sub.job))
        await scale(kube, job, 1)
        if completed_first:
            await kube.set_phase(names[0], "Succeeded")
            await kube.batch.patch_namespaced_job_status("train", kube.ns, status)
            await kube.delete_pod(names[1])
        else:
            await kube.delete_pod(names[1])
            await kube.set_phase(names[0], "Succeeded")
        finished = await eventually(lambda: _of_job(store, JobFinished, sub.job))
        await kube.batch.patch_namespaced_job_status("train", kube.ns, status)
    assert [f.job for f in finished] == [sub.job]
    assert await log_of(store, JobFailed) == [] and await log_of(store, JobCancelled) == []


async def _of_job(store: EventStore, cls: type, job: str) -> list[Any]:
    return [e for e in await log_of(store, cls) if e.job == job]


async def test_a_running_job_scaled_up_runs_at_its_admitted_size_and_its_new_pod_is_told_why(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """A Job of 2 admitted and running, scaled to 3 (its controller makes the third pod): the job runs on at 2,
    and the third pod waits unbound with a Warning `Ignored` saying so (before: Pending with no word)."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 16})])
    await kube.node("n1", gpus=8)
    job, pods = await kube.job("train", 2, gpus=1)
    async with running_daemon(store, api):
        await eventually(lambda: _all_bound(kube, pods), seconds=30)
        for pod in pods:  # the kubelet starts them
            await kube.set_phase(pod["metadata"]["name"], "Running")
        [sub] = await eventually(lambda: log_of(store, JobStarted))
        await scale(kube, job, 3)
        [third] = await kube.job_pods(job, [2], gpus=1, labels={"muster.dev/queue": "q"})
        name = third["metadata"]["name"]

        async def told() -> list[Obj]:
            listed = await kube.core.list_namespaced_event(kube.ns, field_selector=f"involvedObject.name={name}")
            found = [kube.api.sanitize_for_serialization(e) for e in listed.items]
            return [e for e in found if e["reason"] == "Ignored" and e["type"] == "Warning"]

        [warning] = await eventually(told, seconds=30)
    assert f"job {sub.job} runs at the size it was admitted with (2 pods)" in warning["message"]
    assert await kube.pod_node(name) == ""
    assert await log_of(store, JobCancelled) == [] and len(await log_of(store, JobSubmitted)) == 1
