"""The daemon's dashboard shows the daemon's own fold: no second fold, and no decision changes because of it."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import aiohttp
import anyio
from uikit import memory_log, serving, wait_for

from muster.daemon.loop import LoopOptions, SchedulerLoop, SoleElector
from muster.demo.simcluster import SimulatedCluster, block_rack_nodes
from muster.events.store import EventStore
from muster.events.types import (
    JobFinished,
    JobId,
    JobSubmitted,
    PodSet,
    QueueConfigured,
    QueueName,
    SchedulerConfigured,
)
from muster.projections.cluster import evolve
from muster.projections.state import ClusterState
from muster.replay.audit import audit
from muster.replay.points import Point
from muster.replay.snapshotcodec import encode_state
from muster.replay.source import NatsLog
from muster.ui.feed import Feed

NODES = block_rack_nodes(1, 2, 2, 8)  # 4 nodes, 32 GPUs
JOBS = 6  # 2 x 8 GPUs each: twice what fits, so jobs wait, are admitted as others finish


def submitted(i: int) -> JobSubmitted:
    return JobSubmitted(
        at=int(time.time()),
        job=JobId(f"j{i}"),
        queue=QueueName("q"),
        podsets=[PodSet(name="w", count=2, requests={"gpu": 8})],
        runtime=10,
    )


async def plain_fold(store: EventStore, upto: int | None = None) -> ClusterState:
    state = ClusterState()
    for stored in await store.read():
        if upto is None or stored.seq <= upto:
            evolve(state, stored.event)
    return state


@contextlib.asynccontextmanager
async def daemon(store: EventStore) -> Any:
    def cluster(state: Any) -> SimulatedCluster:
        return SimulatedCluster(NODES, state, speed=20)

    loop = SchedulerLoop(store, elector=SoleElector("d1"), cluster=cluster, options=LoopOptions())
    async with anyio.create_task_group() as tg:
        yield loop, tg
        loop.stop()


async def test_the_dashboard_shares_the_daemons_fold_and_changes_no_decision(store: EventStore) -> None:
    """Pages read all along (live, past, stories, chargeback): every decision re-derives from the log alone."""
    await store.append(
        [
            SchedulerConfigured(at=0, levels=["muster.dev/block", "muster.dev/rack"]),
            QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 32}),
        ]
    )
    feed = Feed(NatsLog(store), store, every=3)
    async with daemon(store) as (loop, tg):
        feed.share(loop)
        await tg.start(loop.run)
        async with serving(feed) as base, aiohttp.ClientSession() as http:
            assert feed.state is loop.state, "the live pages show the daemon's own state"
            await store.append([submitted(i) for i in range(JOBS)])
            pages_read = 0

            async def read_every_page() -> None:
                nonlocal pages_read
                seq = feed.seq
                urls = ["cluster", "queues", "jobs", "chargeback", f"queues?at={max(1, seq // 2)}", "jobs/j0"]
                for url in urls:
                    async with http.get(f"{base}/api/{url}") as r:
                        assert r.status in (200, 404, 503), (url, r.status)  # 404: j0 unknown yet
                        pages_read += r.status == 200

            async def all_finished() -> bool:
                await read_every_page()
                return sum(isinstance(s.event, JobFinished) for s in await store.read()) == JOBS

            await wait_for(all_finished, f"the {JOBS} jobs finished", seconds=60)
            assert pages_read > 0
            last = await store.last_seq()

            async def caught_up() -> bool:
                return loop.folded_seq >= last

            await wait_for(caught_up, "the daemon folded the whole log")
            assert loop.state == await plain_fold(store), "the daemon's state is the plain fold of its log"
            for seq in range(1, last + 1):
                async with feed.at(Point(seq=seq)) as moment:
                    assert moment.state == await plain_fold(store, seq), f"seq {seq}"
            assert encode_state(loop.state) == encode_state(await plain_fold(store))
            assert feed.past.ended, "the finished jobs are kept for past points"
            assert all(job is not loop.state.jobs[job.id] for job in feed.past.ended), "copies, not the daemon's"
    report = await audit(NatsLog(store))
    assert report.ok and report.identical >= JOBS, report.differences
    assert feed.broken is None


class BrokenFold:
    """A shared fold whose state cannot be read: whatever the feed does after an event fails."""

    ready = True
    folded_seq = 1

    def __init__(self) -> None:
        self.listeners: list[Any] = []

    @property
    def state(self) -> ClusterState:
        raise RuntimeError("unreadable")

    def on_fold(self, callback: Any) -> None:
        self.listeners.append(callback)


def test_a_failing_dashboard_never_stops_the_daemons_fold() -> None:
    """An error in what the feed does after the daemon folded an event is kept by the feed, never raised to the fold."""
    fold = BrokenFold()
    feed = Feed(memory_log([]))
    feed.share(fold)
    for seq in (1, 2):
        fold.listeners[0](seq, QueueConfigured(at=0, name=QueueName("q"), nominal={}), True)
    assert feed.broken == "RuntimeError: unreadable"
