"""A node lost on a real API server: bare pods' jobs end with it, a Job's gang is evicted once and comes back.

Before issue 11 the evicted gang of bare pods was requeued and readmitted although its pods
never come back, each admission waiting 10 s before failing "pods gone before binding"
(a storm of preemptions and admissions after a node cleanup).
"""

from __future__ import annotations

from kubekit import Kube, eventually, log_of, running_daemon
from kubernetes_asyncio.client import ApiClient

from muster.daemon.k8s import manifests as m
from muster.events.store import EventStore
from muster.events.types import JobAdmitted, JobFailed, JobPreempted, JobSubmitted, QueueConfigured, QueueName


async def test_a_lost_node_ends_bare_gangs_and_requeues_gangs_whose_pods_come_back(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """Node deleted: the pod group fails with it; the Job's gang is evicted once and its replacements bind elsewhere."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 32})])
    first = await kube.node("n1", gpus=16)
    group = await kube.gang("group", 2, gpus=4)
    job, job_pods = await kube.job("train", 2, gpus=4)
    names = [p["metadata"]["name"] for p in group + job_pods]
    async with running_daemon(store, api, pod_wait_seconds=30) as loop:
        await eventually(lambda: _all_on(kube, names, first))
        subs = {s.source.split("/")[0]: s.job for s in await log_of(store, JobSubmitted)}

        await kube.delete_node(first)
        failed = await eventually(lambda: _of_job(store, JobFailed, subs["Gang"]))
        assert failed[0].reason.startswith(f"node {first} was deleted with pods")
        job_names = [p["metadata"]["name"] for p in job_pods]
        await eventually(lambda: kube.gone(*job_names))  # evicted (grace 0): gone at once
        for name in names:  # the pod garbage collector's part: pods of a node that is gone
            if name not in job_names:
                await kube.delete_pod(name)
        # the Job controller's replacements, then a new node for them
        pods = m.job_pods(job, gpus=4, grace_seconds=0, labels={"muster.dev/queue": "q"})
        replacements = [await kube.create_pod(p) for p in pods]
        second = await kube.node("n2", gpus=16)
        await eventually(lambda: _all_on(kube, [p["metadata"]["name"] for p in replacements], second))
        await eventually(lambda: loop.metrics.registry.get_sample_value("muster_apply_backlog") == 0)

    preempted = await log_of(store, JobPreempted)
    # the pod group ended with the node (nothing recreates its pods): never evicted, never requeued
    assert [(p.job, p.reason) for p in preempted] == [(subs["Job"], "NodeFailure")]
    admitted = [a.job for a in await log_of(store, JobAdmitted)]
    assert admitted.count(subs["Gang"]) == 1  # never readmitted
    assert admitted.count(subs["Job"]) == 2
    assert not await _of_job(store, JobFailed, subs["Job"])


async def _all_on(kube: Kube, names: list[str], node: str) -> bool:
    return all([await kube.pod_node(n) == node for n in names])


async def _of_job(store: EventStore, cls: type, job: str) -> list:
    return [e for e in await log_of(store, cls) if e.job == job]
