"""The leader's sealer under a tiny retention window: billing misses nothing, and the rolled log audits clean."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import nats
import pytest
from loopkit import NODES, configure, job

from muster.daemon.archiving import ArchiveStart, Sealer, SealerOptions
from muster.daemon.billing import BillingMetrics, BillingSubscriber, SubscriberOptions
from muster.daemon.billing_store import LedgerDB
from muster.daemon.loop import LoopOptions, SchedulerLoop, SoleElector
from muster.demo.simcluster import SimulatedCluster
from muster.events.archive import DirectoryArchive, last_sealed
from muster.events.store import EventStore, LogHole, Retention
from muster.events.types import Event
from muster.projections.state import ClusterState
from muster.replay.audit import audit
from muster.replay.source import ArchivedLog, NatsLog

WAVES = 8
Factory = Callable[..., contextlib.AbstractAsyncContextManager[EventStore]]


@contextlib.asynccontextmanager
async def billing(url: str, stream: str, db: Path) -> AsyncIterator[BillingSubscriber]:
    """The billing subscriber (durable `billing`) running against `stream` into the SQLite ledger `db`."""
    nc = await nats.connect(url)
    ledger = LedgerDB.open(f"sqlite:///{db}")
    options = SubscriberOptions(stream=stream, durable="billing", batch=20, fetch_timeout=0.2)
    sub = BillingSubscriber(nc.jetstream(), ledger, options, BillingMetrics())
    stop = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            await sub.start()
            tg.start_soon(lambda: sub.run(stop=stop))
            yield sub
            stop.set()
    finally:
        await sub.close()
        await nc.close()
        ledger.close()


async def settled(loop: SchedulerLoop, sub: BillingSubscriber, sealer: Sealer, jobs: int) -> bool:
    """Every job so far finished, billing has everything, and every whole segment is sealed."""
    end = await loop.store.last_seq()
    done = sum(j.status == "finished" for j in loop.state.jobs.values())
    return done == jobs and sub.tracker.seq == end and await last_sealed(sealer.archive) > end - 10


def ledger_of(db: Path) -> Any:
    with LedgerDB.open(f"sqlite:///{db}") as ledger:
        return ledger.read_window()


async def test_billing_and_audit_over_a_stream_the_daemon_rolled_over(
    nats_url: str, tmp_path: Path, store_factory: Factory
) -> None:
    """The leader seals and purges the stream to a 16 KB window; billing equals the unrolled log's, audit finds 0."""
    archive = DirectoryArchive(tmp_path / "archive")
    async with store_factory(nats_url) as store:
        await configure(store)
        window = Retention(max_bytes=16_384)
        sealer = Sealer(store, archive, SealerOptions(10, 0.05, consumers=("billing",), window=window))

        def cluster(state: Any) -> SimulatedCluster:
            return SimulatedCluster(NODES, state, speed=20)

        async with billing(nats_url, store.stream, tmp_path / "rolled.db") as sub, anyio.create_task_group() as tg:
            loop = SchedulerLoop(
                store, elector=SoleElector("d1"), cluster=cluster, options=LoopOptions(), services=[sealer.run]
            )
            await tg.start(loop.run)
            for wave in range(WAVES):
                await store.append([job(f"j{wave}-{i}", gpus=8, runtime=40) for i in range(4)])
                with anyio.fail_after(60):
                    while not await settled(loop, sub, sealer, 4 * (wave + 1)):  # noqa: ASYNC110
                        await anyio.sleep(0.05)
            end = await store.last_seq()
            loop.stop()
        assert await store.first_seq() > 3 * 10, "the sealer should have purged several segments"
        assert sealer.failures == 0
        whole = ArchivedLog(archive, NatsLog(store))
        events: list[Event] = [s.event async for batch in whole.batches() for s in batch]
        assert len(events) == end
        report = await audit(whole)
        assert report.differ == 0 and report.identical > 0

    async with store_factory(nats_url) as unrolled:  # the same log, never rolled over, billed from the start
        await unrolled.append(events, msg_ids=[f"copy-{i}" for i in range(len(events))])
        async with billing(nats_url, unrolled.stream, tmp_path / "unrolled.db") as again:
            with anyio.fail_after(30):
                while again.tracker.seq < end:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
    (usage, _, queues), (usage_unrolled, _, queues_unrolled) = (
        ledger_of(tmp_path / "rolled.db"),
        ledger_of(tmp_path / "unrolled.db"),
    )
    # every job's GPU-seconds and cost inputs; idle capacity is booked when the subscriber is caught up
    # (`settle_every`), which depends on when it read, not on what
    assert usage == usage_unrolled and usage and queues == queues_unrolled


async def test_sealing_waits_for_a_consumer_that_has_not_read_the_events(
    nats_url: str, tmp_path: Path, store_factory: Factory
) -> None:
    """Nothing past a configured consumer's ack floor is sealed, nor anything while that consumer does not exist."""
    from nats.js.api import AckPolicy, ConsumerConfig

    archive = DirectoryArchive(tmp_path / "archive")
    async with store_factory(nats_url) as store:
        await store.append([job(f"j{i}") for i in range(30)])
        sealer = Sealer(store, archive, SealerOptions(segment_events=10, consumers=("slow",)))
        assert await sealer.seal() == [], "no consumer yet: its position is unknown"
        await store.js.add_consumer(store.stream, ConsumerConfig(durable_name="slow", ack_policy=AckPolicy.EXPLICIT))
        assert await sealer.seal() == [] and await last_sealed(archive) == 0
        unbounded = Sealer(store, archive, SealerOptions(segment_events=10, consumers=()))
        assert [(r.first, r.last) for r in await unbounded.seal()] == [(1, 10), (11, 20), (21, 30)]


async def acked_through(store: EventStore, durable: str, seq: int) -> None:
    """Consumer `durable` (created if missing) fetches and acknowledges every message up to `seq`."""
    psub = await store.js.pull_subscribe(f"{store.prefix}.>", durable=durable, stream=store.stream)
    try:
        info = await psub.consumer_info()
        while info.delivered.stream_seq < seq:
            for msg in await psub.fetch(seq - info.delivered.stream_seq, timeout=5):
                await msg.ack_sync()
            info = await psub.consumer_info()
    finally:
        await psub.unsubscribe()


async def test_a_lagging_consumer_holds_the_purge_back(nats_url: str, tmp_path: Path, store_factory: Factory) -> None:
    """Events past the window stay on the stream until the slowest configured consumer has acknowledged them."""
    archive = DirectoryArchive(tmp_path / "archive")
    async with store_factory(nats_url) as store:
        await store.append([job(f"j{i}") for i in range(30)])
        sealer = Sealer(store, archive, SealerOptions(10, consumers=("billing", "slow"), window=Retention(max_bytes=1)))
        await acked_through(store, "billing", 30)
        assert await sealer.step() == ([], 0), "slow does not exist yet: its position is unknown"
        await acked_through(store, "slow", 15)
        sealed, purged = await sealer.step()
        assert [(r.first, r.last) for r in sealed] == [(1, 10)] and purged == 10
        assert await store.first_seq() == 11
        await acked_through(store, "slow", 30)
        sealed, purged = await sealer.step()
        assert [(r.first, r.last) for r in sealed] == [(11, 20), (21, 30)] and purged == 20
        events = [s.event async for batch in ArchivedLog(archive, NatsLog(store)).batches() for s in batch]
        assert [e.job for e in events] == [f"j{i}" for i in range(30)]  # type: ignore[attr-defined]


async def test_only_sealed_events_past_the_window_leave_the_stream(
    nats_url: str, tmp_path: Path, store_factory: Factory
) -> None:
    """Sealed events inside the window (age, bytes) stay; past it they go; unsealed ones stay wherever they are."""
    archive = DirectoryArchive(tmp_path / "archive")
    now = time.time()
    async with store_factory(nats_url) as store:
        await store.append([job(f"j{i}") for i in range(25)])

        def sealer(window: Retention, clock: float = now) -> Sealer:
            return Sealer(store, archive, SealerOptions(10, consumers=(), window=window), clock=lambda: clock)

        assert (await sealer(Retention()).step()).purged == 0, "no window: the stream keeps everything"
        assert await last_sealed(archive) == 20
        assert await sealer(Retention(max_bytes=10**9)).step() == ([], 0), "all of it fits the window"
        assert await sealer(Retention(max_age=3600)).step() == ([], 0), "none of it is an hour old"
        assert await sealer(Retention(max_age=3600), clock=now + 7200).step() == ([], 20), "the unsealed 5 stay"
        assert await store.first_seq() == 21
        await store.append([job(f"k{i}") for i in range(30)])
        info = await store.js.stream_info(store.stream)
        per_message = info.state.bytes / info.state.messages
        sealed, purged = await sealer(Retention(max_bytes=int(per_message * 12.5))).step()
        assert [(r.first, r.last) for r in sealed] == [(21, 30), (31, 40), (41, 50)]
        assert (purged, await store.first_seq()) == (23, 44), "the window keeps the last 12 of 55"


async def test_a_stream_that_denies_purge_is_sealed_and_left_to_its_own_limits(nats_url: str, tmp_path: Path) -> None:
    """On a stream created with deny_purge (NATS never lifts it) the sealer seals, purges nothing and fails no pass."""
    import uuid

    from nats.js.api import StreamConfig

    tag = uuid.uuid4().hex[:12]
    stream, prefix = f"T{tag}", f"t{tag}"
    nc = await nats.connect(nats_url)
    try:
        await nc.jetstream().add_stream(StreamConfig(name=stream, subjects=[f"{prefix}.>"], deny_purge=True))
        store = await EventStore.connect(nc, stream=stream, prefix=prefix, create=False)
        await store.append([job(f"j{i}") for i in range(25)])
        sealer = Sealer(
            store, DirectoryArchive(tmp_path), SealerOptions(10, consumers=(), window=Retention(max_bytes=1))
        )
        for _ in range(2):
            assert (await sealer.step()).purged == 0 and sealer.purge_denied and sealer.failures == 0
        assert (await last_sealed(sealer.archive), await store.first_seq()) == (20, 1)
        await store.close()
    finally:
        await nc.jetstream().delete_stream(stream)
        await nc.close()


async def caught_up_replica(store: EventStore, start: ArchiveStart | None) -> ClusterState:
    """The state of a standby replica started from `start` once it has folded the stream's end."""
    elector = SoleElector("d2")
    await elector.resign()  # it follows the log and never leads
    loop = SchedulerLoop(store, elector=elector, cluster=lambda state: SimulatedCluster(NODES, state), start=start)
    end = await store.last_seq()
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        with anyio.fail_after(20):
            while loop.folded_seq < end:  # noqa: ASYNC110 - the follower has no "caught up" event
                await anyio.sleep(0.02)
        loop.stop()
    return loop.state


async def test_a_replica_started_on_a_purged_stream_folds_the_archive_too(
    nats_url: str, tmp_path: Path, store_factory: Factory
) -> None:
    """A replica on a stream the sealer purged starts from archive and stream as one log; from the stream alone, not."""
    from loopkit import daemon, of, wait_for

    from muster.events.types import JobStarted
    from muster.projections.cluster import fold

    archive = DirectoryArchive(tmp_path / "archive")
    async with store_factory(nats_url) as store:
        await configure(store)
        async with daemon(store):
            await store.append([job(f"j{i}") for i in range(4)])
            # every job admitted and its start reported: the cluster has no fact left in flight,
            # which would land after `whole` is read and be folded by the replica only
            await wait_for(store, lambda events: len(of(events, JobStarted)) == 4)
        whole = fold([s.event for s in await store.read()])
        options = SealerOptions(5, consumers=(), window=Retention(max_bytes=1), state_every=10)
        assert (await Sealer(store, archive, options).step()).purged > 10
        assert await caught_up_replica(store, ArchiveStart(store, archive)) == whole
        with pytest.raises(ExceptionGroup) as alone:  # the stream alone lacks the purged past: no start
            await caught_up_replica(store, None)
        assert alone.group_contains(LogHole)
