"""The lean reader's checks on what a push consumer delivers: a lost delivery stops it, a caught-up read ends."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from muster.events.wire import Raw, WireConnection, WireError, consume


class _Server:
    """The writing half of a connection; the first subscription (the deliver inbox) gets `deliveries`, then EOF."""

    def __init__(self, reader: asyncio.StreamReader, deliveries: list[tuple[int, int, int]]) -> None:
        self.reader = reader
        self.deliveries = deliveries

    def write(self, data: bytes) -> None:
        if data.startswith(b"SUB ") and self.deliveries:
            sid = int(data.split()[2])
            self.reader.feed_data(b"".join(_delivery(sid, *d) for d in self.deliveries))
            self.reader.feed_eof()
            self.deliveries = []

    async def drain(self) -> None:
        return None

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        return None

    async def wait_closed(self) -> None:
        return None


def _delivery(sid: int, seq: int, dseq: int, pending: int, payload: bytes = b"{}") -> bytes:
    reply = f"$JS.ACK.S.C.1.{seq}.{dseq}.1700000000000000000.{pending}"
    headers = b"NATS/1.0\r\nNats-Msg-Id: x\r\n\r\n"
    head = f"HMSG muster.job.j {sid} {reply} {len(headers)} {len(headers) + len(payload)}\r\n".encode()
    return head + headers + payload + b"\r\n"


async def _read(deliveries: list[tuple[int, int, int]], *, caught_up: bool = True) -> list[int]:
    reader = asyncio.StreamReader()
    conn = WireConnection(reader, _Server(reader, deliveries))  # type: ignore[arg-type]
    seqs: list[int] = []
    batch: list[Raw]
    async with contextlib.aclosing(consume(conn, "S", 1, stop_when_caught_up=caught_up)) as batches:
        async for batch in batches:
            seqs += [seq for seq, _, _ in batch]
    return seqs


async def test_a_lost_delivery_stops_the_read_instead_of_skipping() -> None:
    """Delivery sequences 1, 2, 4: the reader raises WireError (the caller resumes), never yields past the hole."""
    with pytest.raises(WireError, match="delivery gap"):
        await _read([(10, 1, 5), (11, 2, 4), (13, 4, 2)])


async def test_a_caught_up_read_ends_at_the_first_message_with_nothing_pending() -> None:
    """Messages after the one that left nothing pending (appended since) are not part of a caught-up read."""
    assert await _read([(10, 1, 2), (11, 2, 1), (12, 3, 0), (13, 4, 0)]) == [10, 11, 12]


async def test_stream_sequences_come_from_each_delivery_not_a_count() -> None:
    """Stream sequences with holes (messages that left the window) are yielded as delivered."""
    assert await _read([(5, 1, 2), (9, 2, 1), (40, 3, 0)]) == [5, 9, 40]
