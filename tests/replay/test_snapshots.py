"""Snapshots: replay from the nearest one costs the events since; a snapshot that is not the fold is discarded.

One contract suite runs against every backend (memory, a directory, a NATS
object store bucket on the embedded server).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from replaykit import STORY, memory_log, mixed, sim, write_jsonl

from muster.cli import main
from muster.events.store import EventStore
from muster.projections.cluster import fold
from muster.replay.points import Point
from muster.replay.rebuild import state_at
from muster.replay.snapshotcodec import SnapshotMeta, decode_state, encode_state, sha256
from muster.replay.snapshots import Discarded, Snapshots
from muster.replay.snapshotstores import DirSnapshots, MemorySnapshots, NatsSnapshots, SnapshotBackend
from muster.replay.snapshotwriter import Snapshotter, write_snapshots
from muster.replay.source import MemoryLog, NatsLog

EVENTS = sim(mixed(2, jobs=30)).events  # about 200 events


@pytest.fixture(params=["memory", "dir", "nats"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SnapshotBackend]:
    """Every snapshot backend, empty."""
    if request.param == "memory":
        yield MemorySnapshots()
    elif request.param == "dir":
        yield DirSnapshots(tmp_path / "snaps")
    else:
        import nats

        nc = await nats.connect(request.getfixturevalue("nats_url"))
        js = nc.jetstream()
        bucket = f"snap-{uuid.uuid4().hex[:10]}"
        try:
            nats_backend = await NatsSnapshots.open(js, bucket, create=True)
            assert nats_backend is not None
            yield nats_backend
        finally:
            await js.delete_object_store(bucket)
            await nc.close()


async def _write_all(snapshots: Snapshots, every: int, *, trusted: bool) -> list[int]:
    """Fold the whole log, writing a snapshot every `every` events (verified by construction when trusted)."""
    from muster.projections.cluster import evolve
    from muster.projections.state import ClusterState

    writer = Snapshotter(snapshots, every, trusted_from=0 if trusted else None)
    state = ClusterState()
    async for batch in snapshots.source.batches(1):
        for seq, ev in batch:
            evolve(state, ev)
            await writer.maybe_snapshot(state, seq)
    return [m.seq for m in writer.written]


async def test_replay_starts_at_the_nearest_snapshot(backend: SnapshotBackend) -> None:
    """With snapshots every 40 events, replay to any point folds fewer than 40 events and equals the full fold."""
    log = memory_log(EVENTS)
    snaps = Snapshots(backend, log)
    written = await _write_all(snaps, 40, trusted=True)
    assert written == list(range(40, len(EVENTS) + 1, 40))
    assert [m.seq for m in await snaps.catalog()] == written
    for n in (1, 39, 40, 41, 119, 120, len(EVENTS) - 1, len(EVENTS)):
        replayed = await state_at(log, Point(seq=n), snaps)
        assert replayed.state == fold(EVENTS[:n]), n
        assert replayed.folded < 40 and replayed.verify_folded == 0
        assert replayed.snapshot is None or replayed.snapshot.seq == n // 40 * 40


async def test_time_points_use_snapshots_taken_no_later(backend: SnapshotBackend) -> None:
    """A replay to time T starts from a snapshot whose events are all at or before T."""
    log = memory_log(EVENTS)
    snaps = Snapshots(backend, log)
    await _write_all(snaps, 25, trusted=True)
    for t in sorted({e.at for e in EVENTS})[::7]:
        expected = fold([e for e in EVENTS if e.at <= t])
        replayed = await state_at(log, Point(time=t), snaps)
        assert replayed.state == expected
        if replayed.snapshot is not None:
            assert replayed.snapshot.at <= t


async def test_unverified_snapshots_are_checked_once_then_trusted(backend: SnapshotBackend) -> None:
    """A writer's unverified snapshots are fold-checked by the first load that passes them and marked verified."""
    log = memory_log(EVENTS)
    snaps = Snapshots(backend, log)
    await _write_all(snaps, 50, trusted=False)
    first = await state_at(log, Point(seq=170), snaps)
    assert first.state == fold(EVENTS[:170])
    assert first.verify_folded == 150 and first.folded == 20
    assert all(m.is_verified for m in await snaps.catalog() if m.seq <= 150)
    again = await state_at(log, Point(seq=170), snaps)
    assert again.verify_folded == 0 and again.folded == 20 and again.snapshot is not None


async def test_a_snapshot_that_is_not_the_fold_is_discarded_and_reported(backend: SnapshotBackend) -> None:
    """A well-formed snapshot whose state differs from a fresh fold of its prefix is discarded, reported, deleted."""
    log = memory_log(EVENTS)
    reports: list[Discarded] = []
    snaps = Snapshots(backend, log, report=reports.append)
    await _write_all(snaps, 50, trusted=True)
    # the snapshot at 100 is replaced by a wrong state with a correct checksum (and no verified mark)
    wrong = fold(EVENTS[:100])
    job = next(j for j in wrong.jobs.values() if j.status == "finished")
    job.status = "pending"
    meta = next(m for m in await snaps.catalog() if m.seq == 100)
    data = encode_state(wrong, meta.format)
    await backend.delete(meta.name)
    await backend.put(msgspec.structs.replace(meta, sha256=sha256(data), size=len(data), verified=""), data)
    replayed = await state_at(log, Point(seq=120), snaps)
    assert replayed.state == fold(EVENTS[:120])
    assert [(d.seq, d.deleted) for d in reports] == [(100, True)]
    assert "does not match a fresh fold of seq 1..100" in reports[0].reason
    assert [d.seq for d in replayed.discarded] == [100]
    assert 100 not in [m.seq for m in await snaps.catalog()]


async def test_corrupted_bytes_are_discarded_even_when_marked_verified(backend: SnapshotBackend) -> None:
    """Stored bytes that no longer match their checksum are discarded; replay falls back to an older snapshot."""
    log = memory_log(EVENTS)
    reports: list[Discarded] = []
    snaps = Snapshots(backend, log, report=reports.append)
    await _write_all(snaps, 50, trusted=True)
    meta = next(m for m in await snaps.catalog() if m.seq == 100)
    data = bytearray(await backend.get(meta.name))
    data[len(data) // 2] ^= 0xFF
    await backend.delete(meta.name)
    await backend.put(meta, bytes(data))
    replayed = await state_at(log, Point(seq=120), snaps)
    assert replayed.state == fold(EVENTS[:120])
    assert replayed.snapshot is not None and replayed.snapshot.seq == 50
    assert [d.seq for d in reports] == [100] and "checksum" in reports[0].reason


async def test_a_snapshot_of_another_log_is_discarded() -> None:
    """The anchor ties a snapshot to its log: snapshots of another log at the same sequences are not used."""
    other = sim(mixed(7, jobs=30)).events
    backend = MemorySnapshots()
    await _write_all(Snapshots(backend, memory_log(other)), 50, trusted=True)
    reports: list[Discarded] = []
    log = memory_log(EVENTS)
    replayed = await state_at(log, Point(seq=120), Snapshots(backend, log, report=reports.append))
    assert replayed.state == fold(EVENTS[:120])
    assert replayed.snapshot is None
    assert reports and all("not the one it was taken after" in d.reason for d in reports)


async def test_a_snapshot_of_another_muster_version_is_skipped_not_deleted() -> None:
    """A snapshot with another state schema or fold code is skipped (that version may still use it)."""
    log = memory_log(EVENTS)
    backend = MemorySnapshots()
    snaps = Snapshots(backend, log)
    await _write_all(snaps, 50, trusted=True)
    meta = next(m for m in await snaps.catalog() if m.seq == 100)
    await backend.set_meta(msgspec.structs.replace(meta, fingerprint="0123456789abcdef"))
    replayed = await state_at(log, Point(seq=120), snaps)
    assert replayed.state == fold(EVENTS[:120])
    assert [(d.seq, d.deleted) for d in replayed.discarded] == [(100, False)]
    assert 100 in [m.seq for m in await snaps.catalog()]


async def test_full_verification_catches_a_forged_mark() -> None:
    """`verify=full` re-checks every snapshot from the empty state, so even a forged verified mark is caught."""
    log = memory_log(EVENTS)
    backend = MemorySnapshots()
    snaps = Snapshots(backend, log)
    await _write_all(snaps, 50, trusted=True)
    wrong = fold(EVENTS[:100])
    wrong.jobs.popitem()
    meta = next(m for m in await snaps.catalog() if m.seq == 100)
    data = encode_state(wrong, meta.format)
    forged = msgspec.structs.replace(meta, sha256=sha256(data), size=len(data), verified=sha256(data))
    await backend.put(forged, data)
    trusting = await state_at(log, Point(seq=100), snaps, verify="marks")
    assert trusting.state != fold(EVENTS[:100])  # documented: marks are trusted after the integrity checks
    full = await state_at(log, Point(seq=100), snaps, verify="full")
    assert full.state == fold(EVENTS[:100])
    assert [d.seq for d in full.discarded] == [100]


async def test_snapshots_of_a_stream_live_in_an_object_store(store: EventStore) -> None:
    """On NATS, `muster snapshot` writes to the STREAM-snapshots bucket and `replay --at` uses the nearest one."""
    import anyio

    events = sim(STORY).events
    await store.append(events)
    url = store.nc.connected_url.geturl() if store.nc.connected_url else ""
    try:
        code = await anyio.to_thread.run_sync(
            main, ["snapshot", "--nats", url, "--stream", store.stream, "--every", "5", "--output", "json"]
        )
        assert code == 0
        backend = await NatsSnapshots.open(store.js, f"{store.stream}-snapshots", create=False)
        assert backend is not None
        snaps = Snapshots(backend, NatsLog(store))
        assert [m.seq for m in await snaps.catalog()] == [5, 10, 15, 20]
        replayed = await state_at(NatsLog(store), Point(seq=17), snaps)
        assert replayed.snapshot is not None and replayed.snapshot.seq == 15 and replayed.folded == 2
        assert replayed.state == fold(events[:17])
    finally:
        await store.js.delete_object_store(f"{store.stream}-snapshots")


class _Announcing:
    """A backend that sends the sequence of every snapshot written (so a test waits on events, not on time)."""

    def __init__(self, inner: SnapshotBackend, send: object) -> None:
        self.inner = inner
        self.send = send

    async def put(self, meta: SnapshotMeta, data: bytes) -> None:
        await self.inner.put(meta, data)
        await self.send.send(meta.seq)  # type: ignore[attr-defined]

    async def list(self) -> list[SnapshotMeta]:
        return await self.inner.list()

    async def get(self, name: str) -> bytes:
        return await self.inner.get(name)

    async def set_meta(self, meta: SnapshotMeta) -> None:
        await self.inner.set_meta(meta)

    async def delete(self, name: str) -> None:
        await self.inner.delete(name)


async def test_following_the_stream_writes_snapshots_as_it_grows(store: EventStore) -> None:
    """`muster snapshot --follow` keeps writing snapshots as events are appended, each verified by construction."""
    import functools

    import anyio

    events = sim(STORY).events
    await store.append(events[:8])
    bucket = f"{store.stream}-snapshots"
    nats_backend = await NatsSnapshots.open(store.js, bucket, create=True)
    assert nats_backend is not None
    send, written = anyio.create_memory_object_stream[int](10)
    snaps = Snapshots(_Announcing(nats_backend, send), NatsLog(store))
    try:
        async with written, send, anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(write_snapshots, NatsLog(store), snaps, every=5, follow=True, store=store))
            with anyio.fail_after(30):  # returns as soon as the snapshots are written
                assert await written.receive() == 5
                await store.append(events[8:])
                assert [await written.receive() for _ in range(3)] == [10, 15, 20]
            tg.cancel_scope.cancel()
        assert all(m.is_verified for m in await snaps.catalog())
        replayed = await state_at(NatsLog(store), Point(seq=21), snaps)
        assert replayed.folded == 1 and replayed.state == fold(events[:21])
    finally:
        await store.js.delete_object_store(bucket)


def test_snapshot_cli_on_a_file_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`muster snapshot --log FILE --snapshots DIR` writes; `replay` then starts from the nearest one."""
    path = write_jsonl(tmp_path / "log.jsonl", EVENTS)
    snaps = str(tmp_path / "snaps")
    assert main(["snapshot", "--log", str(path), "--snapshots", snaps, "--every", "60", "--output", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["written"] == list(range(60, len(EVENTS) + 1, 60))
    assert main(["replay", "--log", str(path), "--snapshots", snaps, "--at", "130", "--output", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["replay"]["snapshot"]["seq"] == 120 and out["replay"]["events_folded"] == 10
    assert main(["snapshot", "--log", str(path), "--every", "60"]) == 2
    assert "--snapshots DIR" in capsys.readouterr().err


def test_snapshot_list_shows_a_clusters_event_times_as_dates(tmp_path: Path, capsys) -> None:
    """`snapshot --list` of a log in epoch seconds gives each snapshot's time as a date, not 1800000170."""
    from muster.replay.points import Clock

    shifted = [msgspec.structs.replace(ev, at=ev.at + 1_800_000_000) for ev in EVENTS]
    path = write_jsonl(tmp_path / "log.jsonl", shifted)
    snaps = str(tmp_path / "snaps")
    assert main(["snapshot", "--log", str(path), "--snapshots", snaps, "--every", "60", "--output", "json"]) == 0
    capsys.readouterr()
    assert main(["snapshot", "--log", str(path), "--snapshots", snaps, "--list"]) == 0
    out = capsys.readouterr().out
    at = shifted[59].at
    assert Clock(epoch=True).at(at) in out and str(at) not in out


async def test_memory_log_reads_what_a_file_holds(tmp_path: Path) -> None:
    """A log in memory and the same log in a file replay to the same states."""
    path = write_jsonl(tmp_path / "log.jsonl", EVENTS)
    raws = path.read_bytes().splitlines()
    a = await state_at(MemoryLog(raws), Point(seq=77))
    b = await state_at(memory_log(EVENTS), Point(seq=77))
    assert a.state == b.state == fold(EVENTS[:77])


def test_a_number_past_msgpack_is_written_as_json_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job of 10**20 GPUs on the log (the core rejects it) makes `muster snapshot` write JSON, which loads back."""
    from muster.events.types import JobSubmitted, PodSet

    huge = JobSubmitted(at=0, job="huge", queue="q", podsets=[PodSet(name="w", count=1, requests={"gpu": 10**20})])
    events = [*EVENTS[:50], huge, *EVENTS[50:]]
    path = write_jsonl(tmp_path / "log.jsonl", events)
    snaps = str(tmp_path / "snaps")
    assert main(["snapshot", "--log", str(path), "--snapshots", snaps, "--every", "40", "--output", "json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["written"] == list(range(40, len(events) + 1, 40))
    assert "seq 80: the state holds a number past" in captured.err and "written as json" in captured.err
    assert main(["snapshot", "--log", str(path), "--snapshots", snaps, "--verify", "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["discarded"] == []


def test_a_state_written_before_order_seq_decodes_with_submission_order() -> None:
    """A stored state without `order_seq`/`places`: each job's place is its submission order, places count from them."""
    state = sim(mixed(2, jobs=20)).state
    stored = json.loads(encode_state(state, "json"))
    stored.pop("places")
    for job in stored["jobs"].values():
        job.pop("order_seq")
    old = decode_state(json.dumps(stored).encode(), "json")
    assert old.places == old.submitted == 20
    assert all(j.order_seq == j.seq for j in old.jobs.values())
