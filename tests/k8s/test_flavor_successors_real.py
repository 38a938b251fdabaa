"""An Indexed Job admitted on a tainted flavor, on a real API server: its next indexes get the flavor too.

The test plays the Job controller and the kubelet; the daemon runs whole (the loop on NATS, the
adapter on the server). A successor pod (an index past parallelism) is a new pod with none of what
the first wave got at binding: the adapter must give it the gang's flavor (label, tolerations) as it
binds it in its predecessor's slot.
"""

from __future__ import annotations

from kubekit import Kube, eventually, log_of, running_daemon
from kubernetes_asyncio.client import ApiClient

from muster.daemon.k8s.client import MERGE_PATCH
from muster.daemon.k8s.pods import FLAVOR_LABEL
from muster.events.store import EventStore
from muster.events.types import (
    FlavorConfigured,
    FlavorQuota,
    JobAdmitted,
    JobFinished,
    QueueConfigured,
    QueueName,
    ResourceGroup,
    Taint,
)

SPOT_TAINT = {"key": "example.com/spot", "value": "true", "effect": "NoSchedule"}


async def _flavor_fit(kube: Kube, name: str) -> tuple[str, str | None, bool]:
    """(node, flavor label, tolerates the spot taint) of a pod as the server holds it."""
    pod = await kube.core.read_namespaced_pod(name, kube.ns)
    tolerations = [(t.key, t.value, t.effect) for t in pod.spec.tolerations or []]
    label = (pod.metadata.labels or {}).get(FLAVOR_LABEL)
    return pod.spec.node_name or "", label, ("example.com/spot", "true", "NoSchedule") in tolerations


async def test_an_indexed_jobs_next_index_gets_its_gangs_flavor_when_bound(
    api: ApiClient, kube: Kube, store: EventStore
) -> None:
    """completions 3, parallelism 2 on the tainted spot flavor: index 2 binds in a freed slot with the spot
    label and toleration, as indexes 0 and 1 did; one admission, on spot, and the job finishes."""
    spot = FlavorConfigured(at=0, name="spot", node_labels={"pool": "spot"}, taints=[Taint(**SPOT_TAINT)])
    group = ResourceGroup(covered=["gpu"], flavors=[FlavorQuota(name="spot", nominal={"gpu": 8})])
    await store.append([spot, QueueConfigured(at=0, name=QueueName("q"), resource_groups=[group])])
    node = await kube.node("spot1", gpus=8, labels={"pool": "spot"})
    await kube.core.patch_node(node, {"spec": {"taints": [SPOT_TAINT]}}, _content_type=MERGE_PATCH)
    job, pods = await kube.job("sweep", 2, gpus=4, completions=3)
    first = [p["metadata"]["name"] for p in pods]
    async with running_daemon(store, api):
        for name in first:
            assert await eventually(lambda n=name: _bound_fit(kube, n)) == (node, "spot", True)
        await kube.set_phase(first[0], "Succeeded")
        [index2] = await kube.job_pods(job, [2], gpus=4, labels={"muster.dev/queue": "q"})
        successor = index2["metadata"]["name"]
        assert await eventually(lambda: _bound_fit(kube, successor)) == (node, "spot", True)

        await kube.set_phase(first[1], "Succeeded")
        await kube.set_phase(successor, "Succeeded")
        await eventually(lambda: log_of(store, JobFinished))
    [admission] = await log_of(store, JobAdmitted)
    assert admission.flavors == {"pod": {"gpu": "spot"}}


async def _bound_fit(kube: Kube, name: str) -> tuple[str, str | None, bool] | None:
    """The pod's flavor fit once it is bound (None before)."""
    fit = await _flavor_fit(kube, name)
    return fit if fit[0] else None
