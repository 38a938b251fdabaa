"""The dashboard's memory: one fold of the log, kept current, and the log as of any past point.

Role: fold the log once from the start into the cluster state
(`projections.cluster.evolve`) and the billing state
(`projections.billing.evolve_billing`), then follow the stream. While folding
it keeps, all derived from the log alone:
- in-memory snapshots of the cluster state every `every` events
  (`replay.snapshots.Snapshotter`, verified by construction: folded from the
  empty state), so `replay.rebuild.state_at` reaches any point by folding at
  most `every` events;
- billing checkpoints at the same sequences: the tracker's bytes and the
  ledger rows accrued since the previous checkpoint, so the ledger at a past
  point is the sum of the deltas before it plus a short fold. The rows are
  kept summed per queue and priority class (`by_queue`): the dashboard bills
  by queue and GPU model, and a report by queue is the same over the sums
  (every column is additive; prices depend on hour, model and class only);
- a thinned history of each queue's GPUs in use (sparklines).

Invariant: the moment `at(point)` gives equals the fold of the log up to the
point (the rule of `state_at`), whether the point is the live end or the past.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import msgspec

from muster.events.store import EventStore
from muster.events.types import JobSubmitted
from muster.projections.billing import (
    DEFAULT_GPU_LABEL,
    BillingState,
    Ledger,
    decode_tracker,
    drain,
    encode_tracker,
    evolve_billing,
    merge_into,
    new_billing_state,
    settle,
)
from muster.projections.cluster import ClusterState, evolve
from muster.replay.points import Point
from muster.replay.rebuild import state_at
from muster.replay.snapshots import MemorySnapshots, Snapshots, Snapshotter, fold_range, no_gc
from muster.replay.source import LogSource

HISTORY_POINTS = 240
EVERY = 25_000
"""Events between two in-memory snapshots: a past point costs at most this many events of fold."""


@dataclass(frozen=True)
class Sample:
    """One point of the queue history: GPUs in use per queue after the event at `seq`."""

    seq: int
    at: int
    used: dict[str, int]


class History:
    """At most `limit` samples over the whole log: one every `stride` sequences, the stride doubling when full.

    Samples fall on multiples of the stride, so the same log gives the same
    history whatever batches it was read in.
    """

    def __init__(self, limit: int = HISTORY_POINTS, stride: int = 16) -> None:
        self.limit = limit
        self.stride = stride
        self.samples: list[Sample] = []

    def observe(self, seq: int, state: ClusterState) -> None:
        if seq % self.stride:
            return
        used = {name: q.usage.get("gpu", 0) for name, q in state.queues.items()}
        self.samples.append(Sample(seq, state.now, used))
        if len(self.samples) > self.limit:
            self.stride *= 2
            self.samples = [s for s in self.samples if s.seq % self.stride == 0]

    def until(self, seq: int) -> list[Sample]:
        return [s for s in self.samples if s.seq <= seq]


def by_queue(ledger: Ledger) -> Ledger:
    """The ledger's usage rows summed per (queue and priority class, hour, GPU model); capacity and queues kept.

    The row key's job part becomes `QUEUE CLASS`: `build_report(by="queue")`,
    which groups by `Usage.queue` and prices per hour, model and class, gives
    the same report over these rows as over the per-job ones (tested).
    """
    out = Ledger(capacity=dict(ledger.capacity), queues=dict(ledger.queues))
    for (_job, hour, model), row in ledger.usage.items():
        key = (f"{row.queue} {row.priority_class}", hour, model)
        have = out.usage.get(key)
        if have is None:
            out.usage[key] = msgspec.structs.replace(row)
        else:
            have.add(row)
    return out


@dataclass
class Checkpoint:
    """The billing fold at `seq`: its tracker, and the ledger rows accrued since the previous checkpoint."""

    seq: int
    tracker: bytes
    delta: Ledger


@dataclass
class Moment:
    """The log as of one point: the cluster state and the queue history up to it (`live`: the end, followed)."""

    state: ClusterState
    seq: int
    last_seq: int
    live: bool
    history: list[Sample] = field(default_factory=list)


class Feed:
    """Folds `source` (then follows `store`, when given) and gives the log as of any point (`at`)."""

    def __init__(
        self,
        source: LogSource,
        store: EventStore | None = None,
        *,
        every: int = EVERY,
        gpu_label: str = DEFAULT_GPU_LABEL,
    ) -> None:
        self.source = source
        self.store = store
        self.gpu_label = gpu_label
        self.state = ClusterState()
        self.billing = new_billing_state(gpu_label)
        self.ledger = Ledger()
        """Every billing row drained so far, summed `by_queue` (the live ledger)."""
        self.checkpoints: list[Checkpoint] = [Checkpoint(0, encode_tracker(self.billing.tracker), Ledger())]
        self.snapshots = Snapshots(MemorySnapshots(), source)
        self.writer = Snapshotter(self.snapshots, every, trusted_from=0)
        self.history = History()
        self.submissions: dict[str, int] = {}
        """Job id -> sequence of its (first) JobSubmitted: where its story starts."""
        self.seq = 0
        self.target = 0
        """The end of the log when the first fold started (progress while catching up)."""
        self.ready = anyio.Event()
        self._changed = anyio.Event()
        self._past: Moment | None = None
        self._past_billing: tuple[int, BillingState] | None = None
        self._past_lock = anyio.Lock()

    # ------------------------------------------------------------ folding

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Fold to the end, then follow the stream (a file log ends there); reports started at once."""
        task_status.started()
        self.target = await self.source.last_seq()
        async for batch in self.source.batches(1, self.target):
            with no_gc():
                for seq, ev in batch:
                    self._fold(seq, ev)
                    if self.writer.due(seq):
                        await self._snapshot(seq)
            self._advanced()
            await anyio.lowlevel.checkpoint()  # a file log never awaits: let the server answer meanwhile
        self.seq = max(self.seq, self.target)
        self.ready.set()
        self._advanced()
        if self.store is None:
            return
        async with contextlib.aclosing(self.store.follow(self.seq + 1)) as events:
            async for seq, ev in events:
                self._fold(seq, ev)
                if self.writer.due(seq):
                    await self._snapshot(seq)
                self._advanced()

    def _fold(self, seq: int, ev: Any) -> None:
        evolve(self.state, ev)
        evolve_billing(self.billing, seq, ev)
        if isinstance(ev, JobSubmitted):
            self.submissions.setdefault(ev.job, seq)
        self.seq = seq
        self.history.observe(seq, self.state)

    async def _snapshot(self, seq: int) -> None:
        await self.writer.maybe_snapshot(self.state, seq)
        self._checkpoint(seq)

    def _checkpoint(self, seq: int) -> None:
        delta = by_queue(drain(self.billing))
        merge_into(self.ledger, delta)
        tracker = encode_tracker(self.billing.tracker)
        last = self.checkpoints[-1]
        if last.seq == seq:  # a reader settled again at the same point: one checkpoint per sequence
            merge_into(last.delta, delta)
            last.tracker = tracker
        else:
            self.checkpoints.append(Checkpoint(seq, tracker, delta))

    def _advanced(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def changed(self) -> None:
        """Wait until the fold advances."""
        await self._changed.wait()

    # ------------------------------------------------------------ reading

    @contextlib.asynccontextmanager
    async def at(self, point: Point) -> AsyncIterator[Moment]:
        """The log as of `point`, for the time a page is built from it.

        The end of the log is the live fold. A past point is built from the
        last past moment when it lies ahead of it by at most `every` events (a
        slider moved forward, another page at the same point: no snapshot to
        decode), else from the nearest snapshot (`state_at`). Past moments are
        built one at a time and their state belongs to the page being built
        until the block ends.
        """
        if point.time is None and (point.seq is None or point.seq >= self.seq):
            yield Moment(self.state, self.seq, self.seq, True, self.history.until(self.seq))
            return
        async with self._past_lock:
            yield await self._past_moment(point)

    async def _past_moment(self, point: Point) -> Moment:
        recent = self._past
        if (
            recent is not None
            and point.time is None
            and point.seq is not None
            and 0 <= point.seq - recent.seq <= self.writer.every
        ):
            await fold_range(self.source, recent.state, recent.seq + 1, point.seq)
            moment = Moment(recent.state, point.seq, self.seq, False, self.history.until(point.seq))
        else:
            # never past what this feed folded: its snapshots and history end there
            upto = Point(seq=self.seq if point.seq is None else point.seq, time=point.time, text=point.text)
            replayed = await state_at(self.source, upto, self.snapshots)
            moment = Moment(replayed.state, replayed.seq, self.seq, False, self.history.until(replayed.seq))
        if self._past_billing is not None and self._past_billing[0] != moment.seq:
            self._past_billing = None
        self._past = moment
        return moment

    async def billing_at(self, moment: Moment) -> BillingState:
        """The billing state (settled, rows `by_queue`) as of a moment given by `at`, inside its block.

        Live: the running jobs are booked up to now and the rows kept as a
        checkpoint (sums do not depend on where runs are cut). Past: the deltas
        up to the checkpoint before it, then a fold.
        """
        if moment.live:
            settle(self.billing)
            self._checkpoint(self.seq)
            return BillingState(tracker=self.billing.tracker, ledger=self.ledger)
        if self._past_billing is not None:
            return self._past_billing[1]
        seq = moment.seq
        base = next(c for c in reversed(self.checkpoints) if c.seq <= seq)
        state = BillingState(tracker=decode_tracker(base.tracker), ledger=Ledger())
        for c in self.checkpoints:
            if c.seq > base.seq:
                break
            merge_into(state.ledger, c.delta)
        if seq > base.seq:
            with no_gc():
                async for batch in self.source.batches(base.seq + 1, seq):
                    for s, ev in batch:
                        evolve_billing(state, s, ev)
        settle(state)
        state.ledger = by_queue(state.ledger)  # the deltas' sums and the fold's per-job rows, summed alike
        self._past_billing = (seq, state)
        return state
