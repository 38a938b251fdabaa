"""Shared pieces of the fault-injection suite (and of `bench/reliability.py`).

- `Load`: a submitter that appends gang submissions at a steady rate and
  retries a failed append with the same events (so the same message ids) until
  it is acknowledged; it records which jobs were acknowledged and how long
  each outage kept it from appending.
- `Follower`: `EventStore.follow` into a list, with the sequences it saw.
- `JetStreamCluster`: three nats-server processes from the wheel on loopback,
  joined by routes, each with its own store dir (`EmbeddedNats` underneath).
- `percentile`, `stream_leader`.

Sizes are small by default so the CI run stays quick; the bench raises them.
"""

from __future__ import annotations

import contextlib
import math
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import attrs
import kmock
import nats
from anyio.abc import TaskStatus

from muster.demo.emulator import KubeEmulator
from muster.events.embedded import EmbeddedNats, free_port
from muster.events.store import EventStore, StoredEvent
from muster.events.types import Event, JobSubmitted, PodSet, QueueConfigured

RETRYABLE = (Exception,)
"""A submitter retries on anything the store raises while NATS is away (StoreError, timeouts, nats errors)."""


def gang(job: str, at: int, queue: str = "team-a", pods: int = 2, gpu: int = 4) -> JobSubmitted:
    return JobSubmitted(
        at=at, job=job, queue=queue, podsets=[PodSet(name="worker", count=pods, requests={"gpu": gpu})], runtime=60
    )


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (nearest rank) of `values`; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(p / 100 * len(ordered))))
    return ordered[rank - 1]


@dataclass
class Load:
    """Appends `batch` submissions every `batch / rate` seconds until stopped; retries each batch until acked."""

    store: EventStore
    rate: float = 100.0
    batch: int = 5
    prefix: str = "job"
    queue: str = "team-a"
    acknowledged: list[str] = field(default_factory=list)
    attempts: int = 0
    failures: int = 0
    stalls: list[float] = field(default_factory=list)
    """Seconds from the first failed attempt of a batch to its acknowledgement."""
    spans: list[tuple[float, float]] = field(default_factory=list)
    """(start, end) of every acknowledged batch's append, on anyio's clock."""
    _stop: bool = False
    _n: int = 0
    _began: anyio.Event = field(default_factory=anyio.Event)
    _acked: anyio.Event = field(default_factory=anyio.Event)
    _running: bool = False

    def stop(self) -> None:
        self._stop = True

    async def wait_acknowledged(self, count: int, seconds: float = 30.0) -> None:
        """Until at least `count` submissions were acknowledged."""
        with anyio.fail_after(seconds):
            while len(self.acknowledged) < count:
                await self._acked.wait()

    async def drain(self, seconds: float = 30.0) -> None:
        """Stop, and wait until the batch in flight (if any) is acknowledged."""
        self.stop()
        with anyio.fail_after(seconds):
            while self._running:
                await self._acked.wait()

    def next_batch(self) -> list[Event]:
        out: list[Event] = []
        for _ in range(self.batch):
            out.append(gang(f"{self.prefix}-{self._n:06d}", at=self._n, queue=self.queue))
            self._n += 1
        return out

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        period = self.batch / self.rate
        while not self._stop:
            started = anyio.current_time()
            events = self.next_batch()
            self._running = True
            try:
                await self.append_until_acked(events)
            finally:
                self._running = False
                self._acked.set()
                self._acked = anyio.Event()
            await anyio.sleep(max(0.0, period - (anyio.current_time() - started)))

    async def next_attempt(self) -> None:
        """Return right after the next append attempt went out (its acknowledgement not yet in)."""
        await self._began.wait()

    def overlapping(self, start: float, end: float) -> list[float]:
        """Durations of the appends that were under way at some moment in [start, end]."""
        return [b - a for a, b in self.spans if a <= end and b >= start]

    async def append_until_acked(self, events: list[Event], deadline: float = 60.0) -> None:
        began = anyio.current_time()
        first_failure: float | None = None
        with anyio.fail_after(deadline):
            while True:
                self.attempts += 1
                self._began.set()
                self._began = anyio.Event()
                try:
                    with anyio.fail_after(10):
                        await self.store.append(events)
                except RETRYABLE:
                    self.failures += 1
                    if first_failure is None:
                        first_failure = anyio.current_time()
                    await anyio.sleep(0.1)
                    continue
                break
        if first_failure is not None:
            self.stalls.append(anyio.current_time() - first_failure)
        self.spans.append((began, anyio.current_time()))
        self.acknowledged.extend(e.job for e in events if isinstance(e, JobSubmitted))


@dataclass
class Follower:
    """Follows the store from sequence 1 into `seen`."""

    store: EventStore
    seen: list[StoredEvent] = field(default_factory=list)
    _changed: anyio.Event = field(default_factory=anyio.Event)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with contextlib.aclosing(self.store.follow(1)) as events:
            async for stored in events:
                self.seen.append(stored)
                self._changed.set()
                self._changed = anyio.Event()

    async def wait_for_seq(self, seq: int, seconds: float = 30.0) -> None:
        with anyio.fail_after(seconds):
            while not self.seen or self.seen[-1].seq < seq:
                await self._changed.wait()


def config_events() -> list[Event]:
    return [QueueConfigured(at=0, name="team-a", nominal={"gpu": 64})]


# ---------------------------------------------------------------- a 3-node JetStream cluster


class JetStreamCluster:
    """Three clustered nats-servers on loopback (routes between all three), JetStream on each."""

    def __init__(self, root: Path, size: int = 3, name: str = "muster") -> None:
        self.cluster_ports = [free_port() for _ in range(size)]
        routes = ",".join(f"nats-route://127.0.0.1:{p}" for p in self.cluster_ports)
        self.servers: list[EmbeddedNats] = []
        for i, cport in enumerate(self.cluster_ports):
            args = ["-n", f"n{i}", "--cluster_name", name, "--cluster", f"nats://127.0.0.1:{cport}"]
            args += ["--routes", routes]
            self.servers.append(
                EmbeddedNats(root / f"n{i}", extra_args=args, wait_jetstream=False, stop_timeout=5, ready_timeout=30)
            )

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def start(self) -> JetStreamCluster:
        for s in self.servers:
            s.start()
        return self

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def by_name(self, name: str) -> EmbeddedNats:
        return self.servers[int(name.removeprefix("n"))]

    async def wait_ready(self, seconds: float = 30.0) -> None:
        """Until every running server answers a JetStream account-info request (the meta leader is elected)."""
        deadline = time.monotonic() + seconds
        for s in self.servers:
            if not s.running:
                continue
            while True:
                nc = None
                try:
                    nc = await nats.connect(s.url, connect_timeout=1, allow_reconnect=False)
                    await nc.jetstream(timeout=1).account_info()
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await anyio.sleep(0.2)
                finally:
                    if nc is not None:
                        await nc.close()


async def stream_leader(store: EventStore) -> str:
    """The server name (`n0`, `n1`, ...) that leads the store's stream."""
    info = await store.js.stream_info(store.stream)
    assert info.cluster is not None and info.cluster.leader
    return str(info.cluster.leader)


# ---------------------------------------------------------------- Kubernetes: an API double that records effects


@attrs.define(kw_only=True)
class RecordingEmulator(KubeEmulator):
    """The API double, also recording the effects it applied: bindings and evictions, per pod."""

    bound: list[tuple[str, str, str]] = attrs.field(factory=list)
    """(pod uid, namespace/name, node) per binding applied."""
    evicted: list[str] = attrs.field(factory=list)
    """namespace/name of every pod whose deletion started (marked or deleted at once)."""

    def _record(self, res: kmock.resource, ns: str | None, name: str, kind: str, obj: dict[str, Any]) -> Any:
        if res.plural == "pods" and not res.group:
            old = self._get(res, ns, name) or {}
            key = f"{ns}/{name}"
            before = (old.get("spec") or {}).get("nodeName")
            after = (obj.get("spec") or {}).get("nodeName")
            if kind != "DELETED" and after and after != before:
                self.bound.append((str(obj["metadata"].get("uid")), key, str(after)))
            marked_before = bool((old.get("metadata") or {}).get("deletionTimestamp"))
            marked_now = kind == "DELETED" or bool((obj.get("metadata") or {}).get("deletionTimestamp"))
            if old and marked_now and not marked_before:
                self.evicted.append(key)
        return super()._record(res, ns, name, kind, obj)


def kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig for an API server on loopback without authentication."""
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
        f"clusters: [{{name: test, cluster: {{server: '{server}'}}}}]\n"
        "users: [{name: test, user: {}}]\n"
        "contexts: [{name: test, context: {cluster: test, user: test}}]\n"
    )
    return path


# ---------------------------------------------------------------- daemons as processes


class DaemonProcess:
    """`muster daemon` in its own process (JSON logs to a file), to be killed -9, paused and resumed."""

    def __init__(self, identity: str, args: list[str], log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.identity = identity
        self.log_path = log_dir / f"{identity}.log"
        muster = Path(sys.executable).parent / "muster"
        self.argv = [str(muster), "daemon", "--identity", identity, "--log-format", "json", *args]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no lease release, no flush, nothing."""
        if self.alive:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._log.close()

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.alive:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def wait_caught_up(self, seconds: float = 60.0) -> None:
        """Wait until the replica has folded the log and started campaigning (a standby, if another leads)."""
        with anyio.fail_after(seconds):
            while "caught up with the log" not in self.log_text():  # noqa: ASYNC110 - a process: read its log
                await anyio.sleep(0.1)
