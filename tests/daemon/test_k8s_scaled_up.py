"""A running Job scaled up: its job keeps the size it was admitted at, and the pods beyond it are told why.

Before, the pods its controller made past the admitted gang waited unbound with no word (no Event, no
condition); a user saw them Pending for ever. A waiting Job scaled is submitted again at its new size
(tests/daemon/test_k8s_lifecycle.py, `Resized`); an admitted one keeps its placement on the log.
"""

from __future__ import annotations

from typing import Any

from adapterkit import eventually
from kubernetes_asyncio.client import CoreV1Api

from muster.daemon.k8s import manifests as m
from muster.events.types import (
    Event,
    JobAdmitted,
    JobCancelled,
    JobStarted,
    JobSubmitted,
    NodeAdded,
    NodeName,
    QueueConfigured,
    QueueName,
)
from muster.projections.cluster import fold


async def test_pods_a_running_job_makes_beyond_its_admitted_size_wait_with_a_warning_saying_why(kube, start_adapter):
    """A Job of 2 admitted and running, scaled to 3: the third pod stays unbound, with one Warning `Ignored` saying
    its job runs at its admitted size of 2; the running job goes on (not cancelled, not submitted again)."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1"))
    job = m.job("train", "ns", parallelism=2)
    emulator.put_object("batch/v1/jobs", job)
    labels = {"muster.dev/queue": "q"}
    for pod in m.job_pods(job, gpus=1, labels=labels):
        await CoreV1Api(api).create_namespaced_pod("ns", pod)
    log: list[Event] = [
        QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8}),
        NodeAdded(at=0, node=NodeName("n1"), capacity={"gpu": 8}),
    ]
    async with start_adapter(api, state=lambda: fold(log), report=True) as (adapter, events):
        await events.wait_for(lambda e: bool(e.of(JobSubmitted)))
        [sub] = events.of(JobSubmitted)
        admitted = JobAdmitted(at=2, job=sub.job, queue=QueueName("q"), placement={p: NodeName("n1") for p in sub.pods})
        log += [sub, admitted]
        assert (await adapter.apply(admitted)).outcome == "applied"
        for key in sub.pods.values():  # the kubelet starts them
            emulator.patch_object("v1/pods", *key.split("/"), {"status": {"phase": "Running"}})
        await events.wait_for(lambda e: bool(e.of(JobStarted)))
        log += events.of(JobStarted)

        emulator.patch_object("batch/v1/jobs", "ns", "train", {"spec": {"parallelism": 3, "completions": 3}})
        [extra] = m.job_pods(job, indexes=[2], gpus=1, labels=labels)  # the Job controller's third pod
        await CoreV1Api(api).create_namespaced_pod("ns", extra)
        name = extra["metadata"]["name"]

        def warnings() -> list[dict[str, Any]]:
            return [
                e
                for e in emulator.list_objects("v1/events", "ns")
                if e["involvedObject"]["name"] == name and e.get("reason") == "Ignored" and e.get("type") == "Warning"
            ]

        [warning] = await eventually(warnings)
        assert f"job {sub.job} runs at the size it was admitted with (2 pods)" in warning["message"]
        assert not emulator.get_object("v1/pods", "ns", name)["spec"].get("nodeName")
    assert not events.of(JobCancelled) and len(events.of(JobSubmitted)) == 1
