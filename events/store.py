"""The event store: muster's log on one NATS JetStream stream.

Role: append events (de-duplicated, optionally fenced by the expected last
sequence), read a range, and follow the log. The store encodes and names what
it appends; getting it onto the stream, pipelined or fenced, is `publishing`'s.
Reads go through `wire`, a lean protocol reader, because nats-py's
per-message cost caps a replay far below the 100,000 events/s a restart
needs. Where events go (`subjects`), what the store raises (`errors`) and how
it connects (`connecting`) have modules of their own, re-exported here.

Invariants:
- One stream (file storage, deny_delete, messages capped at the event size
  cap) holds subjects `<prefix>.<kind>.<id>`; `kind` comes from the
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
- The log's past leaves the stream only by `purge_before`, which the leader's
  sealer calls for what it has sealed into the archive (`daemon/archiving.py`).
  The stream allows purge requests because NATS can never lift `deny_purge`
  from a stream once set; who may send one is NATS permissions' business
  (deploy/nats/accounts.conf grants it to the daemon's identity alone).
"""

from __future__ import annotations

import bisect
import contextlib
import datetime as dt
import hashlib
import heapq
import json
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from typing import Any, NamedTuple

import anyio
import nats
import structlog
from nats.aio.client import Client as NatsClient
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, NotFoundError

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
    LogHole,
    StoreError,
    StoreRefused,
    StoreUnreachable,
    StreamMissing,
)
from muster.events.publishing import Item, Publisher
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
    Raw,
    WireConnection,
    WireError,
    WireOptions,
    WireRefused,
    consume,
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
    "LogHole",
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
_STREAM_NAME_IN_USE = 10058
_PURGE_NOT_PERMITTED = 10110
_NO_MESSAGE_FOUND = 10037
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
    """A window of the stream: messages older than `max_age` seconds, or beyond `max_bytes`, leave it (0: no limit).

    The stream's own limits (JetStream's, `ensure_stream`), and the window the sealer purges to."""

    max_age: float = 0.0
    max_bytes: int = 0


class BadEvent(NamedTuple):
    """Bytes on the stream that are not a valid event; reported and skipped."""

    seq: int
    raw: bytes
    error: str
    subject: str = ""


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
        self._api_prefix = api_prefix
        self.stream = stream
        self.prefix = prefix
        self.request_timeout = request_timeout
        self.bad_events = 0
        self._wire = wire
        self._owns_connection = owns_connection
        self.on_bad: Callable[[BadEvent], None] = on_bad if on_bad is not None else _log_bad
        """Called once per bad message met by a reader (default: a structlog warning)."""
        self._publisher = Publisher(
            nc, self.js, stream=stream, wire=wire, request_timeout=request_timeout, last_seq=self.last_seq
        )
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

        With `retention`, JetStream drops the oldest messages past those limits
        whether they were sealed or not (readers then find a hole): the daemon
        sets them as a safety ceiling well above the window its sealer purges
        to (`daemon/archiving.py`), reached only when the sealer stops for long.
        """
        window = retention if retention is not None else Retention()
        config = StreamConfig(
            name=self.stream,
            subjects=[f"{self.prefix}.>"],
            storage=StorageType.FILE,
            num_replicas=replicas,
            deny_delete=True,
            deny_purge=False,  # only the sealer purges, what it sealed (accounts.conf: the daemon alone may)
            discard=DiscardPolicy.OLD,
            max_age=window.max_age or None,
            max_bytes=window.max_bytes or None,
            duplicate_window=duplicate_window,
            # the server refuses what no reader would take (decode's cap), whoever publishes it
            max_msg_size=MAX_EVENT_BYTES + _HEADER_ROOM,
            allow_direct=True,  # submitters read their own submissions back by subject (accounts.conf)
            # a cycle's decisions are stored all or none (`Publisher.fenced`); servers before 2.12 know no such thing
            allow_atomic=True if _atomic_server(self.nc) else None,
        )
        if not create:
            try:
                info = await self.js.stream_info(self.stream)
            except NotFoundError:
                raise StreamMissing(f"stream {self.stream} does not exist (and create=False)") from None
            self._publisher.atomic = bool(info.config.allow_atomic)
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
        self._publisher.atomic = bool(info.config.allow_atomic)

    @property
    def atomic(self) -> bool:
        """The stream takes atomic batches (NATS 2.12+, `allow_atomic`): fenced appends are all or nothing."""
        return self._publisher.atomic

    async def delete_stream(self) -> None:
        """Delete the whole stream (tests and teardown only; muster never deletes its log)."""
        with contextlib.suppress(NotFoundError):
            await self.js.delete_stream(self.stream)

    async def close(self) -> None:
        """Close the connection if the store opened it (else drop the store's own subscription)."""
        await self._publisher.close()
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
        items: list[Item] = []
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
            return await self._publisher.fenced(items, expected_last_seq)
        return await self._publisher.pipelined(items)

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

    # ------------------------------------------------------------ read

    async def last_seq(self) -> int:
        """Sequence of the last message on the stream (0 when empty)."""
        info = await self.js.stream_info(self.stream)
        return int(info.state.last_seq)

    async def first_seq(self) -> int:
        """Sequence of the first message still on the stream (older ones left its retention window)."""
        info = await self.js.stream_info(self.stream)
        return int(info.state.first_seq)

    async def check_holds(self, from_seq: int, hint: str = "") -> None:
        """Raise LogHole when the stream no longer holds `from_seq` (it left with those up to the first one kept).

        The one check of every reader that must start at a sequence, not later (a replica's fold,
        replay); `follow` applies the same rule to each message it brings.
        """
        first = await self.first_seq()
        start = max(1, from_seq)
        if first > start:
            raise LogHole(self.stream, start, first - 1, hint)

    async def first_seq_since(self, wall_time: float) -> int:
        """Sequence of the first message stored at or after `wall_time` (epoch seconds); past the end when none."""
        stamp = dt.datetime.fromtimestamp(wall_time, dt.UTC).isoformat()
        answer = await self._api(f"STREAM.MSG.GET.{self.stream}", {"start_time": stamp})
        error = answer.get("error")
        if error is not None:
            if error.get("err_code") == _NO_MESSAGE_FOUND:
                return await self.last_seq() + 1
            raise StoreError(f"cannot look up stream {self.stream} by time: {error.get('description')}")
        return int(answer["message"]["seq"])

    async def purge_before(self, seq: int) -> int:
        """Drop the messages before `seq` from the stream (they must be in the archive); how many went.

        Only the leader's sealer calls it. A stream created with `deny_purge` (by muster before
        the sealer purged) refuses for good: StoreError says so.
        """
        if seq < 1:
            return 0  # a purge request without a sequence would empty the whole stream
        answer = await self._api(f"STREAM.PURGE.{self.stream}", {"seq": seq})
        error = answer.get("error")
        if error is not None:
            why = error.get("description")
            if error.get("err_code") == _PURGE_NOT_PERMITTED:
                why = "the stream was created with deny_purge, which NATS never lifts; its own limits stay its window"
            raise StoreError(f"cannot purge stream {self.stream} before {seq}: {why}")
        return int(answer.get("purged", 0))

    async def _api(self, api: str, request: dict[str, Any]) -> dict[str, Any]:
        """One JetStream API request and its decoded answer (errors are in the answer, not raised)."""
        with self.refusals():
            msg = await self.nc.request(
                f"{self._api_prefix}.{api}", json.dumps(request).encode(), timeout=self.request_timeout
            )
        answer: dict[str, Any] = json.loads(msg.data)
        return answer

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


def _atomic_server(nc: NatsClient) -> bool:
    """Whether the server takes atomic batch publishes (nats-server 2.12 and later)."""
    version = nc.connected_server_version
    return (version.major, version.minor) >= (2, 12)
