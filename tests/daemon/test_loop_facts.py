"""Facts a leader's cluster pushes: stored once whichever term reports them, and never without the lease.

The loop runs on the real embedded NATS with a small fake `Cluster` that
pushes the facts a test hands it, as the Kubernetes adapter would (from
inside the term).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
from loopkit import FactCluster, gang

from muster.daemon.loop import LoopOptions, SchedulerLoop, SoleElector
from muster.demo.simcluster import block_rack_nodes
from muster.events.store import EventStore
from muster.events.types import Event, JobFinished, JobId, JobStarted, QueueConfigured, QueueName


class LapsingElector(SoleElector):
    """The only replica, whose lease a test can let lapse (without telling the loop, as a frozen refresh would)."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.valid = True

    def leading(self) -> bool:
        return self.valid and super().leading()


@contextlib.asynccontextmanager
async def replica(
    store: EventStore, facts: list[Event], *, elector: SoleElector | None = None, name: str = "d1"
) -> AsyncIterator[tuple[SchedulerLoop, list[FactCluster]]]:
    clusters: list[FactCluster] = []

    def make(state: Callable[[], Any]) -> FactCluster:
        clusters.append(FactCluster(list(facts)))
        return clusters[-1]

    loop = SchedulerLoop(
        store, elector=elector or SoleElector(name), cluster=make, options=LoopOptions(lease_check=1.0)
    )
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        with anyio.fail_after(15):
            await loop.first_term.wait()
        yield loop, clusters
        loop.stop()


@pytest.mark.parametrize("name", ["g", "ジョブ-🚀\t\n#7/.."], ids=["ascii", "unicode-and-control"])
async def test_a_job_fact_reported_by_two_terms_is_stored_once(store, name):
    """A restarted replica's cluster reports the same submission, start and end again: the log holds each once."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 0})])
    facts: list[Event] = [gang(name), JobStarted(at=2, job=JobId(name)), JobFinished(at=3, job=JobId(name))]
    async with replica(store, facts, name="first"):
        pass
    async with replica(store, facts, name="second") as (loop, _):
        assert loop.epoch == 2
    stored = [type(s.event).__name__ for s in await store.read() if not isinstance(s.event, QueueConfigured)]
    assert sorted(n for n in stored if n != "LeaderElected") == ["JobFinished", "JobStarted", "JobSubmitted"]


async def test_two_runs_of_a_job_starting_in_one_second_are_both_stored_once(store):
    """A job preempted and started again within the second: both starts are stored, each once across two terms."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 0})])
    job = JobId("g")
    facts: list[Event] = [gang("g"), JobStarted(at=2, job=job), JobStarted(at=2, job=job, run=1)]
    async with replica(store, facts, name="first"):
        pass
    async with replica(store, facts, name="second") as (loop, _):
        assert loop.epoch == 2
    starts = [s.event for s in await store.read() if isinstance(s.event, JobStarted)]
    assert [(e.job, e.run, e.at) for e in starts] == [(job, 0, 2), (job, 1, 2)]


async def test_a_leader_whose_lease_lapsed_appends_no_fact(store):
    """Facts pushed while the lease is not valid wait; the term ends on the lost lease, and nothing is written."""
    elector = LapsingElector("d1")
    async with replica(store, [], elector=elector) as (loop, clusters):
        with anyio.fail_after(15):
            while loop.cycles < 1:  # noqa: ASYNC110 - the term's first (empty) cycle: the loop idles after it
                await anyio.sleep(0.01)
        elector.valid = False  # a refresh that never came back; the loop notices on its next lease check
        clusters[0].push([JobFinished(at=5, job=JobId("late"))])
        with anyio.fail_after(15):
            while loop.term is not None:  # noqa: ASYNC110 - stepping down has no event to wait on
                await anyio.sleep(0.02)
        marker = await store.append([QueueConfigured(at=6, name=QueueName("marker"), nominal={})])
        stored = await store.read()
        assert stored[-1].seq == marker[0]
        assert not [s for s in stored if isinstance(s.event, JobFinished)]


async def test_a_new_leader_decides_once_on_all_its_own_facts(store):
    """A cluster that reports some submissions twice (a relist) never makes the term's first cycles lose the fence."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 10**6})])
    gangs = [gang(f"g{i}") for i in range(400)]
    # the repeats make the append's sequences non-contiguous, so the loop cannot fold them as it appends them
    nodes: list[Event] = list(block_rack_nodes(2, 4, 8, 8))  # 512 GPUs: room for every gang
    async with replica(store, [*nodes, *gangs, *gangs[:50], gang("late")]) as (loop, clusters):
        clusters[0].push([*gangs[:50], gang("later")])
        with anyio.fail_after(30):
            while {"late", "later"} - {j for j, job in loop.state.jobs.items() if job.status != "pending"}:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        assert loop.metrics.conflicts._value.get() == 0
