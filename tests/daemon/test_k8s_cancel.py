"""A user's cancel (`muster cancel`) stops the job's workload as its kind expects; the adapter's own cancels do not."""

from __future__ import annotations

from emulatorkit import admission, pod_object, submit_gang
from kubernetes_asyncio.client import CoreV1Api

from muster.daemon.k8s import manifests as m
from muster.events.types import JobCancelled, JobSubmitted


async def test_a_cancelled_job_is_suspended_and_keeps_its_object(kube, start_adapter):
    """Cancelling a running Job patches `spec.suspend: true` on it; its pods are left to the Job controller."""
    emulator, api = kube
    async with start_adapter(api) as (adapter, events):
        sub = await submit_gang(emulator, api, adapter, events)
        assert (await adapter.apply(admission(sub, ["n1", "n2"]))).outcome == "applied"
        done = await adapter.apply(JobCancelled(at=2, job=sub.job, reason="Cancelled: by muster cancel"))
        assert (done.outcome, done.detail) == ("applied", "suspended Job/ns/train")
        job = emulator.get_object("batch/v1/jobs", "ns", "train")
        assert job is not None and job["spec"]["suspend"] is True
        assert all(pod_object(emulator, key) is not None for key in sub.pods.values())
        again = await adapter.apply(JobCancelled(at=3, job=sub.job, reason="Cancelled: by muster cancel"))
        assert again.ok


async def test_a_cancelled_pod_group_loses_its_pods(kube, start_adapter):
    """A labelled pod group has no owner to suspend: cancelling it deletes its pods."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1"))
    core = CoreV1Api(api)
    async with start_adapter(api) as (adapter, events):
        for i in range(2):
            labels = {"muster.dev/queue": "q", "muster.dev/gang": "g", "muster.dev/gang-size": "2"}
            await core.create_namespaced_pod("ns", m.pod(f"g-{i}", "ns", gpus=1, labels=labels))
        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 1)
        [sub] = events.of(JobSubmitted)
        done = await adapter.apply(JobCancelled(at=2, job=sub.job, reason="Cancelled: wrong data"))
        assert (done.outcome, done.detail) == ("applied", "deleted 2 pod(s)")
        assert all(pod_object(emulator, key) is None for key in sub.pods.values())


async def test_the_adapters_own_cancellation_changes_nothing(kube, start_adapter):
    """A `WorkloadDeleted` cancellation (the workload is already gone) sends nothing to the cluster."""
    emulator, api = kube
    async with start_adapter(api) as (adapter, events):
        sub = await submit_gang(emulator, api, adapter, events)
        done = await adapter.apply(JobCancelled(at=2, job=sub.job, reason="WorkloadDeleted: Job ns/train is gone"))
        assert done.outcome == "skipped"
        job = emulator.get_object("batch/v1/jobs", "ns", "train")
        assert job is not None and not job["spec"].get("suspend")
