"""Archive segments: sealed as the stream held them, checksummed, contiguous, and refused when damaged.

One contract, run against both backends: a directory and a JetStream object store bucket.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from muster.events.archive import Archive, ArchiveError, DirectoryArchive, ObjectArchive, last_sealed, open_archive

RAWS = [(seq, f"muster.job.j{seq}".encode(), b'{"type":"JobStarted","at":%d,"job":"j"}' % seq) for seq in range(1, 11)]


@pytest.fixture(params=["directory", "object-store"])
async def archive(request: pytest.FixtureRequest, tmp_path: Path, nats_url: str) -> AsyncIterator[Archive]:
    """An empty archive of each backend."""
    if request.param == "directory":
        yield DirectoryArchive(tmp_path)
        return
    nc = await nats.connect(nats_url)
    bucket = f"archive-{uuid.uuid4().hex[:8]}"
    try:
        yield await open_archive(f"nats-object:{bucket}", nc.jetstream())
    finally:
        with contextlib.suppress(Exception):
            await nc.jetstream().delete_object_store(bucket)
        await nc.close()


async def test_a_sealed_segment_reads_back_as_stored(archive: Archive) -> None:
    """Every record (sequence, subject, bytes) and the snapshot come back exactly as sealed."""
    ref = await archive.seal(RAWS[:6], b"snapshot-at-1")
    await archive.seal(RAWS[6:])
    assert [(r.first, r.last) for r in await archive.segments()] == [(1, 6), (7, 10)]
    segment = await archive.read(ref)
    assert segment.raws() == RAWS[:6] and segment.snapshot == b"snapshot-at-1"
    assert await last_sealed(archive) == 10


async def test_a_damaged_segment_is_refused(archive: Archive, tmp_path: Path) -> None:
    """One flipped byte in a stored segment fails its checksum instead of replaying wrong events."""
    ref = await archive.seal(RAWS)
    if isinstance(archive, DirectoryArchive):
        path = tmp_path / ref.name
        data = bytearray(path.read_bytes())
        data[-5] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        assert isinstance(archive, ObjectArchive)
        data = bytearray((await archive.obs.get(ref.name)).data)
        data[-5] ^= 0xFF
        await archive.obs.put(ref.name, bytes(data))
    with pytest.raises(ArchiveError, match="checksum"):
        await archive.read(ref)


async def test_a_segment_that_would_leave_a_hole_is_refused(archive: Archive) -> None:
    """The archive is a prefix of the log: a segment must start right after the last one (or at 1)."""
    with pytest.raises(ArchiveError, match="right after"):
        await archive.seal(RAWS[2:])
    await archive.seal(RAWS[:3])
    with pytest.raises(ArchiveError, match="right after"):
        await archive.seal(RAWS[4:])


async def test_a_missing_bucket_is_an_error_when_it_may_not_be_made(nats_url: str) -> None:
    """Readers open an object-store archive without creating it: a wrong name says so."""
    nc = await nats.connect(nats_url)
    try:
        with pytest.raises(ArchiveError, match="does not exist"):
            await open_archive(f"nats-object:nope-{uuid.uuid4().hex[:8]}", nc.jetstream(), create=False)
    finally:
        await nc.close()
