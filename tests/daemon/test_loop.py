"""The scheduler loop of one replica on the real embedded NATS, against the in-process simulated cluster."""

from __future__ import annotations

import contextlib
import uuid

import anyio
import nats
import nats.js.errors
from loopkit import configure, daemon, job, of, wait_for

from muster.daemon.leader import KvElector
from muster.daemon.loop import SchedulerLoop
from muster.events.store import EventStore
from muster.events.types import (
    Event,
    JobAdmitted,
    JobFinished,
    JobInadmissible,
    JobStarted,
    JobSubmitted,
    LeaderElected,
)


async def test_submissions_are_admitted_applied_and_run_to_completion(store):
    """More work than fits: every job is admitted once, bound in the cluster, and finishes; waiting jobs say why."""
    await configure(store)
    async with daemon(store, speed=20) as d:
        await store.append([job(f"j{i}", gpus=8, pods=2, runtime=10) for i in range(4)])  # 64 GPUs on 32
        events = await wait_for(store, lambda ev: len(of(ev, JobFinished)) == 4)
        admitted = of(events, JobAdmitted)
        assert sorted(a.job for a in admitted) == [f"j{i}" for i in range(4)]
        assert {a.epoch for a in admitted} == {1}
        assert of(events, JobInadmissible), "the two jobs that had to wait were told why"
        assert sorted(e.job for e in d.applied if isinstance(e, JobAdmitted)) == [f"j{i}" for i in range(4)]
        assert len(of(events, JobStarted)) == 4
        # every decision sits right after the state it was decided on: its cycle's events are contiguous
        cycles = [(s.event.cycle, s.seq) for s in events if isinstance(s.event, (JobAdmitted, JobInadmissible))]
        for cycle in {c for c, _ in cycles}:
            seqs = [seq for c, seq in cycles if c == cycle]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))


class AppendFirst:
    """Another writer gets in just before the loop's first decision append."""

    def __init__(self, store: EventStore, event: Event) -> None:
        self.store, self.event, self.fired = store, event, 0

    async def before_append(self, events: list[Event]) -> None:
        if not self.fired:
            self.fired = len(events)
            await self.store.append([self.event])


async def test_a_verdict_refused_by_the_fence_is_written_when_decided_again(store):
    """A job told why it waits in a cycle whose append was refused still gets its JobInadmissible on the log."""
    await configure(store)
    hook = AppendFirst(store, job("late", gpus=8))
    async with daemon(store, hooks=hook):
        await store.append([job("huge", gpus=8, pods=100)])  # 800 GPUs on 32: waits for a quota change
        events = await wait_for(store, lambda ev: [a.job for a in of(ev, JobAdmitted)] == ["late"], 30)
        assert hook.fired, "the first decisions were refused by the fence"
        with anyio.fail_after(30):
            while "huge" not in {e.job for e in of(events, JobInadmissible)}:
                await anyio.sleep(0.05)
                events = await store.read()


async def test_a_write_that_beats_the_decisions_is_folded_and_the_cycle_decided_again(store):
    """The fenced append is refused; the loop folds the newcomer and decides again: nothing lost or doubled."""
    await configure(store)
    hook = AppendFirst(store, job("late", gpus=8))
    async with daemon(store, hooks=hook) as d:
        await store.append([job("early", gpus=8)])
        events = await wait_for(store, lambda ev: {a.job for a in of(ev, JobAdmitted)} == {"early", "late"})
        await anyio.sleep(0.2)
        events = await store.read()
        assert hook.fired == 1
        assert sorted(a.job for a in of(events, JobAdmitted)) == ["early", "late"]
        assert d.loop.metrics.registry.get_sample_value("muster_append_conflicts_total") == 1
        # the refused cycle left nothing on the log: "late" was submitted before any decision
        first_decision = next(s.seq for s in events if isinstance(s.event, JobAdmitted))
        late = next(s.seq for s in events if isinstance(s.event, JobSubmitted) and s.event.job == "late")
        assert late < first_decision


async def test_a_malformed_message_at_the_end_of_the_log_does_not_stop_scheduling(store):
    """Bad bytes on the stream are skipped and counted; the fence still lines up behind them."""
    await configure(store)
    async with daemon(store) as d:
        nc = await nats.connect(store.nc.connected_url.geturl())
        try:
            await nc.jetstream().publish(f"{store.prefix}.job.garbage", b"{not json", stream=store.stream)
        finally:
            await nc.close()
        await anyio.sleep(0.3)
        await store.append([job("after-garbage", gpus=8)])
        await wait_for(store, lambda ev: any(a.job == "after-garbage" for a in of(ev, JobAdmitted)))
        assert d.loop.metrics.registry.get_sample_value("muster_bad_events_total") == 1


async def test_a_restarted_replica_continues_in_a_new_epoch_without_deciding_twice(store):
    """After a clean stop, a new replica replays the log, leads at epoch 2, re-applies the running job, decides on."""
    await configure(store)
    async with daemon(store, name="first"):
        await store.append([job("a", gpus=8)])
        await wait_for(store, lambda ev: of(ev, JobAdmitted))
    async with daemon(store, name="second") as d:
        await store.append([job("b", gpus=8)])
        events = await wait_for(store, lambda ev: len(of(ev, JobAdmitted)) == 2)
        assert [(e.epoch, e.holder) for e in of(events, LeaderElected)] == [(1, "first"), (2, "second")]
        assert [(a.job, a.epoch) for a in of(events, JobAdmitted)] == [("a", 1), ("b", 2)]
        assert d.loop.state.jobs["a"].status == "admitted"
        # the new term's cluster was told about "a" (idempotent re-apply, once the term's first cycle
        # decided: before or after "b", whichever that cycle saw) and applied "b"; applying follows the
        # append, so wait for it rather than expect it the moment the log shows "b"
        with anyio.fail_after(30):
            while len([e for e in d.applied if isinstance(e, JobAdmitted)]) < 2:  # noqa: ASYNC110 - observing a fake
                await anyio.sleep(0.02)
        assert sorted(e.job for e in d.applied if isinstance(e, JobAdmitted)) == ["a", "b"]


async def test_a_stopped_leader_releases_its_lease_at_once(store):
    """stop() deletes the KV lease, so a standby can win it immediately instead of after the TTL."""
    bucket = f"lease-release-{uuid.uuid4().hex[:10]}"  # unique: a leftover of another run cannot hold it
    try:
        loop = SchedulerLoop(store, elector=KvElector(store.js, holder="x", bucket=bucket, ttl=30))
        async with anyio.create_task_group() as tg:
            await tg.start(loop.run)
            with anyio.fail_after(30):
                while not loop.leading:  # noqa: ASYNC110 - no event for "announced"; a bounded poll
                    await anyio.sleep(0.02)
            loop.stop()
        other = KvElector(store.js, holder="y", bucket=bucket, ttl=30)
        kv = await other.open()
        await other._campaign(kv)
        assert other.leading()
    finally:
        with anyio.CancelScope(shield=True), contextlib.suppress(nats.js.errors.NotFoundError):
            await store.js.delete_key_value(bucket)
