"""Past states of the log for the dashboard: dense in-memory checkpoints that leave the ended jobs out.

Role: keep, while a fold advances, what rebuilds the cluster state at any
sequence it passed, cheaply: on a long log most jobs have ended, and decoding
them is what made a far past point slow (a full snapshot of 1M events holds
~50,000 ended jobs). So:
- each ended job is kept once, in the order jobs ended (`ended`): the
  fold's own object, or a copy taken when it ended when the fold is another's
  (the daemon's);
- a checkpoint every `every` sequences keeps the state without its ended jobs
  (encoded as `replay.snapshotcodec` encodes a state: small, since only the live
  jobs, nodes and queues remain) and how many jobs had ended by then.
A past state is a checkpoint decoded, its ended jobs put back in the fold's
order (submission order), then a fold of at most `every` events.

Invariant: `state_at(point)` equals the fold of the log up to the point (the
rule of `replay.rebuild.state_at`). It holds because the fold never changes a
job once it is in `TERMINAL` (every handler of `projections.cluster` passes
over such a job) but for one field: `JobReleased` clears `held` of a job that
was held when it ended. A job counts as ended here only when it is terminal
and not held, so what is kept is final. Tests compare every checkpoint with a
fresh fold.

The live state is only read (encoded, and its ended jobs copied): the caller's
fold may be the daemon's own (`feed.SharedFold`), which the dashboard must
never change.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from dataclasses import dataclass

import msgspec

from muster.events.types import Event
from muster.projections.state import TERMINAL, ClusterState, JobState
from muster.replay.heap import no_gc
from muster.replay.points import Point
from muster.replay.snapshotcodec import decode_state, encode_state
from muster.replay.snapshots import fold_range
from muster.replay.source import LogSource

EVERY = 5_000
"""Events between two checkpoints: a past point costs at most this many events of fold."""

_submission = operator.attrgetter("seq")
_job_encoder = msgspec.msgpack.Encoder()
_job_decoder = msgspec.msgpack.Decoder(JobState)


def _copy(job: JobState) -> JobState:
    """A deep copy of an ended job (msgpack; JSON for a quantity past 64 bits, folded though rejected)."""
    try:
        return _job_decoder.decode(_job_encoder.encode(job))
    except OverflowError:
        return msgspec.json.decode(msgspec.json.encode(job), type=JobState)


@dataclass(frozen=True)
class Checkpoint:
    """The fold at `seq` (its latest event time `at`) without the first `ended` ended jobs, encoded in `fmt`."""

    seq: int
    at: int
    ended: int
    data: bytes
    fmt: str


@dataclass
class Past:
    """A state rebuilt for a point: the fold of sequences 1..seq."""

    state: ClusterState
    seq: int


class PastStates:
    """Checkpoints of a fold from sequence `first` on (`observe` after each event), and states rebuilt from them."""

    def __init__(self, every: int = EVERY, *, copy: bool = True) -> None:
        """`copy`: keep copies of the ended jobs, not the fold's own (a fold the caller must not reach into)."""
        if every < 1:
            raise ValueError("every must be at least 1")
        self.every = every
        self.copy = copy
        self.ended: list[JobState] = []
        """The ended jobs, in the order they ended; none is ever changed."""
        self._ended_ids: set[str] = set()
        self.checkpoints: list[Checkpoint] = []
        self._live: dict[str, None] = {}
        """Ids of the jobs not (yet) counted as ended, in the fold's order (a checkpoint keeps these)."""
        self._scanned = 0
        """How many of the fold's jobs (which only grow, in submission order) `_live` has seen."""
        self._due = 0
        """The next sequence a checkpoint is taken at (the next multiple of `every`)."""

    @property
    def first(self) -> int | None:
        """The first sequence this can rebuild (None: nothing observed yet)."""
        return self.checkpoints[0].seq if self.checkpoints else None

    def begin(self, state: ClusterState, seq: int) -> None:
        """Start from `state`, the fold of 1..seq (the empty state at 0, or a fold joined midway)."""
        for job in state.jobs.values():
            self._maybe_ended(job)
        self._checkpoint(state, seq)

    def observe(self, seq: int, ev: Event, state: ClusterState) -> None:
        """`state` has just folded `ev` at `seq`: keep the job it ended, and a checkpoint when one is due."""
        job_id = getattr(ev, "job", None)
        if isinstance(job_id, str):
            job = state.jobs.get(job_id)
            if job is not None and job.status in TERMINAL:  # most events leave their job running
                self._maybe_ended(job)
        if seq >= self._due:
            self._checkpoint(state, seq)

    def _maybe_ended(self, job: JobState) -> None:
        if job.status in TERMINAL and not job.held and job.id not in self._ended_ids:
            self._ended_ids.add(job.id)
            self._live.pop(job.id, None)
            self.ended.append(_copy(job) if self.copy else job)

    def _checkpoint(self, state: ClusterState, seq: int) -> None:
        ended, jobs = self._ended_ids, state.jobs
        with no_gc():
            for k in itertools.islice(jobs, self._scanned, None):  # the jobs submitted since the last one
                if k not in ended:
                    self._live[k] = None
            self._scanned = len(jobs)
            live = {k: jobs[k] for k in self._live}
            kept = msgspec.structs.replace(state, jobs=live)
            try:
                fmt, data = "msgpack+zlib", encode_state(kept, "msgpack+zlib")
            except OverflowError:  # msgpack holds 64-bit integers only, as for stored snapshots
                fmt, data = "json", encode_state(kept, "json")
        self.checkpoints.append(Checkpoint(seq, state.now, len(self.ended), data, fmt))
        self._due = (seq // self.every + 1) * self.every

    # ------------------------------------------------------------ reading

    def covers(self, point: Point) -> bool:
        """Whether a checkpoint lies at or before `point` (else the state comes from elsewhere)."""
        first = self.checkpoints[0] if self.checkpoints else None
        if first is None:
            return False
        return (point.seq is None or point.seq >= first.seq) and (point.time is None or point.time >= first.at)

    def restore(self, checkpoint: Checkpoint) -> ClusterState:
        """The fold at the checkpoint: its state with the jobs ended by then put back, in submission order."""
        with no_gc():
            state = decode_state(checkpoint.data, checkpoint.fmt)
            jobs = [*state.jobs.values(), *self.ended[: checkpoint.ended]]
            jobs.sort(key=_submission)  # two runs already nearly in order: a merge, not a sort
            state.jobs = {j.id: j for j in jobs}
        state.reset_bookkeeping()
        return state

    async def state_at(self, source: LogSource, point: Point, last: int) -> Past:
        """The fold of the log up to `point` (not past `last`), from the checkpoint before it; `covers(point)`."""
        target = last if point.seq is None else min(point.seq, last)
        seqs = [c.seq for c in self.checkpoints]
        i = bisect.bisect_right(seqs, target) - 1
        while point.time is not None and i > 0 and self.checkpoints[i].at > point.time:
            i -= 1
        checkpoint = self.checkpoints[i]
        state = self.restore(checkpoint)
        folded_to, folded = await fold_range(source, state, checkpoint.seq + 1, target, until=point.time)
        if folded:
            return Past(state, folded_to)
        return Past(state, target if point.time is None else checkpoint.seq)
