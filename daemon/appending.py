"""Appending one cycle's decisions in one round trip, fenced, all or a prefix.

`EventStore.append(..., expected_last_seq=)` confirms each message before
sending the next, so a cycle of k decisions takes k round trips, and a write
by anyone else in between cuts the cycle (a prefix stored). Under load that
window is most of the time, and cut cycles are what `muster audit` cannot
re-derive. Here the messages are sent back to back, and chained:

- the first carries `Nats-Expected-Last-Sequence: expected` (the log ends
  where the state decided on ends);
- each next one carries `Nats-Expected-Last-Msg-Id: <the previous one's id>`.

The server checks each against the stream as it stores them, so either the
whole cycle lands contiguously right after `expected`, or it stops at the
first message something else got in front of, and every later one fails too
(the previous id is no longer last): what is stored is always a prefix, as
with the one-by-one path, but the window for a cut shrinks from k round trips
to the server's time to store k messages.

Results are those of `EventStore.append`: the sequences, or
`ConcurrencyConflict` (with the stored prefix), or `AppendError` when some
answers never came (stored or not: fold the log before deciding again).

This belongs in `events/store.py` as an append option; it lives here until
the store's owner takes it.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Sequence
from typing import Any

import anyio
import msgspec
from nats.aio.subscription import Subscription

from muster.events.codec import MAX_EVENT_BYTES, encode
from muster.events.store import AppendError, ConcurrencyConflict, EventStore, EventTooLarge, StoreError, subject_for
from muster.events.types import Event

__all__ = ["ChainedAppender"]

_WRONG_LAST_SEQUENCE = 10071
_WRONG_LAST_MSG_ID = 10070
_CONFLICTS = (_WRONG_LAST_SEQUENCE, _WRONG_LAST_MSG_ID)


class _Error(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _Ack(msgspec.Struct):
    seq: int = 0
    duplicate: bool = False
    error: _Error | None = None


_decode_ack = msgspec.json.Decoder(_Ack).decode


class ChainedAppender:
    def __init__(self, store: EventStore, *, timeout: float = 5.0) -> None:
        self.store = store
        self.timeout = timeout
        self._sub: Subscription | None = None
        self._inbox = ""
        self._batches = itertools.count(1)

    async def _subscription(self) -> Subscription:
        if self._sub is None:
            nc = self.store.nc
            self._inbox = nc.new_inbox()
            self._sub = await nc.subscribe(self._inbox + ".>")
        return self._sub

    async def close(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            # a gone connection has nothing to unsubscribe from
            with anyio.move_on_after(2, shield=True), contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def append(self, events: Sequence[Event], *, expected_last_seq: int, msg_ids: Sequence[str]) -> list[int]:
        if not events:
            return []
        sub = await self._subscription()
        nc, store = self.store.nc, self.store
        batch = next(self._batches)
        prefix = f"{self._inbox}.{batch}."
        payloads = []
        for i, ev in enumerate(events):
            data = encode(ev)
            if len(data) > MAX_EVENT_BYTES:
                raise EventTooLarge(i, type(ev).__name__, len(data), MAX_EVENT_BYTES)
            payloads.append(data)
        for i, (ev, data) in enumerate(zip(events, payloads, strict=True)):
            headers = {"Nats-Msg-Id": msg_ids[i], "Nats-Expected-Stream": store.stream}
            if i == 0:
                headers["Nats-Expected-Last-Sequence"] = str(expected_last_seq)
            else:
                headers["Nats-Expected-Last-Msg-Id"] = msg_ids[i - 1]
            await nc.publish(subject_for(ev, store.prefix), data, reply=f"{prefix}{i}", headers=headers)
        results: list[int | _Error | None] = [None] * len(events)
        answered = 0
        with anyio.move_on_after(self.timeout):
            async for msg in sub.messages:
                if not msg.subject.startswith(prefix):
                    continue  # a late answer to an earlier batch
                i = int(msg.subject[len(prefix) :])
                if not 0 <= i < len(results) or results[i] is not None:
                    continue
                ack = _decode_ack(msg.data)
                results[i] = ack.error if ack.error is not None else ack.seq
                answered += 1
                if answered == len(results):
                    break
        return await self._outcome(results, expected_last_seq)

    async def _outcome(self, results: list[Any], expected: int) -> list[int]:
        stored: list[int] = []
        for r in results:
            if not isinstance(r, int):
                break
            stored.append(r)
        if len(stored) == len(results):
            return stored
        first = results[len(stored)]
        if first is None:
            raise AppendError(f"{len(stored)} of {len(results)} decisions confirmed; the rest got no answer")
        assert isinstance(first, _Error)
        if first.err_code not in _CONFLICTS:
            raise StoreError(f"append refused: {first.description} ({first.code}/{first.err_code})")
        match = re.search(r"wrong last sequence: (\d+)", first.description)
        actual = int(match.group(1)) if match else await self.store.last_seq()
        raise ConcurrencyConflict(expected + len(stored), actual, stored)
