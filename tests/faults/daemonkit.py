"""A world for daemon fault tests: NATS, a Kubernetes API double with kubelets, gangs arriving, daemon processes.

`World` holds an event stream (its own stream, prefix and leader bucket on a
NATS server), the recording API double served on loopback with a kubeconfig
for it, a simulated kubelet, a submitter that creates gangs (batch Jobs of two
1-GPU pods that run for a second) at a steady rate, a follower of the log, and
`muster daemon` processes started against all of it. Used by
test_daemon_faults.py and bench/reliability.py.
"""

from __future__ import annotations

import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from anyio.abc import TaskGroup
from faultkit import DaemonProcess, Follower, RecordingEmulator, kubeconfig

from muster.daemon.k8s import Backoff
from muster.daemon.k8s import manifests as m
from muster.demo.emulator import running
from muster.demo.kubelet_sim import SimulatedKubelet
from muster.events.store import EventStore, StoredEvent
from muster.events.types import Event, JobAdmitted, JobSubmitted, LeaderElected, QueueConfigured, SchedulerConfigured
from muster.replay.invariants import Binding, Report, check_log

TTL = 2.0
"""Leader lease TTL of the daemons (seconds): short, so takeovers are quick (1 s stalls the 2-core CI into churn)."""


@dataclass
class World:
    store: EventStore
    emulator: RecordingEmulator
    kubeconfig: Path
    tmp: Path
    tg: TaskGroup
    bucket: str
    follower: Follower
    ttl: float = TTL
    daemons: dict[str, DaemonProcess] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)
    """`Job/ns/<name>` of every gang created in the cluster."""
    _submitting: bool = False
    _n: int = 0

    # ------------------------------------------------------------ daemons

    def start_daemon(self, identity: str | None = None) -> DaemonProcess:
        identity = identity or f"d{len(self.daemons)}"
        args = ["--nats", self.store.nc.connected_url.geturl(), "--stream", self.store.stream]
        args += ["--subject-prefix", self.store.prefix, "--leader-ttl", str(self.ttl), "--kv-bucket", self.bucket]
        args += ["--kubeconfig", str(self.kubeconfig), "--log-level", "info"]
        proc = DaemonProcess(identity, args, self.tmp)
        self.daemons[identity] = proc
        return proc

    def leader(self) -> tuple[int, str]:
        """(epoch, holder) of the last LeaderElected on the log ((0, "") before any)."""
        for s in reversed(self.follower.seen):
            if isinstance(s.event, LeaderElected):
                return s.event.epoch, s.event.holder
        return 0, ""

    def stop_all(self) -> None:
        for d in self.daemons.values():
            d.stop()

    # ------------------------------------------------------------ gangs

    async def submit(self, rate: float, *, runtime: str = "1") -> None:
        """Create gangs at `rate` per second until `stop_submitting()`."""
        self._submitting = True
        period = 1.0 / rate
        while self._submitting:
            started = anyio.current_time()
            name = f"g-{self._n:05d}"
            self._n += 1
            job = m.job(name, "ns", parallelism=2)
            self.emulator.put_object("batch/v1/jobs", job)
            pods = m.job_pods(
                job, gpus=1, labels={"muster.dev/queue": "q"}, annotations={"muster.dev/runtime": runtime}
            )
            for pod in pods:
                pod["spec"]["terminationGracePeriodSeconds"] = 0
                self.emulator.put_object("v1/pods", pod)
            self.created.append(f"Job/ns/{name}")
            await anyio.sleep(max(0.0, period - (anyio.current_time() - started)))

    def stop_submitting(self) -> None:
        self._submitting = False

    # ------------------------------------------------------------ the log

    def log(self) -> list[StoredEvent]:
        return list(self.follower.seen)

    async def wait_log(self, predicate: Callable[[list[StoredEvent]], bool], seconds: float = 30.0) -> float:
        """Until `predicate(log)`; returns the seconds waited."""
        started = time.monotonic()
        with anyio.fail_after(seconds):
            while not predicate(self.follower.seen):  # noqa: ASYNC110 - the follower's list grows under us
                await anyio.sleep(0.02)
        return time.monotonic() - started

    def bindings(self) -> list[Binding]:
        pod_of: dict[str, tuple[str, str]] = {}
        for s in self.follower.seen:
            if isinstance(s.event, JobSubmitted):
                for gang_pod, key in s.event.pods.items():
                    pod_of[key] = (s.event.job, gang_pod)
        out = []
        for uid, key, node in self.emulator.bound:
            job, gang_pod = pod_of.get(key, (None, None))
            out.append(Binding(uid, node, job, gang_pod))
        return out

    def check(self, *, settled: bool = False) -> Report:
        log = self.log()
        submitted = [s.event.job for s in log if isinstance(s.event, JobSubmitted)] if settled else None
        return check_log(log, submitted=submitted, bindings=self.bindings(), settled=settled)

    def sources(self) -> dict[str, int]:
        """How many JobSubmitted each gang source (`Job/ns/name`) has on the log."""
        out: dict[str, int] = {}
        for s in self.follower.seen:
            if isinstance(s.event, JobSubmitted):
                out[s.event.source] = out.get(s.event.source, 0) + 1
        return out


def admitted_in(epoch: int) -> Callable[[list[StoredEvent]], bool]:
    return lambda log: any(isinstance(s.event, JobAdmitted) and s.event.epoch == epoch for s in log)


def admitted_after(epoch: int) -> Callable[[list[StoredEvent]], bool]:
    """An admission by a later leader (a new leader may itself lose its first term before deciding)."""
    return lambda log: any(isinstance(s.event, JobAdmitted) and s.event.epoch > epoch for s in log)


def elected_after(epoch: int) -> Callable[[list[StoredEvent]], bool]:
    return lambda log: any(isinstance(s.event, LeaderElected) and s.event.epoch > epoch for s in log)


def config_events(nodes: int) -> list[Event]:
    return [SchedulerConfigured(at=0, levels=[]), QueueConfigured(at=0, name="q", nominal={"gpu": nodes * 8})]


@contextlib.asynccontextmanager
async def world(nats_url: str, tmp: Path, *, nodes: int = 8, ttl: float = TTL) -> AsyncIterator[World]:
    """Everything but the daemons, which the test starts with `world.start_daemon()`."""
    tag = uuid.uuid4().hex[:10]
    emulator = RecordingEmulator()
    store = await EventStore.connect(nats_url, stream=f"D{tag}", prefix=f"d{tag}", duplicate_window=60)
    try:
        await store.append(config_events(nodes))
        async with running(emulator) as (emu, api):
            for i in range(nodes):
                emu.put_object("v1/nodes", m.node(f"n{i}"))
            config = kubeconfig(tmp / "kubeconfig.yaml", str(api.configuration.host))
            kubelet = SimulatedKubelet(api, speed=1.0, backoff=Backoff(initial=0.02, maximum=0.2, jitter=0.0))
            async with anyio.create_task_group() as tg:
                follower = Follower(store)
                await tg.start(follower.run)
                await tg.start(kubelet.run)
                w = World(store, emulator, config, tmp, tg, f"lead-{tag}", follower, ttl=ttl)
                try:
                    yield w
                finally:
                    w.stop_submitting()
                    w.stop_all()
                    tg.cancel_scope.cancel()
    finally:
        with anyio.move_on_after(10, shield=True):
            with contextlib.suppress(Exception):
                await store.js.delete_key_value(f"lead-{tag}")
            await store.delete_stream()
            await store.close()


def jitter(rng: random.Random, low: float, high: float) -> float:
    return rng.uniform(low, high)


def describe(report: Report, world: World) -> str:
    tails = {name: d.log_text()[-2000:] for name, d in world.daemons.items()}
    return report.summary() + "\n" + "\n".join(f"--- {n}\n{t}" for n, t in tails.items())
