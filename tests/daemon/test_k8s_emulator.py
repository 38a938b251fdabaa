"""The Kubernetes API double answers like kube-apiserver where muster depends on it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio.client import CoreV1Api

from muster.daemon.k8s import manifests as m
from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.errors import Conflict, NotFound, TemporaryError
from muster.daemon.k8s.owners import job_pods, jobset_size, kubeflow_size


async def watch_lines(client: Any, url: str, count: int) -> list[dict[str, Any]]:
    """Read `count` events of a watch stream."""
    out: list[dict[str, Any]] = []
    async with client.get(url) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.strip():
                out.append(json.loads(line))
            if len(out) == count:
                break
    return out


async def test_resource_versions_increase_with_every_change_and_lists_carry_the_latest(kube):
    """Each create/patch/delete gets a higher resourceVersion; a list reports the current one."""
    emulator, api = kube
    core = CoreV1Api(api)
    created = await core.create_namespaced_pod("ns", m.pod("p", "ns"))
    patched = emulator.patch_object("v1/pods", "ns", "p", {"metadata": {"labels": {"a": "b"}}})
    emulator.put_object("v1/nodes", m.node("n1"))
    versions = [int(created.metadata.resource_version), int(patched["metadata"]["resourceVersion"])]
    listed = await core.list_pod_for_all_namespaces()
    assert versions[0] < versions[1] < int(listed.metadata.resource_version) == emulator.resource_version
    assert created.status.phase == "Pending"
    assert created.spec.termination_grace_period_seconds == 30
    assert created.metadata.uid


@pytest.mark.parametrize("flag", ["true", "True"])
async def test_watch_is_detected_in_both_spellings_and_replays_from_a_version(kube, flag):
    """`watch=true` (kubectl) and `watch=True` (the Python client) both stream the changes after the version."""
    emulator, _ = kube
    emulator.put_object("v1/nodes", m.node("n1"))
    since = emulator.resource_version
    emulator.put_object("v1/nodes", m.node("n2"))
    emulator.remove_object("v1/nodes", None, "n1")
    client = emulator.servers[0].client
    events = await watch_lines(client, f"/api/v1/nodes?watch={flag}&resourceVersion={since}", 2)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "n2"), ("DELETED", "n1")]
    assert int(events[0]["object"]["metadata"]["resourceVersion"]) < int(
        events[1]["object"]["metadata"]["resourceVersion"]
    )


async def test_binding_sets_the_node_once_and_then_answers_409_naming_it(kube):
    """pods/binding sets spec.nodeName and PodScheduled; binding again answers 409 'already assigned to node'."""
    emulator, api = kube
    emulator.put_object("v1/pods", m.pod("p", "ns"))
    client = KubeClient(api)
    await client.bind("ns", "p", "n1")
    pod = emulator.get_object("v1/pods", "ns", "p")
    assert pod["spec"]["nodeName"] == "n1"
    assert any(c["type"] == "PodScheduled" and c["status"] == "True" for c in pod["status"]["conditions"])
    with pytest.raises(Conflict, match='already assigned to node "n1"'):
        await client.bind("ns", "p", "n2")
    with pytest.raises(NotFound):
        await client.bind("ns", "nope", "n1")


async def test_eviction_deletes_unbound_pods_at_once_and_marks_bound_ones(kube):
    """Eviction: an unbound pod, or a bound one with grace 0, is deleted; a bound one with grace is marked."""
    emulator, api = kube
    client = KubeClient(api)
    emulator.put_object("v1/pods", m.pod("pending", "ns"))
    emulator.put_object("v1/pods", m.pod("quick", "ns", node_name="n1"))
    emulator.put_object("v1/pods", m.pod("slow", "ns", node_name="n1", grace_seconds=30))
    await client.evict("ns", "pending", grace_seconds=None)
    await client.evict("ns", "quick", grace_seconds=0)
    await client.evict("ns", "slow", grace_seconds=None)
    assert emulator.get_object("v1/pods", "ns", "pending") is None
    assert emulator.get_object("v1/pods", "ns", "quick") is None
    slow = emulator.get_object("v1/pods", "ns", "slow")
    assert slow["metadata"]["deletionTimestamp"]
    assert [c["type"] for c in slow["status"]["conditions"]] == ["DisruptionTarget"]
    with pytest.raises(NotFound):
        await client.evict("ns", "pending", grace_seconds=None)


async def test_injected_faults_answer_first_then_the_server_recovers(kube):
    """`fail(...)` answers the next matching requests with the error, then requests succeed again."""
    emulator, api = kube
    emulator.put_object("v1/pods", m.pod("p", "ns"))
    emulator.fail("POST", "pods", "binding", status=503, times=1)
    client = KubeClient(api)
    with pytest.raises(TemporaryError):
        await client.bind("ns", "p", "n1")
    await client.bind("ns", "p", "n1")
    assert emulator.get_object("v1/pods", "ns", "p")["spec"]["nodeName"] == "n1"


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        pytest.param(lambda: job_pods({"parallelism": 4}), 4, id="job-parallelism"),
        pytest.param(lambda: job_pods({"parallelism": 8, "completions": 2}), 2, id="job-capped-by-completions"),
        pytest.param(lambda: job_pods({}), 1, id="job-defaults"),
        pytest.param(
            lambda: jobset_size(m.jobset("js", replicated=[("driver", 1, 1), ("workers", 4, 2)])), 9, id="jobset"
        ),
        pytest.param(lambda: kubeflow_size(m.pytorchjob("pj", masters=1, workers=7)), 8, id="pytorchjob"),
    ],
)
def test_gang_size_comes_from_the_owner_spec(size, expected):
    """Gang sizes: Job parallelism (capped by completions), JobSet replicas x parallelism, sum of replicas."""
    assert size() == expected
