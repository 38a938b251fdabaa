"""An adapter that starts after a gang ran: the gang's end is still reported (no capacity held forever)."""

from __future__ import annotations

from kubernetes_asyncio.client import CoreV1Api

from muster.daemon.k8s import manifests as m
from muster.events.types import JobAdmitted, JobFinished, JobSubmitted, NodeName, QueueConfigured, QueueName
from muster.projections.cluster import fold


async def test_a_gang_that_finished_while_no_adapter_watched_is_reported_finished(kube, start_adapter):
    """Pods bound and Succeeded before a new leader's adapter starts: it reports the known job finished."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1"))
    job = m.job("train", "ns", parallelism=2)
    emulator.put_object("batch/v1/jobs", job)
    for pod in m.job_pods(job, gpus=1, labels={"muster.dev/queue": "q"}):
        await CoreV1Api(api).create_namespaced_pod("ns", pod)
    async with start_adapter(api) as (_, events):  # the old leader's adapter: it submits the gang
        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 1)
        [sub] = events.of(JobSubmitted)
    for key in sub.pods.values():  # bound by the old leader, then run to completion during the failover
        ns, name = key.split("/")
        emulator.patch_object("v1/pods", ns, name, {"spec": {"nodeName": "n1"}, "status": {"phase": "Succeeded"}})
    admitted = JobAdmitted(at=2, job=sub.job, queue=QueueName("q"), placement={p: NodeName("n1") for p in sub.pods})
    state = fold([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8}), sub, admitted])

    async with start_adapter(api, state=lambda: state) as (_, events):
        await events.wait_for(lambda e: bool(e.of(JobFinished)))
    assert [e.job for e in events.of(JobFinished)] == [sub.job]
    assert not events.of(JobSubmitted)  # the log knows the gang: not submitted again


async def test_an_admission_reapplied_before_the_gang_is_sized_still_binds(kube, start_adapter):
    """A new leader re-applies an admission while its adapter still fetches the gang's owner: it waits and binds."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1"))
    job = m.job("train", "ns", parallelism=2)
    emulator.put_object("batch/v1/jobs", job)
    for pod in m.job_pods(job, gpus=1, labels={"muster.dev/queue": "q"}):
        await CoreV1Api(api).create_namespaced_pod("ns", pod)
    async with start_adapter(api) as (_, events):
        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 1)
        [sub] = events.of(JobSubmitted)
    admitted = JobAdmitted(at=2, job=sub.job, queue=QueueName("q"), placement={p: NodeName("n1") for p in sub.pods})
    state = fold([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8}), sub, admitted])
    emulator.fail("GET", "jobs", status=None, delay=0.5)  # the owner lookup is slow

    async with start_adapter(api, state=lambda: state) as (adapter, _):
        result = await adapter.apply(admitted)
    assert (result.ok, result.outcome) == (True, "applied"), result
    for key in sub.pods.values():
        assert emulator.get_object("v1/pods", *key.split("/"))["spec"]["nodeName"] == "n1"
