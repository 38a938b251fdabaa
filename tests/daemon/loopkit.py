"""A scheduler loop of one replica for tests: on the session's NATS, against the in-process simulated cluster.

- `daemon(store)`: `async with daemon(store) as d:` a loop leading alone (`SoleElector`) whose
  terms' clusters are `SimulatedCluster`s of `NODES`; `d.applied` is what they were told.
- `configure(store)`: queue `q` (32 GPUs) over the block and rack levels; `job(name, ...)` a
  submission to it.
- `wait_for(store, predicate)`: the log once `predicate(events)` holds (fails after `seconds`);
  `of(events, cls)`: the events of a type.
- `FactCluster(initial)`: a fake `Cluster` that pushes the facts a test hands it, from inside its
  term, as the Kubernetes adapter would; `gang(name)` a one-GPU job in `q`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from anyio.abc import TaskStatus

from muster.daemon.cluster import Sink
from muster.daemon.loop import LoopOptions, SchedulerLoop, SoleElector
from muster.demo.simcluster import SimulatedCluster, block_rack_nodes
from muster.events.store import EventStore, StoredEvent
from muster.events.types import Event, JobId, JobSubmitted, PodSet, QueueConfigured, QueueName, SchedulerConfigured

NODES = block_rack_nodes(1, 2, 2, 8)  # 4 nodes, 32 GPUs


def job(name: str, gpus: int = 8, pods: int = 1, runtime: int | None = None) -> JobSubmitted:
    """A gang of `pods` pods of `gpus` GPUs each in queue `q`, submitted now."""
    return JobSubmitted(
        at=int(time.time()),
        job=JobId(name),
        queue=QueueName("q"),
        podsets=[PodSet(name="w", count=pods, requests={"gpu": gpus})],
        runtime=runtime,
    )


async def configure(store: EventStore) -> None:
    """Queue `q` of 32 GPUs (the nodes' all) over the block and rack levels."""
    await store.append(
        [
            SchedulerConfigured(at=0, levels=["muster.dev/block", "muster.dev/rack"]),
            QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 32}),
        ]
    )


async def wait_for(store: EventStore, predicate: Any, seconds: float = 10.0) -> list[StoredEvent]:
    """The log once `predicate(events)` holds; fails after `seconds`."""
    with anyio.fail_after(seconds):
        while True:
            events = await store.read()
            if predicate(events):
                return events
            await anyio.sleep(0.05)


def of(events: list[StoredEvent], cls: type[Any]) -> list[Any]:
    """The events of type `cls`."""
    return [s.event for s in events if isinstance(s.event, cls)]


class Daemon:
    """A running loop and the simulated clusters of its terms."""

    def __init__(self, loop: SchedulerLoop, clusters: list[SimulatedCluster]) -> None:
        self.loop = loop
        self.clusters = clusters

    @property
    def applied(self) -> list[Event]:
        return [e for c in self.clusters for e in c.applied]


@contextlib.asynccontextmanager
async def daemon(
    store: EventStore, *, speed: float = 1.0, hooks: Any = None, name: str = "d1"
) -> AsyncIterator[Daemon]:
    """A loop leading alone until the block ends; its terms' clusters simulate `NODES` at `speed`."""
    clusters: list[SimulatedCluster] = []

    def cluster(state: Any) -> SimulatedCluster:
        c = SimulatedCluster(NODES, state, speed=speed)
        clusters.append(c)
        return c

    loop = SchedulerLoop(store, elector=SoleElector(name), cluster=cluster, hooks=hooks, options=LoopOptions())
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        with anyio.fail_after(10):
            await loop.first_term.wait()
        yield Daemon(loop, clusters)
        loop.stop()


class FactCluster:
    """A cluster that pushes `initial` when its term starts, and whatever `push` is given later, from its term."""

    def __init__(self, initial: list[Event]) -> None:
        self.initial = initial
        self._send, self._recv = anyio.create_memory_object_stream[list[Event]](16)

    async def run(self, sink: Sink, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self._recv, self._send:
            await sink(self.initial)
            task_status.started()
            async for events in self._recv:
                await sink(events)

    def push(self, events: list[Event]) -> None:
        self._send.send_nowait(events)

    async def ready(self, event: Event) -> None:
        pass

    async def apply(self, event: Event) -> Any:
        return None

    def holds(self, job: str) -> bool:
        return False


def gang(name: str) -> JobSubmitted:
    """A one-pod, one-GPU job in queue `q`."""
    return JobSubmitted(
        at=1, job=JobId(name), queue=QueueName("q"), podsets=[PodSet(name="w", count=1, requests={"gpu": 1})]
    )
