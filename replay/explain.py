"""`explain`: a job's story from the log, and, for a waiting job, what would have to change for it to run.

Role: feed the log, up to a point, to a `Storyteller` (`story`, pure; the
numbers of a waiting job are `blockers`), from the start of the log or, in an
archived log, from the state sealed before the job's submission
(`replay.sealedstate`), so the story needs no events the archive dropped.
"""

from __future__ import annotations

from muster.replay.heap import no_gc
from muster.replay.points import Point, as_of
from muster.replay.rebuild import state_at
from muster.replay.sealedstate import Sealed, nearest_sealed
from muster.replay.source import ArchivedLog, LogSource
from muster.replay.story import Story, Storyteller


async def explain(source: LogSource, job: str, point: Point) -> tuple[Story, int]:
    """Fold the log up to `point`, telling `job`'s story; returns (story, the time it is told as of: the
    point's time, or that of the last event folded)."""
    last = await source.last_seq()
    end = point.seq if point.seq is not None else last
    start = await _before_submission(source, job, end, point.time) if isinstance(source, ArchivedLog) else None
    teller = Storyteller(job, start.state if start is not None else None)
    teller.story.told_from = start.seq if start is not None else 0
    async for batch in source.batches(teller.story.told_from + 1, end, until=point.time):
        with no_gc():  # not across the read (see `no_gc`)
            for seq, ev in batch:
                teller.step(seq, ev)
    teller.state.now = as_of(point, teller.state.now)  # the story told as of the time asked
    return teller.finish(), teller.state.now


async def _before_submission(log: ArchivedLog, job: str, end: int, until: int | None) -> Sealed | None:
    """The state sealed in the archive before `job` was submitted (its story starts after it), or None.

    Every event of the job's story comes at or after its submission, whose time the state at the
    point holds: a state sealed at an earlier time precedes all of them.
    """
    at_point = await state_at(log, Point(seq=end, time=until))
    found = at_point.state.jobs.get(job)
    if found is None:
        return None
    sealed = await nearest_sealed(log, max_seq=end, max_time=found.submitted_at - 1)
    return sealed if sealed.seq else None
