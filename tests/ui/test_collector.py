"""The dashboard folds the log with the garbage collector off, but never while it waits for the log.

The collector is the process's: left off across a read (a NATS fetch), every other task of the
server, or of a daemon serving it, ran with it off meanwhile. Each reader here goes through a log
that awaits before every batch, as a network log does, and notes whether the collector was on
while it waited.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import anyio.lowlevel
import pytest
from uikit import IDLE, memory_log, sim

from muster.events.reading import StoredEvent
from muster.replay.explain import explain
from muster.replay.points import END, Point
from muster.replay.snapshots import fold_range
from muster.replay.source import LogSource
from muster.ui import pages
from muster.ui.books import Books
from muster.ui.feed import Feed


class AwaitingLog:
    """A log that awaits before handing each batch over, noting whether the collector is on then."""

    def __init__(self, inner: LogSource) -> None:
        self.inner = inner
        self.name = inner.name
        self.collector_on: list[bool] = []

    async def last_seq(self) -> int:
        return await self.inner.last_seq()

    async def batches(
        self, from_seq: int = 1, to_seq: int | None = None, *, until: int | None = None
    ) -> AsyncIterator[list[StoredEvent]]:
        async for batch in self.inner.batches(from_seq, to_seq, until=until):
            await anyio.lowlevel.checkpoint()  # another task runs here
            self.collector_on.append(gc.isenabled())
            yield batch

    async def raw(self, seq: int) -> bytes | None:
        return await self.inner.raw(seq)


async def _past_billing(log: AwaitingLog, last: int) -> object:
    books = Books(log, every=7)
    await books.follow(None)
    return await books.at(last - 3)  # from the checkpoint before it: a fold that reads the log


async def _story_page(log: AwaitingLog, last: int) -> object:
    feed = Feed(log, every=3)
    await feed.run()
    async with feed.at(END) as moment:
        return [await pages.job(feed, moment, job_id) for job_id in moment.state.jobs]


async def _fold_range(log: AwaitingLog, last: int) -> object:
    from muster.projections.state import ClusterState

    return await fold_range(log, ClusterState(), 1, last)


async def _explain(log: AwaitingLog, last: int) -> object:
    return await explain(log, "a", Point(seq=last))


@pytest.mark.parametrize(
    "reader",
    [
        pytest.param(_past_billing, id="chargeback-at-a-past-point"),
        pytest.param(_story_page, id="job-story-page"),
        pytest.param(_fold_range, id="fold-range"),
        pytest.param(_explain, id="explain"),
    ],
)
async def test_the_collector_is_on_while_a_reader_waits_for_the_log(
    reader: Callable[[AwaitingLog, int], Awaitable[object]],
) -> None:
    """Every wait for a batch happens with the collector on, and it is on again when the reader returns."""
    events = sim(IDLE).events
    log = AwaitingLog(memory_log(events))
    await reader(log, len(events))
    assert log.collector_on, "the reader read nothing"
    assert all(log.collector_on), f"collector off during {log.collector_on.count(False)} reads"
    assert gc.isenabled()
