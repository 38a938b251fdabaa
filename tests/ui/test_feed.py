"""The dashboard's fold: any point of the log shows the fold of its prefix, billing and stories included."""

from __future__ import annotations

import itertools

import pytest
from uikit import FLAVORED_QUEUES, IDLE, STORY, memory_log, mixed, sim

from muster.events.types import (
    Event,
    JobAdmitted,
    JobCancelled,
    JobHeld,
    JobId,
    JobRejected,
    JobReleased,
    JobSubmitted,
    PodSet,
    QueueConfigured,
    QueueName,
)
from muster.projections.billing import fold_billing
from muster.projections.chargeback import build_report
from muster.projections.cluster import evolve
from muster.projections.state import ClusterState
from muster.replay.explain import explain
from muster.replay.explaincli import document
from muster.replay.points import END, Point
from muster.replay.snapshots import Snapshots
from muster.replay.snapshotstores import MemorySnapshots
from muster.ui import pages
from muster.ui.feed import Feed, History


def fold(events: list, upto: int) -> ClusterState:
    state = ClusterState()
    for ev in events[:upto]:
        evolve(state, ev)
    return state


async def folded(events: list, every: int = 25) -> Feed:
    feed = Feed(memory_log(events), every=every)
    await feed.run()
    return feed


@pytest.mark.parametrize(
    "scenario", [pytest.param(mixed(3, idle=True), id="mixed-idle"), pytest.param(STORY, id="story")]
)
async def test_every_point_shows_the_fold_of_the_log_up_to_it(scenario: str) -> None:
    """The state at any sequence (checkpoint, ended jobs put back, fold) equals the plain fold of that prefix."""
    events = sim(scenario).events
    feed = await folded(events, every=9)
    assert len(feed.past.checkpoints) >= len(events) // 9
    n = len(events)
    for seq in [*range(0, n, 5), n, *range(n - 1, 0, -7)]:  # forward from the last point, the end, then back
        async with feed.at(Point(seq=seq)) as moment:
            assert moment.seq == seq
            assert moment.state == fold(events, seq), f"seq {seq}"
            assert moment.live == (seq == n)


async def test_a_time_point_stops_before_the_first_later_event() -> None:
    """`?at=@T` shows the fold up to the last event at or before T, as `muster replay --at @T` does."""
    events = sim(STORY).events
    feed = await folded(events, every=4)
    t = events[len(events) // 2].at
    upto = max(i for i, ev in enumerate(events, start=1) if ev.at <= t)
    async with feed.at(Point(time=t)) as moment:
        assert moment.seq == upto and moment.state == fold(events, upto)


def report(billing, now: int):
    ledger = billing.ledger
    return build_report(list(ledger.usage.items()), list(ledger.capacity.items()), ledger.queues, start=0, end=now + 1)


async def test_chargeback_at_any_point_is_the_billing_fold_of_that_prefix() -> None:
    """Checkpoints of rows summed by queue + a short fold price like a fresh per-job billing fold, live or past."""
    events = sim(mixed(5, idle=True)).events
    feed = await folded(events, every=11)
    async with feed.at(END) as live:
        got = await feed.billing_at(live)
        expected = fold_billing(list(enumerate(events, start=1)))
        assert report(got, live.state.now) == report(expected, live.state.now)
        assert report(got, live.state.now).totals.allocated_gpu_hours > 0
    for seq in [*range(1, len(events), 13), 40, 3]:  # forward from the last point, and back
        async with feed.at(Point(seq=seq)) as moment:
            past = fold_billing(list(enumerate(events[:seq], start=1)))
            assert report(await feed.billing_at(moment), moment.state.now) == report(past, moment.state.now), seq


async def test_the_job_page_tells_the_story_explain_tells() -> None:
    """Started from the checkpoint before its submission, each job's story is line for line `muster explain`'s."""
    events = sim(IDLE).events
    log = memory_log(events)
    feed = Feed(log, every=3)
    await feed.run()
    async with feed.at(END) as moment:
        assert moment.state.jobs
        for job_id in moment.state.jobs:
            doc = await pages.job(feed, moment, job_id)
            story, now = await explain(log, job_id, END)
            assert doc is not None
            assert doc["story"] == document(story, now)["story"], job_id
            assert doc["pending"] == story.pending


async def test_a_job_unknown_at_a_point_has_no_page() -> None:
    """Before its submission (or never submitted) a job has no page: the server answers 404."""
    events = sim(STORY).events
    feed = await folded(events, every=5)
    async with feed.at(Point(seq=1)) as before:
        assert await pages.job(feed, before, "b-big") is None
    async with feed.at(END) as live:
        assert await pages.job(feed, live, "no-such-job") is None


def test_the_queue_history_stays_small_and_spans_the_whole_log() -> None:
    """However long the log, the history keeps at most `limit` samples, spread evenly from its start to its end."""
    events = sim(mixed(7)).events
    state = fold(events, len(events))
    history = History(limit=20, stride=1)
    for seq in range(1, 10_001):
        history.observe(seq, state)
    seqs = [s.seq for s in history.samples]
    assert 10 <= len(seqs) <= 20
    assert seqs[0] == history.stride and seqs[-1] > 10_000 - history.stride
    assert all(b - a == history.stride for a, b in itertools.pairwise(seqs))
    assert history.samples[-1].used == {name: q.usage.get("gpu", 0) for name, q in state.queues.items()}


async def test_a_job_that_ended_while_held_is_kept_live_until_released() -> None:
    """A job cancelled while held changes once more (its release): every point around it still equals the fold."""
    sub = [PodSet(name="w", count=1, requests={"gpu": 8})]  # no nodes: it waits
    events: list[Event] = [
        QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8}),
        JobSubmitted(at=1, job=JobId("a"), queue=QueueName("q"), podsets=sub),
        JobHeld(at=2, job=JobId("a")),
        JobCancelled(at=3, job=JobId("a")),
        JobSubmitted(at=4, job=JobId("b"), queue=QueueName("q"), podsets=sub),
        JobReleased(at=5, job=JobId("a")),
        JobCancelled(at=6, job=JobId("b")),
        JobSubmitted(at=7, job=JobId("c"), queue=QueueName("q"), podsets=sub),
    ]
    feed = await folded(events, every=1)
    for seq in range(len(events), -1, -1):  # backwards: every point from its own checkpoint
        async with feed.at(Point(seq=seq)) as moment:
            assert moment.state == fold(events, seq), f"seq {seq}"
            assert list(moment.state.jobs) == list(fold(events, seq).jobs), "the fold's order (submission order)"
    assert [j.id for j in feed.past.ended] == ["a", "b"]
    assert not feed.past.ended[0].held


async def test_a_feed_started_from_a_stored_snapshot_shows_every_point_and_bills_from_the_start() -> None:
    """From the newest stored snapshot: points before it and after it, the chargeback and the stories are the fold's."""
    events = sim(mixed(3, idle=True)).events
    log = memory_log(events)
    n, k = len(events), len(events) * 2 // 3
    snapshots = Snapshots(MemorySnapshots(), log)
    await snapshots.write(fold(events, k), k, verified_from=0)
    feed = Feed(log, every=7, snapshots=snapshots)
    await feed.run()
    assert feed.past.first == k, "the live fold started from the snapshot"
    for seq in [n, *range(n - 1, 0, -6)]:
        async with feed.at(Point(seq=seq)) as moment:
            assert moment.state == fold(events, seq), f"seq {seq}"
    async with feed.at(END) as live:
        expected = fold_billing(list(enumerate(events, start=1)))
        assert report(await feed.billing_at(live), live.state.now) == report(expected, live.state.now)
        early = [j for j, s in feed.books.submissions.items() if s < k][:3]
        assert early
        for job_id in early:
            doc = await pages.job(feed, live, job_id)
            story, now = await explain(log, job_id, END)
            assert doc is not None and doc["story"] == document(story, now)["story"], job_id


async def test_a_quantity_past_64_bits_is_kept_like_any_other() -> None:
    """A job asking for more than msgpack can hold (rejected, but folded) is checkpointed and shown as the fold."""
    huge = [PodSet(name="w", count=1, requests={"gpu": 2**70})]
    events: list[Event] = [
        QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8}),
        JobSubmitted(at=1, job=JobId("huge"), queue=QueueName("q"), podsets=huge),
        JobRejected(at=2, job=JobId("huge"), reason="too big"),
        JobSubmitted(at=3, job=JobId("b"), queue=QueueName("q"), podsets=[PodSet(name="w", count=1, requests={})]),
    ]
    feed = await folded(events, every=1)
    for seq in range(len(events), -1, -1):
        async with feed.at(Point(seq=seq)) as moment:
            assert moment.state == fold(events, seq), f"seq {seq}"


async def test_the_queues_page_counts_a_flavored_queues_gpus() -> None:
    """A queue with quota per flavor is drawn with its GPUs (the page read plain `gpu` only: 0 nominal, 0 used,
    a flat history), in its row and in the history its line is drawn from."""
    events = sim(FLAVORED_QUEUES).events
    feed = await folded(events, every=1)
    running = next(i for i, ev in enumerate(events, start=1) if isinstance(ev, JobAdmitted))
    async with feed.at(Point(seq=running)) as moment:
        page = pages.queues(moment)
    rows = {r["queue"]: r["gpus"] for r in page["rows"]}
    assert rows == {
        "q": {"nominal": 16, "used": 16, "borrowed": 8, "lent": 0},
        "idle": {"nominal": 8, "used": 0, "borrowed": 0, "lent": 8},
    }
    assert page["history"][-1]["used"] == {"q": 16, "idle": 0}
