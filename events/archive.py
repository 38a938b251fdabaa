"""The archive: the log's sealed past, kept after it leaves the stream's window.

Role: a segment holds the stored messages of one contiguous sequence range
exactly as the stream held them (sequence, subject, payload), with the
snapshot of the state at the range's start (opaque bytes from the snapshot
writer, or none), zlib-compressed and checksummed. Segments live in a
directory (`DirectoryArchive`) or a JetStream object store bucket
(`ObjectArchive`, named `nats-object:BUCKET`); the stream's window plus the
archive is the whole log, and readers go through `replay.source.ArchivedLog`, which decodes
both with the store's one rule (`store.decode_raws`).

Invariants:
- Segments are contiguous and never overlap: a segment starts right after
  the last one sealed (`seal` refuses anything else), so the archive is a
  prefix of the log with no hole.
- A segment is written under a temporary name and renamed (an object is
  listed once all its chunks are stored), so a reader sees a whole segment
  or none; its bytes are checked against the sha256 in its header on every
  read (`ArchiveError` when they differ: the archive is damaged, which is
  not the same as bad events inside it).
- One message is one record: nothing is re-split on read.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import anyio.to_thread
import msgspec

from muster.events.errors import StoreError
from muster.events.store import EventStore
from muster.events.wire import Raw

__all__ = [
    "Archive",
    "ArchiveError",
    "DirectoryArchive",
    "ObjectArchive",
    "Segment",
    "SegmentRef",
    "archive_problem",
    "last_sealed",
    "open_archive",
    "seal_new",
]

SnapshotAt = Callable[[int], Awaitable[bytes]]
"""The snapshot of the state before a sequence, as opaque bytes (empty: none)."""

_MAGIC = b"muster-segment-1\n"
_SUFFIX = ".seg"
_OBJECT_PREFIX = "nats-object:"


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


class Archive(Protocol):
    """Where segments are kept: a directory (`DirectoryArchive`) or a JetStream object store (`ObjectArchive`)."""

    name: str

    async def segments(self) -> list[SegmentRef]:
        """Every sealed segment, in sequence order."""
        ...

    async def read(self, ref: SegmentRef) -> Segment:
        """The segment, checked against its checksum (ArchiveError when missing or damaged)."""
        ...

    async def seal(self, raws: list[Raw], snapshot: bytes = b"") -> SegmentRef:
        """Write `raws` (contiguous with the archive's end) as one segment, whole or not at all."""
        ...


async def last_sealed(archive: Archive) -> int:
    """The last sequence in the archive (0 when empty)."""
    refs = await archive.segments()
    return refs[-1].last if refs else 0


def _refs(names: list[str]) -> list[SegmentRef]:
    refs: list[SegmentRef] = []
    for name in sorted(names):
        first, _, last = name.removesuffix(_SUFFIX).partition("-")
        if name.endswith(_SUFFIX) and first.isdigit() and last.isdigit():
            refs.append(SegmentRef(int(first), int(last), name))
    return refs


def _segment(raws: list[Raw], snapshot: bytes, after: int) -> Segment:
    """The segment of `raws`, refused unless it starts right after the archive's end `after`."""
    if not raws:
        raise ArchiveError("nothing to seal")
    first, last = raws[0][0], raws[-1][0]
    if first != after + 1:
        raise ArchiveError(f"segment {first}..{last} does not start right after the archive's end ({after})")
    return Segment(
        first=first,
        last=last,
        seqs=[r[0] for r in raws],
        subjects=[r[1] for r in raws],
        payloads=[r[2] for r in raws],
        snapshot=snapshot,
    )


class DirectoryArchive:
    """Segments as files in one directory (file work runs in a worker thread)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.name = str(path)

    async def segments(self) -> list[SegmentRef]:
        if not self.path.is_dir():
            return []
        return _refs([entry.name for entry in self.path.glob(f"*{_SUFFIX}")])

    async def read(self, ref: SegmentRef) -> Segment:
        def load() -> Segment:
            try:
                data = (self.path / ref.name).read_bytes()
            except OSError as exc:
                raise ArchiveError(f"{ref.name}: {exc.strerror or exc}") from None
            return open_bytes(data, ref.name)

        return await anyio.to_thread.run_sync(load)

    async def seal(self, raws: list[Raw], snapshot: bytes = b"") -> SegmentRef:
        segment = _segment(raws, snapshot, await last_sealed(self))
        name = segment_name(segment.first, segment.last)

        def write() -> None:
            # under a temporary name, then renamed: a reader sees a whole segment or none
            self.path.mkdir(parents=True, exist_ok=True)
            tmp = self.path / f".{name}.tmp"
            tmp.write_bytes(seal_bytes(segment))
            os.replace(tmp, self.path / name)

        await anyio.to_thread.run_sync(write)
        return SegmentRef(segment.first, segment.last, name)


class ObjectArchive:
    """Segments as objects of a JetStream object store bucket (an object is listed once it is whole)."""

    def __init__(self, obs: Any, bucket: str) -> None:
        self.obs = obs
        self.name = f"nats-object:{bucket}"

    @classmethod
    async def open(cls, js: Any, bucket: str, *, create: bool = True) -> ObjectArchive:
        """The bucket (file storage), created when missing and `create`; ArchiveError otherwise."""
        from nats.js.api import ObjectStoreConfig, StorageType
        from nats.js.errors import BucketNotFoundError, NotFoundError

        try:
            return cls(await js.object_store(bucket), bucket)
        except (BucketNotFoundError, NotFoundError):
            if not create:
                raise ArchiveError(f"archive bucket {bucket} does not exist") from None
        config = ObjectStoreConfig(description="muster log segments", storage=StorageType.FILE)
        return cls(await js.create_object_store(bucket, config), bucket)

    async def segments(self) -> list[SegmentRef]:
        from nats.js.errors import NotFoundError

        try:
            infos = await self.obs.list(ignore_deletes=True)
        except NotFoundError:  # an empty bucket
            return []
        return _refs([info.name for info in infos if not info.deleted])

    async def read(self, ref: SegmentRef) -> Segment:
        import io

        from nats.js.errors import Error as NatsJsError

        buf = io.BytesIO()
        try:
            # writeinto: nats-py otherwise grows the result with bytes += chunk (quadratic)
            result = await self.obs.get(ref.name, writeinto=buf)
        except NatsJsError as exc:
            raise ArchiveError(f"{ref.name}: {type(exc).__name__} {exc}") from None
        return open_bytes(buf.getvalue() or bytes(result.data or b""), ref.name)

    async def seal(self, raws: list[Raw], snapshot: bytes = b"") -> SegmentRef:
        segment = _segment(raws, snapshot, await last_sealed(self))
        name = segment_name(segment.first, segment.last)
        data = await anyio.to_thread.run_sync(seal_bytes, segment)  # compressing a segment takes a while
        await self.obs.put(name, data)
        return SegmentRef(segment.first, segment.last, name)


def archive_problem(location: str) -> str | None:
    """Why a reader cannot use `location` as an archive before connecting anywhere (None: it may)."""
    if location.startswith(_OBJECT_PREFIX):
        return None if location.removeprefix(_OBJECT_PREFIX) else f"archive {location}: name the bucket"
    return None if Path(location).is_dir() else f"archive {location} is not a directory"


async def open_archive(location: str, js: Any = None, *, create: bool = True) -> Archive:
    """`nats-object:BUCKET` (the JetStream object store, through `js`), else a directory."""
    if location.startswith(_OBJECT_PREFIX):
        if js is None:
            raise ArchiveError(f"{location}: an object-store archive needs a NATS connection")
        return await ObjectArchive.open(js, location.removeprefix(_OBJECT_PREFIX), create=create)
    return DirectoryArchive(location)


async def seal_new(
    store: EventStore, archive: Archive, *, through: int, every: int, snapshot_at: SnapshotAt | None = None
) -> list[SegmentRef]:
    """Seal the stream's messages after the archive's end in whole segments of `every`, up to `through`.

    The one writer (the leader) calls it with `through` no later than what
    every reader that must not miss an event has consumed (billing's ack
    floor) and well before the window's end. `snapshot_at(seq)` gives the
    snapshot of the state before `seq` (empty: none), asked in sequence order.
    """
    sealed: list[SegmentRef] = []
    start = await last_sealed(archive) + 1
    while start + every - 1 <= through:
        raws: list[Raw] = []
        async with contextlib.aclosing(store.raw_batches(start, start + every - 1)) as batches:
            async for batch in batches:
                raws.extend(batch)
        if not raws or raws[0][0] != start:  # `through` is stored, so what is missing left the window
            raise ArchiveError(f"events from {start} left stream {store.stream} before they were sealed")
        snapshot = await snapshot_at(start) if snapshot_at is not None else b""
        sealed.append(await archive.seal(raws, snapshot))
        start = raws[-1][0] + 1
    return sealed
