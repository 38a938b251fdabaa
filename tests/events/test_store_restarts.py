"""The store across nats-server restarts: follow, read and append lose nothing and store nothing twice."""

from __future__ import annotations

import contextlib

import anyio
import pytest

from muster.events.embedded import EmbeddedNats
from muster.events.store import EventStore, StoredEvent
from muster.events.types import Event, JobFinished


def finishes(n: int, start: int = 0) -> list[Event]:
    """`n` distinct JobFinished events at times start, start+1, ..."""
    return [JobFinished(at=start + i, job=f"job-{start + i}") for i in range(n)]


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "sigkill"])
async def test_follow_sees_events_appended_after_a_server_restart(own_nats: EmbeddedNats, crash: bool) -> None:
    """A follower keeps its place through a server restart and yields later appends once each, in order."""
    events = finishes(6)
    seen: list[StoredEvent] = []
    async with await EventStore.connect(own_nats.url, stream="RESTART", prefix="restart") as es:
        await es.append(events[:3])
        with anyio.fail_after(30):
            async with contextlib.aclosing(es.follow(1)) as follower:
                async for stored in follower:
                    seen.append(stored)
                    if len(seen) == 3:
                        await own_nats.arestart(kill=crash)
                        await es.append(events[3:])
                    if len(seen) == 6:
                        break
        assert seen == [StoredEvent(i + 1, e) for i, e in enumerate(events)]
        assert await es.read() == seen


async def test_read_after_restart_finds_every_event(own_nats: EmbeddedNats) -> None:
    """Events appended before a restart are all read back after it from the same store directory."""
    events = finishes(50)
    async with await EventStore.connect(own_nats.url, stream="DURABLE", prefix="durable") as es:
        await es.append(events)
        await own_nats.arestart()
        with anyio.fail_after(15):
            assert [s.event for s in await es.read()] == events


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "sigkill"])
async def test_append_interrupted_by_a_restart_stores_every_event_once(own_nats: EmbeddedNats, crash: bool) -> None:
    """A pipelined append that spans a server restart completes, and each event is on the stream exactly once."""
    events = finishes(10_000)
    async with await EventStore.connect(own_nats.url, stream="MIDWAY", prefix="midway", request_timeout=2) as es:
        appending = True
        restarted_during_append = False
        async with anyio.create_task_group() as tg:

            async def restart_midway() -> None:
                nonlocal restarted_during_append
                while await es.last_seq() < 200:  # noqa: ASYNC110 - polls the server; nothing to wait on
                    await anyio.sleep(0.005)
                restarted_during_append = appending
                await own_nats.arestart(kill=crash)

            tg.start_soon(restart_midway)
            with anyio.fail_after(60):
                seqs = await es.append(events)
            appending = False
        stored = await es.read()
    assert restarted_during_append
    assert sorted(seqs) == [s.seq for s in stored]
    assert sorted(s.event.at for s in stored) == list(range(10_000))
