"""A waiting gang's workload deleted by its user while the daemon watches, on a real API server.

The user's deletion of a Job, a JobSet, a pod group or a lone pod is a cancellation
(`JobCancelled` `WorkloadDeleted`), not a failure: before, the first pod's deletion event
ended the job `JobFailed` ("pod X was deleted before it was bound"), and chargeback and
`muster jobs` called the user's own deletion a failure. A pod deleted out of a workload
that is still there is made again by its controller (the Job controller, JobSet's child Jobs, a
training operator, a pod group's own controller): the replacement takes its place; only a pod
group nothing recreates fails. The server runs no garbage collector or Job controller: the
tests delete the owner, then its pods, and make the replacements, as those would.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from adapterkit import EventLog
from kubekit import Kube, admitted, eventually, running_adapter, submitted
from kubernetes_asyncio.client import ApiClient

from muster.daemon.k8s import KubernetesAdapter
from muster.daemon.k8s import manifests as m
from muster.events.types import Event, JobCancelled, JobFailed, JobStarted, JobSubmitted, QueueConfigured, QueueName
from muster.projections.cluster import fold

Obj = dict[str, Any]
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


def waiting_pod_group(volcano: bool) -> Callable[[Kube], Awaitable[tuple[str, Deletion]]]:
    """A Volcano or coscheduling PodGroup of bare pods, its pods deleted and the PodGroup left."""

    async def make(kube: Kube) -> tuple[str, Deletion]:
        _, pods = await kube.pod_group("g", 2, volcano=volcano, labels={"muster.dev/queue": "q"})

        async def delete() -> None:
            for p in pods:
                await kube.delete_pod(p["metadata"]["name"])

        return "WorkloadDeleted: its pods are gone", delete

    return make


async def waiting_pod(kube: Kube) -> tuple[str, Deletion]:
    await kube.pod("solo", gpus=1, labels={"muster.dev/queue": "q"})
    return "WorkloadDeleted: its pods are gone", lambda: kube.delete_pod("solo")


@pytest.mark.parametrize(
    "make",
    [waiting_job, waiting_jobset, waiting_group, waiting_pod_group(True), waiting_pod_group(False), waiting_pod],
    ids=["job", "jobset", "pod-group", "volcano-bare", "coscheduling-bare", "pod"],
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


Replace = Callable[[Obj], Awaitable[Obj]]


async def losing_job(kube: Kube) -> tuple[list[Obj], Replace]:
    """A Job of 2 pods; its controller makes a deleted pod again under a new name (same index)."""
    job, pods = await kube.job("train", 2, gpus=1)

    async def replace(pod: Obj) -> Obj:
        index = int(pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"])
        [made] = await kube.job_pods(job, [index], gpus=1, labels={"muster.dev/queue": "q"})
        return made

    return pods, replace


async def losing_jobset(kube: Kube) -> tuple[list[Obj], Replace]:
    """A JobSet of 2 child Jobs of 1 pod; the child Job's controller makes a deleted pod again under a new name."""
    _, pods = await kube.jobset("train", 2, 1, gpus=1)

    async def replace(pod: Obj) -> Obj:
        [made] = await kube.recreate([pod], suffix="-r1")
        return made

    return pods, replace


async def losing_pytorchjob(kube: Kube) -> tuple[list[Obj], Replace]:
    """A PyTorchJob (master and worker); the training operator makes a deleted pod again under the same name."""
    owner = await kube.custom(m.pytorchjob("train", kube.ns, masters=1, workers=1))
    made = m.pytorchjob_pods(owner, gpus=1, labels={"muster.dev/queue": "q"}, grace_seconds=0)
    pods = [await kube.create_pod(p) for p in made]

    async def replace(pod: Obj) -> Obj:
        [again] = await kube.recreate([pod])
        return again

    return pods, replace


@pytest.mark.parametrize("make", [losing_job, losing_jobset, losing_pytorchjob], ids=["job", "jobset", "pytorchjob"])
async def test_a_pod_deleted_from_a_waiting_job_still_there_is_replaced_in_its_place(
    api: ApiClient, kube: Kube, make: Callable[[Kube], Awaitable[tuple[list[Obj], Replace]]]
) -> None:
    """A pending Job's (JobSet's, PyTorchJob's) pod deleted while the workload exists: its controller's replacement
    takes its place and the job's admission binds it with the others (before, the job ended JobFailed at once
    and the replacement and the survivors waited unbound for ever, with no job and no verdict)."""
    node = await kube.node("n1")
    pods, replace = await make(kube)
    log: list[Event] = [QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})]
    async with running_adapter(api, state=lambda: fold(log), reconcile_seconds=3600) as (adapter, events):
        sub = await submitted(events)
        log.append(sub)
        lost, kept = pods[1]["metadata"]["name"], pods[0]["metadata"]["name"]
        await kube.delete_pod(lost)
        replacement = await replace(pods[1])
        await adapter.caught_up("pods", int(replacement["metadata"]["resourceVersion"]))
        admission = admitted(sub, node, at=2)
        log.append(admission)
        await adapter.ready(admission)  # as the daemon applies an admission: once its pods are there
        assert (await adapter.apply(admission)).outcome == "applied"
        await adapter.reconcile()  # a pass after it finds nothing to say
        assert [await kube.pod_node(p) for p in (kept, replacement["metadata"]["name"])] == [node, node]
    assert events.of(JobFailed) == [] and events.of(JobCancelled) == []
    assert events.of(JobSubmitted) == [sub]


async def test_a_job_past_its_deadline_that_deletes_its_pods_fails_rather_than_waiting_for_replacements(
    api: ApiClient, kube: Kube
) -> None:
    """A Job failed DeadlineExceeded deletes its pods and makes none again: its job fails naming why, instead of
    waiting for ever for replacements (a phantom holding its queue's quota)."""
    await kube.node("n1")
    job, pods = await kube.job("train", 2, gpus=1)
    failed = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "past its deadline"}
    status = {"status": {"conditions": [{**failed, "lastProbeTime": None, "lastTransitionTime": None}]}}
    async with running_adapter(api, reconcile_seconds=3600) as (_adapter, events):
        sub = await submitted(events)
        await kube.batch.patch_namespaced_job_status(job["metadata"]["name"], kube.ns, status)
        await kube.delete_pod(pods[0]["metadata"]["name"])
        await events.wait_for(lambda e: bool(e.of(JobFailed)))
    [fail] = events.of(JobFailed)
    assert fail.job == sub.job
    assert fail.reason.startswith(f"Job/{kube.ns}/train is Failed (DeadlineExceeded), so it makes no pod again")
    assert events.of(JobCancelled) == []


@pytest.mark.parametrize("kind", ["labelled", "volcano", "coscheduling"])
async def test_a_pod_deleted_from_a_waiting_group_that_keeps_the_others_fails_it_after_a_whole_pass(
    api: ApiClient, kube: Kube, kind: str
) -> None:
    """One pod of a pending pod group of bare pods (labelled, or a Volcano or coscheduling PodGroup) deleted, the
    others kept: JobFailed naming it, from the second pass on (before, a PodGroup's gang waited for ever for a
    replacement nothing makes)."""
    await kube.node("n1")
    if kind == "labelled":
        await kube.gang("g", 3)
    else:
        await kube.pod_group("g", 3, volcano=kind == "volcano", labels={"muster.dev/queue": "q"})
    async with running_adapter(api, reconcile_seconds=3600) as (adapter, events):
        sub = await submitted(events)
        key = f"{kube.ns}/g-1"
        await kube.delete_pod("g-1")
        # the deletion seen (a list's resourceVersion may be past the last pod event for long: other writes)
        await eventually(lambda: not adapter.translator.gangs.has_pod(key))
        await adapter.reconcile()  # the user may be deleting the others: one pass waits
        assert events.of(JobFailed) == []
        await adapter.reconcile()
    assert [(f.job, f.reason) for f in events.of(JobFailed)] == [
        (sub.job, f"pod {key} was deleted before it was bound")
    ]
    assert events.of(JobCancelled) == []


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


async def admit_the_submitted(
    adapter: KubernetesAdapter, events: EventLog, log: list[Event], node: str
) -> JobSubmitted:
    """Admit the one gang the adapter submits onto `node` and apply it, as the daemon would (the log grows)."""
    sub = await submitted(events)
    admission = admitted(sub, node, at=2)
    log += [sub, admission]
    await adapter.ready(admission)
    assert (await adapter.apply(admission)).outcome == "applied"
    return sub


async def test_a_running_job_deleted_by_its_user_is_cancelled_not_failed(api: ApiClient, kube: Kube) -> None:
    """A bound, running Job its user deletes (then its pods, as the garbage collector does) ends JobCancelled
    WorkloadDeleted, as reconciliation ends it when no daemon watched (before: JobFailed, "pod X was deleted
    while running")."""
    node = await kube.node("n1")
    _, pods = await kube.job("train", 2, gpus=1)
    log: list[Event] = [QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})]
    async with running_adapter(api, state=lambda: fold(log), reconcile_seconds=3600) as (adapter, events):
        sub = await admit_the_submitted(adapter, events, log, node)
        for pod in pods:
            await kube.set_phase(pod["metadata"]["name"], "Running")
        await events.wait_for(lambda e: bool(e.of(JobStarted)))
        await kube.batch.delete_namespaced_job("train", kube.ns)
        for pod in pods:
            await kube.delete_pod(pod["metadata"]["name"])
        await events.wait_for(lambda e: bool(e.of(JobCancelled)))
        await adapter.reconcile()  # a pass after the deletion finds nothing more to say
    assert [(c.job, c.reason) for c in events.of(JobCancelled)] == [
        (sub.job, f"WorkloadDeleted: Job/{kube.ns}/train is gone")
    ]
    assert events.of(JobFailed) == []


async def test_a_running_lone_pod_deleted_by_its_user_is_cancelled_not_failed(api: ApiClient, kube: Kube) -> None:
    """A bound, running pod of its own (no owner) its user deletes ends JobCancelled WorkloadDeleted, as
    reconciliation ends it when no daemon watched (before: JobFailed "pod X was deleted while running", so
    chargeback and `muster jobs` called the user's own deletion a failure)."""
    node = await kube.node("n1")
    await kube.pod("solo", gpus=1, labels={"muster.dev/queue": "q"})
    log: list[Event] = [QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})]
    async with running_adapter(api, state=lambda: fold(log), reconcile_seconds=3600) as (adapter, events):
        sub = await admit_the_submitted(adapter, events, log, node)
        await kube.set_phase("solo", "Running")
        await events.wait_for(lambda e: bool(e.of(JobStarted)))
        await kube.delete_pod("solo")
        await events.wait_for(lambda e: bool(e.of(JobCancelled)))
        await adapter.reconcile()  # a pass after the deletion finds nothing more to say
    assert [(c.job, c.reason) for c in events.of(JobCancelled)] == [(sub.job, "WorkloadDeleted: its pods are gone")]
    assert events.of(JobFailed) == []
