"""Archive segments: sealed as the stream held them, checksummed, contiguous, and refused when damaged."""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.events.archive import ArchiveError, DirectoryArchive

RAWS = [(seq, f"muster.job.j{seq}".encode(), b'{"type":"JobStarted","at":%d,"job":"j"}' % seq) for seq in range(1, 11)]


def test_a_sealed_segment_reads_back_as_stored(tmp_path: Path) -> None:
    """Every record (sequence, subject, bytes) and the snapshot come back exactly as sealed."""
    archive = DirectoryArchive(tmp_path)
    ref = archive.seal(RAWS[:6], b"snapshot-at-1")
    archive.seal(RAWS[6:])
    assert [(r.first, r.last) for r in archive.segments()] == [(1, 6), (7, 10)]
    segment = archive.read(ref)
    assert segment.raws() == RAWS[:6] and segment.snapshot == b"snapshot-at-1"
    assert archive.last_sealed() == 10


def test_a_damaged_segment_is_refused(tmp_path: Path) -> None:
    """One flipped byte in a segment file fails its checksum instead of replaying wrong events."""
    archive = DirectoryArchive(tmp_path)
    ref = archive.seal(RAWS)
    path = tmp_path / ref.name
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ArchiveError, match="checksum"):
        archive.read(ref)


def test_a_segment_that_would_leave_a_hole_is_refused(tmp_path: Path) -> None:
    """The archive is a prefix of the log: a segment must start right after the last one (or at 1)."""
    archive = DirectoryArchive(tmp_path)
    with pytest.raises(ArchiveError, match="right after"):
        archive.seal(RAWS[2:])
    archive.seal(RAWS[:3])
    with pytest.raises(ArchiveError, match="right after"):
        archive.seal(RAWS[4:])
