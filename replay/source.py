"""Where replay reads the log: a NATS JetStream stream (with its archive), a JSONL file, or memory.

Role: one interface (`LogSource`) over the three, so every replay command,
test and benchmark runs on any of them. A JSONL file is the output of
`muster sim --output jsonl` (or a dump of a stream): line N is stream
sequence N.

Invariants:
- `batches` yields events in sequence order, each once; `until` stops before
  the first event later than it (the rule of `EventStore.iter_batches`).
- Bad input never stops a reader: a line or message that does not decode is
  reported once per read with its sequence (`on_bad`) and skipped. Blank
  lines keep their number and are skipped silently.
- `raw(seq)` returns the stored bytes at a sequence (None past the end); the
  snapshot anchor uses it to tell one log from another.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import anyio

from muster.events.archive import (
    Archive,
    ArchiveError,
    Segment,
    SegmentRef,
    archive_problem,
    last_sealed,
    open_archive,
)
from muster.events.codec import DecodeError, decode, encode
from muster.events.store import BadEvent, EventStore, StoredEvent, SubjectRule, decode_raws
from muster.events.subjects import queue_filters
from muster.events.types import Event

BATCH = 4096


class LogSource(Protocol):
    """A readable log: the events and the raw bytes at each sequence."""

    name: str

    async def last_seq(self) -> int: ...

    def batches(
        self, from_seq: int = 1, to_seq: int | None = None, *, until: int | None = None
    ) -> AsyncIterator[list[StoredEvent]]: ...

    async def raw(self, seq: int) -> bytes | None: ...


def _ignore(bad: BadEvent) -> None:
    return None


class MemoryLog:
    """A log held in memory as stored bytes, one entry per sequence (index 0 is sequence 1)."""

    def __init__(self, raws: Sequence[bytes], name: str = "memory", on_bad: Callable[[BadEvent], None] | None = None):
        self.raws = raws
        self.name = name
        self.on_bad = on_bad if on_bad is not None else _ignore
        self.bad_events = 0

    @classmethod
    def from_events(cls, events: Sequence[Event], name: str = "memory") -> MemoryLog:
        return cls([encode(e) for e in events], name)

    @classmethod
    def from_file(cls, path: str | Path, on_bad: Callable[[BadEvent], None] | None = None) -> FileLog:
        return FileLog(path, on_bad)

    async def last_seq(self) -> int:
        return len(self.raws)

    async def raw(self, seq: int) -> bytes | None:
        if 1 <= seq <= len(self.raws):
            return self.raws[seq - 1]
        return None

    async def batches(
        self, from_seq: int = 1, to_seq: int | None = None, *, until: int | None = None
    ) -> AsyncGenerator[list[StoredEvent], None]:
        raws = self.raws
        end = len(raws) if to_seq is None else min(to_seq, len(raws))
        seq = max(1, from_seq)
        while seq <= end:
            stop = min(end, seq + BATCH - 1)
            out: list[StoredEvent] = []
            for i in range(seq, stop + 1):
                data = raws[i - 1]
                if not data.strip():
                    continue
                try:
                    event = decode(data)
                except DecodeError as exc:
                    self.bad_events += 1
                    self.on_bad(BadEvent(i, data, exc.message))
                    continue
                if until is not None and event.at > until:
                    if out:
                        yield out
                    return
                out.append(StoredEvent(i, event))
            if out:
                yield out
            seq = stop + 1


class FileLog(MemoryLog):
    """A JSONL file (`muster sim --output jsonl`): line N is sequence N."""

    def __init__(self, path: str | Path, on_bad: Callable[[BadEvent], None] | None = None) -> None:
        data = Path(path).read_bytes()
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()  # the newline that ends the last line starts no new one
        super().__init__([ln.rstrip(b"\r") for ln in lines], str(path), on_bad)

    def not_a_log(self, look: int = 100) -> str | None:
        """Why the file is no event log (none of its first `look` lines is an event), or None.

        A log may hold bad lines (they are reported and skipped), but a file none of whose
        first lines is an event is something else: a scenario, a queues file, a typo."""
        lines = [(i, raw) for i, raw in enumerate(self.raws, start=1) if raw.strip()][:look]
        if not lines:
            return None
        for _, raw in lines:
            try:
                decode(raw)
                return None
            except DecodeError:
                continue
        hint = ""
        if self.name.endswith((".yaml", ".yml")):
            hint = f"; a scenario? `muster sim {self.name} --output jsonl > log.jsonl` writes its log"
        return f"{self.name} is not a JSONL event log: none of its first {len(lines)} lines is an event{hint}"


_NOT_SEALED_HERE = " and are in no archive segment read here (--archive DIR reads the sealed ones)"


class NatsLog:
    """A JetStream stream read through `EventStore` (bad messages are reported by the store).

    A read from before the stream's first message (the retention window moved
    past it) raises LogHole (a StoreError) instead of starting later in silence.
    """

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.name = f"{store.stream}"

    async def last_seq(self) -> int:
        last: int = await self.store.last_seq()
        return last

    async def raw(self, seq: int) -> bytes | None:
        from nats.js.errors import NotFoundError

        if seq < 1:
            return None
        try:
            msg = await self.store.js.get_msg(self.store.stream, seq)
        except NotFoundError:
            return None
        return bytes(msg.data) if msg.data is not None else b""

    async def batches(
        self, from_seq: int = 1, to_seq: int | None = None, *, until: int | None = None
    ) -> AsyncGenerator[list[StoredEvent], None]:
        # not silently later: the window moved past them
        await self.store.check_holds(from_seq, _NOT_SEALED_HERE)
        async with contextlib.aclosing(self._read(from_seq, to_seq, until)) as batches:
            async for batch in batches:
                yield batch

    def _read(self, from_seq: int, to_seq: int | None, until: int | None) -> AsyncGenerator[list[StoredEvent], None]:
        return self.store.iter_batches(from_seq, to_seq, until=until)


class QueueLog(NatsLog):
    """What one queue's own identity may read of a stream: its jobs' events and the cluster-wide ones.

    The subjects are `events.subjects.queue_filters` (deploy/nats/accounts.conf grants a team
    exactly those). Folded, they give the queue's jobs as the whole log does: their
    submissions, decisions, facts and control, the configuration, nodes and leadership. Other
    queues' jobs are absent, so what they hold (nodes, borrowed quota) does not show. Raw
    reads by sequence (snapshot anchors) are not among the identity's rights: None.
    """

    def __init__(self, store: EventStore, queue: str) -> None:
        super().__init__(store)
        self.name = f"{store.stream} (queue {queue}'s subjects)"
        self.filters = queue_filters(queue, store.prefix)

    async def raw(self, seq: int) -> bytes | None:
        return None

    def _read(self, from_seq: int, to_seq: int | None, until: int | None) -> AsyncGenerator[list[StoredEvent], None]:
        return self.store.iter_batches(from_seq, to_seq, until=until, subjects=self.filters)


class ArchivedLog:
    """The whole log: the sealed segments of an archive, then the stream's window after them.

    Both are decoded by the store's one rule (`decode_raws`, bad messages
    reported by the store). Like `NatsLog`, raises StoreError when a range
    falls in a hole: events that left the stream without being sealed.
    """

    def __init__(self, archive: Archive, stream: NatsLog) -> None:
        self.archive = archive
        self.stream = stream
        self.name = f"{archive.name}+{stream.name}"
        self._last: tuple[SegmentRef, Segment] | None = None

    async def segment(self, ref: SegmentRef) -> Segment:
        """The segment, read and checked once for consecutive uses (its snapshot, then its events)."""
        if self._last is None or self._last[0] != ref:
            self._last = (ref, await self.archive.read(ref))
        return self._last[1]

    async def last_seq(self) -> int:
        return max(await self.stream.last_seq(), await last_sealed(self.archive))

    async def raw(self, seq: int) -> bytes | None:
        for ref in await self.archive.segments():
            if ref.first <= seq <= ref.last:
                segment = await self.segment(ref)
                return segment.payloads[segment.seqs.index(seq)] if seq in segment.seqs else None
        return await self.stream.raw(seq)

    async def batches(
        self, from_seq: int = 1, to_seq: int | None = None, *, until: int | None = None
    ) -> AsyncGenerator[list[StoredEvent], None]:
        end = await self.last_seq() if to_seq is None else to_seq
        store = self.stream.store
        rule = SubjectRule()
        seq = max(1, from_seq)
        for ref in await self.archive.segments():
            if ref.last < seq:
                continue
            if ref.first > end:
                return
            segment = await self.segment(ref)  # a read and a checksum
            raws = [raw for raw in segment.raws() if raw[0] >= seq]
            out, done = decode_raws(raws, end, until, rule, store.report)
            if out:
                yield out
            if done:
                return
            seq = ref.last + 1
        if seq > end:
            return
        async with contextlib.aclosing(self.stream.batches(seq, end, until=until)) as batches:
            async for batch in batches:
                yield batch


# ---------------------------------------------------------------- CLI plumbing


class SourceError(Exception):
    """The log cannot be opened (missing file, missing stream, not a NATS URL): exit 2."""


class SourceUnavailable(SourceError):
    """NATS did not answer: a runtime failure (exit 1), not bad input."""


def _connecting(args: argparse.Namespace) -> bool:
    return any(getattr(args, f, None) for f in ("config", "creds", "tls_ca", "tls_cert", "tls_key"))


@contextlib.asynccontextmanager
async def open_source(
    args: argparse.Namespace, on_bad: Callable[[BadEvent], None], *, wait: bool = False
) -> AsyncGenerator[tuple[LogSource, EventStore | None], None]:
    """The log the arguments name, and the store behind it (None for a file).

    A stream is reached as `natsconnect.settings_of` says (`--config`, `--creds`, TLS); with
    `--scope QUEUE`, only what that queue's own identity may read of it (`QueueLog`). With
    `wait` (a sidecar that may start before NATS or its stream exists) it tries again, with
    growing pauses, instead of failing.
    """
    import os

    from muster.replay.natsconnect import ConfigProblem, settings_of

    scope = getattr(args, "scope", None)
    if scope is not None and (args.log or getattr(args, "archive", None)):
        raise SourceError("--scope reads one queue's subjects of a stream; it goes with neither --log nor --archive")
    if args.log:
        if _connecting(args):
            raise SourceError("--config, --creds and --tls-* connect to NATS; they do not go with --log")
        # two logs named at once: reading the file alone would answer for a stream the user did not get
        stream = [
            flag
            for flag in ("--nats", "--stream", "--subject-prefix")
            if getattr(args, flag[2:].replace("-", "_"), None)
        ]
        if stream:
            raise SourceError(f"--log names a file and {', '.join(stream)} a stream: give one log")
        try:
            log = FileLog(args.log, on_bad)
        except OSError as exc:
            raise SourceError(f"cannot read {args.log}: {exc.strerror or exc}") from None
        problem = log.not_a_log()
        if problem is not None:
            raise SourceError(problem)
        yield log, None
        return

    from muster.events.store import StoreError, StoreUnreachable

    archive = getattr(args, "archive", None)
    if archive is not None and (problem := archive_problem(archive)) is not None:
        raise SourceError(problem)
    try:
        settings = settings_of(args)
    except ConfigProblem as exc:
        raise SourceError(str(exc)) from None
    args.stream = args.stream or settings.stream or os.environ.get("MUSTER_STREAM", "MUSTER")
    prefix: dict[str, Any] = {"prefix": settings.prefix} if settings.prefix else {}
    attempt = 0
    while True:
        try:
            store = await EventStore.connect(
                args.nats or settings.urls,
                stream=args.stream,
                create=False,
                on_bad=on_bad,
                connect_attempts=1,
                **prefix,
                **settings.options,
            )
            break
        except (StoreError, OSError) as exc:
            if not wait:
                if isinstance(exc, (StoreUnreachable, OSError)):
                    raise SourceUnavailable(f"cannot open stream {args.stream}: {exc}") from None
                raise SourceError(f"cannot open stream {args.stream}: {exc}") from None
            attempt += 1
            pause = min(30.0, 0.5 * 2.0**attempt)
            print(f"cannot open stream {args.stream} yet ({exc}); trying again in {pause:g} s", file=sys.stderr)
            await anyio.sleep(pause)
    try:
        with store.refusals():
            if scope is not None:
                yield QueueLog(store, scope), store
            elif archive is None:
                yield NatsLog(store), store
            else:
                try:
                    segments = await open_archive(archive, store.js, create=False)
                except ArchiveError as exc:
                    raise SourceError(str(exc)) from None
                yield ArchivedLog(segments, NatsLog(store)), store
    finally:
        with anyio.move_on_after(5, shield=True):
            await store.close()
