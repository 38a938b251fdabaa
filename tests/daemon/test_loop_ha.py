"""Two daemons on one NATS: one leads, a crashed leader is replaced, a paused one cannot act on waking.

Each daemon runs in its own thread with its own event loop, NATS connection,
lease (KV bucket, TTL 3 s) and simulated cluster, as two replicas in two pods
would. Freezing a daemon's thread freezes all of it (lease refresh, follower,
loop), as SIGSTOP or a long GC pause would.

The replicas share the test's process (and GIL) on a loaded 2-core CI box: a
1 s TTL lets a starved lease refresh cause a legitimate second election, so the
TTL is longer, and the tests wait for conditions (deadlines of 30 s), never for
a fixed time, and assert nothing about how long a takeover took.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.to_thread
import loopkit
import pytest

from muster.daemon.leader import KvElector
from muster.daemon.loop import LoopOptions, SchedulerLoop
from muster.demo.simcluster import SimulatedCluster, block_rack_nodes
from muster.events.store import EventStore, StoredEvent
from muster.events.types import (
    DECISION_TYPES,
    Event,
    JobAdmitted,
    JobId,
    JobSubmitted,
    LeaderElected,
    PodSet,
    QueueConfigured,
    QueueName,
    SchedulerConfigured,
)
from muster.projections.state import ClusterState

TTL = 3.0
"""Lease TTL (s): a refresh every TTL/5, trusted for 0.75 TTL, so a stall on a busy box is not a takeover."""
DEADLINE = 30.0
NODES = block_rack_nodes(2, 2, 2, 8)  # 64 GPUs


class Freeze:
    """A hook that, once armed, blocks its daemon's whole event loop in front of the next decision append."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.frozen = threading.Event()
        self.thaw = threading.Event()
        self.events: list[Event] = []

    async def before_append(self, events: list[Event]) -> None:
        if self.armed.is_set():
            self.armed.clear()
            self.events = list(events)
            self.frozen.set()
            self.thaw.wait(30)  # deliberately blocking: the process is frozen, not a task


class Replica:
    """One daemon in its own thread and event loop."""

    def __init__(self, url: str, stream: str, prefix: str, bucket: str, name: str, hooks: Any = None) -> None:
        self.url, self.stream, self.prefix, self.bucket, self.name = url, stream, prefix, bucket, name
        self.hooks = hooks
        self.loop: SchedulerLoop | None = None
        self.elector: KvElector | None = None
        self.clusters: list[SimulatedCluster] = []
        self.started = threading.Event()
        self._end: str | None = None
        self._ended = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name=f"replica-{name}", daemon=True)

    def start(self) -> Replica:
        self.thread.start()
        if not self.started.wait(15):
            raise RuntimeError(f"replica {self.name} did not start: {self.error!r}")
        return self

    @property
    def applied(self) -> list[Event]:
        return [e for c in self.clusters for e in c.applied]

    def leading(self) -> bool:
        return self.loop is not None and self.loop.leading

    def crash(self) -> None:
        """Cancel everything without resigning; returns once the replica is gone (as a killed process is)."""
        self._end = "crash"
        self._ended.set()
        self.thread.join(15)
        assert not self.thread.is_alive(), f"replica {self.name} did not end"

    def stop(self) -> None:
        self._end = self._end or "stop"
        self._ended.set()

    def _cluster(self, state: Any) -> SimulatedCluster:
        cluster = SimulatedCluster(NODES, state, report_started=False)
        self.clusters.append(cluster)
        return cluster

    def _main(self) -> None:
        try:
            anyio.run(self._run)
        except BaseException as exc:
            self.error = exc
            self.started.set()

    async def _run(self) -> None:
        store = await EventStore.connect(self.url, stream=self.stream, prefix=self.prefix, create=False)
        try:
            elector = self.elector = KvElector(store.nc.jetstream(), holder=self.name, bucket=self.bucket, ttl=TTL)
            self.loop = SchedulerLoop(
                store,
                elector=elector,
                cluster=self._cluster,
                hooks=self.hooks,
                options=LoopOptions(lease_check=0.05, catch_up_timeout=5),
            )
            async with anyio.create_task_group() as tg:
                await tg.start(self.loop.run)
                self.started.set()
                await anyio.to_thread.run_sync(self._ended.wait)
                if self._end == "crash":
                    tg.cancel_scope.cancel()  # no resign: the lease is left to expire, as in a crash
                else:
                    self.loop.stop()
        finally:
            with anyio.CancelScope(shield=True):
                await store.close()


@pytest.fixture
async def ha(store: EventStore) -> AsyncIterator[Any]:
    """`ha(name, hooks=None)` starts a replica on the test's stream; all are stopped afterwards."""
    await store.append(
        [
            SchedulerConfigured(at=0, levels=["muster.dev/block", "muster.dev/rack"]),
            QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 64}),
        ]
    )
    bucket = f"lead-{uuid.uuid4().hex[:8]}"
    replicas: list[Replica] = []

    async def start(name: str, hooks: Any = None) -> Replica:
        r = Replica(store.nc.connected_url.geturl(), store.stream, store.prefix, bucket, name, hooks)
        replicas.append(r)
        return await anyio.to_thread.run_sync(r.start)

    yield start
    for r in replicas:
        r.stop()
        if r.hooks is not None:
            r.hooks.thaw.set()
    for r in replicas:
        await anyio.to_thread.run_sync(r.thread.join, 15)
    for r in replicas:
        assert r.error is None, f"replica {r.name} failed: {r.error!r}"
    js = store.nc.jetstream()
    await js.delete_key_value(bucket)


def job(name: str, gpus: int = 8) -> JobSubmitted:
    return JobSubmitted(
        at=int(time.time()),
        job=JobId(name),
        queue=QueueName("q"),
        podsets=[PodSet(name="w", count=1, requests={"gpu": gpus})],
    )


async def wait_for(
    store: EventStore, predicate: Callable[[list[StoredEvent]], bool], seconds: float = DEADLINE
) -> list[StoredEvent]:
    """Read the log until `predicate(events)` holds (this file's deadline)."""
    return await loopkit.wait_for(store, predicate, seconds)


async def until(condition: Any, seconds: float = DEADLINE) -> None:
    """Poll `condition()` (state another replica's thread changes) until it holds."""
    with anyio.fail_after(seconds):
        while not condition():  # noqa: ASYNC110 - the replicas' threads give no notification
            await anyio.sleep(0.02)


def admitted_jobs(replica: Replica) -> set[str]:
    return {e.job for e in replica.applied if isinstance(e, JobAdmitted)}


def leaders(events: list[StoredEvent]) -> list[LeaderElected]:
    return [s.event for s in events if isinstance(s.event, LeaderElected)]


def admissions(events: list[StoredEvent]) -> dict[str, list[JobAdmitted]]:
    out: dict[str, list[JobAdmitted]] = {}
    for s in events:
        if isinstance(s.event, JobAdmitted):
            out.setdefault(s.event.job, []).append(s.event)
    return out


def no_stale_decisions(events: list[StoredEvent]) -> None:
    """No decision on the log carries an epoch older than a LeaderElected before it."""
    epoch = 0
    for s in events:
        if isinstance(s.event, LeaderElected):
            epoch = max(epoch, s.event.epoch)
        elif isinstance(s.event, DECISION_TYPES):
            assert s.event.epoch == epoch, f"seq {s.seq}: {s.event!r} decided at epoch {s.event.epoch}, log at {epoch}"


async def test_exactly_one_of_two_replicas_leads(store, ha):
    """Two replicas started together: one LeaderElected on the log, one replica leading, and it decides."""
    a, b = await ha("a"), await ha("b")
    events = await wait_for(store, lambda ev: len(leaders(ev)) == 1)
    await store.append([job("j1")])
    events = await wait_for(store, lambda ev: "j1" in admissions(ev))
    [elected] = leaders(events)
    holder = a if elected.holder == "a" else b
    assert holder.elector is not None and holder.elector.revision is not None
    revision = holder.elector.revision
    # several lease refreshes later (each one bumps the key's revision), still one leader
    await until(lambda: (holder.elector.revision or 0) >= revision + 3)
    events = await store.read()
    assert len(leaders(events)) == 1
    [elected] = leaders(events)
    assert [r.name for r in (a, b) if r.leading()] == [elected.holder]
    assert admissions(events)["j1"][0].epoch == elected.epoch == 1


async def test_a_crashed_leader_is_replaced_and_no_decision_is_lost_or_doubled(store, ha):
    """Jobs submitted before, during and after the leader's crash are each admitted once and applied."""
    a = await ha("a")
    await wait_for(store, lambda ev: len(leaders(ev)) == 1)
    b = await ha("b")
    for i in range(3):
        await store.append([job(f"before-{i}")])
    await wait_for(store, lambda ev: len(admissions(ev)) == 3)
    await until(lambda: admitted_jobs(a) >= {f"before-{i}" for i in range(3)})  # applying follows the append
    await anyio.to_thread.run_sync(a.crash)
    for i in range(3):
        await store.append([job(f"during-{i}")])
        await anyio.sleep(0.1)
    events = await wait_for(store, lambda ev: len(leaders(ev)) == 2)
    for i in range(2):
        await store.append([job(f"after-{i}")])
    events = await wait_for(store, lambda ev: len(admissions(ev)) == 8)
    await until(lambda: admitted_jobs(b) >= set(admissions(events)))  # applying follows the append
    events = await store.read()

    assert [(e.epoch, e.holder) for e in leaders(events)] == [(1, "a"), (2, "b")]
    assert {j: len(a) for j, a in admissions(events).items()} == {j: 1 for j in admissions(events)}
    no_stale_decisions(events)
    # every admission on the log was applied by the replica that led when it was decided,
    # and the new leader re-applied the admissions of the crashed one's term (idempotent)
    applied_by_a, applied_by_b = admitted_jobs(a), admitted_jobs(b)
    assert applied_by_a == {j for j, [adm] in admissions(events).items() if adm.epoch == 1}
    assert {f"before-{i}" for i in range(3)} <= applied_by_a
    assert applied_by_b == set(admissions(events))


async def test_a_paused_leader_that_wakes_up_cannot_get_a_decision_applied(store, ha):
    """Frozen in front of its append, the old leader is deposed; on waking its append is refused and nothing applied."""
    freeze = Freeze()
    a = await ha("a", hooks=freeze)
    await wait_for(store, lambda ev: len(leaders(ev)) == 1)
    b = await ha("b")
    freeze.armed.set()
    await store.append([job("j1")])
    assert await anyio.to_thread.run_sync(freeze.frozen.wait, 10)
    assert [type(e).__name__ for e in freeze.events] == ["JobAdmitted"]

    events = await wait_for(store, lambda ev: "j1" in admissions(ev))  # the standby took over and decided
    applied_before_thaw = len(a.applied)
    freeze.thaw.set()
    assert a.loop is not None
    conflicts = a.loop.metrics.registry
    # the woken replica tries its old append, which is refused
    await until(lambda: (conflicts.get_sample_value("muster_append_conflicts_total") or 0) >= 1)
    await store.append([job("j2")])
    events = await wait_for(store, lambda ev: "j2" in admissions(ev))
    await until(lambda: admitted_jobs(b) >= {"j1", "j2"})  # applying follows the append
    await until(lambda: a.loop is not None and a.loop.state.epoch == 2)  # the standby folds on behind the log
    events = await store.read()

    assert [(e.epoch, e.holder) for e in leaders(events)] == [(1, "a"), (2, "b")]
    assert [e.epoch for e in admissions(events)["j1"]] == [2]
    no_stale_decisions(events)
    assert len(a.applied) == applied_before_thaw == 0
    assert not a.leading()
    assert admitted_jobs(b) == {"j1", "j2"}
    state: ClusterState = a.loop.state
    assert state.epoch == 2 and state.leader == "b"  # the woken replica folds on as a standby
