"""A Job's pods over its life, on a real API server: pods that come back late, and indexes past parallelism.

The test plays the Job controller (pods with ownerReferences to the Job's uid) and the kubelet
(phases); the daemon runs whole (the loop on NATS, the adapter on the server).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from adapterkit import EventLog
from kubekit import FAST, Kube, admitted, eventually, log_of, running_daemon, submitted
from kubernetes_asyncio.client import ApiClient

from muster.daemon.applier import DecisionApplier
from muster.daemon.cluster import KubeCluster
from muster.daemon.k8s import manifests as m
from muster.events.store import EventStore
from muster.events.types import (
    Event,
    JobAdmitted,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    QueueConfigured,
    QueueName,
)
from muster.projections.cluster import fold

Pods = list[dict[str, Any]]


def names(pods: Pods) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


async def nodes_of(kube: Kube, pods: Pods) -> list[str]:
    return [await kube.pod_node(n) for n in names(pods)]


async def of_job(store: EventStore, cls: type, job: str) -> list[Any]:
    return [e for e in await log_of(store, cls) if e.job == job]


async def test_a_jobs_replacements_that_come_back_after_its_admission_gave_up_run_as_a_new_job(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """Node lost, the Job's pods late: readmitted, it fails after the pod wait; the late pods are a new job and bind."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 32})])
    first = await kube.node("n1", gpus=16)
    job, pods = await kube.job("train", 2, gpus=4)
    async with running_daemon(store, api, pod_wait_seconds=1) as loop:
        await eventually(lambda: _all_on(kube, pods, first))
        [sub] = await log_of(store, JobSubmitted)
        second = await kube.node("n2", gpus=16)

        await kube.delete_node(first)
        await eventually(lambda: kube.gone(*names(pods)))  # evicted (grace 0)
        [failed] = await eventually(lambda: of_job(store, JobFailed, sub.job))
        assert failed.reason.startswith("pods gone before binding")

        late = await kube.job_pods(job, gpus=4, labels={"muster.dev/queue": "q"})  # the controller, late
        await eventually(lambda: _all_on(kube, late, second))
        await eventually(lambda: loop.metrics.registry.get_sample_value("muster_apply_backlog") == 0)

    first_run, second_run = await log_of(store, JobSubmitted)
    assert first_run == sub
    assert second_run.source == sub.source and second_run.job != sub.job
    assert second_run.job.startswith(sub.job)
    assert sorted(second_run.pods.values()) == sorted(f"{kube.ns}/{n}" for n in names(late))
    assert [p.reason for p in await log_of(store, JobPreempted)] == ["NodeFailure"]
    assert [a.job for a in await log_of(store, JobAdmitted)] == [sub.job, sub.job, second_run.job]
    assert not await of_job(store, JobFailed, second_run.job)


async def test_an_indexed_jobs_next_indexes_run_in_its_admitted_gang_until_completions(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """completions 4, parallelism 2: indexes 2 and 3 bind on nodes their predecessors left; one admission; ends at 4."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})])
    await kube.node("a", gpus=4)
    await kube.node("b", gpus=4)
    job, pods = await kube.job("sweep", 2, gpus=4, completions=4)
    labels = {"muster.dev/queue": "q"}
    async with running_daemon(store, api):
        placed = await eventually(lambda: _bound(kube, pods))
        [sub] = await log_of(store, JobSubmitted)
        assert [(ps.name, ps.count) for ps in sub.podsets] == [("pod", 2)]

        await kube.set_phase(names(pods)[0], "Succeeded")
        [index2] = await kube.job_pods(job, [2], gpus=4, labels=labels)
        assert await eventually(lambda: kube.pod_node(names([index2])[0])) == placed[0]

        # every pod of the gang done, 3 of 4 completions: the job runs on, and index 3 takes a slot
        await kube.set_phase(names(pods)[1], "Succeeded")
        await kube.set_phase(names([index2])[0], "Succeeded")
        [index3] = await kube.job_pods(job, [3], gpus=4, labels=labels)
        assert await eventually(lambda: kube.pod_node(names([index3])[0])) in placed

        await kube.set_phase(names([index3])[0], "Succeeded")
        await eventually(lambda: of_job(store, JobFinished, sub.job))

    assert len(await log_of(store, JobSubmitted)) == 1
    assert [a.job for a in await log_of(store, JobAdmitted)] == [sub.job]  # no re-queue, quota counted once
    assert len(await log_of(store, JobFinished)) == 1


async def test_a_running_jobs_pod_deleted_while_the_job_is_there_is_replaced_on_its_node(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """A running Job's pod deleted by someone: the Job controller's replacement is bound on the deleted pod's node
    in the admitted gang, and the job finishes (before: JobFailed at once, and the replacement waited unbound for
    ever, in no job)."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})])
    await kube.node("a", gpus=4)
    await kube.node("b", gpus=4)
    job, pods = await kube.job("train", 2, gpus=4)
    async with running_daemon(store, api):
        placed = await eventually(lambda: _bound(kube, pods))
        [sub] = await log_of(store, JobSubmitted)
        for name in names(pods):
            await kube.set_phase(name, "Running")
        await eventually(lambda: of_job(store, JobStarted, sub.job))

        await kube.delete_pod(names(pods)[1])  # its kubelet confirms at once
        [again] = await kube.job_pods(job, [1], gpus=4, labels={"muster.dev/queue": "q"})
        assert await eventually(lambda: kube.pod_node(names([again])[0])) == placed[1]

        for name in names([pods[0], again]):
            await kube.set_phase(name, "Succeeded")
        await eventually(lambda: of_job(store, JobFinished, sub.job))

    assert await log_of(store, JobFailed) == []
    assert [a.job for a in await log_of(store, JobAdmitted)] == [sub.job]  # in place: no re-queue
    assert len(await log_of(store, JobSubmitted)) == 1


async def test_a_successor_pod_is_bound_only_while_the_lease_is_held(api: ApiClient, kube: Kube) -> None:
    """The lease lapsed, a Job's next index waits unbound in the applier; the lease back, it binds in its slot."""
    node = await kube.node("a", gpus=8)
    job, pods = await kube.job("sweep", 2, gpus=4, completions=3)
    log: list[Event] = [QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})]
    lease = {"held": True}
    cluster = KubeCluster(api, lambda: fold(log), backoff=FAST)
    applier = DecisionApplier(cluster, leading=lambda: lease["held"], victims={}, poll=0.01)
    events = EventLog()
    async with anyio.create_task_group() as tg:
        await tg.start(applier.run)
        await tg.start(cluster.run, events)
        admission = admitted(await submitted(events), node)
        log += [*events.events, admission]
        applier.submit(admission)
        await eventually(lambda: _all_on(kube, pods, node))

        lease["held"] = False  # lapsed (a slow refresh, a paused leader): its term has not ended yet
        await kube.set_phase(names(pods)[0], "Succeeded")
        [index2] = await kube.job_pods(job, [2], gpus=4, labels={"muster.dev/queue": "q"})
        await eventually(lambda: applier.waits == 1)
        assert await kube.pod_node(names([index2])[0]) == ""

        lease["held"] = True
        assert await eventually(lambda: kube.pod_node(names([index2])[0])) == node
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("restart", [pytest.param(False, id="watched"), pytest.param(True, id="daemon-restarted")])
async def test_pods_made_again_under_the_names_of_an_ended_run_are_a_new_run(
    api: ApiClient, kube: Kube, store: EventStore, restart: bool
) -> None:
    """An operator's pods (`<job>-worker-0`) finish, then come back with the same names: a new job, bound."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})])
    node = await kube.node("n1", gpus=8)
    owner = await kube.custom(m.pytorchjob("ddp", kube.ns, masters=1, workers=1))

    async def make_pods() -> Pods:
        made = m.pytorchjob_pods(owner, gpus=2, labels={"muster.dev/queue": "q"}, grace_seconds=0)
        return [await kube.create_pod(p) for p in made]

    async def make_again() -> Pods:
        for name in names(first):  # the operator restarts the job: same names, new uids
            await kube.delete_pod(name)
        return await make_pods()

    first = await make_pods()
    async with running_daemon(store, api):
        await eventually(lambda: _all_on(kube, first, node))
        [sub] = await log_of(store, JobSubmitted)
        for name in names(first):
            await kube.set_phase(name, "Succeeded")
        await eventually(lambda: of_job(store, JobFinished, sub.job))
        if not restart:
            again = await make_again()
            await eventually(lambda: _all_on(kube, again, node))
    if restart:  # made again while no daemon ran: the next one tells them apart on its relist
        again = await make_again()
        async with running_daemon(store, api):
            await eventually(lambda: _all_on(kube, again, node))

    assert names(again) == names(first)
    first_run, second_run = await log_of(store, JobSubmitted)
    assert first_run == sub
    assert second_run.job.startswith(f"{sub.job}-r") and second_run.pods == sub.pods
    assert [a.job for a in await log_of(store, JobAdmitted)] == [sub.job, second_run.job]


async def _all_on(kube: Kube, pods: Pods, node: str) -> bool:
    return all(n == node for n in await nodes_of(kube, pods))


async def _bound(kube: Kube, pods: Pods) -> list[str] | None:
    placed = await nodes_of(kube, pods)
    return placed if all(placed) else None
