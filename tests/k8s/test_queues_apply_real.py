"""`muster queues apply`, as an admin runs it, then the daemon on a real API server: the plain and grouped forms.

The command appends to the log (the session's NATS); the daemon reads its queues from there and
binds on the real server: a plain queue's gang on any schedulable node, a flavored queue's gang
on its flavor's nodes, tolerating the flavor's taint.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
from kubekit import Kube, eventually, running_daemon
from kubernetes_asyncio.client import ApiClient

from muster.daemon.k8s import manifests as m
from muster.daemon.k8s.client import MERGE_PATCH
from muster.daemon.k8s.pods import FLAVOR_GATE, FLAVOR_LABEL
from muster.events.store import EventStore
from muster.events.types import NodeName

PLAIN = """\
queues:
  - {name: plain, nominal: {gpu: 8}}
"""

GROUPED = """\
flavors:
  - {name: h100, node_labels: {example.com/product: H100}, taints: [{key: example.com/gpu, value: h100}]}
  - {name: a100, node_labels: {example.com/product: A100}}
queues:
  - name: team-f
    resource_groups:
      - covered: [gpu]
        flavors: [{name: h100, nominal: {gpu: 8}}, {name: a100, nominal: {gpu: 8}}]
"""


async def queues_apply(nats_url: str, store: EventStore, path: Path) -> str:
    """Run `muster queues apply PATH` on the store's stream as a separate process; its output (exit 0 asserted)."""
    flags = ["--nats", nats_url, "--stream", store.stream, "--subject-prefix", store.prefix]
    command = [sys.executable, "-m", "muster.cli", "queues", "apply", str(path), *flags]
    done = await anyio.run_process(command, check=False)
    out = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, out
    return out


async def test_queues_applied_plain_then_grouped_place_gangs_on_their_flavors_nodes(
    api: ApiClient, kube: Kube, store: EventStore, nats_url: str, tmp_path: Path
) -> None:
    """A plain queue's gang binds on the untainted node; a grouped queue applied while the daemon runs makes its
    flavor's tainted node schedulable, and its gang binds there, tolerating the taint."""
    a100 = await kube.node("a100", gpus=8, labels={"example.com/product": "A100"})
    h100 = await kube.node("h100", gpus=8, labels={"example.com/product": "H100"})
    taint = {"key": "example.com/gpu", "value": "h100", "effect": "NoSchedule"}
    await kube.core.patch_node(h100, {"spec": {"taints": [taint]}}, _content_type=MERGE_PATCH)
    (tmp_path / "plain.yaml").write_text(PLAIN)
    (tmp_path / "grouped.yaml").write_text(GROUPED)
    assert "+ queue plain" in await queues_apply(nats_url, store, tmp_path / "plain.yaml")
    _, plain = await kube.job("plain", 1, gpus=8, queue="plain")
    async with running_daemon(store, api) as loop:
        # the tainted node tolerates nothing the plain gang carries: it goes on the other one
        await eventually(lambda: _on(kube, plain[0]["metadata"]["name"], a100))
        assert loop.state.nodes[NodeName(h100)].unschedulable
        assert "+ flavor h100" in await queues_apply(nats_url, store, tmp_path / "grouped.yaml")
        # the flavor's pods tolerate its taint: the node turns schedulable, with no change to it
        await eventually(lambda: not loop.state.nodes[NodeName(h100)].unschedulable)
        _, flavored = await kube.job("flavored", 1, gpus=8, queue="team-f")
        await eventually(lambda: _on(kube, flavored[0]["metadata"]["name"], h100))
    pod = await kube.core.read_namespaced_pod(flavored[0]["metadata"]["name"], kube.ns)
    tolerations = [(t.key, t.value, t.effect) for t in pod.spec.tolerations or []]
    assert ("example.com/gpu", "h100", "NoSchedule") in tolerations


async def _on(kube: Kube, pod: str, node: str) -> bool:
    return await kube.pod_node(pod) == node


async def test_a_flavored_queues_gated_pods_get_the_flavors_node_selector_tolerations_and_label(
    api: ApiClient, kube: Kube, store: EventStore, nats_url: str, tmp_path: Path
) -> None:
    """Through the daemon: a pod group of the grouped queue carrying muster's gate is bound on its flavor's node
    with the flavor's node labels added to its nodeSelector, its taint tolerated and its name as a label, so the
    kubelet and any later scheduler see the flavor it was admitted on."""
    h100 = await kube.node("h100", gpus=8, labels={"example.com/product": "H100"})
    taint = {"key": "example.com/gpu", "value": "h100", "effect": "NoSchedule"}
    await kube.core.patch_node(h100, {"spec": {"taints": [taint]}}, _content_type=MERGE_PATCH)
    (tmp_path / "grouped.yaml").write_text(GROUPED)
    await queues_apply(nats_url, store, tmp_path / "grouped.yaml")
    labels = {"muster.dev/gang": "g", "muster.dev/gang-size": "2", "muster.dev/queue": "team-f"}
    for i in range(2):
        pod = m.pod(f"g-{i}", kube.ns, gpus=4, labels=labels, grace_seconds=0)
        pod["spec"]["schedulingGates"] = [{"name": FLAVOR_GATE}]
        await kube.create_pod(pod)
    async with running_daemon(store, api):
        for i in range(2):
            await eventually(lambda i=i: _on(kube, f"g-{i}", h100))
    for i in range(2):
        pod = await kube.core.read_namespaced_pod(f"g-{i}", kube.ns)
        assert pod.spec.node_selector == {"example.com/product": "H100"}
        assert not pod.spec.scheduling_gates
        assert ("example.com/gpu", "h100", "NoSchedule") in [(t.key, t.value, t.effect) for t in pod.spec.tolerations]
        assert pod.metadata.labels[FLAVOR_LABEL] == "h100"
