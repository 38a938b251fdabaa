"""The pipelined binding pool (`k8s.pipelining`) against a small HTTP/1.1 server of the test's own.

The server here reads requests and answers when the test says, so these tests can prove what
a real server cannot show: that requests go out before the answers before them came back, that
answers reach the request they belong to, and what a connection lost mid-pipeline does.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import anyio.lowlevel
import pytest
from anyio.abc import SocketAttribute, SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

from muster.daemon.k8s.errors import TemporaryError
from muster.daemon.k8s.pipelining import Answer, PipelinedPool

Handler = Callable[[BufferedByteReceiveStream, SocketStream], Awaitable[None]]


async def read_request(reader: BufferedByteReceiveStream) -> bytes:
    """One request's body (the pool sends Content-Length)."""
    head = await reader.receive_until(b"\r\n\r\n", 65536)
    length = next(int(v) for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n")) if k == b"Content-Length")
    return await reader.receive_exactly(length)


def answer(body: bytes, *, status: int = 201, chunked: bool = False) -> bytes:
    if chunked:
        half = len(body) // 2
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (body[:half], body[half:]) if c)
        return b"HTTP/1.1 %d X\r\nTransfer-Encoding: chunked\r\n\r\n%s0\r\n\r\n" % (status, chunks)
    return b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)


@contextlib.asynccontextmanager
async def serving(
    handler: Handler, *, request_seconds: float = 5, clock: Callable[[], float] = anyio.current_time
) -> AsyncIterator[PipelinedPool]:
    """A pool of one connection to a loopback HTTP server calling `handler` for each connection."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    async with listener, anyio.create_task_group() as tg:

        async def one(stream: SocketStream) -> None:
            async with stream:
                with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, anyio.IncompleteRead):
                    await handler(BufferedByteReceiveStream(stream), stream)

        tg.start_soon(listener.serve, one)
        port = listener.extra(SocketAttribute.local_port)
        pool = PipelinedPool(
            f"http://127.0.0.1:{port}", connections=1, ssl_context=None, request_seconds=request_seconds, clock=clock
        )
        try:
            with anyio.fail_after(5):
                yield pool
        finally:
            await pool.aclose()
            tg.cancel_scope.cancel()


async def posts(pool: PipelinedPool, bodies: list[bytes]) -> list[Answer]:
    """Post every body at once, in order, each answer at its body's index."""
    answers: list[Answer | None] = [None] * len(bodies)

    async def one(i: int) -> None:
        answers[i] = await pool.post(f"/r/{i}", bodies[i], {"Content-Type": "application/json"})

    async with anyio.create_task_group() as tg:
        for i in range(len(bodies)):
            tg.start_soon(one, i)
            await anyio.lowlevel.checkpoint()  # in this order onto the connection
    return [a for a in answers if a is not None]


async def test_requests_go_out_before_earlier_answers_and_each_gets_its_own() -> None:
    """Three requests on one connection are all written before the first is answered (the server here
    answers nothing until it has read three), and each caller gets the answer to its own request."""

    async def three_then_answer(reader: BufferedByteReceiveStream, stream: SocketStream) -> None:
        bodies = [await read_request(reader) for _ in range(3)]
        await stream.send(b"".join(answer(b"echo " + b, chunked=i == 1) for i, b in enumerate(bodies)))
        await anyio.sleep_forever()

    async with serving(three_then_answer) as pool:
        answers = await posts(pool, [b"a", b"bb", b"ccc"])
    assert [(a.status, a.body) for a in answers] == [(201, b"echo a"), (201, b"echo bb"), (201, b"echo ccc")]
    assert pool.opened == 1


async def test_an_error_answer_leaves_the_connection_in_step() -> None:
    """A 409 with a body is read whole: the answer after it on the same connection is the right one."""

    async def conflict_then_ok(reader: BufferedByteReceiveStream, stream: SocketStream) -> None:
        await read_request(reader)
        await stream.send(answer(b'{"message":"already assigned"}', status=409))
        await read_request(reader)
        await stream.send(answer(b"ok"))
        await anyio.sleep_forever()

    async with serving(conflict_then_ok) as pool:
        first = await pool.post("/a", b"{}", {})
        second = await pool.post("/b", b"{}", {})
    assert (first.status, second.status, second.body) == (409, 201, b"ok")
    assert pool.opened == 1


async def test_a_connection_lost_mid_pipeline_fails_its_requests_as_temporary_and_the_next_reconnects() -> None:
    """The server reads two requests and hangs up: both fail with a TemporaryError (worth a retry), and
    the next request opens a new connection and is answered."""
    connections = 0

    async def first_hangs_up(reader: BufferedByteReceiveStream, stream: SocketStream) -> None:
        nonlocal connections
        connections += 1
        if connections == 1:
            await read_request(reader)
            await read_request(reader)
            return  # closes the connection unanswered
        await read_request(reader)
        await stream.send(answer(b"fresh"))
        await anyio.sleep_forever()

    failures: list[BaseException] = []

    async with serving(first_hangs_up) as pool:

        async def failing(path: str) -> None:
            try:
                await pool.post(path, b"{}", {})
            except TemporaryError as exc:
                failures.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(failing, "/a")
            await anyio.lowlevel.checkpoint()
            tg.start_soon(failing, "/b")
        again = await pool.post("/c", b"{}", {})
    assert len(failures) == 2
    assert (again.status, again.body, pool.opened) == (201, b"fresh", 2)


async def test_a_request_that_times_out_is_a_temporary_error() -> None:
    """A server that never answers: the request fails with a TemporaryError after request_seconds."""

    async def silent(reader: BufferedByteReceiveStream, stream: SocketStream) -> None:
        await read_request(reader)
        await anyio.sleep_forever()

    async with serving(silent, request_seconds=0.2) as pool:
        with pytest.raises(TemporaryError, match="timed out"):
            await pool.post("/a", b"{}", {})


async def test_a_connection_idle_too_long_is_replaced_before_the_server_drops_it() -> None:
    """After idle_seconds without a request, the next one goes over a new connection, not the idle one
    (kube-apiserver closes a connection idle for 90 s, which would fail a binding sent on it)."""
    now = 0.0

    async def answers_each(reader: BufferedByteReceiveStream, stream: SocketStream) -> None:
        while True:
            await read_request(reader)
            await stream.send(answer(b"ok"))

    async with serving(answers_each, clock=lambda: now) as pool:
        await pool.post("/a", b"{}", {})
        now += 30
        await pool.post("/b", b"{}", {})
        reused = pool.opened
        now += 61
        await pool.post("/c", b"{}", {})
    assert (reused, pool.opened) == (1, 2)
