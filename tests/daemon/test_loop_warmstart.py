"""Warm start: a replica starts from the newest verified snapshot and folds only the log after it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import pytest
from loopkit import NODES, configure, daemon, job, of, wait_for

from muster.daemon.loop import LoopOptions, SchedulerLoop, SoleElector
from muster.daemon.warmstart import SnapshotStart
from muster.demo.simcluster import SimulatedCluster
from muster.events.store import EventStore
from muster.events.types import Event, JobAdmitted, JobCancelled, JobHeld, JobId, JobPreempted
from muster.projections.cluster import evolve
from muster.projections.state import ClusterState
from muster.replay.snapshots import Snapshots
from muster.replay.snapshotstores import MemorySnapshots
from muster.replay.source import NatsLog


async def cold_fold(store: EventStore) -> ClusterState:
    state = ClusterState()
    for stored in await store.read():
        evolve(state, stored.event)
    return state


async def snapshot_of_the_log(store: EventStore) -> tuple[Snapshots, int]:
    """A verified snapshot of the whole log as it is now (what the sidecar writes), and its sequence."""
    snapshots = Snapshots(MemorySnapshots(), NatsLog(store))
    seq = await store.last_seq()
    await snapshots.write(await cold_fold(store), seq, verified_from=0)
    return snapshots, seq


async def admitted_log(store: EventStore, names: Sequence[str] = ("a", "b")) -> list[Any]:
    """A log on which an earlier leader admitted jobs `names` (and stopped)."""
    await configure(store)
    async with daemon(store) as d:
        await d.loop.store.append([job(name) for name in names])
        events = await wait_for(store, lambda evs: len(of(evs, JobAdmitted)) == len(names))
        assert d.loop.epoch == 1
    return of(events, JobAdmitted)


@contextlib.asynccontextmanager
async def replica(
    store: EventStore, snapshots: Snapshots, *, leads: bool, running: Sequence[str] = ()
) -> AsyncIterator[tuple[SchedulerLoop, list]]:
    """A replica "d2" started from `snapshots`; its cluster runs `running` (what a dead leader left there)."""
    clusters: list[SimulatedCluster] = []

    def cluster(state: Any) -> SimulatedCluster:
        clusters.append(SimulatedCluster(NODES, state))
        clusters[-1].running = {name: 0 for name in running}
        return clusters[-1]

    elector = SoleElector("d2")
    if not leads:
        await elector.resign()  # a standby: it follows the log and never leads
    loop = SchedulerLoop(store, elector=elector, cluster=cluster, options=LoopOptions(), start=SnapshotStart(snapshots))
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        yield loop, clusters
        loop.stop()


async def test_a_replica_folds_only_the_log_after_the_newest_snapshot(store):
    """Started with a snapshot, a standby folds only the events after it and holds the state a cold fold gives."""
    await admitted_log(store)
    snapshots, at = await snapshot_of_the_log(store)
    await store.append([job("c")])
    end = await store.last_seq()
    folded: list[int] = []
    async with replica(store, snapshots, leads=False) as (loop, _):
        loop.on_fold(lambda seq, event, accepted: folded.append(seq))
        with anyio.fail_after(10):
            while loop.folded_seq < end:  # noqa: ASYNC110 - the follower has no "caught up" event
                await anyio.sleep(0.02)
        assert loop.state == await cold_fold(store)
    assert all(seq > at for seq in folded), "nothing before the snapshot is folded again"


async def test_a_leader_started_from_a_snapshot_binds_again_what_it_holds(store):
    """A new leader that started from a snapshot re-applies the admissions of earlier terms the snapshot holds."""
    earlier = await admitted_log(store)
    snapshots, _ = await snapshot_of_the_log(store)
    async with replica(store, snapshots, leads=True) as (loop, clusters):
        with anyio.fail_after(10):
            await loop.first_term.wait()
            while not clusters or len(applied_admissions(clusters[0].applied)) < 2:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        assert loop.epoch == 2
    again = applied_admissions(clusters[0].applied)
    assert {(e.job, tuple(sorted(e.placement.items()))) for e in again} == {
        (e.job, tuple(sorted(e.placement.items()))) for e in earlier
    }


def applied_admissions(events: list[Event]) -> list[JobAdmitted]:
    return [e for e in events if isinstance(e, JobAdmitted)]


async def undone_decisions_log(store: EventStore) -> None:
    """Leader 1 admitted a, b and c and applied that; then it evicted a (held since) and a user cancelled b,
    and it died before applying either."""
    admitted = await admitted_log(store, ["a", "b", "c"])
    epoch = admitted[0].epoch
    await store.append(
        [
            JobPreempted(at=0, job=JobId("a"), preemptor=None, reason="IdleReclaim", epoch=epoch),
            JobHeld(at=0, job=JobId("a"), reason="by alice"),
            JobCancelled(at=0, job=JobId("b"), reason="Cancelled: by bob"),
        ]
    )


@pytest.mark.parametrize("start", ["warm", "cold"])
async def test_a_new_leader_applies_every_earlier_decision_the_cluster_does_not_reflect(store, start):
    """A new leader (from a snapshot, or cold) applies an unapplied eviction and cancel; the next term owes neither."""
    await undone_decisions_log(store)
    snapshots = (
        (await snapshot_of_the_log(store))[0] if start == "warm" else Snapshots(MemorySnapshots(), NatsLog(store))
    )
    async with replica(store, snapshots, leads=True, running=["a", "b", "c"]) as (loop, clusters):
        with anyio.fail_after(10):
            await loop.first_term.wait()
            while set(clusters[0].running) != {"c"}:  # noqa: ASYNC110 - the applier has no "done" event
                await anyio.sleep(0.02)
    applied = {(type(e).__name__, e.job) for e in clusters[0].applied}
    assert applied == {("JobPreempted", "a"), ("JobCancelled", "b"), ("JobAdmitted", "c")}
    evicted = next(e for e in clusters[0].applied if isinstance(e, JobPreempted))
    assert (evicted.reason, evicted.preemptor) == ("IdleReclaim", None)
    async with replica(store, snapshots, leads=True, running=["c"]) as (loop, clusters):  # the next term
        with anyio.fail_after(10):
            await loop.first_term.wait()
            while not clusters or not clusters[0].applied or settling(loop):  # noqa: ASYNC110
                await anyio.sleep(0.02)
    assert [(type(e).__name__, e.job) for e in clusters[0].applied] == [("JobAdmitted", "c")], "nothing else is owed"


async def test_a_new_leader_decides_before_it_applies_what_earlier_terms_owe(store):
    """A takeover's first cycle is not held behind re-applying earlier terms: those reach the cluster after it."""
    await admitted_log(store, ["a", "b"])
    await store.append([job("c")])  # waiting for the next leader's first cycle
    cycles_when_applied: list[tuple[str, int]] = []

    class Recording(SimulatedCluster):
        async def apply(self, event: Event) -> Any:
            cycles_when_applied.append((getattr(event, "job", ""), loop.cycles))
            return await super().apply(event)

    loop = SchedulerLoop(store, elector=SoleElector("d2"), cluster=lambda state: Recording(NODES, state))
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        with anyio.fail_after(10):
            while len(cycles_when_applied) < 3:  # noqa: ASYNC110 - the applier has no "done" event
                await anyio.sleep(0.02)
        loop.stop()
    owed = [cycles for job, cycles in cycles_when_applied if job in ("a", "b")]
    assert sorted(job for job, _ in cycles_when_applied) == ["a", "b", "c"]
    assert len(owed) == 2 and min(owed) >= 1, "re-applied before the term's first cycle decided"


def settling(loop: SchedulerLoop) -> bool:
    """Whether the term's applier still holds decisions it was handed."""
    term = loop.term
    return term is None or term.applier is None or term.applier.backlog > 0
