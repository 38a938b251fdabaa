"""A new leader's adapter taking over a cluster: what it finds is reported, completed, and cheap to find.

- A gang that ran while no adapter watched has its end reported (no capacity held forever).
- Gangs the log knows are sized from it: a relist of a big cluster asks the API nothing per gang
  (thousands of owner lookups starved the new leader's event loop until its lease lapsed).
- Lists are read in pages of one snapshot (no single huge answer to decode).
- A gang left partly bound by a killed leader is completed.
"""

from __future__ import annotations

from collections import Counter

from adapterkit import describe, eventually, lists
from kubernetes_asyncio.client import CoreV1Api

from muster.daemon.k8s import manifests as m
from muster.demo.emulator import KubeEmulator
from muster.events.types import (
    JobAdmitted,
    JobFailed,
    JobFinished,
    JobSubmitted,
    NodeAdded,
    NodeName,
    QueueConfigured,
    QueueName,
)
from muster.projections.cluster import fold


async def test_a_gang_that_finished_while_no_adapter_watched_is_reported_finished(kube, start_adapter):
    """Pods bound and Succeeded before a new leader's adapter starts: it reports the known job finished."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1"))
    job = m.job("train", "ns", parallelism=2)
    emulator.put_object("batch/v1/jobs", job)
    for pod in m.job_pods(job, gpus=1, labels={"muster.dev/queue": "q"}):
        await CoreV1Api(api).create_namespaced_pod("ns", pod)
    async with start_adapter(api) as (_, events):  # the old leader's adapter: it submits the gang
        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 1)
        [sub] = events.of(JobSubmitted)
    for key in sub.pods.values():  # bound by the old leader, then run to completion during the failover
        ns, name = key.split("/")
        emulator.patch_object("v1/pods", ns, name, {"spec": {"nodeName": "n1"}, "status": {"phase": "Succeeded"}})
    admitted = JobAdmitted(at=2, job=sub.job, queue=QueueName("q"), placement={p: NodeName("n1") for p in sub.pods})
    state = fold([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8}), sub, admitted])

    async with start_adapter(api, state=lambda: state) as (_, events):
        await events.wait_for(lambda e: bool(e.of(JobFinished)))
    assert [e.job for e in events.of(JobFinished)] == [sub.job]
    assert not events.of(JobSubmitted)  # the log knows the gang: not submitted again


async def test_an_admission_reapplied_before_the_gang_is_sized_still_binds(kube, start_adapter):
    """A new leader re-applies an admission while its adapter still fetches the gang's owner: it waits and binds."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1"))
    job = m.job("train", "ns", parallelism=2)
    emulator.put_object("batch/v1/jobs", job)
    for pod in m.job_pods(job, gpus=1, labels={"muster.dev/queue": "q"}):
        await CoreV1Api(api).create_namespaced_pod("ns", pod)
    async with start_adapter(api) as (_, events):
        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 1)
        [sub] = events.of(JobSubmitted)
    admitted = JobAdmitted(at=2, job=sub.job, queue=QueueName("q"), placement={p: NodeName("n1") for p in sub.pods})
    state = fold([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8}), sub, admitted])
    emulator.fail("GET", "jobs", status=None, delay=0.5)  # the owner lookup is slow

    async with start_adapter(api, state=lambda: state) as (adapter, _):
        result = await adapter.apply(admitted)
    assert (result.ok, result.outcome) == (True, "applied"), result
    for key in sub.pods.values():
        assert emulator.get_object("v1/pods", *key.split("/"))["spec"]["nodeName"] == "n1"


def owner_lookups(emulator: KubeEmulator) -> int:
    """GET requests for batch Jobs (the owner lookups that size a gang)."""
    return sum(
        1
        for r in emulator
        if r.resource is not None and r.resource.plural == "jobs" and r.name and str(r.method.value) == "GET"
    )


async def test_a_new_leader_asks_the_api_nothing_about_gangs_the_log_knows(kube, start_adapter):
    """A relist finding many gangs the log knows sizes them from the log: no owner lookup, each end still reported."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1", gpus=8))
    for i in range(12):
        job = m.job(f"t{i}", "ns", parallelism=2)
        emulator.put_object("batch/v1/jobs", job)
        for pod in m.job_pods(job, gpus=1, labels={"muster.dev/queue": "q"}):
            emulator.put_object("v1/pods", pod)
    async with start_adapter(api) as (_, events):  # an earlier leader: it sizes and submits them
        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 12)
        subs = events.of(JobSubmitted)
    assert owner_lookups(emulator) == 12
    for sub in subs:  # they ran to completion while no adapter watched
        for key in sub.pods.values():
            ns, name = key.split("/")
            emulator.patch_object("v1/pods", ns, name, {"spec": {"nodeName": "n1"}, "status": {"phase": "Succeeded"}})
    admissions = [
        JobAdmitted(at=2, job=s.job, queue=QueueName("q"), placement={p: NodeName("n1") for p in s.pods}) for s in subs
    ]
    state = fold([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8}), *subs, *admissions])

    async with start_adapter(api, state=lambda: state) as (_, events):
        await events.wait_for(lambda e: len(e.of(JobFinished)) == 12)
    assert owner_lookups(emulator) == 12, "the new leader looked up owners the log already sized"
    assert not events.of(JobSubmitted)


async def test_a_gang_left_partly_bound_is_completed_even_if_its_bound_pod_already_succeeded(kube, start_adapter):
    """Leader killed between a gang's bindings; its bound pod ran to the end: the next leader binds the rest."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1"))
    job = m.job("train", "ns", parallelism=2)
    emulator.put_object("batch/v1/jobs", job)
    for pod in m.job_pods(job, gpus=1, labels={"muster.dev/queue": "q"}):
        emulator.put_object("v1/pods", pod)
    async with start_adapter(api) as (_, events):
        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 1)
        [sub] = events.of(JobSubmitted)
    first, second = (key.split("/") for key in sub.pods.values())
    emulator.patch_object("v1/pods", *first, {"spec": {"nodeName": "n1"}, "status": {"phase": "Succeeded"}})
    admitted = JobAdmitted(at=2, job=sub.job, queue=QueueName("q"), placement={p: NodeName("n1") for p in sub.pods})
    state = fold([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8}), sub, admitted])

    async with start_adapter(api, state=lambda: state) as (adapter, events):
        result = await adapter.apply(admitted)
        assert (result.ok, result.outcome) == (True, "applied"), result
        assert emulator.get_object("v1/pods", *second)["spec"]["nodeName"] == "n1"
        emulator.patch_object("v1/pods", *second, {"status": {"phase": "Succeeded"}})
        await events.wait_for(lambda e: bool(e.of(JobFinished)))
    assert not events.of(JobFailed)


async def test_a_large_list_is_read_in_pages_and_each_object_reported_once(kube, start_adapter):
    """With a page size of 3, seven nodes come in three list requests of one snapshot; each is added once."""
    emulator, api = kube
    for i in range(7):
        emulator.put_object("v1/nodes", m.node(f"n{i}"))
    async with start_adapter(api, page_size=3) as (_, events):
        assert describe(events.of(NodeAdded)) == Counter({("NodeAdded", f"n{i}"): 1 for i in range(7)})
        node_lists = lists(emulator, "nodes")
        assert [r.params.get("limit") for r in node_lists] == ["3", "3", "3"]
        assert [bool(r.params.get("continue")) for r in node_lists] == [False, True, True]
        emulator.put_object("v1/nodes", m.node("n7"))  # the watch goes on from the list's snapshot
        await events.wait_for(lambda e: len(e.of(NodeAdded)) == 8)
        assert len(events.of(NodeAdded)) == 8


async def test_a_continue_token_older_than_a_compaction_gets_410_from_the_emulator(kube):
    """The emulator pages a list of one snapshot; after `expire()` the rest of it is gone (410), like kube-apiserver."""
    emulator, _ = kube
    for i in range(3):
        emulator.put_object("v1/nodes", m.node(f"n{i}"))
    server = emulator.servers[0]
    async with server.client.get("/api/v1/nodes?limit=2") as resp:
        page = await resp.json(content_type=None)
    assert [n["metadata"]["name"] for n in page["items"]] == ["n0", "n1"]
    assert page["metadata"]["remainingItemCount"] == 1
    emulator.put_object("v1/nodes", m.node("n3"))  # after the snapshot: not in its later pages
    async with server.client.get(f"/api/v1/nodes?limit=2&continue={page['metadata']['continue']}") as resp:
        rest = await resp.json(content_type=None)
    assert [n["metadata"]["name"] for n in rest["items"]] == ["n2"]
    assert rest["metadata"]["resourceVersion"] == page["metadata"]["resourceVersion"]
    assert "continue" not in rest["metadata"]
    async with server.client.get("/api/v1/nodes?limit=2") as resp:
        token = (await resp.json(content_type=None))["metadata"]["continue"]
    emulator.expire()
    async with server.client.get(f"/api/v1/nodes?limit=2&continue={token}") as resp:
        assert resp.status == 410


async def test_a_new_leader_finds_an_indexed_job_midway_and_keeps_each_pod_in_the_slot_it_took(kube, start_adapter):
    """Index 2 runs where index 0 ran: a relist keeps it in that slot (no foreign usage, no conflict) and ends at 4."""
    emulator, api = kube
    for name in ("a", "b"):
        emulator.put_object("v1/nodes", m.node(name, gpus=8))
    job = m.job("sweep", "ns", parallelism=2, completions=4)
    emulator.put_object("batch/v1/jobs", job)
    labels = {"muster.dev/queue": "q"}
    core = CoreV1Api(api)
    first = m.job_pods(job, gpus=8, labels=labels)
    for pod in first:
        await core.create_namespaced_pod("ns", pod)
    async with start_adapter(api) as (_, events):  # the old leader's adapter: it submits the gang
        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 1)
        [sub] = events.of(JobSubmitted)
    placement = {"pod-0": NodeName("a"), "pod-1": NodeName("b")}
    admitted = JobAdmitted(at=2, job=sub.job, queue=QueueName("q"), placement=placement)
    # under the old leader: index 0 ran on a and succeeded, index 2 took its slot; index 1 runs on b
    index0, index1 = (p["metadata"]["name"] for p in first)
    emulator.patch_object("v1/pods", "ns", index0, {"spec": {"nodeName": "a"}, "status": {"phase": "Succeeded"}})
    emulator.patch_object("v1/pods", "ns", index1, {"spec": {"nodeName": "b"}, "status": {"phase": "Running"}})
    [index2] = m.job_pods(job, [2], gpus=8, labels=labels, node_name="a", phase="Running")
    await core.create_namespaced_pod("ns", index2)
    nodes = [NodeAdded(at=0, node=NodeName(n), capacity={"gpu": 8}) for n in ("a", "b")]
    state = fold([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 16}), *nodes, sub, admitted])

    async with start_adapter(api, state=lambda: state) as (adapter, events):
        gangs = adapter.translator.gangs
        running = [gangs.pod(f"ns/{n}") for n in (index1, index2["metadata"]["name"])]
        assert not [p for p in running if p is None or gangs.holds_capacity(p)]  # none counted as foreign usage
        assert (await adapter.apply(admitted)).outcome == "noop"  # every pod on the node of its slot
        for name in (index1, index2["metadata"]["name"]):
            emulator.patch_object("v1/pods", "ns", name, {"status": {"phase": "Succeeded"}})
        [index3] = m.job_pods(job, [3], gpus=8, labels=labels)
        await core.create_namespaced_pod("ns", index3)
        name3 = index3["metadata"]["name"]
        await eventually(lambda: emulator.get_object("v1/pods", "ns", name3)["spec"].get("nodeName"))
        assert not events.of(JobFinished)  # 3 of 4 completions
        emulator.patch_object("v1/pods", "ns", name3, {"status": {"phase": "Succeeded"}})
        await events.wait_for(lambda e: bool(e.of(JobFinished)))
    assert [e.job for e in events.of(JobFinished)] == [sub.job]
    assert not events.of(JobSubmitted)


async def test_a_new_leader_submits_a_jobs_late_replacements_as_a_new_run_once(kube, start_adapter):
    """The log ended a Job's run (its pods gone before binding); the pods there now are a new job, submitted once."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1", gpus=8))
    job = m.job("train", "ns", parallelism=2)
    emulator.put_object("batch/v1/jobs", job)
    labels = {"muster.dev/queue": "q"}
    first = m.job_pods(job, gpus=1, labels=labels)
    core = CoreV1Api(api)
    for pod in first:
        await core.create_namespaced_pod("ns", pod)
    async with start_adapter(api) as (_, events):
        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 1)
        [sub] = events.of(JobSubmitted)
    for pod in first:  # lost with their node; the readmission gave up on them
        emulator.remove_object("v1/pods", "ns", pod["metadata"]["name"])
    failed = JobFailed(at=3, job=sub.job, reason="pods gone before binding: pod-0, pod-1")
    log = [QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8}), sub, failed]
    for pod in m.job_pods(job, gpus=1, labels=labels):  # the controller's replacements, late
        await core.create_namespaced_pod("ns", pod)

    async with start_adapter(api, state=lambda: fold(log)) as (_, events):
        await events.wait_for(lambda e: bool(e.of(JobSubmitted)))
        [rerun] = events.of(JobSubmitted)
    assert rerun.job.startswith(f"{sub.job}-r") and rerun.source == sub.source
    assert set(rerun.pods.values()).isdisjoint(sub.pods.values())

    log.append(rerun)  # on the log now: the next leader knows it and submits nothing
    async with start_adapter(api, state=lambda: fold(log)) as (adapter, events):
        await adapter.caught_up("pods", emulator.resource_version)
        assert not events.of(JobSubmitted)
