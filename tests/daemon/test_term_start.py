"""A term's start: the cyclic collector pauses from the lease won to the term's first cycle, then runs again.

A collection walking a replica's whole heap during a takeover delays the
first decision; one that never runs again would let reference cycles pile
up for the rest of the term, and, the collector being the process's, for
everything else in it. Both are checked on a real loop and store.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import anyio
import pytest
from anyio.abc import TaskStatus

from muster.daemon.cluster import Applied, Sink
from muster.daemon.loop import LoopOptions, SchedulerLoop, SoleElector
from muster.events.store import EventStore
from muster.events.types import (
    Event,
    JobAdmitted,
    JobId,
    JobSubmitted,
    NodeAdded,
    NodeName,
    PodSet,
    QueueConfigured,
    QueueName,
    SchedulerConfigured,
)
from muster.projections.scheduler import decide
from muster.projections.state import ClusterState


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    """Start each test with the cyclic collector on, as a daemon's process is, whatever ran before in this one."""
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


class Recording:
    """`decide`, noting whether the cyclic collector was enabled at each call."""

    def __init__(self) -> None:
        self.collecting: list[bool] = []

    def __call__(self, state: ClusterState, now: int) -> list[Event]:
        self.collecting.append(gc.isenabled())
        return decide(state, now)


async def test_the_collector_pauses_for_the_first_cycle_of_a_term_and_runs_after_it(store: EventStore) -> None:
    """The term's first cycle decides with the collector paused; later cycles, and the loop after it, with it on."""
    job = JobSubmitted(
        at=1, job=JobId("j"), queue=QueueName("q"), podsets=[PodSet(name="w", count=1, requests={"gpu": 8})]
    )
    await store.append(
        [
            SchedulerConfigured(at=0, levels=[]),
            QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8}),
            NodeAdded(at=0, node=NodeName("n1"), capacity={"gpu": 8}),
            job,
        ]
    )
    policy = Recording()
    loop = SchedulerLoop(store, elector=SoleElector("x"), options=LoopOptions(), decider=policy)
    assert gc.isenabled()
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        with anyio.fail_after(30):
            while not any(isinstance(s.event, JobAdmitted) for s in await store.read()):  # noqa: ASYNC110
                await anyio.sleep(0.05)
            while len(policy.collecting) < 2:  # noqa: ASYNC110 - the cycle after the admission
                await anyio.sleep(0.01)
        collecting_after = gc.isenabled()
        loop.stop()
    assert policy.collecting[0] is False
    assert all(policy.collecting[1:])
    assert collecting_after and gc.isenabled()


class NeverSynced:
    """A cluster whose first sync never ends, so its term never reaches a first cycle."""

    def __init__(self) -> None:
        self.syncing = anyio.Event()

    async def run(self, sink: Sink, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self.syncing.set()
        await anyio.sleep_forever()

    async def ready(self, event: Event) -> None:
        return None

    async def apply(self, event: Event) -> Applied:
        raise AssertionError(f"nothing is decided before the first sync: {event}")

    def holds(self, job: str) -> bool:
        return False


async def test_a_loop_cancelled_before_its_terms_first_cycle_leaves_the_collector_on(store: EventStore) -> None:
    """A replica cancelled (as a crash) while its new term waits for the cluster does not leave the collector off."""
    await store.append([SchedulerConfigured(at=0, levels=[])])
    cluster = NeverSynced()
    loop = SchedulerLoop(store, elector=SoleElector("x"), cluster=lambda state: cluster)
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        with anyio.fail_after(30):
            await cluster.syncing.wait()
        paused = not gc.isenabled()
        tg.cancel_scope.cancel()
    assert paused, "the term's start pauses the collector"
    assert gc.isenabled()
