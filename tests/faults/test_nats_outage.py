"""nats-server killed (-9) and restarted while submissions keep arriving: nothing lost, nothing stored twice.

Design invariants 5 and 7 at the store: every append is retried with the
same message ids until acknowledged, so each submission is on the stream
exactly once, and a follower started before the crashes yields every event
once, in order, catching up after each restart.
"""

from __future__ import annotations

import anyio
import pytest
from faultkit import Follower, Load, config_events, percentile

from muster.events.embedded import EmbeddedNats
from muster.events.store import EventStore
from muster.events.types import JobSubmitted
from muster.replay.invariants import check_log

pytestmark = pytest.mark.faults

KILLS = 3


async def test_server_kills_under_load_lose_and_double_nothing(own_nats: EmbeddedNats) -> None:
    """100 submissions/s through 3 kill -9 + restarts: every acknowledged job stored once, the follower sees all."""
    async with await EventStore.connect(
        own_nats.url, stream="OUTAGE", prefix="outage", request_timeout=1, duplicate_window=60
    ) as es:
        await es.append(config_events())
        load = Load(es, rate=100, batch=5)
        follower = Follower(es)
        kills: list[tuple[float, float]] = []
        async with anyio.create_task_group() as tg:
            await tg.start(follower.run)
            await tg.start(load.run)
            for _ in range(KILLS):
                await anyio.sleep(0.8)
                await load.next_attempt()
                started = anyio.current_time()
                own_nats.kill()  # at once, while that append waits for its acknowledgement
                await own_nats.arestart()
                kills.append((started, anyio.current_time()))
            await anyio.sleep(0.8)
            await load.drain()
            last = await es.last_seq()
            await follower.wait_for_seq(last)
            tg.cancel_scope.cancel()
        stored = await es.read()

    jobs = [s.event.job for s in stored if isinstance(s.event, JobSubmitted)]
    interrupted = [load.overlapping(a, b) for a, b in kills]
    assert all(interrupted), "a kill got in the way of no append: the test proved nothing"
    assert len(jobs) == len(set(jobs)), "a retried append was stored twice"
    assert sorted(jobs) == sorted(load.acknowledged), "an acknowledged submission is missing"
    assert [s.seq for s in follower.seen] == [s.seq for s in stored], "the follower skipped or repeated events"
    assert [s.seq for s in stored] == list(range(1, len(stored) + 1))
    report = check_log(stored, submitted=load.acknowledged)
    assert report.ok, report.summary()
    recovery = [max(d) for d in interrupted]
    assert percentile(recovery, 99) < 15, f"appends stalled too long across a restart: {recovery}"
