"""A user's cancel (`muster cancel`) stops the job's workload as its kind expects; the adapter's own cancels do not."""

from __future__ import annotations

from typing import Any

from adapterkit import eventually
from emulatorkit import admission, pod_object, submit_gang
from kubernetes_asyncio.client import CoreV1Api
from msgspec import UNSET

from muster.daemon.cancels import USER_CANCEL
from muster.daemon.k8s import manifests as m
from muster.demo.emulator import KubeEmulator
from muster.events.types import ControllerRef, Event, JobCancelled, JobSubmitted, QueueConfigured, QueueName
from muster.projections.cluster import fold


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


TRAINER = {"apiVersion": "example.com/v1", "kind": "Trainer", "name": "g", "uid": "u-g", "controller": True}
"""The controller of pod group g (an operator of the user's own kind): it makes the group's pods again when they go."""
GROUP = {"muster.dev/gang": "g", "muster.dev/gang-size": "2", "muster.dev/queue": "q"}


def controlled_pod(name: str, owner: dict[str, Any] = TRAINER) -> dict[str, Any]:
    return m.pod(name, "ns", gpus=1, labels=GROUP, owner=owner, grace_seconds=0)


def admitted_status(emulator: KubeEmulator, name: str) -> str:
    """The reason of a pod's `muster.dev/Admitted` condition ("" for none)."""
    pod = pod_object(emulator, f"ns/{name}") or {}
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c["reason"] for c in conditions if c.get("type") == "muster.dev/Admitted"), "")


async def test_a_cancelled_controlled_pod_group_is_not_run_again_by_its_controller(kube, start_adapter):
    """After `muster cancel`, the pods a pod group's controller makes again are left unbound and told why (no
    new job), by this adapter and by the next leader's; a controller made again (a new uid) runs again."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1"))
    for name in ("g-0", "g-1"):
        emulator.put_object("v1/pods", controlled_pod(name))
    log: list[Event] = [QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})]
    async with start_adapter(api, state=lambda: fold(log), report=True) as (adapter, events):
        await events.wait_for(lambda e: bool(e.of(JobSubmitted)))
        [sub] = events.of(JobSubmitted)
        assert sub.controller == ControllerRef(
            api_version="example.com/v1", kind="Trainer", namespace="ns", name="g", uid="u-g"
        )
        admitted = admission(sub, ["n1"])
        log += [sub, admitted]
        assert (await adapter.apply(admitted)).ok
        cancel = JobCancelled(at=3, job=sub.job, reason=f"{USER_CANCEL} stop it")
        log.append(cancel)
        assert (await adapter.apply(cancel)).detail == "deleted 2 pod(s)"
        for name in ("g-0", "g-1"):  # the operator makes them again
            emulator.put_object("v1/pods", controlled_pod(name))
        await eventually(lambda: all(admitted_status(emulator, n) == "Cancelled" for n in ("g-0", "g-1")))
        assert events.of(JobSubmitted) == [sub]
    async with start_adapter(api, state=lambda: fold(log)) as (adapter, events):  # a new leader
        await adapter.caught_up("pods", emulator.resource_version)
        assert not events.of(JobSubmitted)
        assert all(not (pod_object(emulator, f"ns/{n}") or {})["spec"].get("nodeName") for n in ("g-0", "g-1"))
        for name in ("g-0", "g-1"):  # the user deletes the Trainer and makes it again; its pods come
            emulator.remove_object("v1/pods", "ns", name)
        for name in ("g-0", "g-1"):
            emulator.put_object("v1/pods", controlled_pod(name, TRAINER | {"uid": "u-g2"}))
        await events.wait_for(lambda e: bool(e.of(JobSubmitted)))
        [again] = events.of(JobSubmitted)
        assert again.job != sub.job and again.controller is not UNSET and again.controller.uid == "u-g2"
