"""Bindings over a pool of keep-alive HTTP/1.1 connections, with pipelined requests.

A binding is a small POST answered by a small Status. Through kubernetes-asyncio's aiohttp
session each one holds its connection for a whole round trip before the next request can use
it, and costs the client request and response objects, connector bookkeeping and timeout
machinery (0.33-0.41 ms of CPU per binding in bench/bench_k8s_real.py at load 13-15; this pool
0.21-0.37). Here each of `connections` connections carries requests back to back without
waiting for the answers before (HTTP/1.1 pipelining: the server answers in the order it was
asked), and the request bytes are written by hand. Keep the pipelines shallow (connections
near the requests in flight): kube-apiserver serves a connection's requests one at a time, and
16 deep they cost it 1.8-2.6 ms of CPU per binding against 1.2-1.6 through aiohttp.

Only requests the server may see twice are sent this way: a binding sent twice is answered
409 "already assigned to node N", which the applier reads as done when N is its node.

Invariants:
- On a connection, answers are read in the order the requests were written: a request queues
  its bytes (`_Connection.unsent`) and takes its turn (`_Connection.turns`) in one step; one
  writer at a time sends everything queued in one piece.
- A connection that may be out of step (an error or a cancellation while writing or reading,
  a request that left while waiting for its answer, `Connection: close`) is closed, and every
  request waiting on it fails with a `TemporaryError`: the caller retries, on another connection.
- Every failure is a `KubeError`; nothing of anyio, ssl or the socket escapes.
"""

from __future__ import annotations

import ssl
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio
from anyio.abc import ByteStream
from anyio.streams.buffered import BufferedByteReceiveStream

from muster.daemon.k8s.errors import KubeError, TemporaryError

__all__ = ["Answer", "PipelinedPool", "ssl_context_of"]

MAX_HEAD = 64 * 1024
"""Bytes an answer's status line and headers may take (the API server's are a few hundred)."""


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: its status, headers (names in lower case) and body."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class _Broken(Exception):
    """The connection is out of step; the message says why."""


async def _read_answer(reader: BufferedByteReceiveStream) -> Answer:
    """Read one answer: `Content-Length` or chunked bodies (what the API server sends)."""
    head = await reader.receive_until(b"\r\n\r\n", MAX_HEAD)
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise _Broken(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    status = int(parts[1])
    if "content-length" in headers:
        body = await reader.receive_exactly(int(headers["content-length"])) if headers["content-length"] != "0" else b""
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int((await reader.receive_until(b"\r\n", 1024)).split(b";")[0], 16)
            if size == 0:
                while await reader.receive_until(b"\r\n", MAX_HEAD):
                    pass  # trailers, up to the empty line
                break
            chunks.append(await reader.receive_exactly(size))
            await reader.receive_exactly(2)
        body = b"".join(chunks)
    elif status in (204, 304) or 100 <= status < 200:
        body = b""
    else:
        raise _Broken(f"an answer ({status}) without a length")  # its end would be the connection's
    return Answer(status, headers, body)


class _Connection:
    """One keep-alive connection; requests are written back to back and answered in order."""

    def __init__(self, stream: ByteStream) -> None:
        self.stream = stream
        self.reader = BufferedByteReceiveStream(stream)
        self.unsent: list[bytes] = []
        """Requests waiting for the writer, in order; it sends them all at once (one TLS record, one syscall)."""
        self.writing = False
        self.turns: deque[anyio.Event] = deque()
        """One per request queued and not yet answered, in the order of `unsent`; the first one reads."""
        self.broken = ""
        """Why the connection is closed ("" while it serves)."""
        self.in_flight = 0
        self.used = 0.0
        """When a request last ended on it (the pool's clock)."""

    async def request(self, data: bytes) -> Answer:
        if self.broken:
            raise _Broken(self.broken)
        turn = anyio.Event()
        self.unsent.append(data)
        self.turns.append(turn)  # with no await since the line above: turns and bytes in one order
        if not self.writing:
            await self._write()
        try:
            if not self.broken and self.turns[0] is not turn:
                await turn.wait()  # set by the answer before ours, or by _break
            if self.broken:
                raise _Broken(self.broken)
            answer = await _read_answer(self.reader)
        except BaseException as exc:
            await self._break(f"reading failed: {exc!r}")
            raise
        self.turns.popleft()
        if self.turns:
            self.turns[0].set()
        if answer.headers.get("connection", "").lower() == "close":
            await self._break("the server closed the connection")
        return answer

    async def _write(self) -> None:
        """Send what is queued, and what is queued meanwhile, until nothing is left (one writer at a time)."""
        self.writing = True
        try:
            while self.unsent and not self.broken:
                data = b"".join(self.unsent)
                self.unsent.clear()
                await self.stream.send(data)
        except BaseException as exc:
            await self._break(f"writing failed: {exc!r}")
            raise
        finally:
            self.writing = False

    async def _break(self, why: str) -> None:
        if self.broken:
            return
        self.broken = why
        for turn in self.turns:
            turn.set()  # each wakes, sees `broken` and fails
        self.turns.clear()
        self.unsent.clear()
        with anyio.CancelScope(shield=True):
            await anyio.aclose_forcefully(self.stream)

    async def close(self) -> None:
        await self._break("closed")


def ssl_context_of(configuration: object) -> ssl.SSLContext:
    """The TLS settings kubernetes-asyncio's REST client makes of a `Configuration` (CA, client
    certificate, verification switches), for connections of our own to the same server."""
    context = ssl.create_default_context(cafile=getattr(configuration, "ssl_ca_cert", None))
    cert_file = getattr(configuration, "cert_file", None)
    if cert_file:
        context.load_cert_chain(cert_file, keyfile=getattr(configuration, "key_file", None))
    if not getattr(configuration, "verify_ssl", True):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if getattr(configuration, "disable_strict_ssl_verification", False):
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return context


class PipelinedPool:
    """Up to `connections` connections to the server at `url`; a request goes to the one with the
    fewest in flight, and a new connection is opened while every open one is busy."""

    def __init__(
        self,
        url: str,
        *,
        connections: int,
        ssl_context: ssl.SSLContext | None,
        server_hostname: str | None = None,
        request_seconds: float = 30.0,
        idle_seconds: float = 60.0,
        clock: Callable[[], float] = anyio.current_time,
    ) -> None:
        """`idle_seconds`: a connection idle longer is closed rather than used (kube-apiserver closes
        them after 90 s: a request sent as it does would fail)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"cannot pipeline to {url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        self.host_header = parts.netloc.rpartition("@")[2]
        self.ssl_context = ssl_context
        self.server_hostname = server_hostname or self.host
        self.connections = max(1, connections)
        self.request_seconds = request_seconds
        self.idle_seconds = idle_seconds
        self._clock = clock
        self._open: list[_Connection] = []
        self._opening = 0
        self._opened_one = anyio.Event()
        """Set (and replaced) whenever an opening ends: requests that found every connection opening wait for it."""
        self.opened = 0
        """Connections opened so far (a test reads it)."""

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> Answer:
        """POST `body` to `path` with `headers` (its Content-Type among them); the answer, whatever its status.

        Raises `TemporaryError` when there was no answer (a connection that failed or closed,
        a timeout): the request may or may not have reached the server.
        """
        lines = [f"POST {self.prefix}{path} HTTP/1.1", f"Host: {self.host_header}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines += [f"Content-Length: {len(body)}", "", ""]
        data = "\r\n".join(lines).encode("latin-1") + body
        try:
            with anyio.fail_after(self.request_seconds):
                conn = await self._pick()
                conn.in_flight += 1
                try:
                    return await conn.request(data)
                finally:
                    conn.in_flight -= 1
                    conn.used = self._clock()
        except KubeError:
            raise
        except TimeoutError as exc:
            raise TemporaryError(f"timed out after {self.request_seconds} s") from exc
        except (_Broken, OSError, ssl.SSLError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            raise TemporaryError(f"connection failed: {exc}") from exc
        except (anyio.IncompleteRead, anyio.DelimiterNotFound, ValueError) as exc:
            raise TemporaryError(f"unreadable answer: {exc!r}") from exc

    async def _pick(self) -> _Connection:
        now = self._clock()
        for conn in self._open:
            if not conn.in_flight and now - conn.used > self.idle_seconds:
                await conn.close()  # before the server closes it under a request (it does after 90 s idle)
        self._open = [c for c in self._open if not c.broken]
        best = min(self._open, key=lambda c: c.in_flight, default=None)
        if (best is None or best.in_flight > 0) and len(self._open) + self._opening < self.connections:
            self._opening += 1
            try:
                stream = await self._connect()
            finally:
                self._opening -= 1
                self._opened_one.set()
                self._opened_one = anyio.Event()
            conn = _Connection(stream)
            conn.used = self._clock()
            self._open.append(conn)
            self.opened += 1
            return conn
        if best is None:  # every connection is being opened: wait for one
            await self._opened_one.wait()
            return await self._pick()
        return best

    async def _connect(self) -> ByteStream:
        if not self.tls:
            return await anyio.connect_tcp(self.host, self.port)
        # no ALPN offered: the server answers in HTTP/1.1, which pipelines
        return await anyio.connect_tcp(
            self.host,
            self.port,
            ssl_context=self.ssl_context,
            tls_hostname=self.server_hostname,
            tls_standard_compatible=False,
        )

    async def aclose(self) -> None:
        for conn in self._open:
            await conn.close()
        self._open.clear()
