"""A daemon killed between a decision and its effect, on a real API server: the next one applies it.

A leader stores a decision, then binds or evicts. Killed in between, the log holds a decision
the cluster does not show. These cases write that decision onto the log as the dead leader
would have (its term's epoch, after a first daemon ran and stopped), leave the cluster as the
kill left it, and start a new daemon: it must bind where the log placed the gang (not decide
again), or evict the victim and tell its Job why, and go on from there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kubekit import Kube, eventually, log_of, running_daemon
from kubernetes_asyncio.client import ApiClient

from muster.daemon.k8s.client import KubeClient
from muster.events.store import EventStore
from muster.events.types import (
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobPreempted,
    JobSubmitted,
    LeaderElected,
    NodeName,
    QueueConfigured,
    QueueName,
)

Pods = list[dict[str, Any]]


async def pod_group(kube: Kube) -> Pods:
    return await kube.gang("train", 2, gpus=4)


async def job(kube: Kube) -> Pods:
    return (await kube.job("train", 2, gpus=4))[1]


async def jobset(kube: Kube) -> Pods:
    return (await kube.jobset("train", 2, 1, gpus=4))[1]


async def dead_leaders_epoch(store: EventStore) -> int:
    """The epoch of the last term on the log: a decision of it is the dead leader's, not a deposed one's."""
    return max(e.epoch for e in await log_of(store, LeaderElected))


def names(pods: Pods) -> list[str]:
    return [p["metadata"]["name"] for p in pods]


@pytest.mark.parametrize("make", [pod_group, job, jobset], ids=["pod-group", "job", "jobset"])
async def test_a_gang_a_dead_leader_admitted_and_partly_bound_is_bound_where_it_placed_it(
    api: ApiClient, kube: Kube, store: EventStore, make: Callable[[Kube], Awaitable[Pods]]
) -> None:
    """The next leader binds the rest of the gang on the dead leader's placement, with no decision of its own."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 0})])
    _, second = await kube.node("n1", gpus=8), await kube.node("n2", gpus=8)
    pods = await make(kube)
    async with running_daemon(store, api) as loop:  # no quota yet: the gang is submitted and waits
        await eventually(lambda: any(j.status == "pending" for j in loop.state.jobs.values()))
    [sub] = await log_of(store, JobSubmitted)
    placement = {name: NodeName(second) for name in sub.pods}
    epoch = await dead_leaders_epoch(store)
    await store.append(
        [
            QueueConfigured(at=1, name=QueueName("q"), nominal={"gpu": 16}),
            JobAdmitted(at=1, job=sub.job, queue=QueueName("q"), placement=placement, epoch=epoch),
        ]
    )
    bound, *_ = sorted(sub.pods)
    await KubeClient(api).bind(
        kube.ns, sub.pods[bound].split("/")[1], second
    )  # the dead leader's one binding before it was killed

    async with running_daemon(store, api) as loop:
        await eventually(lambda: all_on(kube, names(pods), second))
        assert loop.state.jobs[sub.job].status == "admitted"
    assert len(await log_of(store, JobAdmitted)) == 1
    assert not await log_of(store, JobFailed) and not await log_of(store, JobCancelled)
    assert len(await log_of(store, JobSubmitted)) == 1


Recreate = Callable[[], Awaitable[Pods]]


async def job_again(kube: Kube) -> tuple[str, Pods, Recreate]:
    obj, pods = await kube.job("train", 2, gpus=4)
    return "Job", pods, lambda: kube.job_pods(obj, gpus=4, labels={"muster.dev/queue": "q"})


async def jobset_again(kube: Kube) -> tuple[str, Pods, Recreate]:
    _, pods = await kube.jobset("train", 2, 1, gpus=4)
    return "JobSet", pods, lambda: kube.recreate(pods)


async def controlled_group_again(kube: Kube) -> tuple[str, Pods, Recreate]:
    _, pods = await kube.controlled_gang("train", 2, gpus=4)
    return "Pod", pods, lambda: kube.recreate(pods, suffix="-r1")


@pytest.mark.parametrize(
    "make", [job_again, jobset_again, controlled_group_again], ids=["job", "jobset", "controlled-pod-group"]
)
async def test_a_preemption_a_dead_leader_decided_is_applied_and_told_by_the_next(
    api: ApiClient, kube: Kube, store: EventStore, make: Callable[[Kube], Awaitable[tuple[str, Pods, Recreate]]]
) -> None:
    """The victim's pods are evicted by the next leader, its workload (a pod group: its pods) gets the Warning
    Preempted, and its controller's replacements are bound as the same job: nothing lost, nothing doubled."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})])
    node = await kube.node("n1", gpus=8)
    kind, pods, recreate = await make(kube)
    async with running_daemon(store, api):
        await eventually(lambda: all_on(kube, names(pods), node))
    [sub] = await log_of(store, JobSubmitted)
    epoch = await dead_leaders_epoch(store)
    await store.append([JobPreempted(at=2, job=sub.job, preemptor=None, reason="WithinQueue", epoch=epoch)])

    told = "train" if kind != "Pod" else names(pods)[0]
    async with running_daemon(store, api) as loop:
        await eventually(lambda: kube.gone(*names(pods)))
        await eventually(lambda: preempted_event(kube, kind, told))
        replacements = await recreate()
        await eventually(lambda: all_on(kube, names(replacements), node))
        assert loop.state.jobs[sub.job].status == "admitted"
    assert [p.job for p in await log_of(store, JobPreempted)] == [sub.job]
    assert [a.job for a in await log_of(store, JobAdmitted)] == [sub.job, sub.job]
    assert len(await log_of(store, JobSubmitted)) == 1
    assert not await log_of(store, JobFailed) and not await log_of(store, JobCancelled)


async def all_on(kube: Kube, pods: list[str], node: str) -> bool:
    return all([await kube.pod_node(p) == node for p in pods])


async def preempted_event(kube: Kube, kind: str, name: str) -> bool:
    listed = await kube.core.list_namespaced_event(
        kube.ns, field_selector=f"involvedObject.kind={kind},involvedObject.name={name}"
    )
    return any(e.reason == "Preempted" and e.type == "Warning" for e in listed.items)
