"""The leader hands a user's cancel (`muster cancel`) to its cluster, so the workload stops; not the adapter's own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
from loopkit import FactCluster, gang

from muster.daemon.loop import LoopOptions, SchedulerLoop, SoleElector
from muster.events.types import Event, JobCancelled, JobId, NodeAdded, NodeName, QueueConfigured, QueueName


class RecordingCluster(FactCluster):
    """A fact cluster that records what the term applies."""

    def __init__(self, initial: list[Event]) -> None:
        super().__init__(initial)
        self.applied: list[Event] = []
        self.changed = anyio.Event()

    async def apply(self, event: Event) -> Any:
        self.applied.append(event)
        self.changed.set()
        self.changed = anyio.Event()
        return None


async def test_a_users_cancel_is_applied_to_the_cluster_and_a_workload_deletion_is_not(store):
    """`Cancelled: ...` reaches the cluster's apply after the admission; `WorkloadDeleted: ...` does not."""
    await store.append(
        [
            QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8}),
            NodeAdded(at=0, node=NodeName("n0"), capacity={"gpu": 8}),
        ]
    )
    clusters: list[RecordingCluster] = []

    def make(state: Callable[[], Any]) -> RecordingCluster:
        clusters.append(RecordingCluster([gang("a"), gang("b")]))
        return clusters[-1]

    loop = SchedulerLoop(store, elector=SoleElector("d1"), cluster=make, options=LoopOptions(lease_check=1.0))
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        with anyio.fail_after(15):
            await loop.first_term.wait()
        cluster = clusters[0]

        def applied() -> list[tuple[str, str]]:
            return [(type(e).__name__, str(getattr(e, "job", ""))) for e in cluster.applied]

        async def until(done: Callable[[], bool]) -> None:
            with anyio.fail_after(15):
                while not done():
                    await cluster.changed.wait()

        await until(lambda: ("JobAdmitted", "b") in applied())
        await store.append([JobCancelled(at=5, job=JobId("a"), reason="WorkloadDeleted: Job ns/a is gone")])
        await store.append([JobCancelled(at=5, job=JobId("b"), reason="Cancelled: by muster cancel")])
        await until(lambda: ("JobCancelled", "b") in applied())
        assert ("JobCancelled", "a") not in applied()
        loop.stop()
