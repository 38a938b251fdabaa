"""The archive: the log's sealed past, kept after it leaves the stream's window.

Role: a segment holds the stored messages of one contiguous sequence range
exactly as the stream held them (sequence, subject, payload), with the
snapshot of the state at the range's start (opaque bytes from the snapshot
writer, or none), zlib-compressed and checksummed. Segments live in a
directory (`DirectoryArchive`); the stream's window plus the archive is the
whole log, and readers go through `replay.source.ArchivedLog`, which decodes
both with the store's one rule (`store.decode_raws`).

Invariants:
- Segments are contiguous and never overlap: a segment starts right after
  the last one sealed (`seal` refuses anything else), so the archive is a
  prefix of the log with no hole.
- A segment is written under a temporary name and renamed, so a reader sees
  a whole segment or none; its bytes are checked against the sha256 in its
  header on every read (`ArchiveError` when they differ: the archive is
  damaged, which is not the same as bad events inside it).
- One message is one record: nothing is re-split on read.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import anyio.to_thread
import msgspec

from muster.events.errors import StoreError
from muster.events.store import EventStore
from muster.events.wire import Raw

__all__ = ["ArchiveError", "DirectoryArchive", "Segment", "SegmentRef", "seal_new"]

SnapshotAt = Callable[[int], bytes]
"""The stored snapshot of the state before a sequence (empty bytes: none)."""

_MAGIC = b"muster-segment-1\n"
_SUFFIX = ".seg"


class ArchiveError(StoreError):
    """A segment that is missing, damaged, or would leave a hole in the archive."""


class SegmentRef(NamedTuple):
    """Where a segment is and which sequences it holds."""

    first: int
    last: int
    name: str


class Segment(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The stored messages `first..last` in sequence order, and the snapshot at `first` (empty: none)."""

    first: int
    last: int
    seqs: list[int]
    subjects: list[bytes]
    payloads: list[bytes]
    snapshot: bytes = b""

    def raws(self) -> list[Raw]:
        return list(zip(self.seqs, self.subjects, self.payloads, strict=True))


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Segment)


def segment_name(first: int, last: int) -> str:
    """Names sort in sequence order."""
    return f"{first:020d}-{last:020d}{_SUFFIX}"


def seal_bytes(segment: Segment) -> bytes:
    """The stored form of a segment: magic, sha256 of the body, zlib-compressed msgpack body."""
    body = zlib.compress(_encoder.encode(segment), 6)
    return _MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def open_bytes(data: bytes, name: str) -> Segment:
    """A segment from its stored form; ArchiveError if it is not one or its checksum fails."""
    if not data.startswith(_MAGIC):
        raise ArchiveError(f"{name}: not a muster segment")
    digest, _, body = data[len(_MAGIC) :].partition(b"\n")
    if hashlib.sha256(body).hexdigest().encode() != digest:
        raise ArchiveError(f"{name}: checksum mismatch (the segment is damaged)")
    try:
        segment = _decoder.decode(zlib.decompress(body))
    except (zlib.error, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ArchiveError(f"{name}: unreadable body: {exc}") from None
    if not (len(segment.seqs) == len(segment.subjects) == len(segment.payloads)):
        raise ArchiveError(f"{name}: record columns of different lengths")
    return segment


class DirectoryArchive:
    """Segments as files in one directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.name = str(path)

    def segments(self) -> list[SegmentRef]:
        """Every sealed segment, in sequence order."""
        if not self.path.is_dir():
            return []
        refs: list[SegmentRef] = []
        for entry in sorted(self.path.glob(f"*{_SUFFIX}")):
            first, _, last = entry.name.removesuffix(_SUFFIX).partition("-")
            if first.isdigit() and last.isdigit():
                refs.append(SegmentRef(int(first), int(last), entry.name))
        return refs

    def last_sealed(self) -> int:
        """The last sequence in the archive (0 when empty)."""
        refs = self.segments()
        return refs[-1].last if refs else 0

    def read(self, ref: SegmentRef) -> Segment:
        try:
            data = (self.path / ref.name).read_bytes()
        except OSError as exc:
            raise ArchiveError(f"{ref.name}: {exc.strerror or exc}") from None
        return open_bytes(data, ref.name)

    def seal(self, raws: list[Raw], snapshot: bytes = b"") -> SegmentRef:
        """Write `raws` (contiguous with the archive's end) as one segment."""
        if not raws:
            raise ArchiveError("nothing to seal")
        first, last = raws[0][0], raws[-1][0]
        after = self.last_sealed()
        if first != after + 1:
            raise ArchiveError(f"segment {first}..{last} does not start right after the archive's end ({after})")
        segment = Segment(
            first=first,
            last=last,
            seqs=[r[0] for r in raws],
            subjects=[r[1] for r in raws],
            payloads=[r[2] for r in raws],
            snapshot=snapshot,
        )
        name = segment_name(first, last)
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / f".{name}.tmp"
        tmp.write_bytes(seal_bytes(segment))
        os.replace(tmp, self.path / name)
        return SegmentRef(first, last, name)


async def seal_new(
    store: EventStore, archive: DirectoryArchive, *, through: int, every: int, snapshot_at: SnapshotAt | None = None
) -> list[SegmentRef]:
    """Seal the stream's messages after the archive's end in whole segments of `every`, up to `through`.

    The one writer (the leader) calls it with `through` no later than what
    every reader that must not miss an event has consumed (billing's ack
    floor) and well before the window's end. `snapshot_at(seq)` gives the
    stored snapshot of the state before `seq` (empty: none).
    """
    sealed: list[SegmentRef] = []
    start = archive.last_sealed() + 1
    while start + every - 1 <= through:
        raws: list[Raw] = []
        async with contextlib.aclosing(store.raw_batches(start, start + every - 1)) as batches:
            async for batch in batches:
                raws.extend(batch)
        if not raws or raws[0][0] != start:  # `through` is stored, so what is missing left the window
            raise ArchiveError(f"events from {start} left stream {store.stream} before they were sealed")
        snapshot = snapshot_at(start) if snapshot_at is not None else b""
        sealed.append(await anyio.to_thread.run_sync(archive.seal, raws, snapshot))  # compress and write off the loop
        start = raws[-1][0] + 1
    return sealed
