"""Reading the stream: ranges, filtered reads and following, with the log's one decoding rule.

Role: the readers of `EventStore` (which inherits them). Reads go through `wire`, a lean
protocol reader, because nats-py's per-message cost caps a replay far below the 100,000
events/s a restart needs.

Invariants:
- An event is only taken from its own subjects (`subject_problem`): a decision
  published on a submission subject, or a submission for another queue than its
  subject names, is a bad event (`decode_raws`, the rule of the stream and the archive).
- Readers never raise on bad bytes: each is reported once as a `BadEvent` with
  its sequence to `on_bad`, counted in `bad_events`, and skipped (it stays on
  the stream). `follow` yields every good event once, in order, across server
  restarts, and never past a hole (LogHole).
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import NamedTuple

import anyio
import structlog

from muster.events.codec import DecodeError, decode
from muster.events.errors import LogHole, StoreError, StoreRefused
from muster.events.streams import StreamManagement
from muster.events.subjects import SubjectRule
from muster.events.types import AnyEvent
from muster.events.wire import JetStreamApiError, Raw, WireConnection, WireError, WireOptions, WireRefused, consume

__all__ = ["BadEvent", "StoredEvent", "StreamReading", "decode_raws"]

log = structlog.get_logger("muster.events.store")

_NO_LIMIT = 1 << 62
"""An `until` later than any event time."""
_FILTERED_BATCH = 4096
"""Events per batch of a filtered read (its filters' messages are merged in memory first)."""


class StoredEvent(NamedTuple):
    """An event with its stream sequence."""

    seq: int
    event: AnyEvent


_stored: Callable[[type[StoredEvent], tuple[int, AnyEvent]], StoredEvent] = tuple.__new__
"""`StoredEvent(seq, event)` without the Python-level NamedTuple constructor (half the cost, once per event)."""


class BadEvent(NamedTuple):
    """Bytes on the stream that are not a valid event; reported and skipped."""

    seq: int
    raw: bytes
    error: str
    subject: str = ""


class StreamReading(StreamManagement):
    """Decoded and raw reads of the stream, and following it (a part of `EventStore`)."""

    bad_events: int
    on_bad: Callable[[BadEvent], None]
    _wire: WireOptions

    def report(self, seq: int, subject: bytes, data: bytes, error: str) -> None:
        """Count a bad message and hand it to `on_bad` (readers of the stream and of its archive)."""
        self.bad_events += 1
        bad = BadEvent(seq, data, error, subject.decode(errors="replace"))
        try:
            self.on_bad(bad)
        except Exception:  # a faulty reporter must not stop the reader either
            log.exception("on_bad callback failed", seq=seq)

    async def _raw_batches(
        self, from_seq: int, *, follow: bool, give_up_after: float = 30.0, filter_subject: str | None = None
    ) -> AsyncGenerator[list[Raw], None]:
        """Raw stored messages from `from_seq`, resuming after connection loss.

        Without `follow`, ends at the end of the stream and gives up once
        resuming has failed for `give_up_after` seconds in a row (a JetStream
        cluster electing a new stream leader answers 503 for a few seconds);
        with it, waits for new messages and retries forever.
        """
        next_seq = max(1, from_seq)
        failures = 0
        failing_since = 0.0
        while True:
            conn: WireConnection | None = None
            try:
                conn = await WireConnection.open(self._wire)
                async with contextlib.aclosing(
                    consume(
                        conn,
                        self.stream,
                        next_seq,
                        stop_when_caught_up=not follow,
                        api_prefix=self._wire.api_prefix,
                        filter_subject=filter_subject,
                    )
                ) as batches:
                    async for batch in batches:
                        failures = 0
                        next_seq = batch[-1][0] + 1
                        yield batch
                return
            except (WireError, JetStreamApiError) as exc:
                if isinstance(exc, JetStreamApiError) and exc.code == 404 and not follow:
                    raise StoreError(f"stream {self.stream}: {exc.description}") from exc
                if isinstance(exc, WireRefused):
                    what = f"subjects {filter_subject}" if filter_subject is not None else "the whole stream"
                    raise StoreRefused(f"reading {what} of {self.stream}: {exc}") from exc
                if failures == 0:
                    failing_since = anyio.current_time()
                failures += 1
                if not follow and anyio.current_time() - failing_since > give_up_after:
                    raise StoreError(f"reading {self.stream} from {next_seq} failed: {exc}") from exc
                log.info("event stream reader reconnecting", stream=self.stream, next_seq=next_seq, error=str(exc))
                await anyio.sleep(min(2.0, 0.05 * 2**failures))
            finally:
                if conn is not None:
                    await conn.close()

    async def iter_batches(
        self,
        from_seq: int = 1,
        to_seq: int | None = None,
        *,
        until: int | None = None,
        subjects: Sequence[str] | None = None,
    ) -> AsyncGenerator[list[StoredEvent], None]:
        """Decoded events `from_seq..to_seq` (default: the end at call time) in batches.

        With `until`, stops before the first event whose `at` is later than `until`.
        With `subjects` (filters, e.g. `subjects.queue_filters`), only the events of
        those subjects, one filtered consumer each, in sequence order.
        """
        if to_seq is None:
            to_seq = await self.last_seq()
        if from_seq > to_seq:
            return
        rule = SubjectRule()
        if subjects is not None:
            merged = await self._filtered_raws(subjects, from_seq, to_seq)
            for start in range(0, len(merged), _FILTERED_BATCH):
                out, done = decode_raws(merged[start : start + _FILTERED_BATCH], to_seq, until, rule, self.report)
                if out:
                    yield out
                if done:
                    return
            return
        async with contextlib.aclosing(self._raw_batches(from_seq, follow=False)) as raws:
            async for raw_batch in raws:
                out, done = decode_raws(raw_batch, to_seq, until, rule, self.report)
                if out:
                    yield out
                if done:
                    return

    async def _filtered_raws(self, subjects: Sequence[str], from_seq: int, to_seq: int) -> list[Raw]:
        """The stored messages `from_seq..to_seq` of the `subjects` filters, merged in sequence order."""
        per_filter: list[list[Raw]] = []
        for subject in subjects:
            got: list[Raw] = []
            async with contextlib.aclosing(self._raw_batches(from_seq, follow=False, filter_subject=subject)) as raws:
                async for raw_batch in raws:
                    got.extend(raw_batch[: _count_upto(raw_batch, to_seq)])
                    if raw_batch[-1][0] >= to_seq:
                        break
            per_filter.append(got)
        return list(heapq.merge(*per_filter, key=lambda raw: raw[0]))

    async def raw_batches(self, from_seq: int, to_seq: int) -> AsyncGenerator[list[Raw], None]:
        """The stored messages `from_seq..to_seq` as the stream holds them (for sealing them elsewhere)."""
        if from_seq > to_seq:
            return
        async with contextlib.aclosing(self._raw_batches(from_seq, follow=False)) as raws:
            async for raw_batch in raws:
                if raw_batch[-1][0] < to_seq:
                    yield raw_batch
                    continue
                yield raw_batch[: _count_upto(raw_batch, to_seq)]
                return

    async def iter_range(
        self, from_seq: int = 1, to_seq: int | None = None, *, until: int | None = None
    ) -> AsyncGenerator[StoredEvent, None]:
        """Like `read`, one event at a time, without holding the range in memory."""
        async with contextlib.aclosing(self.iter_batches(from_seq, to_seq, until=until)) as batches:
            async for batch in batches:
                for stored in batch:
                    yield stored

    async def read(
        self,
        from_seq: int = 1,
        to_seq: int | None = None,
        *,
        until: int | None = None,
        subjects: Sequence[str] | None = None,
    ) -> list[StoredEvent]:
        """Decoded events `from_seq..to_seq` (inclusive; default to the end), bad ones reported and skipped."""
        out: list[StoredEvent] = []
        async with contextlib.aclosing(self.iter_batches(from_seq, to_seq, until=until, subjects=subjects)) as batches:
            async for batch in batches:
                out.extend(batch)
        return out

    async def follow(self, from_seq: int = 1) -> AsyncGenerator[StoredEvent, None]:
        """Every event from `from_seq` on, then new ones as they are appended, forever.

        Survives server restarts and connection loss: it resumes after the
        last sequence it saw, so nothing is skipped or yielded twice. Messages
        that left the stream before it brought them (a purge, limits) raise
        LogHole: it never goes on past a hole. Close it
        with `contextlib.aclosing` when done.
        """
        last = max(1, from_seq) - 1
        problem_of = SubjectRule().problem
        async with contextlib.aclosing(self._raw_batches(from_seq, follow=True)) as raws:
            async for raw_batch in raws:
                for seq, subject, data in raw_batch:
                    if seq <= last:
                        continue
                    if seq > last + 1:  # the stream holds every sequence it was given unless some left it
                        raise LogHole(self.stream, last + 1, seq - 1)
                    last = seq
                    try:
                        event = decode(data)
                    except DecodeError as exc:
                        self.report(seq, subject, data, exc.message)
                        continue
                    problem = problem_of(subject, event)
                    if problem is not None:
                        self.report(seq, subject, data, problem)
                        continue
                    yield StoredEvent(seq, event)


def decode_raws(
    raws: list[Raw], to_seq: int, until: int | None, rule: SubjectRule, report: Callable[[int, bytes, bytes, str], None]
) -> tuple[list[StoredEvent], bool]:
    """The good events of stored messages up to `to_seq` and `until`, and whether that end was reached.

    The one reading rule of the log wherever its messages come from (the
    stream, an archive segment): each message is decoded on its own, taken
    only from its own subject, and a bad one is `report`ed (seq, subject,
    bytes, why) and skipped.
    """
    if not raws:
        return [], False
    latest = until if until is not None else _NO_LIMIT
    problem_of = rule.problem
    last = len(raws) if raws[-1][0] <= to_seq else _count_upto(raws, to_seq)
    out: list[StoredEvent] = []
    append = out.append
    for seq, subject, data in raws[:last] if last < len(raws) else raws:
        # the replay hot loop: one decode, one subject check, one tuple per event
        try:
            event = decode(data)
        except DecodeError as exc:
            report(seq, subject, data, exc.message)
            continue
        problem = problem_of(subject, event)
        if problem is not None:
            report(seq, subject, data, problem)
        elif event.at > latest:
            return out, True
        else:
            append(_stored(StoredEvent, (seq, event)))
    return out, last < len(raws) or raws[-1][0] == to_seq


def _count_upto(raws: list[Raw], seq: int) -> int:
    """How many of `raws` (in sequence order) have a sequence at most `seq`."""
    return bisect.bisect_right(raws, seq, key=lambda raw: raw[0])
