"""The Kubernetes adapter against a real kube-apiserver: what it reads, binds and evicts is what the server does.

Ported from the emulator tests where the real server's answer is the point: bindings and
their 409s, evictions of bound pods with and without a grace period, and the capacity
held by pods of other schedulers. Faults the server cannot be made to inject stay with the
emulator (tests/daemon, tests/faults): dropped streams, 5xx, slow answers, and the 410 of an
expired watch (the watch cache answers an old resourceVersion with the current state, not
410, until it has dropped events, which takes minutes of churn).
"""

from __future__ import annotations

import pytest
from kubekit import Kube, admitted, eventually, running_adapter
from kubernetes_asyncio.client import ApiClient

from muster.daemon.k8s import manifests as m
from muster.daemon.k8s.applying import _ASSIGNED
from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.errors import Conflict
from muster.events.types import (
    JobFailed,
    JobPreempted,
    JobSubmitted,
    NodeAdded,
    NodeUpdated,
    QueueConfigured,
    QueueName,
)
from muster.projections.cluster import fold


async def test_a_ready_node_is_added_without_the_not_ready_taint(api: ApiClient, kube: Kube) -> None:
    """A node registered, reported Ready and untainted as the controllers would is a schedulable NodeAdded."""
    name = await kube.node("n1", gpus=8)
    async with running_adapter(api) as (_, events):
        await events.wait_for(lambda e: any(n.node == name for n in e.of(NodeAdded)))
    [added] = [n for n in events.of(NodeAdded) if n.node == name]
    assert added.ready and not added.unschedulable
    assert added.capacity["gpu"] == 8


async def test_a_gang_is_bound_and_a_second_binding_is_a_noop(api: ApiClient, kube: Kube) -> None:
    """Binding a gang sets every pod's node; applying it again answers 409 naming that node, taken as done."""
    node = await kube.node("n1")
    await kube.gang("g", 2)
    async with running_adapter(api) as (adapter, events):
        await events.wait_for(lambda e: bool(e.of(JobSubmitted)))
        [sub] = events.of(JobSubmitted)
        first = await adapter.apply(admitted(sub, node))
        assert (first.ok, first.outcome) == (True, "applied"), first
        assert [await kube.pod_node(f"g-{i}") for i in range(2)] == [node, node]
        # the adapter's view may lag the server: a second binding is answered 409 naming the node
        with pytest.raises(Conflict) as conflict:
            await KubeClient(api).bind(kube.ns, "g-0", node)
        assert _ASSIGNED.search(conflict.value.message).group(1) == node  # type: ignore[union-attr]
        await eventually(lambda: all(p.node == node for p in adapter.translator.gangs.pods_of(sub.job).values()))  # type: ignore[union-attr]
        again = await adapter.apply(admitted(sub, node))
    assert (again.ok, again.outcome) == (True, "noop"), again


async def test_binding_a_pod_bound_elsewhere_is_a_conflict(api: ApiClient, kube: Kube) -> None:
    """A 409 naming another node is reported as a conflict, and the pod stays where it is."""
    n1, n2 = await kube.node("n1"), await kube.node("n2")
    await kube.gang("g", 1)
    async with running_adapter(api) as (adapter, events):
        await events.wait_for(lambda e: bool(e.of(JobSubmitted)))
        [sub] = events.of(JobSubmitted)
        assert (await adapter.apply(admitted(sub, n1))).outcome == "applied"
        # the adapter's view of the binding (no event of its own to wait for)
        await eventually(lambda: adapter.translator.gangs.pod(f"{kube.ns}/g-0").node == n1)  # type: ignore[union-attr]
        other = await adapter.apply(admitted(sub, n2))
    assert (other.ok, other.outcome) == (False, "conflict"), other
    assert await kube.pod_node("g-0") == n1


async def test_evicting_a_bound_gang_deletes_its_pods_and_reports_nothing(api: ApiClient, kube: Kube) -> None:
    """A preemption evicts every pod (grace 0: gone at once); the adapter expects their end and fails nothing."""
    node = await kube.node("n1")
    await kube.job("train", 2)
    async with running_adapter(api) as (adapter, events):
        await events.wait_for(lambda e: bool(e.of(JobSubmitted)))
        [sub] = events.of(JobSubmitted)
        assert (await adapter.apply(admitted(sub, node))).ok
        result = await adapter.apply(JobPreempted(at=2, job=sub.job, preemptor=None, reason="WithinQueue"))
        assert (result.ok, result.outcome) == (True, "applied"), result
        pods = list(sub.pods.values())
        await eventually(lambda: kube.gone(*(p.split("/")[1] for p in pods)))
        await eventually(lambda: not adapter.translator.gangs.pods_of(sub.job))
    assert not events.of(JobFailed)


async def test_an_evicted_pod_with_a_grace_period_holds_its_node_until_the_kubelet_lets_go(
    api: ApiClient, kube: Kube
) -> None:
    """An evicted pod with a grace period is only marked for deletion; its requests stay reserved until it is gone."""
    node = await kube.node("n1", gpus=8)
    await kube.gang("g", 1, gpus=4, grace_seconds=30)
    async with running_adapter(api) as (adapter, events):
        await events.wait_for(lambda e: bool(e.of(JobSubmitted)))
        [sub] = events.of(JobSubmitted)
        assert (await adapter.apply(admitted(sub, node))).ok
        assert (await adapter.apply(JobPreempted(at=2, job=sub.job, preemptor=None, reason="WithinQueue"))).ok
        pod = await eventually(lambda: _deleting(kube, "g-0"))
        assert pod["spec"]["nodeName"] == node
        await events.wait_for(lambda e: any(u.node == node and u.reserved.get("gpu") == 4 for u in e.of(NodeUpdated)))
        await kube.delete_pod("g-0")  # the kubelet confirms
        await events.wait_for(lambda e: e.of(NodeUpdated)[-1].reserved.get("gpu", 0) == 0)
    # a bare pod is not recreated: its job ends rather than wait in the queue for it
    assert [f.reason for f in events.of(JobFailed)] == ["evicted (WithinQueue) and nothing recreates its pods"]


async def _deleting(kube: Kube, name: str) -> dict | None:
    pod = await kube.get_pod(name)
    return pod if pod is not None and pod["metadata"].get("deletionTimestamp") else None


async def test_pods_of_other_schedulers_hold_capacity(api: ApiClient, kube: Kube) -> None:
    """A pod bound by another scheduler (kube-scheduler, a DaemonSet) reserves its requests on its node."""
    node = await kube.node("n1", gpus=8)
    await kube.pod("other", scheduler="default-scheduler", gpus=3, node_name=node)
    async with running_adapter(api) as (_, events):
        await events.wait_for(lambda e: any(n.node == node for n in e.of(NodeAdded)))
        [added] = [n for n in events.of(NodeAdded) if n.node == node]
        assert added.reserved == {"gpu": 3}
        await kube.delete_pod("other")
        await events.wait_for(lambda e: any(u.node == node and not u.reserved for u in e.of(NodeUpdated)))
    assert not events.of(JobSubmitted)  # not muster's pod


async def test_a_muster_pod_bound_by_nobody_we_know_holds_capacity(api: ApiClient, kube: Kube) -> None:
    """A muster pod created with its nodeName set (no admission on the log places it) reserves its requests."""
    node = await kube.node("n1", gpus=8)
    await kube.gang("placed-by-hand", 1, gpus=4, node_name=node)
    state = fold([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})])
    async with running_adapter(api, state=lambda: state) as (_, events):
        await events.wait_for(lambda e: bool(e.of(JobSubmitted)) and any(n.node == node for n in e.of(NodeAdded)))
    [added] = [n for n in events.of(NodeAdded) if n.node == node]
    assert added.reserved == {"gpu": 4}


async def test_a_gang_on_a_tainted_flavor_tolerates_its_taint_and_is_bound(api: ApiClient, kube: Kube) -> None:
    """The server takes the tolerations added to a gang admitted on a tainted flavor, then its bindings; the
    node, tainted only with the flavor's taint, counts as schedulable."""
    import msgspec

    from muster.daemon.k8s.client import MERGE_PATCH
    from muster.events.types import FlavorConfigured, Taint
    from muster.projections.cluster import evolve
    from muster.projections.state import ClusterState

    node = await kube.node("spot1", labels={"pool": "spot"})
    taint = {"key": "example.com/spot", "value": "true", "effect": "NoSchedule"}
    await kube.core.patch_node(node, {"spec": {"taints": [taint]}}, _content_type=MERGE_PATCH)
    state = ClusterState()
    flavor = FlavorConfigured(
        at=0, name="spot", node_labels={"pool": "spot"}, taints=[Taint(key="example.com/spot", value="true")]
    )
    evolve(state, flavor)
    await kube.gang("g", 2)
    async with running_adapter(api, state=lambda: state) as (adapter, events):
        await events.wait_for(lambda e: bool(e.of(JobSubmitted)) and any(n.node == node for n in e.of(NodeAdded)))
        [added] = [n for n in events.of(NodeAdded) if n.node == node]
        assert not added.unschedulable
        [sub] = events.of(JobSubmitted)
        on_spot = {pod.rsplit("-", 1)[0]: {"gpu": "spot"} for pod in sub.pods}
        result = await adapter.apply(msgspec.structs.replace(admitted(sub, node), flavors=on_spot))
        assert (result.ok, result.outcome) == (True, "applied"), result
    for i in range(2):
        assert await kube.pod_node(f"g-{i}") == node
        pod = await kube.core.read_namespaced_pod(f"g-{i}", kube.ns)
        tolerations = [(t.key, t.operator, t.value, t.effect) for t in pod.spec.tolerations or []]
        assert ("example.com/spot", "Equal", "true", "NoSchedule") in tolerations


async def test_a_gated_pod_gets_its_flavors_node_selector_and_an_ungated_one_its_label(
    api: ApiClient, kube: Kube
) -> None:
    """A pod carrying muster's scheduling gate is submitted, given its flavor's node labels as nodeSelector
    (which the server lets a pod gain only while gated) with the gate lifted, then bound; a pod without
    the gate keeps its immutable nodeSelector and is labelled with its flavor; both land on the flavor."""
    import msgspec

    from muster.daemon.k8s.pods import FLAVOR_GATE, FLAVOR_LABEL
    from muster.events.types import FlavorConfigured
    from muster.projections.cluster import evolve
    from muster.projections.state import ClusterState

    node = await kube.node("h1", labels={"model": "h100"})
    state = ClusterState()
    evolve(state, FlavorConfigured(at=0, name="h100", node_labels={"model": "h100"}))
    labels = {"muster.dev/gang": "g", "muster.dev/gang-size": "2", "muster.dev/queue": "q"}
    gated = m.pod("g-0", kube.ns, gpus=1, labels=labels, grace_seconds=0)
    gated["spec"]["schedulingGates"] = [{"name": FLAVOR_GATE}]
    gated["spec"]["nodeSelector"] = {"team": "a"}
    await kube.create_pod(gated)
    await kube.pod("g-1", gpus=1, labels=labels)
    async with running_adapter(api, state=lambda: state) as (adapter, events):
        await events.wait_for(lambda e: bool(e.of(JobSubmitted)) and any(n.node == node for n in e.of(NodeAdded)))
        [sub] = events.of(JobSubmitted)
        assert len(sub.pods) == 2, "a pod gated for muster alone is part of its gang"
        on_h100 = {pod.rsplit("-", 1)[0]: {"gpu": "h100"} for pod in sub.pods}
        result = await adapter.apply(msgspec.structs.replace(admitted(sub, node), flavors=on_h100))
        assert (result.ok, result.outcome) == (True, "applied"), result
    pods = {i: await kube.core.read_namespaced_pod(f"g-{i}", kube.ns) for i in range(2)}
    assert [p.spec.node_name for p in pods.values()] == [node, node]
    assert pods[0].spec.node_selector == {"team": "a", "model": "h100"}
    assert not pods[0].spec.scheduling_gates
    assert not pods[1].spec.node_selector
    assert [p.metadata.labels[FLAVOR_LABEL] for p in pods.values()] == ["h100", "h100"]


async def test_owners_wanted_together_are_sized_from_one_list(api: ApiClient, kube: Kube) -> None:
    """Jobs and PyTorchJobs found at once are sized by a list of each kind; pods of a deleted Job stay alone."""
    jobs = {name: size for name, size in (("a", 2), ("b", 3))}
    for name, size in jobs.items():
        await kube.job(name, size)
    await kube.job("gone", 2)
    # no garbage collector runs here: its pods stay
    await kube.batch.delete_namespaced_job("gone", kube.ns, propagation_policy="Background")
    for name in ("pt1", "pt2"):
        owner = await kube.custom(m.pytorchjob(name, kube.ns, masters=1, workers=2))
        for pod in m.pytorchjob_pods(owner, gpus=1, labels={"muster.dev/queue": "q"}, grace_seconds=0):
            await kube.create_pod(pod)
    async with running_adapter(api, list_owners_at=2) as (adapter, events):
        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 4)
        await eventually(lambda: not adapter.translator.gangs.sizing())
    sizes = {s.source.split("/")[2]: sum(ps.count for ps in s.podsets) for s in events.of(JobSubmitted)}
    assert sizes == {**jobs, "pt1": 3, "pt2": 3}
