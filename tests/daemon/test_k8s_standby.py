"""A standby replica's standing watch (`Mirror`): a new term's adapter starts from it, without listing the cluster."""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
from adapterkit import FAST, describe, eventually, lists

from muster.daemon.k8s import manifests as m
from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.mirroring import Mirror
from muster.events.types import JobSubmitted, NodeAdded, NodeRemoved


def gang(emulator: Any, name: str) -> None:
    job = m.job(name, "ns", parallelism=2)
    emulator.put_object("batch/v1/jobs", job)
    for pod in m.job_pods(job, gpus=1, labels={"muster.dev/queue": "q"}):
        emulator.put_object("v1/pods", pod)


async def test_a_term_started_from_the_mirror_lists_nothing_and_reports_what_a_list_would(kube, start_adapter):
    """Changes made while the replica stood by are in what its term's adapter reports, with no list request."""
    emulator, api = kube
    for name in ("n1", "n2"):
        emulator.put_object("v1/nodes", m.node(name, gpus=8))
    gang(emulator, "before")
    mirror = Mirror(KubeClient(api), backoff=FAST)
    async with anyio.create_task_group() as tg:
        await tg.start(mirror.run)
        with anyio.fail_after(30):
            await mirror.listed()
        # while standing by: a node goes, one comes, a gang is created
        emulator.remove_object("v1/nodes", None, "n2")
        emulator.put_object("v1/nodes", m.node("n3", gpus=8))
        gang(emulator, "while-standing-by")
        await eventually(lambda: set(mirror.objects("nodes")) == {"n1", "n3"} and len(mirror.objects("pods")) == 4)
        listed = Counter(r.resource.plural for r in [*lists(emulator, "nodes"), *lists(emulator, "pods")])
        async with start_adapter(api, mirror=mirror) as (adapter, warm):
            await adapter.caught_up("pods", emulator.resource_version)
            await warm.wait_for(lambda e: len(e.of(JobSubmitted)) == 2)
            gang(emulator, "after")  # what the watch brings once the term runs
            await warm.wait_for(lambda e: len(e.of(JobSubmitted)) == 3)
        assert Counter(r.resource.plural for r in [*lists(emulator, "nodes"), *lists(emulator, "pods")]) == listed
        tg.cancel_scope.cancel()
    async with start_adapter(api) as (adapter, cold):  # a term that lists, for comparison
        await cold.wait_for(lambda e: len(e.of(JobSubmitted)) == 3)
    assert describe(warm.events) == describe(cold.events)
    assert {e.node for e in warm.of(NodeAdded)} == {"n1", "n3"} and not warm.of(NodeRemoved)


async def test_a_term_that_ended_leaves_the_mirror_watching_for_the_next(kube, start_adapter):
    """Two terms one after the other subscribe to the same mirror; the second sees what changed in between."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1", gpus=8))
    mirror = Mirror(KubeClient(api), backoff=FAST)
    async with anyio.create_task_group() as tg:
        await tg.start(mirror.run)
        async with start_adapter(api, mirror=mirror) as (_, first):
            await first.wait_for(lambda e: len(e.of(NodeAdded)) == 1)
        gang(emulator, "between")
        async with start_adapter(api, mirror=mirror) as (_, second):
            await second.wait_for(lambda e: len(e.of(JobSubmitted)) == 1)
        tg.cancel_scope.cancel()
    assert len(lists(emulator, "nodes")) == len(lists(emulator, "pods")) == 1, "only the mirror listed"
