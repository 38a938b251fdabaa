"""Volcano and coscheduling PodGroups of bare pods losing a running pod or their node, on a real API server.

A PodGroup object makes no pods: the pods in it are made by a controller (a Volcano Job, a
batch Job...) that names itself in their ownerReferences, or by the user, bare. Bare pods
nothing makes again: a pod deleted from such a group, or lost with its node, leaves a gang that
can never be whole, so its job fails naming the pod, and its quota goes to the jobs waiting, as
for a labelled pod group (`muster.dev/gang`). Before, a PodGroup was taken for an owner that
recreates its pods (the group's object was there, so the gang waited for a replacement that never
came): the job sat pending, or running short, for ever, holding its queue's quota. A group whose
pods name a controller still waits for that controller's replacement (the last test). A pod
deleted from a waiting group: tests/k8s/test_user_deletes_real.py, with the labelled groups.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubekit import Kube, admitted, eventually, log_of, running_adapter, running_daemon, submitted
from kubernetes_asyncio.client import ApiClient

from muster.daemon.k8s import manifests as m
from muster.events.store import EventStore
from muster.events.types import (
    Event,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobPreempted,
    JobSubmitted,
    QueueConfigured,
    QueueName,
)
from muster.projections.cluster import fold

Obj = dict[str, Any]
KINDS = pytest.mark.parametrize("volcano", [True, False], ids=["volcano", "coscheduling"])


@KINDS
async def test_a_running_bare_pod_group_that_loses_a_pod_fails_and_frees_its_quota(
    api: ApiClient, kube: Kube, store: EventStore, volcano: bool
) -> None:
    """A bound pod of a running PodGroup deleted: its job fails at once naming the pod, and the gang that waited
    for the queue's quota is admitted (before: the job ran short for ever, holding the quota)."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})])
    await kube.node("n1", gpus=8)
    await kube.node("n2", gpus=8)
    _, pods = await kube.pod_group("sweep", 2, volcano=volcano, gpus=4, labels={"muster.dev/queue": "q"})
    names = [p["metadata"]["name"] for p in pods]
    async with running_daemon(store, api):
        await eventually(lambda: _all_bound(kube, names))
        waiting = await kube.gang("next", 2, gpus=4)  # the queue's quota is taken: it waits
        where = await kube.pod_node(names[1])
        await kube.delete_pod(names[1])
        await eventually(lambda: _all_bound(kube, [p["metadata"]["name"] for p in waiting]), seconds=30)
    subs = {s.source.split("/")[2]: s.job for s in await log_of(store, JobSubmitted)}
    failed = [(f.job, f.reason) for f in await log_of(store, JobFailed)]
    assert failed == [(subs["sweep"], f"pod {kube.ns}/{names[1]} was deleted while running on {where}")]
    assert await log_of(store, JobCancelled) == []


@KINDS
async def test_a_bare_pod_group_made_again_after_its_job_failed_runs_as_a_new_job(
    api: ApiClient, kube: Kube, store: EventStore, volcano: bool
) -> None:
    """The user of a failed bare PodGroup deletes what is left and makes its pods again in the same PodGroup: a new
    job (its id salted by the new pods), admitted and bound; the failed one stays failed."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})])
    await kube.node("n1", gpus=8)
    group, pods = await kube.pod_group("sweep", 2, volcano=volcano, gpus=4, labels={"muster.dev/queue": "q"})
    names = [p["metadata"]["name"] for p in pods]
    async with running_daemon(store, api):
        await eventually(lambda: _all_bound(kube, names))
        [first] = await log_of(store, JobSubmitted)
        await kube.delete_pod(names[1])
        await eventually(lambda: _of_job(store, JobFailed, first.job))
        await kube.delete_pod(names[0])
        again = [
            await kube.create_pod(p)
            for p in m.pod_group_pods(group, 2, gpus=4, grace_seconds=0, labels={"muster.dev/queue": "q"})
        ]
        await eventually(lambda: _all_bound(kube, [p["metadata"]["name"] for p in again]), seconds=30)
    [_, second] = await log_of(store, JobSubmitted)
    assert second.job.startswith(f"{first.job}-r")
    assert [a.job for a in await log_of(store, JobAdmitted)] == [first.job, second.job]


@KINDS
async def test_a_bare_pod_group_on_a_lost_node_fails_and_is_never_readmitted(
    api: ApiClient, kube: Kube, store: EventStore, volcano: bool
) -> None:
    """The node of a running PodGroup of bare pods deleted: its job fails naming the node and pods, once; it is
    neither evicted nor admitted again (before: requeued to wait for ever for pods nothing makes)."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 16})])
    node = await kube.node("n1", gpus=8)
    _, pods = await kube.pod_group("sweep", 2, volcano=volcano, gpus=4, labels={"muster.dev/queue": "q"})
    names = [p["metadata"]["name"] for p in pods]
    async with running_daemon(store, api):
        await eventually(lambda: _all_bound(kube, names))
        [sub] = await log_of(store, JobSubmitted)
        await kube.delete_node(node)
        failed = await eventually(lambda: _of_job(store, JobFailed, sub.job))
    shown = ", ".join(f"{kube.ns}/{n}" for n in names)
    assert [f.reason for f in failed] == [f"node {node} was deleted with pods {shown}; nothing recreates them"]
    assert [p.job for p in await log_of(store, JobPreempted)] == []
    assert [a.job for a in await log_of(store, JobAdmitted)] == [sub.job]


@KINDS
async def test_a_pod_group_whose_pods_name_a_controller_still_waits_for_its_replacement(
    api: ApiClient, kube: Kube, volcano: bool
) -> None:
    """PodGroup pods made by a Volcano Job (their controller): one deleted while the gang waits, the controller's
    replacement takes its place and the admission binds it with the other; no JobFailed."""
    node = await kube.node("n1")
    group = await kube.custom(m.pod_group("sweep", kube.ns, min_member=2, volcano=volcano))
    vcjob = await kube.custom({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "sweep"}})
    made = m.pod_group_pods(group, 2, owner=vcjob, gpus=1, labels={"muster.dev/queue": "q"}, grace_seconds=0)
    pods = [await kube.create_pod(p) for p in made]
    log: list[Event] = [QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})]
    async with running_adapter(api, state=lambda: fold(log), reconcile_seconds=3600) as (adapter, events):
        sub = await submitted(events)
        log.append(sub)
        await kube.delete_pod("sweep-1")
        [replacement] = await kube.recreate([pods[1]])
        await adapter.caught_up("pods", int(replacement["metadata"]["resourceVersion"]))
        await adapter.reconcile()
        await adapter.reconcile()  # two passes: a bare group would have failed by now
        admission = admitted(sub, node, at=2)
        log.append(admission)
        await adapter.ready(admission)
        assert (await adapter.apply(admission)).outcome == "applied"
        assert [await kube.pod_node(p) for p in ("sweep-0", "sweep-1")] == [node, node]
    assert events.of(JobFailed) == [] and events.of(JobCancelled) == []
    assert events.of(JobSubmitted) == [sub]


async def _all_bound(kube: Kube, names: list[str]) -> bool:
    return all([await kube.pod_node(n) for n in names])


async def _of_job(store: EventStore, cls: type, job: str) -> list[Any]:
    return [e for e in await log_of(store, cls) if e.job == job]
