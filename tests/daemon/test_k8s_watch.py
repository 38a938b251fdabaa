"""List+watch: resume from resourceVersion, relist on 410 without duplicate events, retry on errors."""

from __future__ import annotations

from collections import Counter
from typing import Any

from adapterkit import describe, lists

from muster.daemon.k8s import manifests as m
from muster.demo.emulator import KubeEmulator
from muster.events.types import JobSubmitted, NodeAdded, NodeRemoved, NodeUpdated


def seed(emulator: KubeEmulator) -> dict[str, Any]:
    """Three nodes and a Job of three pods, two of which exist."""
    for name in ("n1", "n2", "n3"):
        emulator.put_object("v1/nodes", m.node(name))
    job = m.job("train", "ns", parallelism=3)
    emulator.put_object("batch/v1/jobs", job)
    pods = m.job_pods(job, gpus=1, labels={"muster.dev/queue": "q"})
    for pod in pods[:2]:
        emulator.put_object("v1/pods", pod)
    return {"job": job, "pods": pods}


async def test_a_watch_dropped_with_410_relists_and_writes_only_the_differences(kube, start_adapter):
    """After 410 Gone the adapter relists: changes made meanwhile appear once; nothing seen before is repeated."""
    emulator, api = kube
    objs = seed(emulator)
    async with start_adapter(api) as (adapter, events):
        assert describe(events.events) == Counter(
            {("NodeAdded", "n1"): 1, ("NodeAdded", "n2"): 1, ("NodeAdded", "n3"): 1}
        )
        before = len(events.events)
        assert (len(lists(emulator, "nodes")), len(lists(emulator, "pods"))) == (1, 1)

        # Changes the open watches never stream: the history is compacted right after them.
        emulator.patch_object("v1/nodes", None, "n1", {"metadata": {"labels": {"muster.dev/rack": "r9"}}})
        emulator.remove_object("v1/nodes", None, "n2")
        emulator.put_object("v1/pods", objs["pods"][2])
        emulator.expire()

        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 1 and len(e.of(NodeRemoved)) == 1)
        await adapter.caught_up("nodes", emulator.resource_version)
        await adapter.caught_up("pods", emulator.resource_version)
        assert (len(lists(emulator, "nodes")), len(lists(emulator, "pods"))) == (2, 2)
        assert describe(events.events[before:]) == Counter(
            {("NodeUpdated", "n1"): 1, ("NodeRemoved", "n2"): 1, ("JobSubmitted", events.of(JobSubmitted)[0].job): 1}
        )

        # Another expiry with nothing changed relists and writes nothing.
        after = len(events.events)
        emulator.expire()
        emulator.put_object("v1/nodes", m.node("n4"))  # something to wait for, after the relist
        await events.wait_for(lambda e: len(e.of(NodeAdded)) == 4)
        assert [type(e).__name__ for e in events.events[after:]] == ["NodeAdded"]


async def test_a_closed_watch_resumes_from_its_resource_version_without_relisting(kube, start_adapter):
    """When the server ends a watch stream the adapter watches again from where it was: no list, no repeats."""
    emulator, api = kube
    seed(emulator)
    async with start_adapter(api) as (adapter, events):
        before = len(events.events)
        emulator.close_watches()
        emulator.patch_object("v1/nodes", None, "n3", {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}})
        await events.wait_for(lambda e: len(e.of(NodeUpdated)) == 1)
        await adapter.caught_up("nodes", emulator.resource_version)
        assert [(type(e).__name__, e.node) for e in events.events[before:]] == [("NodeUpdated", "n3")]
        assert events.of(NodeUpdated)[0].unschedulable is True
        assert len(lists(emulator, "nodes")) == 1


async def test_server_errors_on_list_and_watch_are_retried(kube, start_adapter):
    """500s on the initial list and on the watch delay the adapter but do not stop it."""
    emulator, api = kube
    seed(emulator)
    emulator.fail("GET", "nodes", watch=False, status=500, times=2)
    emulator.fail("GET", "pods", watch=True, status=503, times=2)
    async with start_adapter(api) as (_, events):
        assert len(events.of(NodeAdded)) == 3
        emulator.put_object("v1/nodes", m.node("n4"))
        await events.wait_for(lambda e: len(e.of(NodeAdded)) == 4)
        assert len(lists(emulator, "nodes")) == 3


async def test_a_list_that_times_out_is_retried(kube, start_adapter):
    """A list answered slower than the request timeout is abandoned and tried again."""
    emulator, api = kube
    seed(emulator)
    emulator.fail("GET", "nodes", watch=False, status=None, delay=1.0)
    async with start_adapter(api, request_seconds=0.2) as (_, events):
        assert len(events.of(NodeAdded)) == 3
    assert len(lists(emulator, "nodes")) == 2


async def test_a_watch_from_an_expired_version_gets_410_from_the_emulator(kube):
    """The emulator answers a watch from a compacted resourceVersion with a 410 ERROR event, like kube-apiserver."""
    emulator, _ = kube
    emulator.put_object("v1/nodes", m.node("n1"))
    old = emulator.resource_version
    emulator.expire()
    server = emulator.servers[0]
    async with server.client.get(f"/api/v1/nodes?watch=true&resourceVersion={old}") as resp:
        assert resp.status == 200
        body = await resp.json(content_type=None)
    assert body["type"] == "ERROR"
    assert body["object"]["code"] == 410
