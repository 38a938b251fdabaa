"""The chart's rendered RBAC on a real API server is enough for the daemon and no broader; Lease election works there.

The chart is rendered with real Helm (tests/deploy/helmkit.py), its ClusterRole, Role and
bindings applied with the subjects changed to the user `tester` (the server's
non-admin token user), and the adapter and the Lease elector then run as `tester`:
every call they make must be allowed, and what a scheduler must not do is refused.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from kubekit import Kube, eventually, running_adapter
from kubernetes_asyncio.client import ApiClient, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException
from rbackit import bind_chart_rbac_to_tester

from muster.daemon.k8s.lease import LeaseElector
from muster.events.types import JobAdmitted, JobPreempted, JobSubmitted, NodeAdded, NodeName, QueueName


async def test_the_charts_roles_suffice_for_the_adapter_and_the_lease_and_no_more(
    api: ApiClient, user_api: ApiClient, kube: Kube, tmp_path: Path
) -> None:
    """As `tester` with the chart's roles only: watch, owner lookup, bind, evict and the Lease work; the rest is 403."""
    config = await bind_chart_rbac_to_tester(kube, tmp_path)
    election = config["leader_election"]
    node = await kube.node("n1")
    await kube.job("train", 2)

    async with running_adapter(user_api) as (adapter, events):
        await events.wait_for(lambda e: any(n.node == node for n in e.of(NodeAdded)) and bool(e.of(JobSubmitted)))
        [sub] = events.of(JobSubmitted)  # sized from the Job: a `get` of batch/jobs
        placement = {p: NodeName(node) for p in sub.pods}
        bound = await adapter.apply(JobAdmitted(at=1, job=sub.job, queue=QueueName("q"), placement=placement))
        assert (bound.ok, bound.outcome) == (True, "applied"), bound
        evicted = await adapter.apply(JobPreempted(at=2, job=sub.job, preemptor=None, reason="WithinQueue"))
        assert (evicted.ok, evicted.outcome) == (True, "applied"), evicted
        # the Events about it and the Job's status were written as tester (the chart grants events
        # create/patch and jobs patch): Admitted on the Job, Preempted on the Job and each pod
        assert adapter.reporter is not None
        await eventually(lambda: adapter.reporter.written >= len(sub.pods) + 2)  # type: ignore[union-attr]
    listed = await CoreV1Api(api).list_namespaced_event(kube.ns, field_selector="involvedObject.kind=Job")
    assert {e.reason for e in listed.items} == {"Admitted", "Preempted"}
    job = await kube.batch.read_namespaced_job("train", kube.ns)
    assert job.metadata.annotations["muster.dev/status"] == "Preempted"

    elector = LeaseElector(user_api, election["lease_namespace"], election["lease_name"], "replica-a", ttl=2.0)
    async with anyio.create_task_group() as tg:
        await tg.start(elector.run)
        await eventually(elector.leading)
        await elector.resign()
        tg.cancel_scope.cancel()

    core = CoreV1Api(user_api)
    forbidden = [
        core.delete_namespaced_pod("train-x", kube.ns),
        core.list_namespaced_secret(kube.ns),
        core.patch_node(node, {"metadata": {"labels": {"x": "y"}}}),
        core.create_namespaced_pod(kube.ns, {"metadata": {"name": "p"}, "spec": {"containers": []}}),
    ]
    for call in forbidden:
        with pytest.raises(ApiException) as refused:
            await call
        assert refused.value.status == 403


async def test_two_electors_on_a_real_lease_one_leads_and_a_resign_hands_over(api: ApiClient, kube: Kube) -> None:
    """Of two candidates one takes the Lease (the other's replace is refused 409); after a resign the other leads."""
    a = LeaseElector(api, kube.ns, "muster-leader", "replica-a", ttl=2.0)
    b = LeaseElector(api, kube.ns, "muster-leader", "replica-b", ttl=2.0)
    async with anyio.create_task_group() as tg:
        await tg.start(a.run)
        await eventually(a.leading)
        await tg.start(b.run)
        # b polls the Lease several times meanwhile and never takes it while a renews
        with anyio.move_on_after(1.5):
            await eventually(b.leading, seconds=10)
        assert a.leading() and not b.leading()
        await a.resign()
        await eventually(b.leading, seconds=15)
        assert not a.leading()
        tg.cancel_scope.cancel()
