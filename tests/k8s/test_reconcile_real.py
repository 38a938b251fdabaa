"""Reconciliation on a real API server: a workload deleted while no daemon ran ends its job, and its room is used.

Each case runs the whole daemon (the loop on the session's NATS, the Kubernetes adapter on
the real server): a first daemon admits and binds a gang filling the only node; it stops;
the gang's workload is deleted as its user and the garbage collector would; a second gang
is created; a new daemon starts. Before issue 11 the first job stayed admitted forever
("re-applying decisions of earlier terms", skipped: "no pods of this job in the cluster")
and the second gang never bound.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from adapterkit import EventLog
from kubekit import Kube, admitted, eventually, log_of, running_adapter, running_daemon
from kubernetes_asyncio.client import ApiClient
from rbackit import bind_chart_rbac_to_tester

from muster.daemon.k8s import KubernetesAdapter
from muster.events.store import EventStore
from muster.events.types import (
    Event,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobPreempted,
    JobSubmitted,
    NodeName,
    QueueConfigured,
    QueueName,
)
from muster.projections.cluster import fold

Pods = list[dict[str, Any]]


async def make_group(kube: Kube, name: str) -> tuple[Pods, Callable[[], Awaitable[None]]]:
    pods = await kube.gang(name, 2, gpus=4)

    async def delete() -> None:
        for p in pods:
            await kube.delete_pod(p["metadata"]["name"])

    return pods, delete


async def make_job(kube: Kube, name: str) -> tuple[Pods, Callable[[], Awaitable[None]]]:
    _, pods = await kube.job(name, 2, gpus=4)

    async def delete() -> None:  # the user deletes the Job; the garbage collector its pods
        await kube.batch.delete_namespaced_job(name, kube.ns)
        for p in pods:
            await kube.delete_pod(p["metadata"]["name"])

    return pods, delete


async def make_jobset(kube: Kube, name: str) -> tuple[Pods, Callable[[], Awaitable[None]]]:
    _, pods = await kube.jobset(name, 2, 1, gpus=4)

    async def delete() -> None:
        await kube.delete_jobset(name)
        for p in pods:
            await kube.delete_pod(p["metadata"]["name"])

    return pods, delete


async def preempt_gang(
    kube: Kube, adapter: KubernetesAdapter, events: EventLog, log: list[Event], node: str
) -> JobSubmitted:
    """Admit the gang the adapter submits onto `node`, preempt it (onto `log`), wait until its pods are evicted."""
    await events.wait_for(lambda e: bool(e.of(JobSubmitted)))
    [sub] = events.of(JobSubmitted)
    admitted = JobAdmitted(at=1, job=sub.job, queue=QueueName("q"), placement={p: NodeName(node) for p in sub.pods})
    preempted = JobPreempted(at=2, job=sub.job, preemptor=None, reason="WithinQueue")
    log += [sub, admitted, preempted]
    assert (await adapter.apply(admitted)).ok
    assert (await adapter.apply(preempted)).ok
    await eventually(lambda: kube.gone(*(key.split("/")[1] for key in sub.pods.values())))
    return sub


async def all_bound(kube: Kube, pods: Pods, node: str) -> bool:
    return all([await kube.pod_node(p["metadata"]["name"]) == node for p in pods])


@pytest.mark.parametrize("make", [make_group, make_job, make_jobset], ids=["pod-group", "job", "jobset"])
async def test_a_workload_deleted_while_no_daemon_ran_ends_its_job_and_frees_its_room(
    api: ApiClient, kube: Kube, store: EventStore, make: Callable[..., Any]
) -> None:
    """Its job is cancelled (WorkloadDeleted) when the next daemon starts, holding nothing in its queue's
    usage, and a new gang binds in its place."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})])
    node = await kube.node("n1", gpus=8)
    first, delete_first = await make(kube, "first")
    async with running_daemon(store, api):
        await eventually(lambda: all_bound(kube, first, node))
    [old] = await log_of(store, JobSubmitted)

    await delete_first()
    second, _ = await make(kube, "second")
    async with running_daemon(store, api) as loop:
        await eventually(lambda: all_bound(kube, second, node))
        # no phantom: the deleted workload's job holds nothing, the queue counts the second gang alone
        assert loop.state.jobs[old.job].status == "cancelled"
        assert loop.state.queues[QueueName("q")].usage == {"gpu": 8}
        admitted = {j.id for j in loop.state.jobs.values() if j.status == "admitted"}
        assert admitted == {s.job for s in await log_of(store, JobSubmitted) if s.job != old.job}
    cancelled = await log_of(store, JobCancelled)
    assert [c.job for c in cancelled] == [old.job]
    assert cancelled[0].reason.startswith("WorkloadDeleted")
    assert {a.job for a in await log_of(store, JobAdmitted)} == {old.job} | {
        s.job for s in await log_of(store, JobSubmitted) if s.job != old.job
    }


async def test_a_job_whose_pods_went_but_whose_owner_remains_is_kept(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """Pods gone while their Job still exists are its controller's to recreate: the job is not ended."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})])
    node = await kube.node("n1", gpus=8)
    _, pods = await kube.job("train", 2, gpus=4)
    async with running_daemon(store, api):
        await eventually(lambda: all_bound(kube, pods, node))
    for p in pods:
        await kube.delete_pod(p["metadata"]["name"])
    async with running_daemon(store, api) as loop:
        await eventually(lambda: loop.term is not None and loop.term.synced_seq is not None)
        [job] = [j for j in loop.state.jobs.values()]
        assert job.status == "admitted"
    assert not await log_of(store, JobCancelled)


async def test_a_requeued_jobs_owner_deleted_while_watched_is_found_by_the_periodic_pass(
    api: ApiClient, kube: Kube
) -> None:
    """A preempted Job's gang waits for replacements; its Job deleted meanwhile, a later pass cancels the job."""
    node = await kube.node("n1", gpus=8)
    await kube.job("train", 2, gpus=4)
    log: list[Event] = [QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})]
    async with running_adapter(api, state=lambda: fold(log), reconcile_seconds=0.2) as (adapter, events):
        sub = await preempt_gang(kube, adapter, events, log, node)  # evicted: no JobFailed, its controller recreates
        await kube.batch.delete_namespaced_job("train", kube.ns, propagation_policy="Background")
        await events.wait_for(lambda e: bool(e.of(JobCancelled)))
    [cancelled] = events.of(JobCancelled)
    assert (cancelled.job, cancelled.reason) == (sub.job, f"WorkloadDeleted: Job/{kube.ns}/train is gone")
    assert not events.of(JobFailed)


@pytest.mark.parametrize("make", [make_group, make_job], ids=["pod-group", "job"])
async def test_a_waiting_workload_deleted_while_no_daemon_ran_leaves_no_phantom_in_its_queue(
    api: ApiClient, kube: Kube, store: EventStore, make: Callable[..., Any]
) -> None:
    """A gang that waited when the daemon stopped and was deleted meanwhile is cancelled: its queue holds nothing."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})])
    await kube.node("n1", gpus=4)  # room for one of the gang's two 4-GPU pods: it waits
    _, delete = await make(kube, "waiting")
    async with running_daemon(store, api) as loop:
        await eventually(lambda: any(j.status == "pending" for j in loop.state.jobs.values()))
    [sub] = await log_of(store, JobSubmitted)

    await delete()
    async with running_daemon(store, api) as loop:
        await eventually(lambda: loop.state.jobs[sub.job].status == "cancelled")
        assert not [j for j in loop.state.jobs.values() if j.status in ("pending", "admitted")]
    [cancelled] = await log_of(store, JobCancelled)
    assert cancelled.job == sub.job and cancelled.reason.startswith("WorkloadDeleted")


@contextlib.asynccontextmanager
async def preempted_controlled_group(
    api: ApiClient, kube: Kube
) -> AsyncIterator[tuple[KubernetesAdapter, EventLog, JobSubmitted, dict[str, Any], list[Event]]]:
    """A labelled pod group of a `Trainer` controller, admitted and preempted by an adapter running on `api` (its
    pods evicted, its replacements not made): the adapter, its events, the submission, the controller, the log."""
    node = await kube.node("n1", gpus=8)
    trainer, _ = await kube.controlled_gang("train", 2, gpus=4)
    log: list[Event] = [QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})]
    async with running_adapter(api, state=lambda: fold(log), reconcile_seconds=3600) as (adapter, events):
        sub = await preempt_gang(kube, adapter, events, log, node)
        yield adapter, events, sub, trainer, log


@pytest.mark.parametrize("made_again", [False, True], ids=["deleted", "deleted-and-made-again"])
async def test_a_preempted_pod_group_whose_controller_is_deleted_is_cancelled(
    api: ApiClient, kube: Kube, made_again: bool
) -> None:
    """A pod group of an operator of the user's own, preempted, waits for its replacements; once its controller
    is deleted (or made again under its name: another object) a reconciliation pass cancels the job naming the
    controller (it waited forever before)."""
    async with preempted_controlled_group(api, kube) as (adapter, events, sub, trainer, log):
        assert await adapter.reconcile() == []  # its controller is there: it makes replacements, the job waits
        await kube.delete_custom(trainer)
        if made_again:
            await kube.custom({"apiVersion": "example.com/v1", "kind": "Trainer", "metadata": {"name": "train"}})
        cancelled = await adapter.reconcile()
    assert [(c.job, c.reason) for c in cancelled] == [
        (sub.job, f"WorkloadDeleted: Trainer/{kube.ns}/train (the controller of pod group train) is gone")
    ]
    after = fold([*log, *cancelled])
    assert after.jobs[sub.job].status == "cancelled"
    assert after.queues[QueueName("q")].usage.get("gpu", 0) == 0
    assert not events.of(JobFailed)


async def test_a_preempted_pod_group_whose_controller_went_while_no_adapter_ran_is_cancelled_at_start(
    api: ApiClient, kube: Kube
) -> None:
    """The same found by the next adapter's reconciliation before it reports started: no phantom job waits in
    its queue."""
    async with preempted_controlled_group(api, kube) as (_, _, sub, trainer, log):
        pass
    await kube.delete_custom(trainer)
    async with running_adapter(api, state=lambda: fold(log), reconcile_seconds=3600) as (_, events):
        [cancelled] = events.of(JobCancelled)  # pushed before the adapter reported started
    assert cancelled.job == sub.job and cancelled.reason.startswith("WorkloadDeleted")
    assert fold([*log, cancelled]).jobs[sub.job].status == "cancelled"
    assert not events.of(JobSubmitted)


async def test_a_pod_group_whose_controllers_kind_is_not_served_gets_no_verdict(api: ApiClient, kube: Kube) -> None:
    """A controller of a kind the server does not serve cannot be read: its group is not cancelled on a guess
    (as for an owner that cannot be read, the next pass asks again)."""
    node = await kube.node("n1", gpus=8)
    owner = {"apiVersion": "nothere.example.com/v1", "kind": "Ghost", "name": "g", "uid": "u-g", "controller": True}
    await kube.gang("train", 2, gpus=4, owner=owner)
    log: list[Event] = [QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})]
    async with running_adapter(api, state=lambda: fold(log), reconcile_seconds=3600) as (adapter, events):
        await preempt_gang(kube, adapter, events, log, node)
        assert await adapter.reconcile() == []


@pytest.mark.parametrize("granted", [True, False], ids=["granted", "not-granted"])
async def test_the_charts_pod_group_controllers_value_is_the_right_reconciliation_needs(
    api: ApiClient, user_api: ApiClient, kube: Kube, tmp_path: Path, granted: bool
) -> None:
    """As `tester` with the chart's roles: with `rbac.podGroupControllers` naming the controller's kind, a deleted
    controller's waiting group is cancelled; without it the read is refused and the group gets no verdict."""
    values = {"rbac": {"podGroupControllers": [{"apiGroup": "example.com", "resources": ["trainers"]}]}}
    await bind_chart_rbac_to_tester(kube, tmp_path, values if granted else None)
    async with preempted_controlled_group(user_api, kube) as (adapter, _, sub, trainer, _):
        await kube.delete_custom(trainer)
        verdicts = await adapter.reconcile()
    assert [(type(v), v.job) for v in verdicts] == ([(JobCancelled, sub.job)] if granted else [])


@pytest.mark.parametrize("alive", [True, False], ids=["controller-there", "controller-deleted"])
async def test_a_preempted_pod_group_without_pods_at_a_new_leader_is_judged_by_the_controller_the_log_names(
    api: ApiClient, kube: Kube, alive: bool
) -> None:
    """A preempted pod group whose pods are all gone when the next adapter starts (no pod names its controller):
    with its controller there it keeps its job, and the replacements the controller makes are that job's pods,
    bound by its next admission (before: cancelled 'its pods are gone', the replacements a new job); with its
    controller deleted it is cancelled naming the controller."""
    async with preempted_controlled_group(api, kube) as (_, _, sub, trainer, log):
        pass
    if not alive:
        await kube.delete_custom(trainer)
    async with running_adapter(api, state=lambda: fold(log), reconcile_seconds=3600) as (adapter, events):
        cancelled = events.of(JobCancelled)  # pushed before the adapter reported started
        if not alive:
            assert [(c.job, c.reason) for c in cancelled] == [
                (sub.job, f"WorkloadDeleted: Trainer/{kube.ns}/train (the controller of pod group train) is gone")
            ]
            return
        assert cancelled == []
        meta = trainer["metadata"]
        owner = {"apiVersion": "example.com/v1", "kind": "Trainer", "name": "train", "uid": meta["uid"]}
        replacements = await kube.gang("train", 2, gpus=4, owner=owner | {"controller": True})
        again = admitted(sub, kube.node_name("n1"), at=3)
        log.append(again)
        await adapter.caught_up("pods", int(replacements[-1]["metadata"]["resourceVersion"]))
        assert (await adapter.apply(again)).outcome == "applied"
        await eventually(lambda: all_bound(kube, replacements, kube.node_name("n1")))
        assert await adapter.reconcile() == []
    assert not events.of(JobSubmitted) and not events.of(JobCancelled)
