"""A Job preempted as its run ends, on a real kube-apiserver: a pod that succeeded before its eviction is done.

The emulator tier (`tests/daemon/test_k8s_preempted_as_it_ends.py`) also holds the race the demo showed (a
pod that succeeds while its eviction is on its way); here the server's own eviction of a succeeded pod.
"""

from __future__ import annotations

from kubekit import Kube, admitted, eventually, running_adapter
from kubernetes_asyncio.client import ApiClient

from muster.events.types import JobFailed, JobFinished, JobPreempted, JobStarted, JobSubmitted


async def test_a_job_preempted_after_one_pod_succeeded_binds_only_the_replacement_of_the_other(
    api: ApiClient, kube: Kube
) -> None:
    """The succeeded pod's slot stays done: the Job's one replacement is bound on re-admission, and the job
    finishes when it succeeds (before: the gang waited for two replacements and failed "pods gone")."""
    node = await kube.node("n1")
    job, pods = await kube.job("train", 2)
    first, last = sorted(p["metadata"]["name"] for p in pods)
    async with running_adapter(api, pod_wait_seconds=2) as (adapter, events):
        await events.wait_for(lambda e: bool(e.of(JobSubmitted)))
        [sub] = events.of(JobSubmitted)
        assert (await adapter.apply(admitted(sub, node))).outcome == "applied"
        for name in (first, last):
            await kube.set_phase(name, "Running")
        await events.wait_for(lambda e: len(e.of(JobStarted)) == 1)
        await kube.set_phase(first, "Succeeded")
        await eventually(lambda: adapter.translator.gangs.pod(f"{kube.ns}/{first}").phase == "Succeeded")  # type: ignore[union-attr]

        assert (await adapter.apply(JobPreempted(at=2, job=sub.job, preemptor=None, reason="WithinQueue"))).ok
        await eventually(lambda: kube.gone(first, last))
        [made] = await kube.job_pods(job, [1], gpus=1, labels={"muster.dev/queue": "q"})  # index 1 only
        replacement = made["metadata"]["name"]
        await eventually(lambda: adapter.translator.gangs.complete(sub.job))

        again = await adapter.apply(admitted(sub, node))
        assert (again.outcome, sorted(again.pods)) == ("applied", [f"{kube.ns}/{replacement}"]), again
        await kube.set_phase(replacement, "Running")
        await events.wait_for(lambda e: len(e.of(JobStarted)) == 2)
        await kube.set_phase(replacement, "Succeeded")
        await events.wait_for(lambda e: bool(e.of(JobFinished)))
    assert not events.of(JobFailed)
