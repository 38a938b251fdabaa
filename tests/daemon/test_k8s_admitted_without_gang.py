"""An admission of a job the adapter has no gang for: bound once its pods come, ended once they never will.

A new leader's relist can miss a pod its controller makes again (the gang is not whole, so it runs no job
yet), and a gang whose owner went can be left alone with its pods still there. Before, the admission was
skipped and forgotten ("no pods of this job in the cluster"): the log held the job admitted, counting
against its queue, with nothing bound (a phantom job), and reconciliation, which judged it by the pod
names the log holds, found those names present and said nothing.
"""

from __future__ import annotations

from adapterkit import eventually
from kubernetes_asyncio.client import CoreV1Api

from muster.daemon.k8s import manifests as m
from muster.events.types import (
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobSubmitted,
    NodeAdded,
    NodeName,
    QueueConfigured,
    QueueName,
)
from muster.projections.cluster import fold

QUEUE = QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})
NODE = NodeAdded(at=0, node=NodeName("n1"), capacity={"gpu": 8})


async def test_an_admission_applied_before_its_gang_is_whole_binds_once_the_replacement_comes(kube, start_adapter):
    """A new leader finds an admitted Job missing a pod (deleted while no leader ran): its admission, re-applied
    before the Job controller's replacement exists, binds both pods once it does, and nothing ends the job."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1"))
    job = m.job("train", "ns", parallelism=2)
    emulator.put_object("batch/v1/jobs", job)
    pods = m.job_pods(job, gpus=1, labels={"muster.dev/queue": "q"})
    for pod in pods:
        await CoreV1Api(api).create_namespaced_pod("ns", pod)
    async with start_adapter(api) as (_, events):  # the old leader's adapter: it submits the gang
        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 1)
        [sub] = events.of(JobSubmitted)
    admitted = JobAdmitted(at=2, job=sub.job, queue=QueueName("q"), placement={p: NodeName("n1") for p in sub.pods})
    state = fold([QUEUE, NODE, sub, admitted])
    emulator.remove_object("v1/pods", "ns", pods[1]["metadata"]["name"])  # deleted while no leader ran

    async with start_adapter(api, state=lambda: state) as (adapter, events):
        result = await adapter.apply(admitted)  # as a new term re-applies it
        assert (result.ok, result.outcome) == (True, "skipped"), result
        assert await adapter.reconcile() == []  # its Job is there to make the pod again
        [replacement] = m.job_pods(job, indexes=[1], gpus=1, labels={"muster.dev/queue": "q"})
        await CoreV1Api(api).create_namespaced_pod("ns", replacement)
        names = [pods[0]["metadata"]["name"], replacement["metadata"]["name"]]
        await eventually(
            lambda: all(emulator.get_object("v1/pods", "ns", n)["spec"].get("nodeName") == "n1" for n in names)
        )
        assert await adapter.reconcile() == []
    assert not events.of(JobSubmitted) and not events.of(JobCancelled) and not events.of(JobFailed)


async def test_an_admitted_job_whose_pods_the_adapter_leaves_alone_ends_at_the_next_reconciliation(kube, start_adapter):
    """A Volcano PodGroup deleted while no leader ran, its bare pods left behind: the new leader leaves them alone
    (no gang), and its admission binds nothing; reconciliation ends the admitted job (WorkloadDeleted) rather than
    let it hold its queue's GPUs for ever, though pods under its names are still there."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1"))
    group = m.pod_group("sweep", "ns", min_member=2, queue="q")
    emulator.put_object("scheduling.volcano.sh/v1beta1/podgroups", group)
    for pod in m.pod_group_pods(group, 2, gpus=1):
        await CoreV1Api(api).create_namespaced_pod("ns", pod)
    async with start_adapter(api) as (_, events):
        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 1)
        [sub] = events.of(JobSubmitted)
    admitted = JobAdmitted(at=2, job=sub.job, queue=QueueName("q"), placement={p: NodeName("n1") for p in sub.pods})
    log = [QUEUE, NODE, sub, admitted]
    emulator.remove_object("scheduling.volcano.sh/v1beta1/podgroups", "ns", "sweep")

    async with start_adapter(api, state=lambda: fold(log)) as (adapter, events):
        result = await adapter.apply(admitted)
        assert result.outcome == "skipped", result
        ended = await eventually(adapter.reconcile)
        assert [(e.job, type(e).__name__) for e in ended] == [(sub.job, "JobCancelled")]
        assert ended[0].reason.startswith("WorkloadDeleted")  # type: ignore[attr-defined]
    for name in ("sweep-0", "sweep-1"):
        assert not emulator.get_object("v1/pods", "ns", name)["spec"].get("nodeName")
