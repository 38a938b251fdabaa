"""Feedback where users look, on a real API server: Events on pods and workloads, PodScheduled on waiting pods.

`kubectl describe pod` shows a pod's Events and conditions; these tests read the same objects.
"""

from __future__ import annotations

from typing import Any

import anyio
from kubekit import Kube, eventually, running_adapter, running_daemon
from kubernetes_asyncio.client import ApiClient

from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.reporting import Report, Reporter, Target
from muster.events.store import EventStore
from muster.events.types import JobAdmitted, JobPreempted, JobSubmitted, NodeName, QueueConfigured, QueueName


async def events_of(kube: Kube, kind: str, name: str) -> list[dict[str, Any]]:
    """The Events about one object, as `kubectl describe` lists them."""
    listed = await kube.core.list_namespaced_event(
        kube.ns, field_selector=f"involvedObject.kind={kind},involvedObject.name={name}"
    )
    return [kube.api.sanitize_for_serialization(e) for e in listed.items]


async def reasons(kube: Kube, kind: str, name: str) -> set[str]:
    return {e["reason"] for e in await events_of(kube, kind, name)}


async def scheduled_condition(kube: Kube, pod: str) -> dict[str, Any] | None:
    obj = await kube.get_pod(pod)
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled":
            return dict(c)
    return None


async def test_a_waiting_gang_says_why_on_its_pods_and_job_and_its_admission_says_where(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """A gang too big for the cluster: Waiting with the core's reason, PodScheduled=False; then Admitted with nodes."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 64})])
    await kube.node("n1", gpus=8)
    _, pods = await kube.job("big", 2, gpus=8)
    names = [p["metadata"]["name"] for p in pods]
    async with running_daemon(store, api):
        condition = await eventually(lambda: scheduled_condition(kube, names[0]))
        assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
        assert condition["message"].startswith("muster: ")
        for name in names:
            [waiting] = [e for e in await events_of(kube, "Pod", name) if e["reason"] == "Waiting"]
            assert waiting["message"] == condition["message"] and waiting["source"]["component"] == "muster"
        await eventually(lambda: _has(kube, "Job", "big", "Waiting"))

        second = await kube.node("n2", gpus=8)
        await eventually(lambda: _has(kube, "Job", "big", "Admitted"))
        for name in names:
            await eventually(lambda name=name: _has(kube, "Pod", name, "Admitted"))
        [admitted] = [e for e in await events_of(kube, "Job", "big") if e["reason"] == "Admitted"]
        assert kube.node_name("n1") in admitted["message"] and second in admitted["message"]
        # bound: the binding itself turned the condition True
        assert (await scheduled_condition(kube, names[0]) or {}).get("status") == "True"


async def _has(kube: Kube, kind: str, name: str, reason: str) -> bool:
    return reason in await reasons(kube, kind, name)


async def test_a_preempted_gang_is_told_by_whom_and_why(api: ApiClient, kube: Kube) -> None:
    """Evicted pods and their Job get a Warning Preempted naming the reason and the preemptor."""
    node = await kube.node("n1")
    await kube.job("victim", 1)
    async with running_adapter(api) as (adapter, events):
        await events.wait_for(lambda e: bool(e.of(JobSubmitted)))
        [sub] = events.of(JobSubmitted)
        placement = {p: NodeName(node) for p in sub.pods}
        assert (await adapter.apply(JobAdmitted(at=1, job=sub.job, queue=QueueName("q"), placement=placement))).ok
        preempt = JobPreempted(at=2, job=sub.job, preemptor="ns/job/boss-1", reason="WithinQueue")
        assert (await adapter.apply(preempt)).ok
        await eventually(lambda: _has(kube, "Job", "victim", "Preempted"))
    [event] = [e for e in await events_of(kube, "Job", "victim") if e["reason"] == "Preempted"]
    assert event["type"] == "Warning"
    assert "WithinQueue" in event["message"] and "ns/job/boss-1" in event["message"]


async def test_the_same_report_twice_is_one_event_counted_twice(api: ApiClient, kube: Kube) -> None:
    """Reports aggregate as client-go's correlator does: same object, reason and message: one Event, count 2."""
    pod = await kube.pod("p", gpus=1)
    target = Target("v1", "Pod", kube.ns, "p", pod["metadata"]["uid"])
    reporter = Reporter(KubeClient(api))
    async with anyio.create_task_group() as tg:
        await tg.start(reporter.run)
        reporter.report([Report(target, "Normal", "Waiting", "muster: no room")])
        await eventually(lambda: reporter.written == 1)
        reporter.report([Report(target, "Normal", "Waiting", "muster: no room")])
        await eventually(lambda: reporter.written == 2)
        tg.cancel_scope.cancel()
    [event] = await events_of(kube, "Pod", "p")
    assert event["count"] == 2
