"""The leader's lease is never starved by the loop's own work.

A scheduling cycle over a big backlog (or a new leader's first, which builds
the scheduler index from scratch) can compute for seconds. The lease is
refreshed by a task on the same event loop, so such a cycle must not hold the
loop: here a policy that works longer than the lease's validity on each of
its first cycles runs under a real NATS KV lease, and the leader keeps its one
term throughout and gets its decisions on the log.
"""

from __future__ import annotations

import time
import uuid

import anyio

from muster.daemon.leader import VALIDITY, KvElector
from muster.daemon.loop import LoopOptions, SchedulerLoop
from muster.events.store import EventStore
from muster.events.types import (
    Event,
    JobAdmitted,
    JobId,
    JobSubmitted,
    LeaderElected,
    NodeAdded,
    NodeName,
    PodSet,
    QueueConfigured,
    QueueName,
    SchedulerConfigured,
)
from muster.projections.scheduler import decide
from muster.projections.state import ClusterState

TTL = 2.0


class SlowPolicy:
    """`decide`, after `seconds` of work that holds its thread (as CPU-bound work would), on the first `slow` cycles."""

    def __init__(self, seconds: float, slow: int) -> None:
        self.seconds = seconds
        self.slow = slow
        self.calls = 0

    def __call__(self, state: ClusterState, now: int) -> list[Event]:
        self.calls += 1
        if self.calls <= self.slow:
            time.sleep(self.seconds)  # deliberately blocking: whatever thread runs the cycle is busy
        return decide(state, now)


async def test_a_cycle_longer_than_the_lease_validity_keeps_the_lease_and_its_decisions(store: EventStore) -> None:
    """Cycles computing longer than the lease's validity: the leader keeps its one term and admits the job."""
    await store.append(
        [
            SchedulerConfigured(at=0, levels=[]),
            QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8}),
            NodeAdded(at=0, node=NodeName("n1"), capacity={"gpu": 8}),
        ]
    )
    bucket = f"lease-{uuid.uuid4().hex[:8]}"
    elector = KvElector(store.js, holder="slow", bucket=bucket, ttl=TTL)
    policy = SlowPolicy(seconds=TTL * VALIDITY + 0.5, slow=2)
    loop = SchedulerLoop(store, elector=elector, options=LoopOptions(), decider=policy)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(loop.run)
            with anyio.fail_after(30):
                await loop.first_term.wait()
                # submitted once the first slow cycle is under way, so that a second one must admit it
                while policy.calls < 1:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
                await store.append(
                    [
                        JobSubmitted(
                            at=1,
                            job=JobId("j"),
                            queue=QueueName("q"),
                            podsets=[PodSet(name="w", count=1, requests={"gpu": 8})],
                        )
                    ]
                )
                while not any(isinstance(s.event, JobAdmitted) for s in await store.read()):  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            assert policy.calls >= 2, "the slow cycles did not run"
            assert loop.leading and loop.epoch == 1
            loop.stop()
    finally:
        await store.js.delete_key_value(bucket)
    events = [s.event for s in await store.read()]
    assert [(e.epoch, e.holder) for e in events if isinstance(e, LeaderElected)] == [(1, "slow")]
    assert [(e.job, e.epoch) for e in events if isinstance(e, JobAdmitted)] == [("j", 1)]
    assert elector.terms == 1, "the lease lapsed during a cycle"
