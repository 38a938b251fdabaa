"""The stream itself: made sure of, looked up, and purged of what the archive sealed.

Role: the JetStream stream under the event store (`EventStore` inherits these): its
configuration (`ensure_stream`), where it starts and ends, and `purge_before`.

Invariants:
- One stream (file storage, deny_delete, messages capped at the event size cap)
  holds subjects `<prefix>.<kind>.<id>` (`events.subjects`).
- The log's past leaves the stream only by `purge_before`, which the leader's
  sealer calls for what it has sealed into the archive (`daemon/archiving.py`).
  The stream allows purge requests because NATS can never lift `deny_purge`
  from a stream once set; who may send one is NATS permissions' business
  (deploy/nats/accounts.conf grants it to the daemon's identity alone).
- A reader that must start at a sequence never starts later in silence:
  `check_holds` raises LogHole when the stream no longer holds it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Iterator
from typing import Any, NamedTuple

import nats
import structlog
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, NotFoundError

from muster.events.codec import MAX_EVENT_BYTES
from muster.events.connecting import refusal
from muster.events.errors import LogHole, StoreError, StoreRefused, StreamMissing
from muster.events.publishing import Publisher

__all__ = ["HEADER_ROOM", "Retention", "StreamManagement"]

log = structlog.get_logger("muster.events.store")

_STREAM_NAME_IN_USE = 10058
_SUBJECTS_OVERLAP = 10065
"""JetStream's answer to a new stream whose subjects another stream of the server holds."""
_PURGE_NOT_PERMITTED = 10110
_NO_MESSAGE_FOUND = 10037
HEADER_ROOM = 512
"""Bytes kept free for our headers when checking a message against the server's max_payload."""


class Retention(NamedTuple):
    """A window of the stream: messages older than `max_age` seconds, or beyond `max_bytes`, leave it (0: no limit).

    The stream's own limits (JetStream's, `ensure_stream`), and the window the sealer purges to."""

    max_age: float = 0.0
    max_bytes: int = 0


class StreamManagement:
    """The stream's configuration, ends and purge (a part of `EventStore`)."""

    nc: NatsClient
    js: JetStreamContext
    stream: str
    prefix: str
    request_timeout: float
    _api_prefix: str
    _publisher: Publisher

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
            max_msg_size=MAX_EVENT_BYTES + HEADER_ROOM,
            allow_direct=True,  # submitters read their own submissions back by subject (accounts.conf)
            # a cycle's decisions are stored all or none (`Publisher.fenced`); servers before 2.12 know no such thing
            allow_atomic=True if _atomic_server(self.nc) else None,
        )
        if not create:
            try:
                info = await self.js.stream_info(self.stream)
            except NotFoundError:
                raise StreamMissing(
                    f"stream {self.stream} does not exist on this server (the daemon or `muster queues apply` makes it)"
                ) from None
            self._publisher.atomic = bool(info.config.allow_atomic)
            return
        try:
            info = await self.js.add_stream(config)
        except APIError as exc:
            if exc.err_code == _SUBJECTS_OVERLAP:
                raise StoreError(
                    f"cannot create stream {self.stream}: another stream of this server holds {self.prefix}.> "
                    "(give this log a subject prefix of its own: --subject-prefix, or the config's nats.subject_prefix)"
                ) from exc
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


def _atomic_server(nc: NatsClient) -> bool:
    """Whether the server takes atomic batch publishes (nats-server 2.12 and later)."""
    version = nc.connected_server_version
    return (version.major, version.minor) >= (2, 12)
