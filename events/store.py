"""The event store: muster's log on one NATS JetStream stream.

Role: the facade every caller uses: connect, append events (de-duplicated,
optionally fenced by the expected last sequence), read a range, and follow the
log. The store encodes and names what it appends; getting it onto the stream,
pipelined or fenced, is `publishing`'s; reading is `reading`'s, the stream's
configuration, ends and purge are `streams`'. Where events go (`subjects`),
what the store raises (`errors`) and how it connects (`connecting`) have
modules of their own; their names callers use are re-exported here.

Invariants:
- One stream (file storage, deny_delete, messages capped at the event size
  cap) holds subjects `<prefix>.<kind>.<id>`; `kind` comes from the
  event type, `id` is the job, node, queue... name made safe for a subject
  token (`subject_token`). Submissions go to `<prefix>.submit.<queue>.<job>`,
  so NATS permissions can let a team publish to its own queues only.
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
- What readers take and skip is `reading`'s rule; what leaves the stream, by
  `purge_before` only, is `streams`'.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import structlog
from nats.aio.client import Client as NatsClient

from muster.events.codec import MAX_EVENT_BYTES, encode
from muster.events.connecting import (  # re-exported: callers know them as the store's
    NATS_SCHEMES,
    connect_client,
    default_url,
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
from muster.events.reading import BadEvent, StoredEvent, StreamReading, decode_raws  # re-exported
from muster.events.streams import HEADER_ROOM, Retention  # Retention re-exported
from muster.events.subjects import (  # re-exported
    DEFAULT_PREFIX,
    SCOPED_KINDS,
    SubjectRule,
    subject_for,
    subject_problem,
    subject_token,
)
from muster.events.types import Event, JobSubmitted
from muster.events.wire import WireConnection, WireOptions

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
_MAX_MSG_ID = 200


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


class EventStore(StreamReading):
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
            with store.refusals():  # an identity that may not create or look up the stream is told so
                await store.ensure_stream(
                    replicas=replicas, duplicate_window=duplicate_window, create=create, retention=retention
                )
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        """Close the connection if the store opened it (else drop the store's own subscription)."""
        await self._publisher.close()
        if self._owns_connection and not self.nc.is_closed:
            with anyio.move_on_after(5, shield=True):
                await self.nc.close()

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
        limit = min(MAX_EVENT_BYTES, max(0, self.nc.max_payload - HEADER_ROOM) or MAX_EVENT_BYTES)
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
