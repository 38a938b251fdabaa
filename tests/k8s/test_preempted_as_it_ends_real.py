"""A Job preempted as its run ends, on a real kube-apiserver: a pod that succeeded before its eviction is done.

The emulator tier (`tests/daemon/test_k8s_preempted_as_it_ends.py`) also holds the race the demo showed (a
pod that succeeds while its eviction is on its way); here the server's own eviction of a succeeded pod.
"""

from __future__ import annotations

from kubekit import Kube, admitted, eventually, replacement_finishes, running_adapter, started, submitted
from kubernetes_asyncio.client import ApiClient

from muster.events.types import JobFailed, JobFinished, JobPreempted


async def test_a_job_preempted_after_one_pod_succeeded_binds_only_the_replacement_of_the_other(
    api: ApiClient, kube: Kube
) -> None:
    """The succeeded pod's slot stays done (the eviction leaves that pod): the Job's one replacement is bound on
    re-admission, and the job finishes when it succeeds (before: the gang waited for two replacements and failed
    "pods gone")."""
    node = await kube.node("n1")
    job, pods = await kube.job("train", 2)
    first, last = sorted(p["metadata"]["name"] for p in pods)
    async with running_adapter(api, pod_wait_seconds=2) as (adapter, events):
        sub = await submitted(events)
        await started(adapter, events, kube, sub, node)
        await kube.set_phase(first, "Succeeded")
        await eventually(lambda: adapter.translator.gangs.pod(f"{kube.ns}/{first}").phase == "Succeeded")  # type: ignore[union-attr]

        assert (await adapter.apply(JobPreempted(at=2, job=sub.job, preemptor=None, reason="WithinQueue"))).ok
        await eventually(lambda: kube.gone(last))
        assert await kube.pod_node(first) == node  # left in place: its work is done, and a new leader reads it
        [made] = await kube.job_pods(job, [1], gpus=1, labels={"muster.dev/queue": "q"})  # index 1 only
        replacement = made["metadata"]["name"]
        await eventually(lambda: adapter.translator.gangs.complete(sub.job))
        await replacement_finishes(adapter, events, kube, admitted(sub, node), replacement)
    assert not events.of(JobFailed)


async def terminating(kube: Kube, *names: str) -> bool:
    """Whether every pod named has its deletion on its way (an eviction with a grace period, no kubelet to end it)."""
    for name in names:
        pod = await kube.get_pod(name)
        if pod is None or not pod["metadata"].get("deletionTimestamp"):
            return False
    return True


async def test_a_pod_that_succeeds_in_its_evictions_grace_period_leaves_its_slot_done(
    api: ApiClient, kube: Kube
) -> None:
    """A pod evicted with a grace period that exits with success before it is gone is counted finished: the
    re-admission binds the one replacement the Job controller makes (before: the gang waited for two and the
    re-admission failed "pods gone before binding")."""
    node = await kube.node("n1")
    job, pods = await kube.job("train", 2, grace_seconds=30)
    first, last = sorted(p["metadata"]["name"] for p in pods)
    async with running_adapter(api, pod_wait_seconds=2) as (adapter, events):
        sub = await submitted(events)
        await started(adapter, events, kube, sub, node)

        assert (await adapter.apply(JobPreempted(at=2, job=sub.job, preemptor=None, reason="WithinQueue"))).ok
        await eventually(lambda: terminating(kube, first, last))
        await kube.set_phase(first, "Succeeded")  # it finished in its grace period
        await eventually(lambda: adapter.translator.gangs.pod(f"{kube.ns}/{first}").phase == "Succeeded")  # type: ignore[union-attr]
        for name in (first, last):  # the kubelet confirms both deletions
            await kube.delete_pod(name)
        [made] = await kube.job_pods(job, [1], gpus=1, labels={"muster.dev/queue": "q"})  # index 1 only
        replacement = made["metadata"]["name"]
        await eventually(lambda: adapter.translator.gangs.complete(sub.job))
        await replacement_finishes(adapter, events, kube, admitted(sub, node), replacement)
    assert not events.of(JobFailed)


async def test_a_job_whose_pods_all_succeed_in_their_evictions_grace_period_finishes(
    api: ApiClient, kube: Kube
) -> None:
    """Every pod of a preempted Job exits with success before its eviction's grace period ends: the job ends
    JobFinished and its re-admission binds nothing (before: it waited for replacements that never came)."""
    node = await kube.node("n1")
    _, pods = await kube.job("train", 2, grace_seconds=30)
    names = sorted(p["metadata"]["name"] for p in pods)
    async with running_adapter(api, pod_wait_seconds=2) as (adapter, events):
        sub = await submitted(events)
        await started(adapter, events, kube, sub, node)

        assert (await adapter.apply(JobPreempted(at=2, job=sub.job, preemptor=None, reason="WithinQueue"))).ok
        await eventually(lambda: terminating(kube, *names))
        for name in names:
            await kube.set_phase(name, "Succeeded")
        await events.wait_for(lambda e: bool(e.of(JobFinished)))
        for name in names:
            await kube.delete_pod(name)
        assert (await adapter.apply(admitted(sub, node))).outcome == "skipped"
    assert not events.of(JobFailed)
