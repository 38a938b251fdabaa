"""Appending to the event stream: pipelined, and fenced (atomic batches, else chained publishes).

Role: the publishing half of `store.EventStore`. `append` encodes events and
names them (msg ids); this module gets the encoded messages onto the stream:

- `pipelined(items)`: every message published without waiting for each ack
  (over the lean wire protocol where it can), the stragglers confirmed one by
  one; JetStream's de-duplication makes a retried batch store nothing twice.
- `fenced(items, expected)`: the messages land contiguously right after
  `expected`, as atomic batches of up to 1,000 where the stream allows them
  (NATS 2.12+), else chained in one round trip; when the log moved, only a
  prefix of whole batches (or of messages) is stored (`ConcurrencyConflict`
  with the stored sequences); when answers are missing, `AppendError`.

Invariants: those of `store` for appends (its module docstring); one parser
of the server's conflicts (`_actual_last_seq`), one msg-id rule (the store's).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec
import nats
import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription
from nats.js.errors import APIError, NotFoundError, TooManyStalledMsgsError

from muster.events.connecting import refusal
from muster.events.errors import AppendError, ConcurrencyConflict, StoreError, StoreRefused
from muster.events.wire import PublishResult, WireConnection, WireError, WireOptions, publish_pipelined

__all__ = ["Item", "Publisher"]

log = structlog.get_logger("muster.events.store")

Item = tuple[str, bytes, str]
"""One message to publish: subject, encoded event, msg id."""

_WRONG_LAST_SEQUENCE = 10071
_WRONG_LAST_MSG_ID = 10070
_CONFLICTS = (_WRONG_LAST_SEQUENCE, _WRONG_LAST_MSG_ID)
_DUPLICATE_IN_BATCH = 10201
_ATOMIC_MAX = 1000
"""Messages per atomic batch at most (the server's default limit)."""
_WIRE_MIN_BATCH = 64
"""Batches at least this big are appended through `wire`; smaller ones through nats-py."""


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


class Publisher:
    """Publishes a store's encoded messages onto its stream (see the module docstring)."""

    def __init__(
        self,
        nc: NatsClient,
        js: Any,
        *,
        stream: str,
        wire: WireOptions,
        request_timeout: float,
        last_seq: Callable[[], Awaitable[int]],
    ) -> None:
        self.nc = nc
        self.js = js
        self.stream = stream
        self.request_timeout = request_timeout
        self._wire = wire
        self._last_seq = last_seq
        self._replies: Subscription | None = None
        """Answers to chained (fenced) publishes, `<inbox>.<chain>.<index>`; subscribed at the first."""
        self._reply_inbox = ""
        self._chains = itertools.count(1)
        self.atomic = False
        """The stream takes atomic batches (NATS 2.12+, `allow_atomic`): fenced appends are all or nothing."""

    async def close(self) -> None:
        """Drop the subscription to chained publishes' answers (a gone connection has none to drop)."""
        if self._replies is not None:
            replies, self._replies = self._replies, None
            with anyio.move_on_after(2, shield=True), contextlib.suppress(Exception):
                await replies.unsubscribe()

    async def pipelined(self, items: list[Item]) -> list[int]:
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

    async def _publish_wire(self, items: list[Item]) -> list[PublishResult]:
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

    async def _publish_nats(self, items: list[Item]) -> list[PublishResult]:
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

    async def fenced(self, items: list[Item], expected: int) -> list[int]:
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

    async def _publish_atomic(self, items: list[Item], expected: int) -> _Answer:
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

    async def _append_chained(self, items: list[Item], expected: int) -> list[int]:
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
            expected + len(stored), actual if actual is not None else await self._last_seq(), stored
        )

    async def _publish_chained(self, items: list[Item], expected: int) -> list[_Answer]:
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

    async def _append_checked(self, items: list[Item], expected: int) -> list[int]:
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
                    actual = await self._last_seq()
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


def _actual_last_seq(description: str | None) -> int | None:
    match = re.search(r"wrong last sequence: (\d+)", description or "")
    return int(match.group(1)) if match else None
