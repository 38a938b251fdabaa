"""The adapter against a real API server and kubelet (K3s in Docker via testcontainers); skipped without Docker."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest
import yaml
from kubernetes_asyncio.client import ApiClient, BatchV1Api, Configuration
from kubernetes_asyncio.config import load_kube_config_from_dict

from muster.events.types import JobAdmitted, JobFinished, JobStarted, JobSubmitted, NodeAdded, NodeName, QueueName

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def k3s_kubeconfig() -> Iterator[dict]:
    """A K3s cluster in a container, as a kubeconfig dict."""
    from testcontainers.community.k3s import K3SContainer

    with K3SContainer() as k3s:
        yield yaml.safe_load(k3s.config_yaml())


def gang_job(name: str) -> dict:
    pod_spec = {
        "schedulerName": "muster",
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "main",
                "image": "busybox:1.36",
                "command": ["sh", "-c", "sleep 3"],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
            }
        ],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "parallelism": 2,
            "completions": 2,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {"metadata": {"labels": {"muster.dev/queue": "q"}}, "spec": pod_spec},
        },
    }


async def test_a_job_gang_is_submitted_bound_run_and_finished_on_k3s(k3s_kubeconfig, start_adapter):
    """On a real cluster: the Job's pods form one gang, bindings place them, the kubelet runs them to completion."""
    config = Configuration()
    await load_kube_config_from_dict(k3s_kubeconfig, client_configuration=config)
    async with ApiClient(config) as api:
        await BatchV1Api(api).create_namespaced_job("default", gang_job("gang"))
        async with start_adapter(api) as (adapter, events):
            await events.wait_for(lambda e: bool(e.of(NodeAdded)) and bool(e.of(JobSubmitted)), seconds=60)
            node = next(n for n in events.of(NodeAdded) if n.ready and not n.unschedulable)
            [sub] = events.of(JobSubmitted)
            assert sub.source == "Job/default/gang"
            placement = {name: NodeName(node.node) for name in sub.pods}
            result = await adapter.apply(JobAdmitted(at=1, job=sub.job, queue=QueueName("q"), placement=placement))
            assert result.outcome == "applied"
            await events.wait_for(lambda e: bool(e.of(JobStarted)) and bool(e.of(JobFinished)), seconds=120)
            again = await adapter.apply(JobAdmitted(at=1, job=sub.job, queue=QueueName("q"), placement=placement))
            assert again.ok
        with anyio.move_on_after(10, shield=True):
            await BatchV1Api(api).delete_namespaced_job("gang", "default", propagation_policy="Background")
