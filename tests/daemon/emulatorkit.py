"""Helpers for adapter tests on the Kubernetes API double (`muster.demo.emulator`).

- `submit_gang(...)`: nodes n1 and n2, a Job of `size` one-GPU pods in queue `q`, and its
  JobSubmitted once the running adapter reported it.
- `admission(sub, nodes)`: the admission of that gang; `pod_object(emulator, key)`: a pod as
  the double holds it.
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio.client import ApiClient, CoreV1Api

from muster.daemon.k8s import manifests as m
from muster.demo.emulator import KubeEmulator
from muster.events.types import JobAdmitted, JobSubmitted, NodeName, QueueName


async def submit_gang(
    emulator: KubeEmulator, api: ApiClient, adapter: Any, events: Any, *, size: int = 3, **pod_args: Any
) -> JobSubmitted:
    """Create a Job of `size` pods (1 GPU each) and wait for its JobSubmitted."""
    for name in ("n1", "n2"):
        emulator.put_object("v1/nodes", m.node(name))
    job = m.job("train", "ns", parallelism=size)
    emulator.put_object("batch/v1/jobs", job)
    core = CoreV1Api(api)
    for pod in m.job_pods(job, gpus=1, labels={"muster.dev/queue": "q"}, **pod_args):
        await core.create_namespaced_pod("ns", pod)
    await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 1)
    await adapter.caught_up("pods", emulator.resource_version)
    [sub] = events.of(JobSubmitted)
    return sub


def admission(sub: JobSubmitted, nodes: list[str]) -> JobAdmitted:
    """The admission of the whole gang `sub` in queue `q`, its pods spread over `nodes` in name order."""
    names = sorted(sub.pods)
    return JobAdmitted(
        at=1,
        job=sub.job,
        queue=QueueName("q"),
        placement={n: NodeName(nodes[i % len(nodes)]) for i, n in enumerate(names)},
    )


def pod_object(emulator: KubeEmulator, key: str) -> dict[str, Any] | None:
    """The pod `namespace/name` as the API double holds it (None: gone)."""
    ns, name = key.split("/")
    return emulator.get_object("v1/pods", ns, name)
