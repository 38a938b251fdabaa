"""A 3-node JetStream cluster on loopback, stream at 3 replicas, as a production install runs it.

Under a steady load of submissions, one follower server is killed (-9), then
the stream's leader: every acknowledged event is still on the stream (read
back from a surviving server), nothing is stored twice, and appends go on
after a new leader is elected.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from faultkit import JetStreamCluster, Load, config_events, stream_leader

from muster.events.store import EventStore, StoredEvent, StoreError
from muster.events.types import JobSubmitted
from muster.replay.invariants import check_log

pytestmark = pytest.mark.faults


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[JetStreamCluster]:
    """Three clustered nats-servers from the wheel, each with its own store dir."""
    c = JetStreamCluster(tmp_path)
    try:
        c.start()
        yield c
    finally:
        c.stop()


async def read_once_served(es: EventStore, seconds: float = 60.0) -> list[StoredEvent]:
    """The whole stream, once the cluster serves reads again.

    Right after the failover the servers may still answer 503 "temporarily unavailable" (the restarted one
    catching up, the meta leader moving) for longer than a read retries on a busy 2-core box; what this test
    checks is what the stream holds, so wait for it to be served."""
    with anyio.fail_after(seconds):
        while True:
            try:
                return await es.read()
            except StoreError as exc:
                if "503" not in str(exc):
                    raise
                await anyio.sleep(0.5)


async def test_killing_a_follower_then_the_leader_loses_no_acknowledged_event(cluster: JetStreamCluster) -> None:
    """Kill one server, then the stream leader, under load: all acknowledged submissions survive, once each."""
    await cluster.wait_ready()
    with anyio.fail_after(30):
        es = await EventStore.connect(
            ",".join(cluster.urls), stream="HA", prefix="ha", replicas=3, request_timeout=2, duplicate_window=60
        )
    async with es:
        info = await es.js.stream_info("HA")
        assert info.config.num_replicas == 3
        await es.append(config_events())
        load = Load(es, rate=100, batch=5)
        victims: list[str] = []
        async with anyio.create_task_group() as tg:
            await tg.start(load.run)
            await anyio.sleep(1.0)
            leader = await stream_leader(es)
            follower = next(f"n{i}" for i in range(3) if f"n{i}" != leader)
            victims.append(follower)
            await load.next_attempt()
            cluster.by_name(follower).kill()
            await anyio.sleep(1.0)
            acked_before = len(load.acknowledged)
            leader = await stream_leader(es)
            victims.append(leader)
            await load.next_attempt()
            cluster.by_name(leader).kill()
            # the survivor alone has no quorum (1 of 3): bring the follower back, as an operator would
            await cluster.by_name(follower).astart()
            await load.wait_acknowledged(acked_before + 50)  # appends go on under a new leader
            await load.drain()
            tg.cancel_scope.cancel()
        new_leader = await stream_leader(es)
        stored = await read_once_served(es)

    assert new_leader != victims[1]
    jobs = [s.event.job for s in stored if isinstance(s.event, JobSubmitted)]
    assert len(jobs) == len(set(jobs)), "an event was stored twice"
    assert set(load.acknowledged) <= set(jobs), f"lost: {sorted(set(load.acknowledged) - set(jobs))[:10]}"
    assert [s.seq for s in stored] == list(range(1, len(stored) + 1))
    report = check_log(stored, submitted=load.acknowledged)
    assert report.ok, report.summary()
