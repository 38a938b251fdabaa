"""The event store: muster's log on one NATS JetStream stream.

Role: append events (de-duplicated, optionally fenced by the expected last
sequence), read a range, and follow the log. Appends go through nats-py; reads
go through `wire`, a lean protocol reader, because nats-py's per-message cost
caps a replay far below the 100,000 events/s a restart needs.

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
- A fenced append (`expected_last_seq`) stores each message only if the stream
  ends where the previous one did; otherwise `ConcurrencyConflict`. A retry of
  a fenced batch that was already stored returns its original sequences.
- Readers never raise on bad bytes: each is reported once as a `BadEvent` with
  its sequence to `on_bad`, counted in `bad_events`, and skipped (it stays on
  the stream). `follow` yields every good event once, in order, across server
  restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any, NamedTuple

import anyio
import nats
import structlog
from nats.aio.client import Client as NatsClient
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, NotFoundError, TooManyStalledMsgsError

from muster.events.codec import MAX_EVENT_BYTES, DecodeError, decode, encode
from muster.events.types import (
    AnyEvent,
    CohortConfigured,
    Event,
    GpuUtilizationSampled,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobHeld,
    JobInadmissible,
    JobPreempted,
    JobRejected,
    JobReleased,
    JobStarted,
    JobSubmitted,
    LeaderElected,
    NodeAdded,
    NodeCordoned,
    NodeRemoved,
    NodeUpdated,
    PriorityClassConfigured,
    QueueConfigured,
    SchedulerConfigured,
    SubmissionRejected,
)
from muster.events.wire import (
    JetStreamApiError,
    PublishResult,
    Raw,
    WireConnection,
    WireError,
    WireOptions,
    consume,
    publish_pipelined,
    redact,
)

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_STREAM",
    "AppendError",
    "BadEvent",
    "ConcurrencyConflict",
    "EventStore",
    "EventTooLarge",
    "StoreError",
    "StoredEvent",
    "default_url",
    "subject_for",
    "subject_problem",
    "subject_token",
]

log = structlog.get_logger("muster.events.store")

DEFAULT_STREAM = "MUSTER"
DEFAULT_PREFIX = "muster"
DEFAULT_URL = "nats://127.0.0.1:4222"
_WRONG_LAST_SEQUENCE = 10071
_STREAM_NAME_IN_USE = 10058
_WIRE_MIN_BATCH = 64
"""Batches at least this big are appended through `wire`; smaller ones through nats-py."""
_HEADER_ROOM = 512
"""Bytes kept free for our headers when checking a message against the server's max_payload."""


def default_url() -> str:
    """The NATS server to use: `$NATS_URL`, else the local default."""
    return os.environ.get("NATS_URL") or DEFAULT_URL


# ---------------------------------------------------------------- results and errors


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


class StoreError(Exception):
    """The event store cannot do what was asked (missing stream, server unreachable...)."""


class StoreUnreachable(StoreError):
    """No server of the URLs answered the first connection (a runtime failure, not bad input)."""


class StreamMissing(StoreError):
    """The stream does not exist and the caller did not ask to create it."""


class ConcurrencyConflict(StoreError):
    """A fenced append found the stream ended elsewhere than expected.

    `stored` holds the sequences of the batch's messages stored before the
    conflict (a fenced batch is checked message by message).
    """

    def __init__(self, expected: int, actual: int, stored: Sequence[int] = ()) -> None:
        super().__init__(f"expected the stream to end at {expected}, it ends at {actual}")
        self.expected = expected
        self.actual = actual
        self.stored = list(stored)


class EventTooLarge(StoreError, ValueError):
    """An event whose encoded form exceeds the size cap; nothing of its batch was stored."""

    def __init__(self, index: int, event_type: str, size: int, limit: int) -> None:
        super().__init__(f"event #{index} ({event_type}) encodes to {size} bytes, over the {limit}-byte cap")
        self.index = index
        self.size = size
        self.limit = limit


class AppendError(StoreError):
    """Some messages of a batch could not be confirmed stored after retries; retrying the batch is safe."""


# ---------------------------------------------------------------- subjects

_SAFE = re.compile(r"[A-Za-z0-9_\-/:=@+]+")
_MAX_TOKEN = 128


def subject_token(value: str) -> str:
    """`value` as one subject token: deterministic, injective, ASCII, no `.`, `*`, `>` or whitespace.

    Safe characters pass through; every other UTF-8 byte becomes `%XX`. An empty
    value is `%`; a token longer than 128 characters is cut and suffixed with
    `~` and a hash of the whole value.
    """
    if not value:
        return "%"
    if _SAFE.fullmatch(value) and len(value) <= _MAX_TOKEN:
        return value
    parts: list[str] = []
    for ch in value:
        if _SAFE.fullmatch(ch):
            parts.append(ch)
        else:
            parts.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    token = "".join(parts)
    if len(token) > _MAX_TOKEN:
        token = token[:100] + "~" + hashlib.sha256(value.encode("utf-8")).hexdigest()[:24]
    return token


def _route(event: Event) -> tuple[str, str]:
    """(kind, id) of an event's subject; a submission's id is `<queue>.<job>`."""
    match event:
        case JobSubmitted():
            return "submit", f"{subject_token(event.queue)}.{subject_token(event.job)}"
        case (
            JobCancelled()
            | JobHeld()
            | JobReleased()
            | JobStarted()
            | JobFinished()
            | JobFailed()
            | JobAdmitted()
            | JobPreempted()
            | JobInadmissible()
            | JobRejected()
            | SubmissionRejected()
            | GpuUtilizationSampled()
        ):
            return "job", subject_token(event.job)
        case NodeAdded() | NodeUpdated() | NodeRemoved() | NodeCordoned():
            return "node", subject_token(event.node)
        case QueueConfigured():
            return "queue", subject_token(event.name)
        case CohortConfigured():
            return "cohort", subject_token(event.name)
        case PriorityClassConfigured():
            return "priorityclass", subject_token(event.name)
        case SchedulerConfigured():
            return "scheduler", "config"
        case LeaderElected():
            return "leader", subject_token(event.holder)
    return "other", subject_token(type(event).__name__)


def subject_for(event: Event, prefix: str = DEFAULT_PREFIX) -> str:
    """`<prefix>.<kind>.<id>` for an event (`<prefix>.submit.<queue>.<job>` for a submission)."""
    kind, ident = _route(event)
    return f"{prefix}.{kind}.{ident}"


_KIND: dict[type, bytes] = {
    JobSubmitted: b"submit",
    **{
        t: b"job"
        for t in (
            JobCancelled,
            JobHeld,
            JobReleased,
            JobStarted,
            JobFinished,
            JobFailed,
            JobAdmitted,
            JobPreempted,
            JobInadmissible,
            JobRejected,
            SubmissionRejected,
            GpuUtilizationSampled,
        )
    },
    **{t: b"node" for t in (NodeAdded, NodeUpdated, NodeRemoved, NodeCordoned)},
    QueueConfigured: b"queue",
    CohortConfigured: b"cohort",
    PriorityClassConfigured: b"priorityclass",
    SchedulerConfigured: b"scheduler",
    LeaderElected: b"leader",
}


def subject_problem(subject: bytes, event: Event) -> str | None:
    """Why `event` must not be taken from `subject` (None when it may), whatever the prefix.

    Each kind of event has its own subjects, and NATS permissions say who may
    publish where (deploy/nats/accounts.conf): only the daemon publishes on
    `job.*`, a team only on `submit.<its queue>.*`. So a job event counts only
    on `<kind>.<id>` subjects of its kind, and a submission only on the
    `submit.<queue>.<job>` subject of its own queue and job, or on `job.<id>`
    (the daemon's, where logs written before submissions had their own
    subjects keep them). Tokens never contain dots, so the kind is found from
    the right and the prefix need not be known.
    """
    tokens = subject.split(b".")
    kind = _KIND.get(type(event), b"other")
    on_submit = len(tokens) >= 4 and tokens[-3] == b"submit"
    if on_submit and isinstance(event, JobSubmitted):
        if tokens[-2] == subject_token(event.queue).encode() and tokens[-1] == subject_token(event.job).encode():
            return None
        return (
            f"submission of job {event.job!r} to queue {event.queue!r} published on "
            f"{subject.decode(errors='replace')!r}: a submission counts only on its own queue's and job's subject"
        )
    if not on_submit and len(tokens) >= 3 and (tokens[-2] == kind or (kind == b"submit" and tokens[-2] == b"job")):
        return None
    return (
        f"{type(event).__name__} published on {subject.decode(errors='replace')!r}, "
        f"not on a {kind.decode()}.* subject where it belongs"
    )


def _check_prefix(prefix: str) -> None:
    if not prefix or "" in prefix.split(".") or prefix.split(".")[-1] == "submit" or any(c in prefix for c in " *>"):
        # subject_problem finds an event's kind counting tokens from the right
        raise StoreError(f"subject prefix {prefix!r}: must be subject tokens, the last one not 'submit'")


def _header_safe(mid: str) -> str:
    """A caller's msg id as a NATS header value: as given when printable ASCII, else a digest of it.

    Callers build ids from job names, which may be any unicode; the digest keeps
    equal ids equal and different ones different.
    """
    if mid and mid.isascii() and mid.isprintable():
        return mid
    return "sha256:" + hashlib.sha256(mid.encode("utf-8", errors="surrogatepass")).hexdigest()


def _default_msg_id(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
            await store.ensure_stream(replicas=replicas, duplicate_window=duplicate_window, create=create)
        except BaseException:
            await store.close()
            raise
        return store

    async def ensure_stream(self, *, replicas: int = 1, duplicate_window: float = 120.0, create: bool = True) -> None:
        """Create the stream if missing; an existing stream is used as configured by whoever made it."""
        config = StreamConfig(
            name=self.stream,
            subjects=[f"{self.prefix}.>"],
            storage=StorageType.FILE,
            num_replicas=replicas,
            deny_delete=True,
            deny_purge=True,
            discard=DiscardPolicy.OLD,
            duplicate_window=duplicate_window,
            # the server refuses what no reader would take (decode's cap), whoever publishes it
            max_msg_size=MAX_EVENT_BYTES + _HEADER_ROOM,
            allow_direct=True,  # submitters read their own submissions back by subject (accounts.conf)
        )
        if not create:
            try:
                await self.js.stream_info(self.stream)
            except NotFoundError:
                raise StreamMissing(f"stream {self.stream} does not exist (and create=False)") from None
            return
        try:
            await self.js.add_stream(config)
        except APIError as exc:
            if exc.err_code != _STREAM_NAME_IN_USE:
                raise StoreError(f"cannot create stream {self.stream}: {exc.description}") from exc
            info = await self.js.stream_info(self.stream)
            subjects = info.config.subjects or []
            if f"{self.prefix}.>" not in subjects:
                raise StoreError(f"stream {self.stream} exists with subjects {subjects}, not {self.prefix}.>") from exc
            log.info("using existing stream with a different configuration", stream=self.stream)

    async def delete_stream(self) -> None:
        """Delete the whole stream (tests and teardown only; muster never deletes its log)."""
        with contextlib.suppress(NotFoundError):
            await self.js.delete_stream(self.stream)

    async def close(self) -> None:
        """Close the connection if the store opened it."""
        if self._owns_connection and not self.nc.is_closed:
            with anyio.move_on_after(5, shield=True):
                await self.nc.close()

    async def __aenter__(self) -> EventStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

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
        for i, event in enumerate(events):
            data = encode(event)
            if len(data) > limit:
                raise EventTooLarge(i, type(event).__name__, len(data), limit)
            mid = _header_safe(msg_ids[i]) if msg_ids is not None else _default_msg_id(data)
            items.append((subject_for(event, prefix), data, mid))
        if expected_last_seq is not None:
            return await self._append_fenced(items, expected_last_seq)
        return await self._append_pipelined(items)

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
        raise AppendError(f"publish to {subject} not confirmed after {attempts} attempts: {last}")

    async def _append_fenced(self, items: list[tuple[str, bytes, str]], expected: int) -> list[int]:
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

    def _report(self, seq: int, subject: bytes, data: bytes, error: str) -> None:
        self.bad_events += 1
        bad = BadEvent(seq, data, error, subject.decode(errors="replace"))
        try:
            self.on_bad(bad)
        except Exception:  # a faulty reporter must not stop the reader either
            log.exception("on_bad callback failed", seq=seq)

    async def _raw_batches(
        self, from_seq: int, *, follow: bool, give_up_after: float = 30.0
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
        self, from_seq: int = 1, to_seq: int | None = None, *, until: int | None = None
    ) -> AsyncGenerator[list[StoredEvent], None]:
        """Decoded events `from_seq..to_seq` (default: the end at call time) in batches.

        With `until`, stops before the first event whose `at` is later than `until`.
        """
        if to_seq is None:
            to_seq = await self.last_seq()
        if from_seq > to_seq:
            return
        async with contextlib.aclosing(self._raw_batches(from_seq, follow=False)) as raws:
            async for raw_batch in raws:
                out: list[StoredEvent] = []
                append = out.append
                stop = False
                for seq, subject, data in raw_batch:  # the replay hot loop: keep it lean
                    if seq > to_seq:
                        stop = True
                        break
                    try:
                        event = decode(data)
                    except DecodeError as exc:
                        self._report(seq, subject, data, exc.message)
                    else:
                        problem = subject_problem(subject, event)
                        if problem is not None:
                            self._report(seq, subject, data, problem)
                        elif until is not None and event.at > until:
                            stop = True
                            break
                        else:
                            append(_stored(StoredEvent, (seq, event)))
                    if seq == to_seq:
                        stop = True
                        break
                if out:
                    yield out
                if stop:
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
        self, from_seq: int = 1, to_seq: int | None = None, *, until: int | None = None
    ) -> list[StoredEvent]:
        """Decoded events `from_seq..to_seq` (inclusive; default to the end), bad ones reported and skipped."""
        out: list[StoredEvent] = []
        async with contextlib.aclosing(self.iter_batches(from_seq, to_seq, until=until)) as batches:
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
        async with contextlib.aclosing(self._raw_batches(from_seq, follow=True)) as raws:
            async for raw_batch in raws:
                for seq, subject, data in raw_batch:
                    if seq <= last:
                        continue
                    last = seq
                    try:
                        event = decode(data)
                    except DecodeError as exc:
                        self._report(seq, subject, data, exc.message)
                        continue
                    problem = subject_problem(subject, event)
                    if problem is not None:
                        self._report(seq, subject, data, problem)
                        continue
                    yield StoredEvent(seq, event)


NATS_SCHEMES = ("nats", "tls", "ws", "wss")


def url_problem(url: str) -> str | None:
    """Why `url` is no NATS server URL (`http://...`, a typo in the scheme), or None."""
    scheme, sep, rest = url.strip().partition("://")
    if not sep:
        return None if url.strip() else "the NATS URL is empty"
    if scheme.lower() not in NATS_SCHEMES:
        host = rest.rpartition("@")[2].split("/", 1)[0] or "HOST:4222"
        return (
            f"{redact(url)} is not a NATS URL: NATS speaks its own protocol, not {scheme}; "
            f"use nats://{host} (or {', '.join(s + '://' for s in NATS_SCHEMES[1:])})"
        )
    return None


async def connect_client(servers: list[str], attempts: int, nats_options: dict[str, Any]) -> NatsClient:
    """A nats-py client that fails fast on the first connection (StoreError naming the URLs) and
    reconnects as `nats_options` say afterwards. Every long-running client connects through it."""
    return await _connect(servers, attempts, nats_options)


async def _connect(servers: list[str], attempts: int, nats_options: dict[str, Any]) -> NatsClient:
    """A nats-py client that fails fast on the first connection and reconnects as configured afterwards."""
    for url in servers:
        problem = url_problem(url)
        if problem is not None:
            raise StoreError(problem)
    last_error: list[Exception] = []
    caller_cb = nats_options.get("error_cb")

    async def on_error(exc: Exception) -> None:
        last_error.append(exc)
        del last_error[:-10]  # the client lives long: keep only the latest few
        log.debug("nats client error", error=f"{type(exc).__name__}: {exc}")
        if caller_cb is not None:
            await caller_cb(exc)

    options: dict[str, Any] = {
        "name": "muster",
        "reconnect_time_wait": 0.25,
        "connect_timeout": 5,
        "error_cb": on_error,
        "disconnected_cb": _nats_disconnected,
        "reconnected_cb": _nats_reconnected,
    }
    options.update({k: v for k, v in nats_options.items() if k != "error_cb"})
    reconnects = options.pop("max_reconnect_attempts", -1)
    # nats-py never gives up a first connection unless max_reconnect_attempts > 0, so
    # bound it for the first connection and switch to the caller's setting afterwards
    # nats-py 2.16 can also hang after a failed TLS handshake: bound the whole first connection
    per_try = float(options["connect_timeout"]) + float(options["reconnect_time_wait"])
    try:
        with anyio.fail_after(attempts * len(servers) * per_try + 1):
            nc = await nats.connect(servers=servers, max_reconnect_attempts=max(1, attempts - 1), **options)
    except Exception as exc:
        # the server's own word (an authorization violation) says more than the reset
        # of the socket it closed right after, whichever the client saw last
        said = [e for e in last_error if not isinstance(e, OSError)]
        reason = said[-1] if said else (last_error[-1] if last_error else exc)
        where = ", ".join(redact(u) for u in servers)  # never a password in a message or a log
        raise StoreUnreachable(f"cannot connect to {where}: {type(reason).__name__}: {reason}") from None
    nc.options["max_reconnect_attempts"] = reconnects
    return nc


def _actual_last_seq(description: str | None) -> int | None:
    match = re.search(r"wrong last sequence: (\d+)", description or "")
    return int(match.group(1)) if match else None


async def _nats_disconnected() -> None:
    log.info("nats disconnected")


async def _nats_reconnected() -> None:
    log.info("nats reconnected")
