"""A queue's scoped view at a point reads the queue's events once: the view's own read checks the point."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import pytest

from muster.events.store import EventStore, StoredEvent
from muster.events.types import JobId, JobSubmitted, PodSet, QueueConfigured, QueueName
from muster.replay.cliutil import UsageError, point_reader
from muster.replay.explain import explain
from muster.replay.points import parse_point
from muster.replay.rebuild import state_at
from muster.replay.source import QueueLog


class CountedQueueLog(QueueLog):
    """A queue's scoped view of the stream that counts its reads of the stream."""

    reads = 0

    def _read(self, from_seq: int, to_seq: int | None, until: int | None) -> AsyncGenerator[list[StoredEvent], None]:
        self.reads += 1
        return super()._read(from_seq, to_seq, until)


def submitted(name: str, queue: str, at: int) -> JobSubmitted:
    pods = [PodSet(name="w", count=1, requests={"gpu": 1})]
    return JobSubmitted(at=at, job=JobId(name), queue=QueueName(queue), podsets=pods)


async def scoped(store: EventStore) -> CountedQueueLog:
    """Queues a and b, a's jobs a-1 (t=1000) and a-2 (t=1020), b's b-1 (t=1010); the view of queue a."""
    await store.append([QueueConfigured(at=1000, name=QueueName(q), nominal={"gpu": 8}) for q in "ab"])
    await store.append([submitted("a-1", "a", 1000), submitted("b-1", "b", 1010), submitted("a-2", "a", 1020)])
    return CountedQueueLog(store, "a")


@pytest.mark.parametrize(
    ("at", "jobs"),
    [
        pytest.param("@1005", {"a-1"}, id="time-between-its-jobs"),
        pytest.param("@1020", {"a-1", "a-2"}, id="time-of-its-last-event"),
        pytest.param("4", {"a-1"}, id="seq-of-another-queues-job"),
        pytest.param("5", {"a-1", "a-2"}, id="seq-at-the-end"),
    ],
)
async def test_a_point_inside_the_queues_log_is_read_once(store: EventStore, at: str, jobs: set[str]) -> None:
    """`jobs --scope a --at P` folds a's events up to P with one read of the stream, checking P on the way."""
    source = await scoped(store)
    point = parse_point(at)
    replayed = await state_at(await point_reader(source, point, "--at"), point)
    assert set(replayed.state.jobs) == jobs
    assert source.reads == 1


@pytest.mark.parametrize(
    ("at", "words"),
    [
        pytest.param("@1100", "is past the end of", id="time-past-its-last-event"),
        pytest.param("@900", "is before the start of", id="time-before-its-first-event"),
        pytest.param("9", "is past the end of", id="seq-past-the-stream"),
    ],
)
async def test_a_point_outside_the_queues_log_is_refused_after_one_read(store: EventStore, at: str, words: str) -> None:
    """A point outside what queue a's identity reads is a UsageError (exit 2) naming the log, after one read."""
    source = await scoped(store)
    point = parse_point(at)
    with pytest.raises(UsageError, match=words):
        await explain(await point_reader(source, point, "--at"), "a-1", point)
    assert source.reads == 1
