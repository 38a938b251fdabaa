"""The gang kinds teams already run, on a real API server with the whole daemon: only `schedulerName` changes.

Each case makes the owner object (its CRD installed from a permissive schema) and the pods
as that project's controller would (labels, annotations, ownerReferences with the server's
uids), starts the daemon (the loop on the session's NATS, the adapter on the real server),
and checks the gang is submitted from the owner's size and bound whole. The pure part of the
same recognition: tests/daemon/test_k8s_gang_kinds.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kubekit import MERGE, Kube, eventually, log_of, running_adapter, running_daemon
from kubernetes_asyncio.client import ApiClient
from rbackit import bind_chart_rbac_to_tester

from muster.events.store import EventStore
from muster.events.types import JobAdmitted, JobCancelled, JobRejected, JobSubmitted, QueueConfigured, QueueName

Pods = list[dict[str, Any]]


async def bound(kube: Kube, pods: Pods) -> bool:
    return all([await kube.pod_node(p["metadata"]["name"]) for p in pods])


async def queues(store: EventStore, *names: str) -> None:
    await store.append([QueueConfigured(at=0, name=QueueName(n), nominal={"gpu": 64}) for n in names])


async def test_an_mpijob_launcher_and_workers_are_bound_as_one_gang(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """An MPIJob's launcher pod (owned by its launcher Job) and 3 workers are one gang of 4, all bound."""
    await queues(store, "q")
    await kube.node("n1", gpus=8)
    mpi, pods = await kube.mpijob("allreduce", 3, gpus=2)
    async with running_daemon(store, api):
        await eventually(lambda: bound(kube, pods), seconds=30)
    [sub] = await log_of(store, JobSubmitted)
    assert sub.source == f"MPIJob/{kube.ns}/allreduce"
    assert sub.job == f"{kube.ns}/mpijob/allreduce-{mpi['metadata']['uid'][:8]}"
    assert sorted((ps.name, ps.count) for ps in sub.podsets) == [("launcher", 1), ("worker", 3)]
    assert len(await log_of(store, JobAdmitted)) == 1


async def test_a_volcano_pod_group_is_bound_whole_in_the_queue_it_names(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """Pods annotated scheduling.k8s.io/group-name form a gang of the PodGroup's minMember, queued in spec.queue."""
    await queues(store, "research")
    await kube.node("n1", gpus=8)
    group, pods = await kube.pod_group("sweep", 3, volcano=True, queue="research")
    async with running_daemon(store, api):
        await eventually(lambda: bound(kube, pods), seconds=30)
    [sub] = await log_of(store, JobSubmitted)
    assert (sub.source, sub.queue) == (f"VolcanoPodGroup/{kube.ns}/sweep", "research")
    assert sub.job.endswith(group["metadata"]["uid"][:8])
    assert [(ps.name, ps.count) for ps in sub.podsets] == [("pod", 3)]


async def test_a_coscheduling_pod_group_is_bound_whole(api: ApiClient, kube: Kube, store: EventStore) -> None:
    """Pods labelled scheduling.x-k8s.io/pod-group form a gang of the (scheduler-plugins) PodGroup's minMember."""
    await queues(store, "q")
    await kube.node("n1", gpus=8)
    _, pods = await kube.pod_group("pairs", 2, volcano=False, gpus=4, labels={"muster.dev/queue": "q"})
    async with running_daemon(store, api):
        await eventually(lambda: bound(kube, pods), seconds=30)
    [sub] = await log_of(store, JobSubmitted)
    assert (sub.source, sub.queue) == (f"CoschedulingPodGroup/{kube.ns}/pairs", "q")
    assert [(ps.name, ps.count) for ps in sub.podsets] == [("pod", 2)]


async def test_a_pod_group_with_min_member_zero_is_left_alone_and_the_daemon_goes_on(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """A Volcano PodGroup with minMember 0 is never submitted; a good gang created after it is still bound."""
    await queues(store, "q")
    await kube.node("n1", gpus=8)
    _, bad = await kube.pod_group("bad", 2, volcano=True, min_member=0, queue="q")
    async with running_daemon(store, api):
        good = await kube.gang("good", 2, gpus=1)
        await eventually(lambda: bound(kube, good), seconds=30)
        assert not await bound(kube, bad[:1])
    subs = await log_of(store, JobSubmitted)
    assert [s.source for s in subs] == [f"Gang/{kube.ns}/good"]
    assert not await log_of(store, JobRejected)


async def test_a_kueue_queue_label_puts_a_job_in_that_muster_queue(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """A Job labelled kueue.x-k8s.io/queue-name (as Kueue users do; not its pods) is queued there and bound."""
    await queues(store, "team-queue")
    await kube.node("n1", gpus=8)
    _, pods = await kube.job("train", 2, gpus=2, queue="", job_labels={"kueue.x-k8s.io/queue-name": "team-queue"})
    async with running_daemon(store, api):
        await eventually(lambda: bound(kube, pods), seconds=30)
    [sub] = await log_of(store, JobSubmitted)
    assert sub.queue == "team-queue"


async def test_the_charts_roles_let_the_adapter_size_every_new_kind(
    user_api: ApiClient, kube: Kube, tmp_path: Path
) -> None:
    """As `tester` with the chart's roles only, an MPIJob, both PodGroup kinds and a namespace are looked up."""
    await bind_chart_rbac_to_tester(kube, tmp_path)
    await default_queue(kube, "ns-q")
    await kube.mpijob("mpi", 1)
    await kube.pod_group("volcano", 2, volcano=True, queue="q")
    await kube.pod_group("cosched", 2, volcano=False)  # no queue: the namespace's default
    async with running_adapter(user_api) as (_, events):
        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 3)
    queues = sorted((s.source.split("/")[0], s.queue) for s in events.of(JobSubmitted))
    assert queues == [("CoschedulingPodGroup", "ns-q"), ("MPIJob", "q"), ("VolcanoPodGroup", "q")]


async def default_queue(kube: Kube, queue: str) -> None:
    """Name the test namespace's default queue, as a cluster admin would label it."""
    labels = {"muster.dev/default-queue": queue}
    await kube.core.patch_namespace(kube.ns, {"metadata": {"labels": labels}}, _content_type=MERGE)


async def test_a_namespaces_default_queue_takes_gangs_that_name_none(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """A Job whose pods name no queue, in a namespace labelled muster.dev/default-queue, is queued there and bound."""
    await queues(store, "ns-default")
    await default_queue(kube, "ns-default")
    await kube.node("n1", gpus=8)
    _, pods = await kube.job("train", 2, gpus=2, queue="")
    async with running_daemon(store, api):
        await eventually(lambda: bound(kube, pods), seconds=30)
    [sub] = await log_of(store, JobSubmitted)
    assert sub.queue == "ns-default"


async def make_mpijob(kube: Kube, name: str) -> tuple[Pods, Callable[[], Awaitable[None]]]:
    mpi, pods = await kube.mpijob(name, 1, gpus=4)

    async def delete() -> None:  # the user deletes the MPIJob; the garbage collector its launcher Job and pods
        await kube.delete_custom(mpi)
        await kube.batch.delete_namespaced_job(f"{name}-launcher", kube.ns)
        for p in pods:
            await kube.delete_pod(p["metadata"]["name"])

    return pods, delete


def make_pod_group(volcano: bool) -> Callable[[Kube, str], Awaitable[tuple[Pods, Callable[[], Awaitable[None]]]]]:
    async def make(kube: Kube, name: str) -> tuple[Pods, Callable[[], Awaitable[None]]]:
        group, pods = await kube.pod_group(name, 2, volcano=volcano, gpus=4, labels={"muster.dev/queue": "q"})

        async def delete() -> None:
            await kube.delete_custom(group)
            for p in pods:
                await kube.delete_pod(p["metadata"]["name"])

        return pods, delete

    return make


@pytest.mark.parametrize(
    "make", [make_mpijob, make_pod_group(True), make_pod_group(False)], ids=["mpijob", "volcano", "coscheduling"]
)
async def test_a_new_kinds_workload_deleted_while_no_daemon_ran_ends_its_job(
    api: ApiClient, kube: Kube, store: EventStore, make: Callable[..., Any]
) -> None:
    """Its owner (MPIJob, PodGroup) and pods deleted while no daemon ran: WorkloadDeleted, and a new gang binds."""
    await queues(store, "q")
    await kube.node("n1", gpus=8)
    first, delete_first = await make(kube, "first")
    async with running_daemon(store, api):
        await eventually(lambda: bound(kube, first), seconds=30)
    [old] = await log_of(store, JobSubmitted)
    await delete_first()
    second, _ = await make(kube, "second")
    async with running_daemon(store, api):
        await eventually(lambda: bound(kube, second), seconds=30)
    [cancelled] = await log_of(store, JobCancelled)
    assert cancelled.job == old.job
    assert cancelled.reason.startswith("WorkloadDeleted")
