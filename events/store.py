"""The event store: muster's log on one NATS JetStream stream.

Role: append events (de-duplicated, optionally fenced by the expected last
sequence), read a range, and follow the log. Appends go through nats-py; reads
go through `wire`, a lean protocol reader, because nats-py's per-message cost
caps a replay far below the 100,000 events/s a restart needs. Where events
go (`subjects`), what the store raises (`errors`) and how it connects
(`connecting`) have modules of their own, re-exported here.

Invariants:
- One stream (file storage, deny_delete, deny_purge, messages capped at the
  event size cap) holds subjects `<prefix>.<kind>.<id>`; `kind` comes from the
  event type, `id` is the job, node, queue... name made safe for a subject
  token (`subject_token`). Submissions go to `<prefix>.submit.<queue>.<job>`,
  so NATS permissions can let a team publish to its own queues only.
- An event is only taken from its own subjects (`subject_problem`): a decision
  published on a submission subject, or a submission for another queue than
  its subject names, is a bad event. Permissions on subjects are therefore
  permissions on what the events say.
- Every append carries a deterministic `Nats-Msg-Id` (sha256 of the encoded
  event unless the caller passes ids), so a retried append is stored once and
  returns the sequences of the first attempt.
- A fenced append (`expected_last_seq`) lands contiguously right after
  `expected_last_seq`: as atomic batches of up to 1,000 messages where the
  stream allows them (NATS 2.12+; all of a batch or none), else chained in
  one round trip; when the log moved, only a prefix of whole batches (or of
  messages) is stored (`ConcurrencyConflict` with the stored sequences);
  when answers are missing, `AppendError` (fold the log before deciding
  again). A retry of a fenced batch that was already stored returns its
  original sequences.
- Readers never raise on bad bytes: each is reported once as a `BadEvent` with
  its sequence to `on_bad`, counted in `bad_events`, and skipped (it stays on
  the stream). `follow` yields every good event once, in order, across server
  restarts.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hashlib
import heapq
import itertools
import re
import uuid
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from typing import Any, NamedTuple

import anyio
import msgspec
import nats
import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, NotFoundError, TooManyStalledMsgsError

from muster.events.codec import MAX_EVENT_BYTES, DecodeError, decode, encode
from muster.events.connecting import (  # re-exported: callers know them as the store's
    NATS_SCHEMES,
    connect_client,
    default_url,
    refusal,
    url_problem,
)
from muster.events.connecting import connect_client as _connect
from muster.events.errors import (  # re-exported
    AppendError,
    ConcurrencyConflict,
    EventTooLarge,
    StoreError,
    StoreRefused,
    StoreUnreachable,
    StreamMissing,
)
from muster.events.subjects import (  # re-exported
    DEFAULT_PREFIX,
    SCOPED_KINDS,
    SubjectRule,
    subject_for,
    subject_problem,
    subject_token,
)
from muster.events.types import AnyEvent, Event, JobSubmitted
from muster.events.wire import (
    JetStreamApiError,
    PublishResult,
    Raw,
    WireConnection,
    WireError,
    WireOptions,
    WireRefused,
    consume,
    publish_pipelined,
)

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_STREAM",
    "NATS_SCHEMES",
    "AppendError",
    "BadEvent",
    "ConcurrencyConflict",
    "EventStore",
    "EventTooLarge",
    "Retention",
    "StoreError",
    "StoreRefused",
    "StoreUnreachable",
    "StoredEvent",
    "StreamMissing",
    "SubjectRule",
    "connect_client",
    "decode_raws",
    "default_url",
    "msg_id_token",
    "subject_for",
    "subject_problem",
    "subject_token",
    "url_problem",
]

log = structlog.get_logger("muster.events.store")

DEFAULT_STREAM = "MUSTER"
_NO_LIMIT = 1 << 62
"""An `until` later than any event time."""
_WRONG_LAST_SEQUENCE = 10071
_WRONG_LAST_MSG_ID = 10070
_CONFLICTS = (_WRONG_LAST_SEQUENCE, _WRONG_LAST_MSG_ID)
_DUPLICATE_IN_BATCH = 10201
_ATOMIC_MAX = 1000
"""Messages per atomic batch at most (the server's default limit)."""
_STREAM_NAME_IN_USE = 10058
_WIRE_MIN_BATCH = 64
"""Batches at least this big are appended through `wire`; smaller ones through nats-py."""
_MAX_MSG_ID = 200
_FILTERED_BATCH = 4096
"""Events per batch of a filtered read (its filters' messages are merged in memory first)."""
_HEADER_ROOM = 512
"""Bytes kept free for our headers when checking a message against the server's max_payload."""


# ---------------------------------------------------------------- results and errors


class StoredEvent(NamedTuple):
    """An event with its stream sequence."""

    seq: int
    event: AnyEvent


_stored: Callable[[type[StoredEvent], tuple[int, AnyEvent]], StoredEvent] = tuple.__new__
"""`StoredEvent(seq, event)` without the Python-level NamedTuple constructor (half the cost, once per event)."""


class Retention(NamedTuple):
    """The stream's window: messages older than `max_age` seconds, or beyond `max_bytes`, leave it (0: no limit)."""

    max_age: float = 0.0
    max_bytes: int = 0


class BadEvent(NamedTuple):
    """Bytes on the stream that are not a valid event; reported and skipped."""

    seq: int
    raw: bytes
    error: str
    subject: str = ""


class _AckError(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _Ack(msgspec.Struct):
    """JetStream's answer to a publish."""

    seq: int = 0
    duplicate: bool = False
    error: _AckError | None = None


_decode_ack = msgspec.json.Decoder(_Ack).decode
_Answer = int | _AckError | None
"""What became of one message of a chained publish: its sequence, the server's refusal, or no answer."""


def _check_prefix(prefix: str) -> None:
    if (
        not prefix
        or "" in prefix.split(".")
        or prefix.split(".")[-1] in SCOPED_KINDS
        or any(c in prefix for c in " *>")
    ):
        # subject_problem finds an event's kind counting tokens from the right
        raise StoreError(f"subject prefix {prefix!r}: must be subject tokens, the last one not {sorted(SCOPED_KINDS)}")


def msg_id_token(value: str) -> str:
    """`value` as a `Nats-Msg-Id`: as given when short printable ASCII, else `sha256:` and a digest of it.

    The one msg-id rule of every writer: ids are built from job names, which
    may be any unicode or very long; a NATS header takes printable ASCII only.
    The digest keeps equal ids equal and different ones different.
    """
    if value and value.isascii() and value.isprintable() and len(value) <= _MAX_MSG_ID:
        return value
    return "sha256:" + hashlib.sha256(value.encode("utf-8", errors="surrogatepass")).hexdigest()[:32]


def _default_msg_id(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _no_queue(job: str) -> None:
    return None


def _log_bad(bad: BadEvent) -> None:
    log.warning(
        "bad event skipped",
        seq=bad.seq,
        subject=bad.subject,
        error=bad.error,
        raw=bad.raw[:200].decode(errors="replace"),
    )


def _wire_options(nc: NatsClient, servers: Sequence[str], api_prefix: str) -> WireOptions:
    opts: dict[str, Any] = nc.options
    return WireOptions(
        servers=list(servers),
        user=opts.get("user"),
        password=opts.get("password"),
        token=opts.get("token"),
        tls=opts.get("tls"),
        tls_hostname=opts.get("tls_hostname"),
        connect_timeout=float(opts.get("connect_timeout") or 5.0),
        api_prefix=api_prefix,
        # nats-py keeps the inbox prefix (an identity's own, in accounts.conf) only on the client
        inbox_prefix=bytes(getattr(nc, "_inbox_prefix", b"_INBOX")).decode() or "_INBOX",
    )


# ---------------------------------------------------------------- the store


class EventStore:
    """Append, read and follow muster's events on a JetStream stream. Create with `await EventStore.connect(...)`."""

    def __init__(
        self,
        nc: NatsClient,
        *,
        stream: str,
        prefix: str,
        wire: WireOptions,
        owns_connection: bool,
        on_bad: Callable[[BadEvent], None] | None,
        api_prefix: str,
        request_timeout: float,
    ) -> None:
        _check_prefix(prefix)
        self.nc = nc
        self.js = nc.jetstream(prefix=api_prefix, timeout=request_timeout)
        self.stream = stream
        self.prefix = prefix
        self.request_timeout = request_timeout
        self.bad_events = 0
        self._wire = wire
        self._owns_connection = owns_connection
        self.on_bad: Callable[[BadEvent], None] = on_bad if on_bad is not None else _log_bad
        """Called once per bad message met by a reader (default: a structlog warning)."""
        self._replies: Subscription | None = None
        """Answers to chained (fenced) publishes, `<inbox>.<chain>.<index>`; subscribed at the first."""
        self._reply_inbox = ""
        self._chains = itertools.count(1)
        self.atomic = False
        """The stream takes atomic batches (NATS 2.12+, `allow_atomic`): fenced appends are all or nothing."""
        self.queue_of: Callable[[str], str | None] | None = None
        """The queue of a job, for the subjects of its events (`job.<queue>.<job>`, which that queue's
        identity may read); the daemon answers from its folded state. None: `job.<job>`."""

    # ------------------------------------------------------------ lifecycle

    @classmethod
    async def connect(
        cls,
        url_or_nc: str | Sequence[str] | NatsClient | None = None,
        *,
        stream: str = DEFAULT_STREAM,
        prefix: str = DEFAULT_PREFIX,
        replicas: int = 1,
        create: bool = True,
        duplicate_window: float = 120.0,
        on_bad: Callable[[BadEvent], None] | None = None,
        api_prefix: str = "$JS.API",
        request_timeout: float = 5.0,
        connect_attempts: int = 3,
        retention: Retention | None = None,
        **nats_options: Any,
    ) -> EventStore:
        """Connect (or use the given nats-py client) and make sure the stream exists.

        `url_or_nc`: a URL, comma-separated URLs, a list of URLs, a connected
        nats-py client (left open by `close()`), or None for `default_url()`.
        `nats_options` go to `nats.connect`. The first connection gives up
        after `connect_attempts` tries per server (raising StoreError with the
        reason); once connected, the store reconnects forever unless
        `max_reconnect_attempts` says otherwise.
        """
        _check_prefix(prefix)
        if isinstance(url_or_nc, NatsClient):
            nc = url_or_nc
            owns = False
            servers = [u.geturl() for u in nc.servers] or [default_url()]
        else:
            raw = url_or_nc if url_or_nc is not None else default_url()
            servers = [u.strip() for u in raw.split(",")] if isinstance(raw, str) else list(raw)
            nc = await _connect(servers, connect_attempts, nats_options)
            owns = True
        store = cls(
            nc,
            stream=stream,
            prefix=prefix,
            wire=_wire_options(nc, servers, api_prefix),
            owns_connection=owns,
            on_bad=on_bad,
            api_prefix=api_prefix,
            request_timeout=request_timeout,
        )
        try:
            await store.ensure_stream(
                replicas=replicas, duplicate_window=duplicate_window, create=create, retention=retention
            )
        except BaseException:
            await store.close()
            raise
        return store

    async def ensure_stream(
        self,
        *,
        replicas: int = 1,
        duplicate_window: float = 120.0,
        create: bool = True,
        retention: Retention | None = None,
    ) -> None:
        """Create the stream if missing; an existing stream is used as configured by whoever made it.

        With `retention`, the stream keeps a bounded window (the oldest
        messages leave it first); what leaves must have been sealed into the
        archive before (`events.archive.seal_new`), or readers find a hole.
        """
        window = retention if retention is not None else Retention()
        config = StreamConfig(
            name=self.stream,
            subjects=[f"{self.prefix}.>"],
            storage=StorageType.FILE,
            num_replicas=replicas,
            deny_delete=True,
            deny_purge=True,
            discard=DiscardPolicy.OLD,
            max_age=window.max_age or None,
            max_bytes=window.max_bytes or None,
            duplicate_window=duplicate_window,
            # the server refuses what no reader would take (decode's cap), whoever publishes it
            max_msg_size=MAX_EVENT_BYTES + _HEADER_ROOM,
            allow_direct=True,  # submitters read their own submissions back by subject (accounts.conf)
            # a cycle's decisions are stored all or none (`_append_fenced`); servers before 2.12 know no such thing
            allow_atomic=True if _atomic_server(self.nc) else None,
        )
        if not create:
            try:
                info = await self.js.stream_info(self.stream)
            except NotFoundError:
                raise StreamMissing(f"stream {self.stream} does not exist (and create=False)") from None
            self.atomic = bool(info.config.allow_atomic)
            return
        try:
            info = await self.js.add_stream(config)
        except APIError as exc:
            if exc.err_code != _STREAM_NAME_IN_USE:
                raise StoreError(f"cannot create stream {self.stream}: {exc.description}") from exc
            info = await self.js.stream_info(self.stream)
            subjects = info.config.subjects or []
            if f"{self.prefix}.>" not in subjects:
                raise StoreError(f"stream {self.stream} exists with subjects {subjects}, not {self.prefix}.>") from exc
            log.info("using existing stream with a different configuration", stream=self.stream)
        self.atomic = bool(info.config.allow_atomic)

    async def delete_stream(self) -> None:
        """Delete the whole stream (tests and teardown only; muster never deletes its log)."""
        with contextlib.suppress(NotFoundError):
            await self.js.delete_stream(self.stream)

    async def close(self) -> None:
        """Close the connection if the store opened it (else drop the store's own subscription)."""
        if self._replies is not None:
            replies, self._replies = self._replies, None
            # a gone connection has nothing to unsubscribe from
            with anyio.move_on_after(2, shield=True), contextlib.suppress(Exception):
                await replies.unsubscribe()
        if self._owns_connection and not self.nc.is_closed:
            with anyio.move_on_after(5, shield=True):
                await self.nc.close()

    @contextlib.contextmanager
    def refusals(self) -> Iterator[None]:
        """Raise StoreRefused for a NATS request that timed out because the server refused it (permissions)."""
        try:
            yield
        except nats.errors.TimeoutError:
            why = refusal(self.nc)
            if why is None:
                raise
            raise StoreRefused(f"NATS refused a request: {why}") from None

    async def __aenter__(self) -> EventStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open_wire(self) -> WireConnection:
        """A raw protocol connection with the store's servers and credentials (the caller closes it).

        For bulk writers that publish pre-encoded messages without acknowledgements (benchmarks).
        """
        return await WireConnection.open(self._wire)

    # ------------------------------------------------------------ append

    async def append(
        self,
        events: Sequence[Event],
        *,
        expected_last_seq: int | None = None,
        msg_ids: Sequence[str] | None = None,
    ) -> list[int]:
        """Store `events` in order and return their stream sequences.

        Each message carries `Nats-Msg-Id` (`msg_ids[i]`, else the sha256 of its
        bytes), so retrying a batch stores nothing twice and returns the first
        sequences. With `expected_last_seq` the batch is fenced: raises
        `ConcurrencyConflict` if the stream does not end where expected.
        """
        if not events:
            return []
        if msg_ids is not None and len(msg_ids) != len(events):
            raise ValueError(f"{len(msg_ids)} msg_ids for {len(events)} events")
        limit = min(MAX_EVENT_BYTES, max(0, self.nc.max_payload - _HEADER_ROOM) or MAX_EVENT_BYTES)
        items: list[tuple[str, bytes, str]] = []
        prefix = self.prefix
        queue_of = self._queues_of(events)
        for i, event in enumerate(events):
            data = encode(event)
            if len(data) > limit:
                raise EventTooLarge(i, type(event).__name__, len(data), limit)
            mid = msg_id_token(msg_ids[i]) if msg_ids is not None else _default_msg_id(data)
            job = getattr(event, "job", None)
            items.append((subject_for(event, prefix, queue_of(job) if job is not None else None), data, mid))
        if expected_last_seq is not None:
            return await self._append_fenced(items, expected_last_seq)
        return await self._append_pipelined(items)

    def _queues_of(self, events: Sequence[Event]) -> Callable[[str], str | None]:
        """Jobs' queues for a batch's subjects: its own submissions first (a job found and ended at once),
        then `queue_of`."""
        known = self.queue_of
        if known is None:
            return _no_queue
        submitted: dict[str, str] = {e.job: e.queue for e in events if isinstance(e, JobSubmitted)}
        if not submitted:
            return known
        return lambda job: submitted.get(job) or known(job)

    async def _append_pipelined(self, items: list[tuple[str, bytes, str]]) -> list[int]:
        """Publish without waiting for each ack; confirm the stragglers one by one.

        The server stores one connection's messages in the order sent, so the
        sequences follow the batch order unless a message had to be re-sent.
        Big batches go through `wire` (a tenth of nats-py's cost per message).
        """
        results: list[PublishResult] = [None] * len(items)
        todo = list(range(len(items)))
        for attempt in range(3):
            # unconfirmed messages are re-sent: the same msg id makes that harmless
            batch = [items[i] for i in todo]
            publish = self._publish_wire if len(batch) >= _WIRE_MIN_BATCH else self._publish_nats
            for i, result in zip(todo, await publish(batch), strict=True):
                results[i] = result
            todo = [i for i in todo if not isinstance(results[i], int)]
            if not todo:
                break
            await anyio.sleep(0.1 * (attempt + 1))
        for i in todo:  # the last resort, one by one; raises what cannot be stored
            subject, data, mid = items[i]
            results[i] = (await self._publish_one(subject, data, {"Nats-Msg-Id": mid}))[0]
        return [int(r) for r in results if isinstance(r, int)]

    async def _publish_wire(self, items: list[tuple[str, bytes, str]]) -> list[PublishResult]:
        try:
            conn = await WireConnection.open(self._wire)
        except WireError as exc:
            log.info("pipelined append falls back to nats-py", error=str(exc))
            return await self._publish_nats(items)
        try:
            results: list[PublishResult] = await publish_pipelined(
                conn, items, stream=self.stream, ack_timeout=self.request_timeout
            )
        finally:
            await conn.close()
        return results

    async def _publish_nats(self, items: list[tuple[str, bytes, str]]) -> list[PublishResult]:
        js = self.js
        futures: list[asyncio.Future[Any]] = []
        reconnects = self.nc.stats["reconnects"]
        try:
            for subject, data, mid in items:
                futures.append(
                    await js.publish_async(
                        subject, data, wait_stall=self.request_timeout, headers={"Nats-Msg-Id": mid}, stream=self.stream
                    )
                )
        except (TooManyStalledMsgsError, nats.errors.Error) as exc:
            # acks stopped coming (server gone?): the rest goes through the confirmed path
            log.info("pipelined append stalled", sent=len(futures), of=len(items), error=str(exc))
        await self._await_acks(futures, reconnects)
        results: list[PublishResult] = [None] * len(items)
        for i, future in enumerate(futures):
            if future.done() and not future.cancelled() and future.exception() is None:
                results[i] = int(future.result().seq)
            elif not future.done():
                future.cancel()
        return results

    async def _await_acks(self, futures: list[asyncio.Future[Any]], reconnects: int) -> None:
        """Wait for the acks until all came, the deadline passed, or a reconnect left some orphaned.

        Acks of messages sent before a reconnect never arrive; once the
        connection is back and acks stop coming, the rest are re-sent instead.
        """
        pending = set(futures)
        deadline = anyio.current_time() + self.request_timeout + 0.001 * len(futures)
        while pending and anyio.current_time() < deadline:
            done, pending = await asyncio.wait(pending, timeout=0.25)
            if pending and not done and self.nc.stats["reconnects"] != reconnects and self.nc.is_connected:
                return

    async def _publish_one(
        self, subject: str, data: bytes, headers: dict[str, str], attempts: int = 3
    ) -> tuple[int, bool]:
        """(sequence, was a duplicate) of one confirmed publish, retried on timeouts and server trouble."""
        last: Exception | None = None
        for attempt in range(attempts):
            try:
                ack = await self.js.publish(subject, data, headers=dict(headers), stream=self.stream)
                return int(ack.seq), bool(ack.duplicate)
            except APIError as exc:
                if exc.err_code == _WRONG_LAST_SEQUENCE or (exc.code is not None and exc.code < 500):
                    raise
                last = exc
            except (TimeoutError, nats.errors.Error) as exc:
                last = exc
            await anyio.sleep(0.1 * (attempt + 1))
        why = refusal(self.nc)
        if why is not None:
            raise StoreRefused(f"publish to {subject}: {why}")
        raise AppendError(f"publish to {subject} not confirmed after {attempts} attempts: {last}")

    async def _append_fenced(self, items: list[tuple[str, bytes, str]], expected: int) -> list[int]:
        """Store the batch right after `expected`, whole or not at all (per atomic batch of up to 1,000 messages).

        On a stream that allows atomic batch publish (NATS 2.12+; the store
        creates its stream so), each chunk is one atomic batch whose first
        message carries the fence: the server stores all of it or none. A
        refusal that may be our own earlier attempt (the fence moved, or the
        batch repeats stored msg ids) is sorted out message by message
        (`_append_checked`). Elsewhere the batch is chained (`_append_chained`).
        """
        if not self.atomic:
            return await self._append_chained(items, expected)
        seqs: list[int] = []
        for start in range(0, len(items), _ATOMIC_MAX):
            chunk = items[start : start + _ATOMIC_MAX]
            answer = await self._publish_atomic(chunk, expected + len(seqs))
            if isinstance(answer, int):
                seqs.extend(range(answer - len(chunk) + 1, answer + 1))
                continue
            if answer is None:
                raise AppendError(f"{len(seqs)} of {len(items)} fenced messages confirmed; the rest got no answer")
            if answer.err_code not in (_WRONG_LAST_SEQUENCE, _DUPLICATE_IN_BATCH):
                raise StoreError(f"append refused: {answer.description} ({answer.code}/{answer.err_code})")
            try:
                return seqs + await self._append_checked(items[start:], expected + len(seqs))
            except ConcurrencyConflict as exc:
                raise ConcurrencyConflict(exc.expected, exc.actual, seqs + exc.stored) from None
        return seqs

    async def _publish_atomic(self, items: list[tuple[str, bytes, str]], expected: int) -> _Answer:
        """One atomic batch fenced on `expected`: the last sequence stored, the server's refusal, or None."""
        replies = await self._reply_subscription()
        batch = uuid.uuid4().hex
        commit = f"{self._reply_inbox}.{next(self._chains)}"
        last = len(items) - 1
        for i, (subject, data, mid) in enumerate(items):
            headers = {"Nats-Msg-Id": mid, "Nats-Batch-Id": batch, "Nats-Batch-Sequence": str(i + 1)}
            if i == 0:
                headers["Nats-Expected-Last-Sequence"] = str(expected)
            if i == last:
                headers["Nats-Batch-Commit"] = "1"
            await self.nc.publish(subject, data, reply=commit if i == last else "", headers=headers)
        with anyio.move_on_after(self.request_timeout):
            async for msg in replies.messages:
                if msg.subject == commit:
                    ack = _decode_ack(msg.data)
                    return ack.error if ack.error is not None else ack.seq
        return None

    async def _append_chained(self, items: list[tuple[str, bytes, str]], expected: int) -> list[int]:
        """Send the batch back to back, chained, so it lands right after `expected` whole or as a prefix.

        The first message expects the stream to end at `expected`
        (`Nats-Expected-Last-Sequence`), each next one expects its
        predecessor's msg id last (`Nats-Expected-Last-Msg-Id`). The server
        checks each as it stores them: a write by anyone else in between stops
        the chain there, and every later message fails too. One round trip
        for the batch instead of one per message.
        """
        answers = await self._publish_chained(items, expected)
        stored = [a for a in itertools.takewhile(lambda a: isinstance(a, int), answers) if isinstance(a, int)]
        if len(stored) == len(items):
            return stored
        first = answers[len(stored)]
        if first is None:
            raise AppendError(f"{len(stored)} of {len(items)} fenced messages confirmed; the rest got no answer")
        assert isinstance(first, _AckError)
        if first.err_code not in _CONFLICTS:
            raise StoreError(f"append refused: {first.description} ({first.code}/{first.err_code})")
        if not stored and first.err_code == _WRONG_LAST_SEQUENCE:
            # maybe our own earlier attempt of this batch (the server checks the fence before
            # de-duplicating): the message-by-message path tells it from another writer
            return await self._append_checked(items, expected)
        actual = _actual_last_seq(first.description)
        raise ConcurrencyConflict(
            expected + len(stored), actual if actual is not None else await self.last_seq(), stored
        )

    async def _publish_chained(self, items: list[tuple[str, bytes, str]], expected: int) -> list[_Answer]:
        """Publish `items` fenced and chained without waiting; each one's sequence, error, or None (no answer)."""
        replies = await self._reply_subscription()
        prefix = f"{self._reply_inbox}.{next(self._chains)}."
        for i, (subject, data, mid) in enumerate(items):
            headers = {"Nats-Msg-Id": mid, "Nats-Expected-Stream": self.stream}
            if i == 0:
                headers["Nats-Expected-Last-Sequence"] = str(expected)
            else:
                headers["Nats-Expected-Last-Msg-Id"] = items[i - 1][2]
            await self.nc.publish(subject, data, reply=f"{prefix}{i}", headers=headers)
        answers: list[_Answer] = [None] * len(items)
        missing = len(items)
        with anyio.move_on_after(self.request_timeout):
            async for msg in replies.messages:
                if not msg.subject.startswith(prefix):
                    continue  # a late answer to an earlier chain
                i = int(msg.subject[len(prefix) :])
                if not 0 <= i < len(answers) or answers[i] is not None:
                    continue
                ack = _decode_ack(msg.data)
                answers[i] = ack.error if ack.error is not None else ack.seq
                missing -= 1
                if not missing:
                    break
        return answers

    async def _reply_subscription(self) -> Subscription:
        if self._replies is None:
            self._reply_inbox = self.nc.new_inbox()
            self._replies = await self.nc.subscribe(self._reply_inbox + ".>")
        return self._replies

    async def _append_checked(self, items: list[tuple[str, bytes, str]], expected: int) -> list[int]:
        """The fenced append one confirmed message at a time, recognising its own earlier attempt."""
        seqs: list[int] = []
        i = 0
        while i < len(items):
            subject, data, mid = items[i]
            headers = {"Nats-Msg-Id": mid, "Nats-Expected-Last-Sequence": str(expected)}
            try:
                seq, duplicate = await self._publish_one(subject, data, headers)
            except APIError as exc:
                if exc.err_code != _WRONG_LAST_SEQUENCE:
                    raise
                actual = _actual_last_seq(exc.description)
                if actual is None:
                    actual = await self.last_seq()
                # The server checks the expected sequence before de-duplication, so a
                # retried batch lands here: messages after `expected` that carry our
                # next msg ids are our own earlier attempt, not a competing writer.
                ours = await self._own_messages(expected, actual, [m for _, _, m in items[i:]])
                seqs.extend(ours)
                i += len(ours)
                if i == len(items):
                    return seqs
                if not ours or expected + len(ours) != actual:
                    raise ConcurrencyConflict(expected + len(ours), actual, seqs) from None
                expected = actual
                continue
            seqs.append(seq)
            if not duplicate:  # a duplicate of an older event leaves the stream's end where it was
                expected = seq
            i += 1
        return seqs

    async def _own_messages(self, expected: int, actual: int, ids: list[str]) -> list[int]:
        """Sequences after `expected` whose msg ids are `ids` in order (our own stored prefix)."""
        ours: list[int] = []
        for seq in range(expected + 1, min(actual, expected + len(ids)) + 1):
            try:
                msg = await self.js.get_msg(self.stream, seq)
            except NotFoundError:
                break
            if (msg.headers or {}).get("Nats-Msg-Id") != ids[len(ours)]:
                break
            ours.append(seq)
        return ours

    # ------------------------------------------------------------ read

    async def last_seq(self) -> int:
        """Sequence of the last message on the stream (0 when empty)."""
        info = await self.js.stream_info(self.stream)
        return int(info.state.last_seq)

    async def first_seq(self) -> int:
        """Sequence of the first message still on the stream (older ones left its retention window)."""
        info = await self.js.stream_info(self.stream)
        return int(info.state.first_seq)

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
        last sequence it saw, so nothing is skipped or yielded twice. Close it
        with `contextlib.aclosing` when done.
        """
        last = from_seq - 1
        problem_of = SubjectRule().problem
        async with contextlib.aclosing(self._raw_batches(from_seq, follow=True)) as raws:
            async for raw_batch in raws:
                for seq, subject, data in raw_batch:
                    if seq <= last:
                        continue
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


def _atomic_server(nc: NatsClient) -> bool:
    """Whether the server takes atomic batch publishes (nats-server 2.12 and later)."""
    version = nc.connected_server_version
    return (version.major, version.minor) >= (2, 12)


def _actual_last_seq(description: str | None) -> int | None:
    match = re.search(r"wrong last sequence: (\d+)", description or "")
    return int(match.group(1)) if match else None
