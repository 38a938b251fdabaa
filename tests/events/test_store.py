"""The JetStream event store contract: append, de-duplication, fencing, reads, bad bytes.

The contract tests take `any_store`, which runs them against the session's
embedded nats-server and, where Docker answers, against NATS in a container.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import anyio
import nats
import pytest

from muster.events import codec
from muster.events.codec import MAX_EVENT_BYTES
from muster.events.store import (
    AppendError,
    BadEvent,
    ConcurrencyConflict,
    EventStore,
    EventTooLarge,
    StoredEvent,
    default_url,
)
from muster.events.types import (
    Event,
    GpuUtilizationSampled,
    JobFailed,
    JobFinished,
    JobSubmitted,
    NodeAdded,
    PodSet,
    QueueConfigured,
)

V1_JOB_SUBMITTED = b'{"type":"JobSubmitted","at":5,"job":"j1","queue":"q","pods":4,"gpus":8}'


def submissions(n: int, start: int = 0) -> list[Event]:
    """`n` distinct job submissions at times start, start+1, ..."""
    return [
        JobSubmitted(
            at=start + i,
            job=f"job-{start + i}",
            queue="team-a",
            podsets=[PodSet(name="worker", count=2, requests={"gpu": 4})],
            runtime=3600,
        )
        for i in range(n)
    ]


@pytest.fixture(params=["embedded", pytest.param("docker", marks=pytest.mark.docker)])
async def any_store(
    request: pytest.FixtureRequest,
    store_factory: Callable[..., contextlib.AbstractAsyncContextManager[EventStore]],
) -> AsyncIterator[EventStore]:
    """A store on a fresh stream, on the embedded server or (opt-in) on NATS in Docker."""
    fixture = "docker_nats_url" if request.param == "docker" else "nats_url"
    url: str = request.getfixturevalue(fixture)
    async with store_factory(url) as es:
        yield es


# ---------------------------------------------------------------- append and read


async def test_append_then_read_round_trip(any_store: EventStore) -> None:
    """Appended events come back from read() equal, in order, with consecutive stream sequences."""
    events = [
        QueueConfigured(at=0, name="team-a", nominal={"gpu": 16}),
        NodeAdded(at=0, node="n0", capacity={"gpu": 8}),
        *submissions(3, start=1),
    ]
    seqs = await any_store.append(events)
    assert seqs == [1, 2, 3, 4, 5]
    assert await any_store.last_seq() == 5
    stored = await any_store.read()
    assert stored == [StoredEvent(s, e) for s, e in zip(seqs, events, strict=True)]


async def test_read_a_range_by_sequence(any_store: EventStore) -> None:
    """read(from_seq, to_seq) returns exactly the events with sequences in that inclusive range."""
    events = submissions(10)
    await any_store.append(events)
    assert [s.seq for s in await any_store.read(4, 7)] == [4, 5, 6, 7]
    assert [s.event for s in await any_store.read(9)] == events[8:]
    assert await any_store.read(11) == []


async def test_read_until_stops_at_event_time(any_store: EventStore) -> None:
    """read(until=t) returns the events up to the first one later than t."""
    events = submissions(10, start=100)
    await any_store.append(events)
    stored = await any_store.read(until=104)
    assert [s.event.at for s in stored] == [100, 101, 102, 103, 104]
    assert await any_store.read(until=99) == []


async def test_iter_range_streams_large_ranges_in_order(any_store: EventStore) -> None:
    """iter_range() yields thousands of events in sequence order without gaps (across many deliveries)."""
    events = [GpuUtilizationSampled(at=i, job=f"job-{i % 50}", gpu=(i % 100) / 100) for i in range(6000)]
    await any_store.append(events)
    seqs = [stored.seq async for stored in any_store.iter_range(1)]
    assert seqs == list(range(1, 6001))


async def test_a_range_ending_inside_a_delivery_stops_at_its_last_sequence(any_store: EventStore) -> None:
    """read(from, to) of a large log stops exactly at `to`, wherever it falls in a delivered batch."""
    events = [GpuUtilizationSampled(at=i, job=f"job-{i % 50}", gpu=(i % 100) / 100) for i in range(6000)]
    await any_store.append(events)
    for first, last in [(1, 4999), (2500, 2501), (5999, 6000), (1, 1)]:
        assert [s.seq for s in await any_store.read(first, last)] == list(range(first, last + 1))
    assert [s.event.at for s in await any_store.read(10, until=4500)] == list(range(9, 4501))


async def _stored_subjects(store: EventStore, events: list[Event]) -> list[str]:
    """Append `events`; the subject each was stored on."""
    seqs = await store.append(events)
    return [(await store.js.get_msg(store.stream, seq)).subject for seq in seqs]


async def test_events_land_on_kind_and_id_subjects(any_store: EventStore) -> None:
    """Each event is stored on `<prefix>.<kind>.<id>` with the id made safe for a subject token."""
    events: list[Event] = [
        JobFinished(at=1, job="ns/train.v2"),
        NodeAdded(at=1, node="gpu-node-1"),
        QueueConfigured(at=1, name="équipe a"),
    ]
    subjects = await _stored_subjects(any_store, events)
    p = any_store.prefix
    assert subjects == [f"{p}.job.ns/train%2Ev2", f"{p}.node.gpu-node-1", f"{p}.queue.%C3%A9quipe%20a"]


async def test_a_jobs_events_go_on_its_queues_subjects_when_the_writer_knows_it(any_store: EventStore) -> None:
    """With `queue_of` (the daemon's folded state), and for a job submitted in the same batch, job.<queue>.<job>."""
    any_store.queue_of = {"known": "team-a"}.get
    events: list[Event] = [
        JobFinished(at=1, job="known"),
        *submissions(1),
        JobFailed(at=1, job="job-0"),
        JobFinished(at=1, job="unknown"),
    ]
    subjects = await _stored_subjects(any_store, events)
    p = any_store.prefix
    assert subjects == [
        f"{p}.job.team-a.known",
        f"{p}.submit.team-a.job-0",
        f"{p}.job.team-a.job-0",
        f"{p}.job.unknown",
    ]
    assert [s.event for s in await any_store.read(await any_store.last_seq() - 3)] == events


async def test_a_read_by_queue_filters_gets_that_queues_jobs_and_the_cluster_in_order(any_store: EventStore) -> None:
    """`subjects=queue_filters(q)` reads q's submissions, control and job events, config, nodes; no other queue's."""
    from muster.events.subjects import queue_filters
    from muster.events.types import JobCancelled, JobId, LeaderElected, QueueName

    any_store.queue_of = {"a-1": "team-a", "b-1": "team-b"}.get
    mine = JobSubmitted(at=3, job="a-1", queue="team-a", podsets=[PodSet(name="w", count=1, requests={"gpu": 1})])
    theirs = JobSubmitted(at=3, job="b-1", queue="team-b", podsets=[PodSet(name="w", count=1, requests={"gpu": 1})])
    events: list[Event] = [
        QueueConfigured(at=1, name="team-a"),
        NodeAdded(at=1, node="n1", capacity={"gpu": 8}),
        LeaderElected(at=2, epoch=1, holder="d"),
        theirs,
        mine,
        JobFinished(at=4, job="b-1"),
        JobCancelled(at=5, job=JobId("a-1"), queue=QueueName("team-a")),
        JobFailed(at=5, job="a-1"),
    ]
    seqs = await any_store.append(events)
    got = await any_store.read(seqs[0], subjects=queue_filters("team-a", any_store.prefix))
    wanted = [0, 1, 2, 4, 6, 7]
    assert [(s.seq, s.event) for s in got] == [(seqs[i], events[i]) for i in wanted]
    assert [
        s.seq for s in await any_store.read(seqs[0], seqs[4], subjects=queue_filters("nobody", any_store.prefix))
    ] == seqs[:3]


# ---------------------------------------------------------------- de-duplication and fencing


async def test_duplicate_append_is_stored_once(any_store: EventStore) -> None:
    """Appending the same batch twice stores it once and returns the first sequences both times."""
    events = submissions(3)
    first = await any_store.append(events)
    again = await any_store.append(events)
    assert again == first
    assert await any_store.last_seq() == 3
    assert len(await any_store.read()) == 3


async def test_caller_msg_ids_decide_what_is_a_duplicate(any_store: EventStore) -> None:
    """With caller-given msg ids, a different event under an already used id is not stored again."""
    first = await any_store.append(submissions(1), msg_ids=["epoch1/cycle7/job-0"])
    again = await any_store.append(submissions(1, start=50), msg_ids=["epoch1/cycle7/job-0"])
    assert again == first
    assert [s.event.at for s in await any_store.read()] == [0]


async def test_msg_ids_made_of_any_unicode_still_deduplicate(any_store: EventStore) -> None:
    """Ids built from job names such as 'ジョブ-🚀' are stored and deduplicated like ASCII ones (not refused)."""
    ids = ["fact:started:ジョブ-🚀:1", "fact:started:ジョブ-🚁:1"]
    first = await any_store.append(submissions(2), msg_ids=ids)
    again = await any_store.append(submissions(2, start=50), msg_ids=ids)
    assert again == first and len(set(first)) == 2
    assert [s.event.at for s in await any_store.read()] == [0, 1]


async def test_fenced_append_chains_expected_sequences(any_store: EventStore) -> None:
    """A fenced batch on the expected end of the stream is stored in order."""
    assert await any_store.append(submissions(3), expected_last_seq=0) == [1, 2, 3]
    assert await any_store.append(submissions(2, start=3), expected_last_seq=3) == [4, 5]


async def test_expected_sequence_conflict_raises_typed_error(any_store: EventStore) -> None:
    """A fenced append behind the stream's end raises ConcurrencyConflict(expected, actual) and stores nothing."""
    await any_store.append(submissions(2))
    with pytest.raises(ConcurrencyConflict) as info:
        await any_store.append(submissions(3, start=10), expected_last_seq=1)
    assert (info.value.expected, info.value.actual, info.value.stored) == (1, 2, [])
    assert await any_store.last_seq() == 2


async def test_retried_fenced_batch_is_stored_once(any_store: EventStore) -> None:
    """Retrying a fenced batch that was already stored returns its sequences instead of a conflict."""
    events = submissions(3)
    first = await any_store.append(events, expected_last_seq=0)
    assert await any_store.append(events, expected_last_seq=0) == first
    assert await any_store.last_seq() == 3


async def test_fenced_retry_of_a_partly_stored_batch_completes_it(any_store: EventStore) -> None:
    """A fenced batch retried after only its first events were stored keeps those and stores the rest once."""
    events = submissions(3)
    first_two = await any_store.append(events[:2], expected_last_seq=0)
    assert await any_store.append(events, expected_last_seq=0) == [*first_two, 3]
    assert await any_store.last_seq() == 3


async def test_fenced_retry_after_another_writer_conflicts(any_store: EventStore) -> None:
    """A fenced batch whose expected end was taken by another writer's events conflicts."""
    await any_store.append(submissions(1))
    await any_store.append(submissions(1, start=1), msg_ids=["other-writer"])
    with pytest.raises(ConcurrencyConflict) as info:
        await any_store.append(submissions(1, start=2), expected_last_seq=1)
    assert (info.value.expected, info.value.actual) == (1, 2)


async def test_fenced_batch_lands_whole_or_not_at_all(any_store: EventStore) -> None:
    """A fenced batch (one round trip) lands right after the expected end, or nothing of it when the log moved."""
    end = await any_store.last_seq()
    cycle = submissions(3)
    assert await any_store.append(cycle, expected_last_seq=end, msg_ids=["c1:0", "c1:1", "c1:2"]) == [1, 2, 3]
    with pytest.raises(ConcurrencyConflict) as info:
        await any_store.append(submissions(3, start=10), expected_last_seq=end, msg_ids=["c2:0", "c2:1", "c2:2"])
    assert (info.value.stored, info.value.actual) == ([], end + 3)
    assert [s.event for s in await any_store.read()] == cycle


async def test_oversized_event_is_refused_with_nothing_stored(any_store: EventStore) -> None:
    """A batch holding an event over the size cap raises EventTooLarge and stores none of the batch."""
    huge = JobFailed(at=1, job="j", reason="x" * (MAX_EVENT_BYTES + 1))
    with pytest.raises(EventTooLarge) as info:
        await any_store.append([*submissions(1), huge])
    assert info.value.index == 1
    assert await any_store.last_seq() == 0


@pytest.mark.parametrize("size", [3, 200], ids=["small-batch", "big-batch"])
async def test_append_without_a_stream_fails_instead_of_hanging(any_store: EventStore, size: int) -> None:
    """When the stream is gone, append raises AppendError within seconds, for small and big batches alike."""
    await any_store.delete_stream()
    with anyio.fail_after(20), pytest.raises(AppendError, match="not confirmed"):
        await any_store.append(submissions(size))


# ---------------------------------------------------------------- bad bytes


async def test_bad_bytes_are_reported_with_their_sequence_and_skipped(any_store: EventStore) -> None:
    """Garbage, truncated JSON, an unknown type and a future version are each reported with their seq, never raised."""
    reported: list[BadEvent] = []
    any_store.on_bad = reported.append
    good = submissions(2)
    await any_store.append(good[:1])
    junk = [
        b"\x00\xffnot json at all",
        b'{"type":"JobFinished","at":3,"job":"j',
        b'{"type":"JobTeleported","at":3,"job":"j"}',
        b'{"type":"JobFinished","at":3,"job":"j","v":99}',
    ]
    junk_seqs = [(await any_store.js.publish(f"{any_store.prefix}.x.y", raw)).seq for raw in junk]
    await any_store.append(good[1:])

    stored = await any_store.read()

    assert [s.event for s in stored] == good
    assert [s.seq for s in stored] == [1, 6]
    assert [(b.seq, b.raw) for b in reported] == list(zip(junk_seqs, junk, strict=True))
    assert all(b.subject == f"{any_store.prefix}.x.y" and b.error for b in reported)
    assert "newer" in reported[3].error
    assert any_store.bad_events == 4


async def test_on_bad_callback_is_given_at_connect(
    nats_url: str, store_factory: Callable[..., contextlib.AbstractAsyncContextManager[EventStore]]
) -> None:
    """The on_bad callback passed to connect() receives bad events; a failing callback does not stop the read."""
    seen: list[int] = []

    def on_bad(bad: BadEvent) -> None:
        seen.append(bad.seq)
        raise RuntimeError("reporter is broken")

    async with store_factory(nats_url, on_bad=on_bad) as es:
        await es.js.publish(f"{es.prefix}.job.j", b"{}")
        await es.append(submissions(1))
        assert [s.seq for s in await es.read()] == [2]
    assert seen == [1]


async def test_stored_v1_job_submitted_is_upcast(any_store: EventStore) -> None:
    """v1 JobSubmitted bytes already on the stream are read back as a v2 job with podsets."""
    ack = await any_store.js.publish(f"{any_store.prefix}.job.j1", V1_JOB_SUBMITTED)
    [stored] = await any_store.read()
    assert stored == StoredEvent(
        ack.seq,
        JobSubmitted(at=5, job="j1", queue="q", podsets=[PodSet(name="worker", count=4, requests={"gpu": 8})], v=2),
    )
    assert stored.event == codec.decode(V1_JOB_SUBMITTED)


# ---------------------------------------------------------------- follow


async def test_follow_yields_existing_then_new_events(any_store: EventStore) -> None:
    """follow() yields the stored events and then events appended while it waits, skipping bad bytes."""
    await any_store.append(submissions(2))
    seen: list[int] = []
    async with contextlib.aclosing(any_store.follow(2)) as events:
        async for stored in events:
            seen.append(stored.seq)
            if stored.seq == 2:
                await any_store.js.publish(f"{any_store.prefix}.x.y", b"garbage")
                await any_store.append(submissions(2, start=2))
            if len(seen) == 3:
                break
    assert seen == [2, 4, 5]
    assert any_store.bad_events == 1


async def test_follow_from_the_end_sees_only_new_events(any_store: EventStore) -> None:
    """follow(last_seq + 1) waits for and yields only events appended after it started."""
    await any_store.append(submissions(3))
    start = await any_store.last_seq() + 1
    async with contextlib.aclosing(any_store.follow(start)) as events:
        await any_store.append(submissions(1, start=3))
        first = await anext(events)
    assert first.seq == 4 and first.event == submissions(1, start=3)[0]


async def test_store_on_a_callers_connection_leaves_it_open(nats_url: str) -> None:
    """Given a connected nats-py client, the store appends and reads through it and close() leaves it open."""
    nc = await nats.connect(nats_url)
    try:
        es = await EventStore.connect(nc, stream="CALLERS", prefix="callers")
        try:
            await es.append(submissions(100))  # big enough for the pipelined wire path
            assert [s.seq for s in await es.read(99)] == [99, 100]
        finally:
            await es.delete_stream()
            await es.close()
        assert nc.is_connected
    finally:
        await nc.close()


def test_default_url_honours_nats_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """default_url() is $NATS_URL when set and the local default otherwise."""
    monkeypatch.setenv("NATS_URL", "nats://elsewhere:4333")
    assert default_url() == "nats://elsewhere:4333"
    monkeypatch.delenv("NATS_URL")
    assert default_url() == "nats://127.0.0.1:4222"


async def test_a_fenced_batch_longer_than_an_atomic_batch_lands_in_order(any_store: EventStore) -> None:
    """A fenced batch of 2,500 events (three atomic batches on NATS 2.12+) is stored contiguously after the fence."""
    events = submissions(2500)
    assert await any_store.append(events, expected_last_seq=0) == list(range(1, 2501))
    assert [s.event for s in await any_store.read()] == events
