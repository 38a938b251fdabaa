"""An admission of a job the adapter has no gang for, on a real API server (a new leader's adapter).

Before, it was skipped silently: the log held the job admitted, counting against its queue, with
nothing bound. Now it is bound once its gang is whole (a pod its Job controller makes again), and a
job whose pods the adapter leaves alone (their PodGroup deleted) is ended by reconciliation. The
emulator tier: tests/daemon/test_k8s_admitted_without_gang.py.
"""

from __future__ import annotations

from kubekit import Kube, admitted, eventually, log_of, running_adapter, running_daemon, submitted
from kubernetes_asyncio.client import ApiClient

from muster.events.store import EventStore
from muster.events.types import (
    Event,
    JobAdmitted,
    JobSubmitted,
    LeaderElected,
    NodeAdded,
    NodeName,
    QueueConfigured,
    QueueName,
)
from muster.projections.cluster import fold

QUEUE = QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})


async def test_a_reapplied_admission_binds_the_gang_once_the_job_controller_remade_its_pod(
    api: ApiClient, kube: Kube
) -> None:
    """An admitted Job lost a pod while no leader ran: the new leader's admission, applied before the replacement
    exists, binds both pods once the controller made it; the job is not ended."""
    n1 = await kube.node("n1")
    job, pods = await kube.job("train", 2)
    async with running_adapter(api) as (_, events):  # the old leader's adapter
        sub = await submitted(events)
    admission = admitted(sub, n1)
    log: list[Event] = [QUEUE, NodeAdded(at=0, node=NodeName(n1), capacity={"gpu": 8}), sub, admission]
    assert fold(log).jobs[sub.job].status == "admitted"
    await kube.delete_pod(pods[1]["metadata"]["name"])
    async with running_adapter(api, state=lambda: fold(log), reconcile_seconds=3600) as (adapter, events):
        result = await adapter.apply(admission)
        assert result.outcome == "skipped", result
        assert await adapter.reconcile() == []  # the Job is there to make its pod again
        [replacement] = await kube.job_pods(job, [1], gpus=1, labels={"muster.dev/queue": "q"})
        names = [pods[0]["metadata"]["name"], replacement["metadata"]["name"]]

        async def bound() -> bool:
            return [await kube.pod_node(n) for n in names] == [n1, n1]

        await eventually(bound)
        assert await adapter.reconcile() == []
    ended_or_new = [e for e in events.of(Event) if type(e).__name__ in ("JobSubmitted", "JobCancelled", "JobFailed")]
    assert not ended_or_new, ended_or_new


async def test_an_admitted_pod_group_whose_podgroup_went_while_no_leader_ran_ends(api: ApiClient, kube: Kube) -> None:
    """A Volcano PodGroup deleted while no leader ran, its bare pods left (no garbage collector): the new leader
    leaves them alone and binds nothing; its reconciliation ends the admitted job WorkloadDeleted."""
    n1 = await kube.node("n1")
    group, pods = await kube.pod_group("sweep", 2, volcano=True, labels={"muster.dev/queue": "q"})
    async with running_adapter(api) as (_, events):
        sub = await submitted(events)
    admission = admitted(sub, n1)
    log: list[Event] = [QUEUE, NodeAdded(at=0, node=NodeName(n1), capacity={"gpu": 8}), sub, admission]
    assert fold(log).jobs[sub.job].status == "admitted"
    await kube.delete_custom(group)
    async with running_adapter(api, state=lambda: fold(log), reconcile_seconds=3600) as (adapter, events):
        assert (await adapter.apply(admission)).outcome == "skipped"
        ended = await eventually(adapter.reconcile)
    assert [(e.job, type(e).__name__) for e in ended] == [(sub.job, "JobCancelled")]
    assert [await kube.pod_node(p["metadata"]["name"]) for p in pods] == ["", ""]


async def test_a_new_leader_binds_a_dead_leaders_admission_once_the_job_controller_remade_a_pod(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """The whole daemon: a leader admitted a Job of 2 and died before binding it; a pod of it was deleted before
    the next leader started. The next leader's term re-applies the admission before the replacement exists; once
    the controller made it, both pods are bound where the log placed them, with no decision of its own."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 0})])
    n1 = await kube.node("n1")
    job, pods = await kube.job("train", 2)
    async with running_daemon(store, api) as loop:  # no quota yet: the gang is submitted and waits
        await eventually(lambda: any(j.status == "pending" for j in loop.state.jobs.values()))
    [sub] = await log_of(store, JobSubmitted)
    epoch = max(e.epoch for e in await log_of(store, LeaderElected))
    placement = {p: NodeName(n1) for p in sub.pods}
    admission = JobAdmitted(at=1, job=sub.job, queue=QueueName("q"), placement=placement, epoch=epoch)
    await store.append([QueueConfigured(at=1, name=QueueName("q"), nominal={"gpu": 8}), admission])
    await kube.delete_pod(pods[1]["metadata"]["name"])
    async with running_daemon(store, api) as loop:
        labels = {"type": "JobAdmitted", "outcome": "skipped"}
        await eventually(lambda: loop.metrics.registry.get_sample_value("muster_applied_decisions_total", labels))
        [replacement] = await kube.job_pods(job, [1], gpus=1, labels={"muster.dev/queue": "q"})
        names = [pods[0]["metadata"]["name"], replacement["metadata"]["name"]]

        async def bound() -> bool:
            return [await kube.pod_node(n) for n in names] == [n1, n1]

        await eventually(bound, seconds=30)
        assert loop.state.jobs[sub.job].status == "admitted"
    on_log = [type(e).__name__ for e in await log_of(store, Event)]
    assert (on_log.count("JobAdmitted"), on_log.count("JobSubmitted")) == (1, 1)
    assert "JobFailed" not in on_log and "JobCancelled" not in on_log
