"""A Job preempted after one pod succeeded, then a leader change before its re-admission is bound (real API server).

The leader that evicted it knew the succeeded pod's slot was done (`Gang.finished`); the next leader knows only
the log and the cluster. The emulator tier: tests/daemon/test_k8s_preempted_as_it_ends.py.
"""

from __future__ import annotations

from kubekit import (
    Kube,
    admitted,
    eventually,
    log_of,
    replacement_finishes,
    running_adapter,
    running_daemon,
    started,
    submitted,
)
from kubernetes_asyncio.client import ApiClient

from muster.events.store import EventStore
from muster.events.types import (
    Event,
    JobFailed,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    LeaderElected,
    NodeAdded,
    NodeName,
    QueueConfigured,
    QueueName,
)
from muster.projections.cluster import fold

QUEUE = QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})


async def test_a_new_leader_binds_only_the_replacement_of_a_preempted_jobs_unfinished_pod(
    api: ApiClient, kube: Kube
) -> None:
    """The old leader evicted a Job of 2 one pod of which had succeeded; the next leader's adapter binds the
    re-admission (on another node) onto the one replacement the Job controller made, and the job finishes when
    it succeeds (before: the evicted pod was gone, the gang never whole, the job held its quota for ever)."""
    n1, n2 = await kube.node("n1"), await kube.node("n2")
    job, pods = await kube.job("train", 2)
    first, last = sorted(p["metadata"]["name"] for p in pods)
    async with running_adapter(api, pod_wait_seconds=2) as (adapter, events):  # the old leader
        sub = await submitted(events)
        await started(adapter, events, kube, sub, n1)
        await kube.set_phase(first, "Succeeded")
        await eventually(lambda: adapter.translator.gangs.pod(f"{kube.ns}/{first}").phase == "Succeeded")  # type: ignore[union-attr]
        preempted = JobPreempted(at=2, job=sub.job, preemptor=None, reason="WithinQueue")
        assert (await adapter.apply(preempted)).ok
        await eventually(lambda: kube.gone(last))
    [made] = await kube.job_pods(job, [1], gpus=1, labels={"muster.dev/queue": "q"})  # index 1 only
    replacement = made["metadata"]["name"]
    nodes = [NodeAdded(at=0, node=NodeName(n), capacity={"gpu": 8}) for n in (n1, n2)]
    log: list[Event] = [QUEUE, *nodes, sub, admitted(sub, n1), JobStarted(at=1, job=sub.job), preempted]
    again = admitted(sub, n2, at=3)  # elsewhere: the succeeded pod on n1 is not on its slot's node
    log.append(again)
    assert fold(log).jobs[sub.job].status == "admitted"
    async with running_adapter(api, state=lambda: fold(log), pod_wait_seconds=2) as (adapter, events):
        await eventually(lambda: adapter.translator.gangs.complete(sub.job))  # once its Job is read
        await replacement_finishes(adapter, events, kube, again, replacement)
    assert not events.of(JobFailed)


async def test_the_next_leader_readmits_a_preempted_job_and_binds_only_its_unfinished_slot(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """The whole daemon: a leader ran a Job of 2, one pod succeeded, the job was preempted and evicted, and the
    leader died; the next leader re-admits it and binds the Job controller's one replacement; the job finishes."""
    await store.append([QUEUE])
    n1 = await kube.node("n1")
    job, pods = await kube.job("train", 2)
    first, last = sorted(p["metadata"]["name"] for p in pods)

    async def on_n1(*names: str) -> bool:
        return [await kube.pod_node(n) for n in names] == [n1] * len(names)

    async with running_daemon(store, api) as loop:  # the first leader admits and binds it
        await eventually(lambda: on_n1(first, last), seconds=30)
        for name in (first, last):
            await kube.set_phase(name, "Running")
        await eventually(lambda: any(j.started_at is not None for j in loop.state.jobs.values()))
        await kube.set_phase(first, "Succeeded")
    [sub] = await log_of(store, JobSubmitted)
    epoch = max(e.epoch for e in await log_of(store, LeaderElected))
    preempted = JobPreempted(at=5, job=sub.job, preemptor=None, reason="WithinQueue", epoch=epoch)
    on_log = [s.event for s in await store.read()]
    async with running_adapter(api, state=lambda: fold(on_log)) as (adapter, _):  # its last decision, applied
        await eventually(lambda: adapter.translator.gangs.pod(f"{kube.ns}/{first}").phase == "Succeeded")  # type: ignore[union-attr]
        assert (await adapter.apply(preempted)).ok
        await store.append([preempted])
        await eventually(lambda: kube.gone(last))
    [made] = await kube.job_pods(job, [1], gpus=1, labels={"muster.dev/queue": "q"})  # index 1 only
    replacement = made["metadata"]["name"]

    assert [e.run for e in await log_of(store, JobStarted)] == [0]
    async with running_daemon(store, api) as loop:  # the next leader
        await eventually(lambda: on_n1(replacement), seconds=30)
        await kube.set_phase(replacement, "Running")
        await eventually(lambda: loop.state.jobs[sub.job].started_at is not None)
        await kube.set_phase(replacement, "Succeeded")
        await eventually(lambda: loop.state.jobs[sub.job].status == "finished")
    ended = [type(e).__name__ for e in await log_of(store, Event) if type(e).__name__ in ("JobFailed", "JobFinished")]
    assert ended == ["JobFinished"]
    # each run's start is on the log once, the second one even within the first one's second
    assert [e.run for e in await log_of(store, JobStarted)] == [0, 1]


async def test_a_new_leader_counts_a_finished_slot_whose_pod_is_gone_by_the_jobs_succeeded_pods(
    api: ApiClient, kube: Kube
) -> None:
    """The pod that succeeded is gone too (evicted before the old leader saw it succeed, or it succeeded in its
    grace period): the next leader reads the Job, whose status counts it succeeded, binds the re-admission onto
    the one replacement, and the job finishes (before: the gang was never whole and the job held its quota)."""
    n1 = await kube.node("n1")
    job, pods = await kube.job("train", 2)
    first, last = sorted(p["metadata"]["name"] for p in pods)
    async with running_adapter(api, pod_wait_seconds=2) as (adapter, events):  # the old leader
        sub = await submitted(events)
        await started(adapter, events, kube, sub, n1)
        preempted = JobPreempted(at=2, job=sub.job, preemptor=None, reason="WithinQueue")
        assert (await adapter.apply(preempted)).ok
        await eventually(lambda: kube.gone(first, last))
    await kube.set_job_status(job, {"succeeded": 1})  # the Job controller counted the first one succeeded
    [made] = await kube.job_pods(job, [1], gpus=1, labels={"muster.dev/queue": "q"})  # index 1 only
    node = NodeAdded(at=0, node=NodeName(n1), capacity={"gpu": 8})
    log: list[Event] = [QUEUE, node, sub, admitted(sub, n1), JobStarted(at=1, job=sub.job), preempted]
    again = admitted(sub, n1, at=3)
    log.append(again)
    async with running_adapter(api, state=lambda: fold(log), pod_wait_seconds=2) as (adapter, events):
        await eventually(lambda: adapter.translator.gangs.complete(sub.job))
        await replacement_finishes(adapter, events, kube, again, made["metadata"]["name"])
    assert not events.of(JobFailed)
