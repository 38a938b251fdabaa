"""Replay, audit and explain a log the daemon wrote: the scheduler loop on the embedded NATS with a simulated cluster.

The daemon's state is captured just before each of its decision appends
(the state its `decide` saw, the fold up to `folded_seq`); replaying the
stream to that sequence must give the same state, and the audit must
re-derive every cycle it appended.
"""

from __future__ import annotations

import contextlib
import time

import anyio
import pytest

from muster.daemon.loop import LoopOptions, SchedulerLoop, SoleElector
from muster.demo.simcluster import SimulatedCluster, block_rack_nodes
from muster.events.store import EventStore
from muster.events.types import (
    Event,
    JobAdmitted,
    JobFinished,
    JobId,
    JobPreempted,
    JobSubmitted,
    PodSet,
    PreemptionPolicy,
    PriorityClassConfigured,
    QueueConfigured,
    QueueName,
    SchedulerConfigured,
)
from muster.projections.state import ClusterState
from muster.replay.audit import audit
from muster.replay.explain import explain
from muster.replay.points import END, Point
from muster.replay.rebuild import state_at
from muster.replay.snapshotcodec import decode_state, encode_state
from muster.replay.source import NatsLog

NODES = block_rack_nodes(1, 2, 2, 8)  # 32 GPUs
SPEED = 100.0  # a job of runtime 100 s runs for one second of wall-clock time


class Capture:
    """The daemon's state (encoded) and folded sequence just before each of its decision appends."""

    def __init__(self) -> None:
        self.loop: SchedulerLoop | None = None
        self.states: list[tuple[int, bytes]] = []

    async def before_append(self, events: list[Event]) -> None:
        assert self.loop is not None
        self.states.append((self.loop.folded_seq, encode_state(self.loop.state, "msgpack")))


def _job(name: str, gpus: int, prio: str, runtime: int) -> JobSubmitted:
    return JobSubmitted(
        at=int(time.time()),
        job=JobId(name),
        queue=QueueName("q"),
        priority_class=prio,
        podsets=[PodSet(name="w", count=gpus // 8, requests={"gpu": 8})],
        runtime=runtime,
    )


async def _until(store: EventStore, kind: type[Event], n: int) -> None:
    """Follow the stream until it holds `n` events of `kind`."""
    seen = 0
    with anyio.fail_after(30):
        async with contextlib.aclosing(store.follow(1)) as events:
            async for stored in events:
                seen += isinstance(stored.event, kind)
                if seen >= n:
                    return


@pytest.fixture
async def daemon_log(store: EventStore) -> Capture:
    """A daemon runs four low-priority jobs, a high-priority one preempts two of them, all finish."""
    await store.append(
        [
            SchedulerConfigured(at=0, levels=["muster.dev/block", "muster.dev/rack"]),
            PriorityClassConfigured(at=0, name="high", value=500),
            PriorityClassConfigured(at=0, name="low", value=10),
            QueueConfigured(
                at=0,
                name=QueueName("q"),
                nominal={"gpu": 32},
                preemption=PreemptionPolicy(within_queue="LowerPriority"),
            ),
        ]
    )
    capture = Capture()

    def cluster(state: object) -> SimulatedCluster:
        return SimulatedCluster(NODES, state, speed=SPEED)  # type: ignore[arg-type]

    loop = SchedulerLoop(
        store,
        elector=SoleElector("solo"),
        cluster=cluster,
        hooks=capture,
        options=LoopOptions(lease_check=0.05, catch_up_timeout=5),
    )
    capture.loop = loop
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        await store.append([_job(f"low-{i}", 8, "low", 200) for i in range(4)])
        await _until(store, JobAdmitted, 4)
        await store.append([_job("high", 16, "high", 50)])
        await _until(store, JobFinished, 5)
        loop.stop()
    return capture


async def test_replay_audit_and_explain_of_a_daemon_log(store: EventStore, daemon_log: Capture) -> None:
    """Replay gives the daemon's state where it decided; audit re-derives each cycle; explain tells a victim's story."""
    log = NatsLog(store)
    # replay: at every point where the daemon decided, the state it decided on
    assert len(daemon_log.states) >= 3
    for seq, blob in daemon_log.states:
        replayed = await state_at(log, Point(seq=seq))
        expected: ClusterState = decode_state(blob, "msgpack")
        assert replayed.state == expected, f"state differs at seq {seq}"
    # audit: the admissions, the two preemptions and the rest, byte for byte
    events = [s.event for s in await store.read()]
    assert sum(isinstance(e, JobPreempted) for e in events) == 2
    report = await audit(log)
    assert report.differ == 0, [(b.seqs, b.recorded, b.derived) for b in report.differences]
    assert report.cycles >= 3 and report.identical >= 8
    assert report.fenced == 0
    # explain: admitted, preempted by `high`, requeued, admitted again, finished
    victim = next(e.job for e in events if isinstance(e, JobPreempted))
    story, _ = await explain(log, victim, END)
    kinds = [ln.kind for ln in story.lines if ln.kind != "started"]
    assert kinds[:4] == ["submitted", "admitted", "preempted", "requeued"]
    assert kinds[-2:] == ["admitted", "finished"] and story.status == "finished"
    pre = next(ln for ln in story.lines if ln.kind == "preempted")
    assert pre.data["preemptor"] == "high" and pre.data["reason"] == "WithinQueue"
