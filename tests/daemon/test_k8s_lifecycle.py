"""A gang's life in the cluster, with the simulated kubelet: started, finished, failed, deleted, preempted."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
from adapterkit import eventually
from kubernetes_asyncio.client import ApiClient, CoreV1Api

from muster.daemon.k8s import manifests as m
from muster.demo.emulator import KubeEmulator
from muster.demo.kubelet_sim import OUTCOME_ANNOTATION, SimulatedKubelet
from muster.events.types import (
    Event,
    JobAdmitted,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    NodeName,
    NodeUpdated,
    QueueConfigured,
    QueueName,
)
from muster.projections.cluster import fold


@contextlib.asynccontextmanager
async def kubelet(api: ApiClient, speed: float = 20.0) -> AsyncIterator[SimulatedKubelet]:
    sim = SimulatedKubelet(api, speed=speed)
    async with anyio.create_task_group() as tg:
        await tg.start(sim.run)
        yield sim
        tg.cancel_scope.cancel()


async def gang(emulator: KubeEmulator, api: ApiClient, events: Any, name: str, **pod_args: Any) -> JobSubmitted:
    """A Job of two 1-GPU pods on node n1's cluster; returns its JobSubmitted."""
    emulator.put_object("v1/nodes", m.node("n1"))
    job = m.job(name, "ns", parallelism=2)
    emulator.put_object("batch/v1/jobs", job)
    core = CoreV1Api(api)
    for pod in m.job_pods(job, gpus=1, labels={"muster.dev/queue": "q"}, **pod_args):
        await core.create_namespaced_pod("ns", pod)
    await events.wait_for(lambda e: any(s.source == f"Job/ns/{name}" for s in e.of(JobSubmitted)))
    return next(s for s in events.of(JobSubmitted) if s.source == f"Job/ns/{name}")


def admit(sub: JobSubmitted) -> JobAdmitted:
    return JobAdmitted(at=1, job=sub.job, queue=QueueName("q"), placement={p: NodeName("n1") for p in sub.pods})


async def test_an_admitted_gang_starts_then_finishes(kube, start_adapter):
    """Bound pods run (one JobStarted once all run) and succeed after their runtime (one JobFinished)."""
    emulator, api = kube
    async with start_adapter(api) as (adapter, events), kubelet(api) as sim:
        sub = await gang(emulator, api, events, "ok", annotations={"muster.dev/runtime": "2"})
        await adapter.caught_up("pods", emulator.resource_version)
        assert sim.started_pods == 0  # nothing runs unbound

        await adapter.apply(admit(sub))
        await events.wait_for(lambda e: len(e.of(JobFinished)) == 1)
        assert [type(e).__name__ for e in events.events if getattr(e, "job", None) == sub.job] == [
            "JobSubmitted",
            "JobStarted",
            "JobFinished",
        ]
        assert sim.ended_pods == 2


async def test_a_failed_pod_fails_the_gang(kube, start_adapter):
    """When a pod of a running gang fails, the job gets one JobFailed that names the pod."""
    emulator, api = kube
    async with start_adapter(api) as (adapter, events), kubelet(api):
        annotations = {"muster.dev/runtime": "1", OUTCOME_ANNOTATION: "Failed"}
        sub = await gang(emulator, api, events, "crash", annotations=annotations)
        await adapter.apply(admit(sub))
        await events.wait_for(lambda e: len(e.of(JobFailed)) == 1)
        [failed] = events.of(JobFailed)
        assert failed.job == sub.job
        assert "failed" in failed.reason and "exited with 1" in failed.reason
        assert events.of(JobFinished) == []


async def test_a_running_pod_deleted_by_someone_else_fails_a_gang_nothing_recreates(kube, start_adapter):
    """A user deleting a pod of a running pod group (no controller) ends its job JobFailed 'deleted while running'."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1"))
    core = CoreV1Api(api)
    labels = {"muster.dev/queue": "q", "muster.dev/gang": "victim", "muster.dev/gang-size": "2"}
    async with start_adapter(api) as (adapter, events), kubelet(api):
        for i in range(2):
            await core.create_namespaced_pod("ns", m.pod(f"victim-{i}", "ns", gpus=1, labels=labels))
        await events.wait_for(lambda e: bool(e.of(JobSubmitted)))
        [sub] = events.of(JobSubmitted)
        await adapter.apply(admit(sub))
        await events.wait_for(lambda e: len(e.of(JobStarted)) == 1)
        ns, name = sub.pods["pod-0"].split("/")
        await core.delete_namespaced_pod(name, ns)  # graceful: the kubelet confirms
        await events.wait_for(lambda e: len(e.of(JobFailed)) == 1)
        assert events.of(JobFailed)[0].reason == f"pod {ns}/{name} was deleted while running on n1"


async def test_a_running_jobs_pod_deleted_by_someone_else_is_replaced_on_its_node(kube, start_adapter):
    """A user deleting a pod of a running Job fails nothing: the Job controller's replacement is bound on the
    deleted pod's node in the admitted gang and runs (before: JobFailed, and the replacement waited unbound)."""
    emulator, api = kube
    core = CoreV1Api(api)
    log: list[Event] = [QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})]
    async with start_adapter(api, state=lambda: fold(log), reconcile_seconds=3600) as (adapter, events), kubelet(api):
        sub = await gang(emulator, api, events, "victim")
        log += [*events.events, admit(sub)]  # the log the adapter binds the replacement by: the slot's node
        await adapter.apply(admit(sub))
        await events.wait_for(lambda e: len(e.of(JobStarted)) == 1)
        ns, name = sub.pods["pod-0"].split("/")
        await core.delete_namespaced_pod(name, ns)  # graceful: the kubelet confirms
        await eventually(lambda: emulator.get_object("v1/pods", ns, name) is None)
        job = emulator.get_object("batch/v1/jobs", "ns", "victim")
        [made] = m.job_pods(job, [int(name.split("-")[1])], gpus=1, labels={"muster.dev/queue": "q"})
        await core.create_namespaced_pod("ns", made)

        def running() -> bool:
            pod = emulator.get_object("v1/pods", "ns", made["metadata"]["name"]) or {}
            return pod.get("spec", {}).get("nodeName") == "n1" and pod.get("status", {}).get("phase") == "Running"

        await eventually(running)
        await adapter.reconcile()  # a pass after it finds nothing to say
        assert events.of(JobFailed) == [] and len(events.of(JobStarted)) == 1


async def test_a_preempted_gang_waits_for_replacement_pods_and_runs_again(kube, start_adapter):
    """Evicted pods report no failure; the Job's replacement pods fill the same gang and bind on re-admission."""
    emulator, api = kube
    async with start_adapter(api) as (adapter, events), kubelet(api):
        sub = await gang(emulator, api, events, "elastic", grace_seconds=0)
        await adapter.apply(admit(sub))
        await events.wait_for(lambda e: len(e.of(JobStarted)) == 1)

        result = await adapter.apply(JobPreempted(at=2, job=sub.job, preemptor=None, reason="FairSharing"))
        assert result.outcome == "applied"
        core = CoreV1Api(api)
        assert (await core.list_namespaced_pod("ns")).items == []  # grace 0: evicted pods go at once

        # The Job controller creates replacements with new names.
        job = emulator.get_object("batch/v1/jobs", "ns", "elastic")
        replacements = m.job_pods(job, gpus=1, labels={"muster.dev/queue": "q"})
        for pod in replacements:
            await core.create_namespaced_pod("ns", pod)
        await adapter.caught_up("pods", emulator.resource_version)

        again = await adapter.apply(admit(sub))
        assert again.outcome == "applied"
        assert sorted(again.pods) == sorted(f"ns/{p['metadata']['name']}" for p in replacements)
        await events.wait_for(lambda e: len(e.of(JobStarted)) == 2)
        assert events.of(JobFailed) == []
        assert len(events.of(JobSubmitted)) == 1


async def test_the_survivors_of_a_failed_gang_hold_their_node_until_they_end(kube, start_adapter):
    """After JobFailed the log no longer counts the gang, so its still-running pods are reserved on their node."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1"))
    group = {"muster.dev/gang": "pair", "muster.dev/gang-size": "2", "muster.dev/queue": "q"}
    crash = {"muster.dev/runtime": "1", OUTCOME_ANNOTATION: "Failed"}
    core = CoreV1Api(api)
    async with start_adapter(api) as (adapter, events), kubelet(api):
        await core.create_namespaced_pod("ns", m.pod("pair-0", "ns", gpus=2, labels=group, annotations=crash))
        await core.create_namespaced_pod("ns", m.pod("pair-1", "ns", gpus=3, labels=group))
        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 1)
        [sub] = events.of(JobSubmitted)
        await adapter.apply(admit(sub))
        await events.wait_for(lambda e: len(e.of(JobFailed)) == 1)
        await events.wait_for(lambda e: any(u.reserved == {"gpu": 3} for u in e.of(NodeUpdated)))

        await core.delete_namespaced_pod("pair-1", "ns", grace_period_seconds=0)
        await events.wait_for(lambda e: e.of(NodeUpdated)[-1].reserved == {})
