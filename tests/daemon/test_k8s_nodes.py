"""Nodes become NodeAdded/Updated/Removed/Cordoned; pods of other schedulers hold capacity as `reserved`."""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client import CoreV1Api

from muster.daemon.k8s import manifests as m
from muster.daemon.k8s.objects import node_view, pod_requests
from muster.events.types import (
    FlavorConfigured,
    JobSubmitted,
    NodeAdded,
    NodeCordoned,
    NodeRemoved,
    NodeUpdated,
    Taint,
)
from muster.projections.cluster import evolve, fold

GiB = 2**30


def taint(key: str, effect: str = "NoSchedule") -> dict[str, str]:
    return {"key": key, "effect": effect}


@pytest.mark.parametrize(
    ("node", "ready", "unschedulable", "cordoned"),
    [
        pytest.param(m.node("n"), True, False, False, id="healthy"),
        pytest.param(m.node("n", ready=False), False, False, False, id="ready-condition-false"),
        pytest.param(m.node("n", taints=[taint("node.kubernetes.io/not-ready")]), True, True, False, id="new-node"),
        pytest.param(m.node("n", taints=[taint("team/dedicated")]), True, True, False, id="noschedule-taint"),
        pytest.param(m.node("n", taints=[taint("maint", "NoExecute")]), True, True, False, id="noexecute-taint"),
        pytest.param(m.node("n", taints=[taint("maint", "PreferNoSchedule")]), True, False, False, id="prefer-only"),
        pytest.param(m.node("n", taints=[taint("nvidia.com/gpu")]), True, False, False, id="gpu-taint-tolerated"),
        pytest.param(
            m.node("n", unschedulable=True, taints=[taint("node.kubernetes.io/unschedulable")]),
            True,
            False,
            True,
            id="cordoned",
        ),
    ],
)
async def test_node_readiness_taints_and_cordon_become_the_right_events(
    kube, start_adapter, node, ready, unschedulable, cordoned
):
    """A node's Ready condition, untolerated taints and spec.unschedulable map to ready/unschedulable/cordon."""
    emulator, api = kube
    emulator.put_object("v1/nodes", node)
    async with start_adapter(api) as (_, events):
        [added] = events.of(NodeAdded)
        assert (added.ready, added.unschedulable) == (ready, unschedulable)
        assert [c.cordoned for c in events.of(NodeCordoned)] == ([True] if cordoned else [])


async def test_node_capacity_is_allocatable_in_base_units_and_labels_are_kept(kube, start_adapter):
    """Allocatable becomes gpu/cpu(milli)/memory(bytes) and topology labels stay ordinary labels."""
    emulator, api = kube
    labels = {"topology.kubernetes.io/zone": "z1", "muster.dev/block": "b0", "muster.dev/rack": "r3"}
    emulator.put_object("v1/nodes", m.node("gpu-1", gpus=8, cpu="95500m", memory="512Gi", labels=labels))
    async with start_adapter(api) as (_, events):
        [added] = events.of(NodeAdded)
        assert added.capacity == {"cpu": 95500, "gpu": 8, "memory": 512 * GiB}
        assert added.labels == {"kubernetes.io/hostname": "gpu-1", **labels}


async def test_node_changes_are_written_once_and_heartbeats_are_not(kube, start_adapter):
    """Uncordon, readiness, label and removal each give one event; a status heartbeat gives none."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1", unschedulable=True))
    emulator.put_object("v1/nodes", m.node("n2", ready=False))
    async with start_adapter(api) as (adapter, events):
        assert [(c.node, c.cordoned) for c in events.of(NodeCordoned)] == [("n1", True)]
        start = len(events.events)

        emulator.patch_object("v1/nodes", None, "n1", {"spec": {"unschedulable": None}})
        emulator.patch_object("v1/nodes", None, "n2", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        hb = [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:10Z"}]
        emulator.patch_object("v1/nodes", None, "n2", {"status": {"conditions": hb}})
        emulator.patch_object("v1/nodes", None, "n1", {"metadata": {"labels": {"muster.dev/rack": "r1"}}})
        emulator.remove_object("v1/nodes", None, "n2")
        await adapter.caught_up("nodes", emulator.resource_version)

        later = events.events[start:]
        assert [(type(e).__name__, e.node) for e in later] == [
            ("NodeCordoned", "n1"),
            ("NodeUpdated", "n2"),
            ("NodeUpdated", "n1"),
            ("NodeRemoved", "n2"),
        ]
        assert later[0].cordoned is False
        assert later[1].ready is True
        assert later[2].labels["muster.dev/rack"] == "r1"


async def test_pods_of_other_schedulers_count_as_reserved_until_they_end(kube, start_adapter):
    """DaemonSet/kube-scheduler pods bound to a node reserve their requests there; muster's own pods do not."""
    emulator, api = kube
    core = CoreV1Api(api)
    emulator.put_object("v1/nodes", m.node("n1"))
    async with start_adapter(api) as (adapter, events):
        ours = m.pod("ours", "ml", gpus=4, node_name="n1", labels={"muster.dev/queue": "q"})
        await core.create_namespaced_pod("ml", ours)
        pending = m.pod("pending", "apps", scheduler="default-scheduler", gpus=1)
        await core.create_namespaced_pod("apps", pending)
        await adapter.caught_up("pods", emulator.resource_version)
        assert events.of(NodeUpdated) == []

        daemonset = m.pod("dcgm-exporter", "kube-system", scheduler="default-scheduler", cpu="500m", memory="1Gi")
        daemonset["spec"]["nodeName"] = "n1"
        await core.create_namespaced_pod("kube-system", daemonset)
        web = m.pod("web", "apps", scheduler="default-scheduler", gpus=1, node_name="n1")
        await core.create_namespaced_pod("apps", web)
        await adapter.caught_up("pods", emulator.resource_version)
        assert events.of(NodeUpdated)[-1].reserved == {"cpu": 500, "gpu": 1, "memory": GiB}

        # A finished pod gives its capacity back; a deleted one too.
        emulator.patch_object("v1/pods", "apps", "web", {"status": {"phase": "Succeeded"}})
        await adapter.caught_up("pods", emulator.resource_version)
        assert events.of(NodeUpdated)[-1].reserved == {"cpu": 500, "memory": GiB}
        await core.delete_namespaced_pod("dcgm-exporter", "kube-system", grace_period_seconds=0)
        await adapter.caught_up("pods", emulator.resource_version)
        assert events.of(NodeUpdated)[-1].reserved == {}


async def test_reserved_pods_seen_before_their_node_are_in_its_first_event(kube, start_adapter):
    """A node listed with pods already bound to it is added with those pods' requests reserved."""
    emulator, api = kube
    emulator.put_object("v1/pods", m.pod("ds", "kube-system", scheduler="default-scheduler", cpu="2", node_name="n1"))
    emulator.put_object("v1/nodes", m.node("n1"))
    async with start_adapter(api) as (_, events):
        assert [e.reserved for e in events.of(NodeAdded)] == [{"cpu": 2000}]
        assert events.of(NodeUpdated) == []


async def test_restart_with_the_log_writes_only_what_changed_meanwhile(kube, start_adapter):
    """Given the folded log, a new adapter re-adds nothing unchanged, removes vanished nodes, skips known jobs."""
    emulator, api = kube
    for name in ("n1", "n2", "n3"):
        emulator.put_object("v1/nodes", m.node(name))
    job = m.job("train", "ns", parallelism=1)
    emulator.put_object("batch/v1/jobs", job)
    for pod in m.job_pods(job, gpus=1, labels={"muster.dev/queue": "q"}):
        emulator.put_object("v1/pods", pod)
    async with start_adapter(api) as (_, first):
        await first.wait_for(lambda e: len(e.of(JobSubmitted)) == 1)
    state = fold(first.events)

    # While no adapter runs: n2 goes away, n3 is cordoned.
    emulator.remove_object("v1/nodes", None, "n2")
    emulator.patch_object("v1/nodes", None, "n3", {"spec": {"unschedulable": True}})
    async with start_adapter(api, state=lambda: state) as (_, second):
        assert [(type(e).__name__, e.node) for e in second.events] == [("NodeRemoved", "n2"), ("NodeCordoned", "n3")]
        assert second.of(NodeRemoved)[0].node == "n2"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]}, {"gpu": 2}, id="limit-only"),
        pytest.param(
            {
                "containers": [{"resources": {"requests": {"cpu": "1"}}}, {"resources": {"requests": {"cpu": "250m"}}}],
                "initContainers": [{"resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}],
            },
            {"cpu": 2000, "memory": GiB},
            id="init-container-peak",
        ),
        pytest.param(
            {
                "containers": [{"resources": {"requests": {"cpu": "1"}}}],
                "initContainers": [{"restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}}],
                "overhead": {"cpu": "100m"},
            },
            {"cpu": 1600},
            id="sidecar-and-overhead",
        ),
        pytest.param(
            {"containers": [{"resources": {"requests": {"cpu": "lots", "ephemeral-storage": "1Gi", "memory": "1Mi"}}}]},
            {"memory": 2**20},
            id="bad-quantity-and-untracked-skipped",
        ),
    ],
)
def test_pod_requests_count_what_the_kube_scheduler_counts(spec, expected):
    """Requests: sum of containers vs. largest init container, plus sidecars and overhead; limits stand in."""
    problems: list[str] = []
    assert pod_requests({"spec": spec}, problems) == expected


def test_node_capacity_past_the_bound_is_left_out_and_reported():
    """A node claiming 10**20 GPUs gets no GPUs (and a problem naming them); its other resources stay."""
    node = m.node("odd")
    node["status"]["allocatable"]["nvidia.com/gpu"] = "99999999999999999999"
    problems: list[str] = []
    view = node_view(node, problems=problems)
    assert "gpu" not in view.capacity and view.capacity["memory"] == 2**40
    assert problems == ["gpu: '99999999999999999999' is more than muster accepts (at most 1125899906842624); left out"]


def test_a_pod_request_past_the_bound_is_kept_exactly_for_the_core_to_reject():
    """A pod asking 99999999999999999999 GPUs keeps that exact number (no float); the core rejects it by name."""
    from muster.events.types import PodSet, QueueConfigured
    from muster.projections.validation import invalid_reason

    spec = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "99999999999999999999"}}}]}
    requests = pod_requests({"spec": spec}, [])
    assert requests == {"gpu": 99999999999999999999}
    gang = JobSubmitted(at=0, job="j", queue="q", podsets=[PodSet(name="w", count=1, requests=requests)])
    state = fold([QueueConfigured(at=0, name="q", nominal={"gpu": 8}), gang])
    assert "gpu=99999999999999999999 is more than muster accepts" in (invalid_reason(state, state.jobs["j"]) or "")


async def test_malformed_objects_are_skipped_and_the_adapter_goes_on(kube, start_adapter):
    """A pod with labels that are not a map and a node with an unparsable quantity do not stop the adapter."""
    emulator, api = kube
    bad = {
        "metadata": {"name": "bad", "namespace": "ns", "labels": ["not", "a", "map"]},
        "spec": {"schedulerName": "muster"},
    }
    emulator.put_object("v1/pods", bad)
    odd = m.node("odd")
    odd["status"]["allocatable"]["cpu"] = "a lot"
    emulator.put_object("v1/nodes", odd)
    async with start_adapter(api) as (_, events):
        [added] = events.of(NodeAdded)
        assert added.capacity == {"gpu": 8, "memory": 2**40}  # the bad cpu quantity is left out
        emulator.put_object("v1/nodes", m.node("good"))
        emulator.put_object("v1/pods", m.pod("fine", "ns", scheduler="default-scheduler", cpu="1", node_name="good"))
        good = [NodeAdded, NodeUpdated]
        await events.wait_for(lambda e: any(n.node == "good" and n.reserved for c in good for n in e.of(c)))
        assert [n.node for n in events.of(NodeAdded)] == ["odd", "good"]


async def test_a_flavor_applied_after_its_nodes_were_tainted_makes_them_schedulable_and_back(kube, start_adapter):
    """A node tainted for a flavor the log does not know yet is unschedulable; the flavor's arrival turns it
    schedulable, its taint dropped from the flavor turns it back, with no change to the node."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("h1", taints=[taint("example.com/gpu")]))
    state = fold([])
    async with start_adapter(api, state=lambda: state) as (adapter, events):
        [added] = events.of(NodeAdded)
        assert added.unschedulable
        h100 = FlavorConfigured(at=1, name="h100", taints=[Taint(key="example.com/gpu", value="h100")])
        evolve(state, h100)
        adapter.flavors_changed()
        await events.wait_for(lambda e: [u.unschedulable for u in e.of(NodeUpdated)] == [False])
        evolve(state, FlavorConfigured(at=2, name="h100"))
        adapter.flavors_changed()
        await events.wait_for(lambda e: [u.unschedulable for u in e.of(NodeUpdated)] == [False, True])
