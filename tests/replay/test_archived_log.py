"""A log whose stream rolled over: archive segments plus the stream's window replay and audit as the whole log."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from replaykit import mixed, sim

from muster.cli import main
from muster.events.archive import DirectoryArchive, seal_new
from muster.events.codec import encode
from muster.events.store import EventStore, Retention, StoreError
from muster.replay.audit import audit, report_document
from muster.replay.source import ArchivedLog, MemoryLog, NatsLog

Factory = Callable[..., contextlib.AbstractAsyncContextManager[EventStore]]


async def _stored(source: ArchivedLog | MemoryLog, **kw: int) -> list[tuple[int, bytes]]:
    return [(s.seq, encode(s.event)) async for batch in source.batches(**kw) for s in batch]


async def test_a_rolled_over_log_replays_and_audits_like_the_whole_log(
    nats_url: str, tmp_path: Path, store_factory: Factory
) -> None:
    """Sealed while appended, the stream keeping 8 KB, the log reads and audits byte-identically to the unrolled one."""
    events = sim(mixed(1)).events
    whole = MemoryLog.from_events(events)
    archive = DirectoryArchive(tmp_path / "archive")
    async with store_factory(nats_url, retention=Retention(max_bytes=8192)) as store:
        for start in range(0, len(events), 10):
            await store.append(events[start : start + 10])
            await seal_new(store, archive, through=await store.last_seq(), every=10)
        assert await store.first_seq() > 100, "the stream should have rolled over several times"
        assert len(await archive.segments()) >= 5
        log = ArchivedLog(archive, NatsLog(store))
        assert await _stored(log) == await _stored(whole)
        assert await _stored(log, from_seq=30, to_seq=170) == await _stored(whole, from_seq=30, to_seq=170)
        middle = events[len(events) // 2].at
        assert await _stored(log, until=middle) == await _stored(whole, until=middle)
        assert await log.raw(7) == await whole.raw(7)
        ours, theirs = report_document(await audit(log)), report_document(await audit(whole))
        for report in (ours, theirs):
            del report["seconds"], report["source"]
        assert ours == theirs and ours["differ"] == 0


async def test_events_that_left_the_stream_unsealed_are_a_hole_not_a_silent_skip(
    nats_url: str, tmp_path: Path, store_factory: Factory
) -> None:
    """Reading across events the window dropped before anyone sealed them fails and says which are missing."""
    events = sim(mixed(1)).events
    async with store_factory(nats_url, retention=Retention(max_bytes=4096)) as store:
        await store.append(events)
        log = ArchivedLog(DirectoryArchive(tmp_path / "empty"), NatsLog(store))
        with pytest.raises(StoreError, match="left stream"):
            await _stored(log)


async def test_replay_and_audit_commands_read_across_the_archive(
    nats_url: str, tmp_path: Path, store_factory: Factory, capsys: pytest.CaptureFixture[str]
) -> None:
    """`muster replay/audit --archive DIR` over a rolled-over stream print what they print for the whole log."""
    events = sim(mixed(1)).events
    archive = DirectoryArchive(tmp_path / "archive")
    whole = tmp_path / "whole.jsonl"
    whole.write_bytes(b"".join(encode(e) + b"\n" for e in events))
    async with store_factory(nats_url, retention=Retention(max_bytes=8192)) as store:
        for start in range(0, len(events), 10):
            await store.append(events[start : start + 10])
            await seal_new(store, archive, through=await store.last_seq(), every=10)
        nats = ["--nats", nats_url, "--stream", store.stream, "--archive", str(archive.path), "--no-snapshots"]
        for command in (["replay", "--output", "json"], ["audit", "--output", "json"]):
            assert await anyio.to_thread.run_sync(main, [*command, *nats]) == 0
            rolled = json.loads(capsys.readouterr().out)
            assert await anyio.to_thread.run_sync(main, [*command, "--log", str(whole)]) == 0
            unrolled = json.loads(capsys.readouterr().out)
            for doc in (rolled, unrolled):
                for how in ("source", "seconds", "replay"):  # where it read and how long it took
                    doc.pop(how, None)
            assert rolled == unrolled
        assert await anyio.to_thread.run_sync(main, ["replay", *nats[:4], "--no-snapshots"]) == 1
        assert "left stream" in capsys.readouterr().err


async def test_an_archived_point_starts_from_the_state_sealed_with_its_segment(
    nats_url: str, tmp_path: Path, store_factory: Factory
) -> None:
    """The state at an archived point is the plain fold's, byte for byte, folding only the tail after its segment."""
    from muster.daemon.archiving import Sealer, SealerOptions
    from muster.replay.points import Point
    from muster.replay.rebuild import state_at
    from muster.replay.snapshotcodec import encode_state

    events = sim(mixed(1)).events
    whole = MemoryLog.from_events(events)
    archive = DirectoryArchive(tmp_path / "archive")
    async with store_factory(nats_url) as store:
        options = SealerOptions(segment_events=10, consumers=(), window=Retention(max_bytes=1), state_every=30)
        sealer = Sealer(store, archive, options)
        for start in range(0, len(events), 40):  # sealed and purged as the log grows, several segments a pass
            await store.append(events[start : start + 40])
            await sealer.step()
        assert await store.first_seq() > 100, "the sealer should have purged what it sealed"
        log = ArchivedLog(archive, NatsLog(store))
        last = (await archive.segments())[-1]
        for seq in (1, 29, 30, 31, 65, 130, last.last, len(events)):
            rolled, plain = await state_at(log, Point(seq=seq)), await state_at(whole, Point(seq=seq))
            assert encode_state(rolled.state, "msgpack") == encode_state(plain.state, "msgpack"), seq
            start = min(seq, last.first - 1) // 30 * 30  # states before segments 31, 61, ...: the last by seq + 1
            assert (rolled.sealed or 0, rolled.folded) == (start, seq - start), seq
        at = events[130].at
        rolled, plain = await state_at(log, Point(time=at)), await state_at(whole, Point(time=at))
        assert encode_state(rolled.state, "msgpack") == encode_state(plain.state, "msgpack")
        assert rolled.seq == plain.seq and rolled.sealed is not None and rolled.folded <= 30


async def test_a_jobs_story_in_the_archive_starts_from_the_state_sealed_before_its_submission(
    nats_url: str, tmp_path: Path, store_factory: Factory
) -> None:
    """`explain` over a sealed archive tells every job's story as over the whole log, most from a sealed state."""
    from muster.daemon.archiving import Sealer, SealerOptions
    from muster.events.types import JobSubmitted
    from muster.replay.explain import explain
    from muster.replay.points import END, Point

    events = sim(mixed(1)).events
    whole = MemoryLog.from_events(events)
    jobs = sorted({e.job for e in events if isinstance(e, JobSubmitted)})
    async with store_factory(nats_url) as store:
        await store.append(events)
        await Sealer(
            store, DirectoryArchive(tmp_path / "archive"), SealerOptions(20, consumers=(), state_every=20)
        ).step()
        log = ArchivedLog(DirectoryArchive(tmp_path / "archive"), NatsLog(store))
        told_from = []
        for job in jobs:
            for point in (END, Point(seq=len(events) // 2)):
                (rolled, now), (plain, plain_now) = await explain(log, job, point), await explain(whole, job, point)
                assert (rolled.lines, rolled.status, rolled.summary, rolled.pending, now) == (
                    plain.lines,
                    plain.status,
                    plain.summary,
                    plain.pending,
                    plain_now,
                ), (job, point)
                told_from.append(rolled.told_from)
        assert sum(1 for seq in told_from if seq > 0) > len(told_from) // 2, told_from


async def test_replay_reads_an_object_store_archive_from_its_sealed_state(
    nats_url: str, tmp_path: Path, store_factory: Factory, capsys: pytest.CaptureFixture[str]
) -> None:
    """`muster replay --archive nats-object:BUCKET` prints the whole log's state, rebuilt from a sealed state."""
    import uuid

    from muster.daemon.archiving import Sealer, SealerOptions
    from muster.events.archive import open_archive

    events = sim(mixed(1)).events
    whole = tmp_path / "whole.jsonl"
    whole.write_bytes(b"".join(encode(e) + b"\n" for e in events))
    bucket = f"archive-{uuid.uuid4().hex[:8]}"
    async with store_factory(nats_url) as store:
        archive = await open_archive(f"nats-object:{bucket}", store.js)
        await store.append(events)
        options = SealerOptions(30, consumers=(), window=Retention(max_bytes=1), state_every=30)
        await Sealer(store, archive, options).step()
        assert await store.first_seq() > 100
        at = ["--at", str(len(events) - 30)]
        nats = ["--nats", nats_url, "--stream", store.stream, "--no-snapshots", "-o", "json"]
        try:
            assert await anyio.to_thread.run_sync(main, ["replay", *at, *nats, "--archive", archive.name]) == 0
            rolled = json.loads(capsys.readouterr().out)
            assert await anyio.to_thread.run_sync(main, ["replay", *at, "-o", "json", "--log", str(whole)]) == 0
            unrolled = json.loads(capsys.readouterr().out)
            assert rolled["replay"]["sealed_state"] == rolled["seq"] - rolled["replay"]["events_folded"] > 0
            for doc in (rolled, unrolled):
                del doc["replay"]
            assert rolled == unrolled
            assert await anyio.to_thread.run_sync(main, ["replay", *nats, "--archive", "nats-object:"]) == 2
            assert "name the bucket" in capsys.readouterr().err
        finally:
            await store.js.delete_object_store(bucket)


async def test_a_state_sealed_by_another_version_is_passed_over_for_an_older_one(
    nats_url: str, tmp_path: Path, store_factory: Factory
) -> None:
    """A state sealed by a muster whose fold differs is passed over for the nearest usable one below it."""
    import msgspec

    from muster.projections.cluster import fold
    from muster.replay.points import Point
    from muster.replay.rebuild import state_at
    from muster.replay.sealedstate import SealedState, open_state, seal_state
    from muster.replay.snapshotcodec import encode_state

    events = sim(mixed(1)).events

    async def state_before(seq: int) -> bytes:
        sealed = seal_state(fold(events[: seq - 1]), seq - 1)
        if seq == 61:  # as a muster whose fold differs would have sealed it
            other = msgspec.structs.replace(msgspec.msgpack.decode(sealed, type=SealedState), fingerprint="other")
            return msgspec.msgpack.encode(other)
        return sealed if seq > 1 else b""

    archive = DirectoryArchive(tmp_path / "archive")
    async with store_factory(nats_url) as store:
        await store.append(events)
        await seal_new(store, archive, through=90, every=30, snapshot_at=state_before)
        segments = await archive.segments()
        assert open_state((await archive.read(segments[2])).snapshot) is None
        log = ArchivedLog(archive, NatsLog(store))
        rolled, plain = await state_at(log, Point(seq=70)), await state_at(MemoryLog.from_events(events), Point(seq=70))
        assert (rolled.sealed, rolled.folded) == (30, 40)
        assert encode_state(rolled.state, "msgpack") == encode_state(plain.state, "msgpack")


async def test_snapshots_of_a_purged_stream_are_written_and_used_through_the_archive(
    nats_url: str, tmp_path: Path, store_factory: Factory, capsys: pytest.CaptureFixture[str]
) -> None:
    """`muster snapshot --archive` folds archive and stream; `replay` then starts from a snapshot in the purged past."""
    from muster.daemon.archiving import Sealer, SealerOptions

    events = sim(mixed(1)).events
    archive = DirectoryArchive(tmp_path / "archive")
    async with store_factory(nats_url) as store:
        await store.append(events)
        await Sealer(store, archive, SealerOptions(50, consumers=(), window=Retention(max_bytes=1))).step()
        assert await store.first_seq() > 150
        capsys.readouterr()  # the sealer's log lines
        source = ["--nats", nats_url, "--stream", store.stream, "--archive", str(archive.path)]
        snaps = ["--snapshots", f"{store.stream}-snaps"]
        try:
            snapshot = ["snapshot", *source, *snaps, "--every", "40", "-o", "json"]
            assert await anyio.to_thread.run_sync(main, snapshot) == 0
            assert json.loads(capsys.readouterr().out)["written"][:3] == [40, 80, 120]
            at = ["--at", "130", "-o", "json"]
            assert await anyio.to_thread.run_sync(main, ["replay", *at, *source, *snaps]) == 0
            replayed = json.loads(capsys.readouterr().out)["replay"]
            assert (replayed["snapshot"]["seq"], replayed["events_folded"]) == (120, 10)
            assert replayed["discarded_snapshots"] == []
        finally:
            await store.js.delete_object_store(f"{store.stream}-snaps")
