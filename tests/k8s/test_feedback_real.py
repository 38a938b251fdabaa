"""Feedback where users look, on a real API server: Events on pods and workloads, PodScheduled on waiting pods.

`kubectl describe pod` shows a pod's Events and conditions; these tests read the same objects.
"""

from __future__ import annotations

from typing import Any

import anyio
from kubekit import Kube, admitted, eventually, log_of, running_adapter, running_daemon, submitted
from kubernetes_asyncio.client import ApiClient

from muster.daemon.k8s import manifests as m
from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.reporting import Report, Reporter, Target
from muster.events.store import EventStore
from muster.events.types import (
    CohortConfigured,
    CohortName,
    JobInadmissible,
    JobPreempted,
    JobSubmitted,
    PreemptionPolicy,
    QueueConfigured,
    QueueName,
)


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
        for name in names:  # each pod's report is written on its own
            await eventually(lambda name=name: _has(kube, "Pod", name, "Waiting"))
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
        sub = await submitted(events)
        assert (await adapter.apply(admitted(sub, node))).ok
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


async def annotations(kube: Kube, job: str) -> dict[str, str]:
    obj = await kube.batch.read_namespaced_job(job, kube.ns)
    return dict(obj.metadata.annotations or {})


async def test_a_jobs_status_is_annotated_on_it_when_it_changes_and_only_then(api: ApiClient, kube: Kube) -> None:
    """Pending with the core's reason, the same reason again writes nothing, then Admitted, then Preempted."""
    node = await kube.node("n1")
    await kube.job("train", 2)
    async with running_adapter(api) as (adapter, events):
        sub = await submitted(events)
        waiting = JobInadmissible(at=1, job=sub.job, reason="needs 2 gpu, 0 free in queue q")
        await adapter.apply(waiting)
        notes = await eventually(lambda: _status(kube, "train", "Pending"))
        assert notes["muster.dev/status-message"] == "muster: needs 2 gpu, 0 free in queue q"
        version = (await kube.batch.read_namespaced_job("train", kube.ns)).metadata.resource_version
        assert adapter.reporter is not None
        written = adapter.reporter.written
        await adapter.apply(waiting)  # the core says it once; a second time (a new leader) changes nothing
        await eventually(lambda: adapter.reporter.written >= written + 3)  # type: ignore[union-attr]
        assert (await kube.batch.read_namespaced_job("train", kube.ns)).metadata.resource_version == version

        assert (await adapter.apply(admitted(sub, node, at=2))).ok
        notes = await eventually(lambda: _status(kube, "train", "Admitted"))
        assert node in notes["muster.dev/status-message"]
        await adapter.apply(JobPreempted(at=3, job=sub.job, preemptor=None, reason="NodeFailure"))
        notes = await eventually(lambda: _status(kube, "train", "Preempted"))
        assert "NodeFailure" in notes["muster.dev/status-message"]


async def _status(kube: Kube, job: str, status: str) -> dict[str, str] | None:
    notes = await annotations(kube, job)
    return notes if notes.get("muster.dev/status") == status else None


async def gang_condition(kube: Kube, pod: str) -> dict[str, Any] | None:
    obj = await kube.get_pod(pod)
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "muster.dev/Admitted":
            return dict(c)
    return None


async def test_a_pod_groups_status_is_a_condition_on_its_pods(api: ApiClient, kube: Kube) -> None:
    """A labelled pod group has no object to annotate: its pods say Pending (with why), then Admitted."""
    node = await kube.node("n1")
    pods = await kube.gang("g", 2)
    async with running_adapter(api) as (adapter, events):
        sub = await submitted(events)
        await adapter.apply(JobInadmissible(at=1, job=sub.job, reason="queue q is full"))
        for pod in pods:
            name = pod["metadata"]["name"]
            pending = await eventually(lambda name=name: gang_condition(kube, name))
            assert (pending["status"], pending["reason"], pending["message"]) == (
                "False",
                "Pending",
                "muster: queue q is full",
            )
        assert (await adapter.apply(admitted(sub, node, at=2))).ok
        for pod in pods:
            name = pod["metadata"]["name"]
            condition = await eventually(lambda name=name: _condition_is(kube, name, "True"))
            assert condition["reason"] == "Admitted"


async def test_a_new_leader_tells_pods_an_earlier_leader_told_to_wait_that_they_are_admitted(
    api: ApiClient, kube: Kube
) -> None:
    """A reporter starts blank: it goes by what the pods show (Pending, told to wait) and says Admitted on each."""
    node = await kube.node("n1")
    pods = await kube.gang("g", 2)
    names = [p["metadata"]["name"] for p in pods]
    async with running_adapter(api) as (adapter, events):
        sub = await submitted(events)
        await adapter.apply(JobInadmissible(at=1, job=sub.job, reason="queue q is full"))
        for name in names:
            await eventually(lambda name=name: _condition_is(kube, name, "False"))
    async with running_adapter(api) as (adapter, events):  # the next leader
        assert (await adapter.apply(admitted(await submitted(events), node, at=2))).ok
        for name in names:
            condition = await eventually(lambda name=name: _condition_is(kube, name, "True"))
            assert condition["reason"] == "Admitted"
            await eventually(lambda name=name: _has(kube, "Pod", name, "Admitted"))


async def _condition_is(kube: Kube, pod: str, status: str) -> dict[str, Any] | None:
    condition = await gang_condition(kube, pod)
    return condition if condition is not None and condition["status"] == status else None


async def test_a_gang_waits_whole_for_its_gated_pod(api: ApiClient, kube: Kube) -> None:
    """A pod with scheduling gates is not scheduled (as kube-scheduler): its gang is submitted once the gate goes."""
    node = await kube.node("n1")
    labels = {"muster.dev/gang": "g", "muster.dev/gang-size": "2", "muster.dev/queue": "q"}
    await kube.pod("g-0", gpus=1, labels=labels)
    gated = m.pod("g-1", kube.ns, gpus=1, labels=labels, grace_seconds=0)
    gated["spec"]["schedulingGates"] = [{"name": "example.com/not-yet"}]
    await kube.create_pod(gated)
    async with running_adapter(api) as (adapter, events):
        await kube.pod("h-0", gpus=1, labels={"muster.dev/queue": "q"})  # a later gang, submitted meanwhile
        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 1)
        [first] = events.of(JobSubmitted)
        assert len(first.pods) == 1, "the gang of the gated pod was submitted before its gate was removed"
        await kube.core.patch_namespaced_pod("g-1", kube.ns, {"spec": {"schedulingGates": None}})
        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 2)
        gang = events.of(JobSubmitted)[1]
        assert len(gang.pods) == 2
        assert (await adapter.apply(admitted(gang, node))).ok


async def test_a_gang_in_a_queue_that_does_not_exist_is_told_it_was_rejected_on_its_job_and_pods(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """The daemon rejects a Job naming an unknown queue: a Warning Rejected naming it on the Job and each pod."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})])
    await kube.node("n1", gpus=8)
    _, pods = await kube.job("lost", 2, gpus=1, queue="no-such-queue")
    async with running_daemon(store, api):
        await eventually(lambda: _has(kube, "Job", "lost", "Rejected"))
        for name in [p["metadata"]["name"] for p in pods]:
            await eventually(lambda name=name: _has(kube, "Pod", name, "Rejected"))
    [event] = [e for e in await events_of(kube, "Job", "lost") if e["reason"] == "Rejected"]
    assert event["type"] == "Warning" and "no-such-queue" in event["message"]
    assert [await kube.pod_node(p["metadata"]["name"]) for p in pods] == ["", ""]


async def test_a_preemption_the_daemon_decides_is_told_on_the_victims_job(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """A queue reclaims its lent quota: the borrower's Job gets a Warning Preempted naming the reason and preemptor."""
    reclaim = PreemptionPolicy(reclaim_within_cohort="Any")
    await store.append(
        [
            CohortConfigured(at=0, name=CohortName("org")),
            QueueConfigured(
                at=0, name=QueueName("lender"), cohort=CohortName("org"), nominal={"gpu": 8}, preemption=reclaim
            ),
            QueueConfigured(at=0, name=QueueName("borrower"), cohort=CohortName("org"), nominal={"gpu": 0}),
        ]
    )
    await kube.node("n1", gpus=8)
    _, borrowed = await kube.job("borrowed", 1, gpus=8, queue="borrower")
    async with running_daemon(store, api):
        await eventually(lambda: _bound(kube, borrowed))
        await kube.job("owned", 1, gpus=8, queue="lender")
        await eventually(lambda: _has(kube, "Job", "borrowed", "Preempted"))
    [event] = [e for e in await events_of(kube, "Job", "borrowed") if e["reason"] == "Preempted"]
    [preempted] = await log_of(store, JobPreempted)
    assert event["type"] == "Warning" and "ReclaimWithinCohort" in event["message"]
    assert preempted.preemptor is not None and preempted.preemptor in event["message"]


async def _bound(kube: Kube, pods: list[dict[str, Any]]) -> bool:
    return all([await kube.pod_node(p["metadata"]["name"]) for p in pods])


async def test_a_waiting_gangs_new_reason_is_told_again_on_its_job_and_pods(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """A gang waiting for quota, then (quota raised) for room, gets a second Waiting Event with the new reason on
    its Job and pods, and its pods' PodScheduled message follows: `kubectl describe` shows the current reason."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 0})])
    await kube.node("n1", gpus=8)
    _, pods = await kube.job("big", 2, gpus=8)
    pod = pods[0]["metadata"]["name"]
    async with running_daemon(store, api):
        await eventually(lambda: _has(kube, "Job", "big", "Waiting"))
        first = (await scheduled_condition(kube, pod) or {}).get("message")
        await store.append([QueueConfigured(at=1, name=QueueName("q"), nominal={"gpu": 64})])

        async def told_twice() -> bool:
            return len({e["message"] for e in await events_of(kube, "Job", "big") if e["reason"] == "Waiting"}) == 2

        await eventually(told_twice)
        await eventually(lambda: _has(kube, "Pod", pod, "Waiting"))
        second = await eventually(lambda: _changed_condition(kube, pod, first))
    waits = [e["message"] for e in await events_of(kube, "Job", "big") if e["reason"] == "Waiting"]
    reasons_on_log = [e.reason for e in await log_of(store, JobInadmissible)]
    assert len(set(reasons_on_log)) >= 2
    assert all(any(r in w for r in reasons_on_log) for w in waits), (waits, reasons_on_log)
    assert second != first and second.startswith("muster: ")


async def _changed_condition(kube: Kube, pod: str, before: str | None) -> str | None:
    message = (await scheduled_condition(kube, pod) or {}).get("message")
    return message if message and message != before else None


async def test_pods_whose_owner_is_not_there_or_no_gang_are_told_they_are_ignored(api: ApiClient, kube: Kube) -> None:
    """Pods naming a PyTorchJob the cluster does not have, and pods of a PodGroup of minMember 0, are left alone
    with a Warning `Ignored` saying why on each (before: pending for ever, only the daemon's log said why)."""
    await kube.node("n1")
    labels = {"training.kubeflow.org/job-name": "ghost", "training.kubeflow.org/replica-type": "master"}
    await kube.pod("ghost-master-0", gpus=1, labels={**labels, "muster.dev/queue": "q"})
    await kube.pod_group("bad", 1, volcano=True, min_member=0, queue="q")
    async with running_adapter(api):
        ghost = await eventually(lambda: _reason(kube, "ghost-master-0", "Ignored"))
        bad = await eventually(lambda: _reason(kube, "bad-0", "Ignored"))
    assert ghost["type"] == "Warning"
    assert ghost["message"].startswith(f"muster: PyTorchJob/{kube.ns}/ghost is not there")
    assert bad["message"].startswith(f"muster: VolcanoPodGroup/{kube.ns}/bad: spec.minMember 0 is not a positive")
    condition = await gang_condition(kube, "bad-0")
    assert condition is not None and condition["reason"] == "Ignored"


async def _reason(kube: Kube, pod: str, reason: str) -> dict[str, Any] | None:
    return next((e for e in await events_of(kube, "Pod", pod) if e["reason"] == reason), None)
