"""Applying decisions: bindings after admission only, evictions on preemption, idempotent and retried."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest
from adapterkit import eventually
from emulatorkit import admission, pod_object, submit_gang
from kubernetes_asyncio.client import CoreV1Api

from muster.daemon.k8s import Applier
from muster.daemon.k8s import manifests as m
from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.pods import PodInfo, pod_info
from muster.demo.emulator import KubeEmulator
from muster.events.types import (
    Event,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobId,
    JobInadmissible,
    JobPreempted,
    JobSubmitted,
    NodeUpdated,
    QueueName,
)


def requests_to(emulator: KubeEmulator, subresource: str) -> list[Any]:
    return [r for r in emulator if r.subresource == subresource and str(r.method.value) == "POST"]


class FrozenView:
    """A GangView that never learns anything new: pods as they were when it was made (stale on purpose)."""

    def __init__(self, pods: dict[str, PodInfo]) -> None:
        self.pods = pods
        self.failed: list[str] = []

    def pods_of(self, job: JobId) -> dict[str, PodInfo] | None:
        return dict(self.pods)

    def complete(self, job: JobId) -> bool:
        return True

    def ended(self, job: JobId) -> bool:
        return bool(self.failed)

    def evicting(self, job: JobId) -> list[PodInfo]:
        return list(self.pods.values())

    def recreates(self, job: JobId) -> bool:
        return True

    def finished(self, job: JobId) -> set[str]:
        return set()

    def fail(self, job: JobId, reason: str, at: int) -> list[Event]:
        self.failed.append(reason)
        return [JobFailed(at=at, job=job, reason=reason)]

    def forget(self, job: JobId) -> None:
        pass


def frozen_view(emulator: KubeEmulator, sub: JobSubmitted) -> FrozenView:
    return FrozenView({name: pod_info(pod_object(emulator, key) or {}) for name, key in sub.pods.items()})


async def test_bindings_are_created_for_every_pod_only_after_admission(kube, start_adapter):
    """No pod is bound while the gang waits; the admission binds every pod to its decided node."""
    emulator, api = kube
    async with start_adapter(api) as (adapter, events):
        sub = await submit_gang(emulator, api, adapter, events)
        assert requests_to(emulator, "binding") == []
        assert all(not pod_object(emulator, key)["spec"].get("nodeName") for key in sub.pods.values())

        decision = admission(sub, ["n1", "n2"])
        result = await adapter.apply(decision)
        assert (result.ok, result.outcome) == (True, "applied")
        for name, key in sub.pods.items():
            pod = pod_object(emulator, key)
            assert pod["spec"]["nodeName"] == decision.placement[name]
            assert {"type": "PodScheduled", "status": "True"}.items() <= pod["status"]["conditions"][-1].items()
        assert len(requests_to(emulator, "binding")) == 3


async def test_applying_an_admission_twice_is_harmless(kube, start_adapter):
    """A second apply of the same admission, even from a stale view that sends the bindings again, is a no-op."""
    emulator, api = kube
    async with start_adapter(api) as (adapter, events):
        sub = await submit_gang(emulator, api, adapter, events)
        stale = frozen_view(emulator, sub)  # taken before the bindings
        decision = admission(sub, ["n1"])
        assert (await adapter.apply(decision)).outcome == "applied"
        await adapter.caught_up("pods", emulator.resource_version)

        again = await adapter.apply(decision)
        assert (again.ok, again.outcome) == (True, "noop")
        assert len(requests_to(emulator, "binding")) == 3

        replay = await Applier(KubeClient(api), stale).apply(decision)
        assert (replay.ok, replay.outcome) == (True, "noop")
        assert len(requests_to(emulator, "binding")) == 6  # answered 409 "already assigned to node n1"
        assert all(pod_object(emulator, key)["spec"]["nodeName"] == "n1" for key in sub.pods.values())


async def test_binding_a_pod_that_is_on_another_node_is_a_conflict(kube, start_adapter):
    """A decision for n2 about pods already on n1 reports a conflict and moves nothing."""
    emulator, api = kube
    async with start_adapter(api) as (adapter, events):
        sub = await submit_gang(emulator, api, adapter, events)
        stale = frozen_view(emulator, sub)
        await adapter.apply(admission(sub, ["n1"]))
        result = await Applier(KubeClient(api), stale).apply(admission(sub, ["n2"]))
        assert (result.ok, result.outcome) == (False, "conflict")
        assert "on n1" in result.detail
        assert all(pod_object(emulator, key)["spec"]["nodeName"] == "n1" for key in sub.pods.values())


async def test_server_errors_on_binding_are_retried(kube, start_adapter):
    """Two 500s on bindings are retried with backoff; every pod ends up bound."""
    emulator, api = kube
    async with start_adapter(api) as (adapter, events):
        sub = await submit_gang(emulator, api, adapter, events)
        emulator.fail("POST", "pods", "binding", status=500, times=2)
        result = await adapter.apply(admission(sub, ["n1"]))
        assert result.outcome == "applied"
        assert len(requests_to(emulator, "binding")) == 5
        assert all(pod_object(emulator, key)["spec"]["nodeName"] == "n1" for key in sub.pods.values())


async def test_a_pod_deleted_before_binding_from_a_job_still_there_is_replaced_in_its_place(kube, start_adapter):
    """A waiting Job's pod deleted while the Job exists fails nothing: the admission binds the Job controller's
    replacement in its place with the others (before: JobFailed, and its admission bound nothing)."""
    emulator, api = kube
    core = CoreV1Api(api)
    # The admission may wait for the gang as long as it takes: learning that the Job is there must wake it.
    async with start_adapter(api, reconcile_seconds=3600, pod_wait_seconds=3600) as (adapter, events):
        sub = await submit_gang(emulator, api, adapter, events)
        lost = sub.pods["pod-1"]
        await core.delete_namespaced_pod(lost.split("/")[1], "ns", grace_period_seconds=0)
        index = int(lost.split("/")[1].split("-")[1])  # `train-<index>-<random>`, as the Job controller names it
        job = emulator.get_object("batch/v1/jobs", "ns", "train")
        [made] = m.job_pods(job, [index], gpus=1, labels={"muster.dev/queue": "q"})
        await core.create_namespaced_pod("ns", made)
        await adapter.caught_up("pods", emulator.resource_version)

        decision = admission(sub, ["n1"])
        with anyio.fail_after(30):
            await adapter.ready(decision)
        assert (await adapter.apply(decision)).outcome == "applied"
        bound = [key for key in sub.pods.values() if key != lost] + [f"ns/{made['metadata']['name']}"]
        assert [pod_object(emulator, key)["spec"]["nodeName"] for key in bound] == ["n1"] * 3
        assert events.of(JobFailed) == [] and events.of(JobCancelled) == []


@pytest.mark.parametrize("kind", ["job", "pod-group", "pod"])
async def test_a_waiting_workload_deleted_by_its_user_is_cancelled_once(kube, start_adapter, kind):
    """A pending Job (then its pods), pod group or lone pod deleted: one JobCancelled WorkloadDeleted, no JobFailed."""
    emulator, api = kube
    core = CoreV1Api(api)
    async with start_adapter(api, reconcile_seconds=3600) as (adapter, events):
        if kind == "job":
            sub = await submit_gang(emulator, api, adapter, events)
            emulator.remove_object("batch/v1/jobs", "ns", "train")
            reason = "WorkloadDeleted: Job/ns/train is gone"
        else:
            emulator.put_object("v1/nodes", m.node("n1"))
            size = 3 if kind == "pod-group" else 1
            labels = {"muster.dev/queue": "q"}
            if kind == "pod-group":
                labels |= {"muster.dev/gang": "g", "muster.dev/gang-size": str(size)}
            for i in range(size):
                await core.create_namespaced_pod("ns", m.pod(f"p-{i}", "ns", gpus=1, labels=labels))
            await events.wait_for(lambda e: bool(e.of(JobSubmitted)))
            [sub] = events.of(JobSubmitted)
            reason = "WorkloadDeleted: its pods are gone"
        for key in sorted(sub.pods.values()):  # one request a pod, as the garbage collector and kubectl send
            await core.delete_namespaced_pod(key.split("/")[1], "ns", grace_period_seconds=0)
        await events.wait_for(lambda e: bool(e.of(JobCancelled)))
        await adapter.reconcile()
    assert [(c.job, c.reason) for c in events.of(JobCancelled)] == [(sub.job, reason)]
    assert events.of(JobFailed) == []


async def test_a_pod_gone_when_its_binding_is_sent_fails_the_job(kube, start_adapter):
    """A binding answered 404 (the pod vanished under a stale view) ends the job with JobFailed, reported once."""
    emulator, api = kube
    async with start_adapter(api) as (adapter, events):
        sub = await submit_gang(emulator, api, adapter, events)
        stale = frozen_view(emulator, sub)
    ns, name = sub.pods["pod-2"].split("/")
    emulator.remove_object("v1/pods", ns, name)
    applier = Applier(KubeClient(api), stale)
    result = await applier.apply(admission(sub, ["n1"]))
    assert (result.ok, result.outcome) == (False, "failed")
    assert [type(e) for e in result.events] == [JobFailed]
    assert f"{ns}/{name}" in result.events[0].reason
    assert stale.failed == [result.events[0].reason]


async def test_preemption_evicts_every_pod_with_its_grace_period(kube, start_adapter):
    """JobPreempted sends one eviction per pod with the pod's terminationGracePeriodSeconds; no JobFailed follows."""
    emulator, api = kube
    async with start_adapter(api) as (adapter, events):
        sub = await submit_gang(emulator, api, adapter, events, grace_seconds=7)
        await adapter.apply(admission(sub, ["n1", "n2"]))
        await adapter.caught_up("pods", emulator.resource_version)

        preempt = JobPreempted(at=2, job=sub.job, preemptor=None, reason="WithinQueue")
        result = await adapter.apply(preempt)
        assert (result.ok, result.outcome) == (True, "applied")
        evictions = requests_to(emulator, "eviction")
        assert sorted(r.name for r in evictions) == sorted(k.split("/")[1] for k in sub.pods.values())
        assert all(r.data["deleteOptions"]["gracePeriodSeconds"] == 7 for r in evictions)
        for key in sub.pods.values():
            pod = pod_object(emulator, key)
            assert pod["metadata"]["deletionTimestamp"]
            assert any(c["type"] == "DisruptionTarget" for c in pod["status"]["conditions"])

        # Until they are gone, the evicted pods hold their nodes: the log counts them as reserved.
        await adapter.caught_up("pods", emulator.resource_version)
        held = {u.node: u.reserved for u in events.of(NodeUpdated)}
        assert held == {"n1": {"gpu": 2}, "n2": {"gpu": 1}}

        # The kubelets confirm: the pods go away. That was muster's doing, not a failure.
        core = CoreV1Api(api)
        for key in sub.pods.values():
            ns, name = key.split("/")
            await core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        await adapter.caught_up("pods", emulator.resource_version)
        assert events.of(JobFailed) == []
        assert {u.node: u.reserved for u in events.of(NodeUpdated)} == {"n1": {}, "n2": {}}


async def test_eviction_refused_by_a_disruption_budget_is_retried_and_a_gone_pod_is_fine(kube, start_adapter):
    """429 on eviction is retried until accepted; evicting pods that are already gone is a no-op."""
    emulator, api = kube
    async with start_adapter(api) as (adapter, events):
        sub = await submit_gang(emulator, api, adapter, events, size=2, grace_seconds=0)
        await adapter.apply(admission(sub, ["n1"]))
        await adapter.caught_up("pods", emulator.resource_version)
        stale = frozen_view(emulator, sub)

        emulator.fail("POST", "pods", "eviction", status=429, times=2)
        preempt = JobPreempted(at=2, job=sub.job, preemptor=None, reason="ReclaimWithinCohort")
        result = await adapter.apply(preempt)
        assert result.outcome == "applied"
        assert len(requests_to(emulator, "eviction")) == 4
        assert all(pod_object(emulator, key) is None for key in sub.pods.values())  # grace 0: deleted at once

        again = await Applier(KubeClient(api), stale).apply(preempt)
        assert (again.ok, again.outcome) == (True, "noop")


async def test_decisions_that_change_nothing_in_the_cluster_are_skipped(kube, start_adapter):
    """JobInadmissible, and an admission of a job with no pods in this cluster, send nothing."""
    emulator, api = kube
    async with start_adapter(api, pod_wait_seconds=0.1) as (adapter, _):
        waiting = await adapter.apply(JobInadmissible(at=1, job=JobId("x"), reason="quota"))
        elsewhere = await adapter.apply(JobAdmitted(at=1, job=JobId("sim-1"), queue=QueueName("q"), placement={}))
        assert (waiting.outcome, elsewhere.outcome) == ("skipped", "skipped")
        assert requests_to(emulator, "binding") == []


async def test_a_binding_the_server_refuses_says_scheduler_error_on_the_pod(kube, start_adapter):
    """A refused binding (a 409 a real server gives only in a race): PodScheduled=False SchedulerError, a Warning."""
    emulator, api = kube
    async with start_adapter(api, report=True) as (adapter, events):
        sub = await submit_gang(emulator, api, adapter, events, size=2)
        ns, name = sub.pods[sorted(sub.pods)[1]].split("/")
        emulator.fail("POST", "pods", "binding", name=name, status=409, message=f"pod {name} is already assigned")
        result = await adapter.apply(admission(sub, ["n1"]))
        assert result.outcome == "conflict"

        def scheduler_error() -> bool:
            pod = pod_object(emulator, f"{ns}/{name}") or {}
            conditions = pod.get("status", {}).get("conditions", [])
            return any(c["type"] == "PodScheduled" and c.get("reason") == "SchedulerError" for c in conditions)

        def warned() -> bool:
            return any(
                e.get("reason") == "FailedScheduling" and e["involvedObject"]["name"] == name
                for e in emulator.list_objects("v1/events", ns)
            )

        await eventually(scheduler_error)
        await eventually(warned)


async def test_pods_admitted_on_a_tainted_flavor_get_its_tolerations_before_binding(kube, start_adapter):
    """A gang admitted on a flavor with taints has its pods tolerate them, then bound; nodes carrying only
    a flavor's taint stay schedulable."""
    from muster.events.types import FlavorConfigured, NodeAdded, Taint
    from muster.projections.cluster import evolve
    from muster.projections.state import ClusterState

    emulator, api = kube
    state = ClusterState()
    evolve(state, FlavorConfigured(at=0, name="spot", node_labels={"pool": "spot"}, taints=[Taint(key="spot")]))
    emulator.put_object(
        "v1/nodes", m.node("s1", labels={"pool": "spot"}, taints=[{"key": "spot", "effect": "NoSchedule"}])
    )
    async with start_adapter(api, state=lambda: state) as (adapter, events):
        sub = await submit_gang(emulator, api, adapter, events, size=2)
        (s1,) = [e for e in events.of(NodeAdded) if e.node == "s1"]
        assert not s1.unschedulable
        on_spot = {pod.rsplit("-", 1)[0]: {"gpu": "spot"} for pod in sub.pods}
        decision = msgspec.structs.replace(admission(sub, ["s1"]), flavors=on_spot)
        result = await adapter.apply(decision)
        assert (result.ok, result.outcome) == (True, "applied")
        for key in sub.pods.values():
            pod = pod_object(emulator, key)
            assert pod["spec"]["nodeName"] == "s1"
            assert {"key": "spot", "operator": "Equal", "value": "", "effect": "NoSchedule"} in pod["spec"][
                "tolerations"
            ]
