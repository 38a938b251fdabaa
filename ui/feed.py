"""The dashboard's memory: the live fold of the log, and the log as of any past point.

Role: give the pages the cluster state as of any point. The live state is
either the feed's own fold (`muster ui`: `run` folds the log from the start,
or from the newest stored snapshot when given some, then follows the stream)
or the daemon's (`share`: the daemon's scheduler loop folds, and calls the
feed after each event it folded; the dashboard reads that state and never
writes it, so there is no second fold of the log). Beside it, derived from
the log alone:
- past states (`moments.PastStates`): a checkpoint every `every` events
  without the ended jobs, so any point it passed costs a small decode and at
  most `every` events of fold; points before a fold joined midway (the
  daemon's warm start, a stored snapshot) come from the stored snapshots
  (`state_at`);
- the books (`books.Books`): the billing fold with its checkpoints and where
  each job's story starts. Beside a fold that did not start from the empty
  state they read the log on their own from the start, behind the live pages
  (the billing fold needs no cluster state);
- a thinned history of each queue's GPUs in use (sparklines), from where the
  feed started observing.

Invariants: the moment `at(point)` gives equals the fold of the log up to the
point (the rule of `replay.rebuild.state_at`), whether the point is the live
end or the past, and is told as of the point's own time (`Moment.now`, the
rule of `replay.points.as_of`), not that of the last event before it. A
failure in what the feed does after a daemon's event is logged and stops the
feed's observing; it never reaches the daemon's fold.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import anyio.lowlevel
import structlog

from muster.events.store import EventStore
from muster.events.types import Event
from muster.projections.cluster import evolve
from muster.projections.ledger import DEFAULT_GPU_LABEL, BillingState
from muster.projections.state import ClusterState
from muster.replay.heap import no_gc
from muster.replay.points import Point, as_of
from muster.replay.rebuild import state_at
from muster.replay.snapshots import Snapshots, Verify, fold_range
from muster.replay.source import LogSource
from muster.replay.views import queue_gpus_used
from muster.ui.books import Books
from muster.ui.moments import EVERY, Past, PastStates

HISTORY_POINTS = 240
SHARED_POLL = 0.05
"""Seconds between two looks at whether a shared fold has caught up with the log."""

log = structlog.get_logger("muster.ui")


class SharedFold(Protocol):
    """A fold of the log the feed shows instead of folding it again (the daemon's `SchedulerLoop`)."""

    @property
    def state(self) -> ClusterState: ...

    @property
    def folded_seq(self) -> int: ...

    @property
    def ready(self) -> bool:
        """Caught up with the log as it was at start."""
        ...

    def on_fold(self, callback: Callable[[int, Event, bool], None]) -> None: ...


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
        self.samples.append(Sample(seq, state.now, queue_gpus_used(state)))
        if len(self.samples) > self.limit:
            self.stride *= 2
            self.samples = [s for s in self.samples if s.seq % self.stride == 0]

    def until(self, seq: int) -> list[Sample]:
        return [s for s in self.samples if s.seq <= seq]


@dataclass
class Moment:
    """The log as of one point: the cluster state and the queue history up to it (`live`: the end, followed)."""

    state: ClusterState
    seq: int
    last_seq: int
    live: bool
    now: int
    """The time the moment is told as of: a time point's own (`@300` is t=300, though the last event before it
    came at t=150), else the last event's (`points.as_of`, as `jobs`, `queues` and `explain --at` tell it)."""
    history: list[Sample] = field(default_factory=list)


class Feed:
    """Folds `source` (then follows `store`, when given), or shows a shared fold, and gives the log at any point."""

    def __init__(
        self,
        source: LogSource,
        store: EventStore | None = None,
        *,
        every: int = EVERY,
        gpu_label: str = DEFAULT_GPU_LABEL,
        snapshots: Snapshots | None = None,
        verify: Verify = "marks",
    ) -> None:
        self.source = source
        self.verify = verify
        self.store = store
        self.snapshots = snapshots
        """Stored snapshots of the log, for points before the first checkpoint (a fold joined midway)."""
        self.past = PastStates(every, copy=False)
        self.books = Books(source, gpu_label=gpu_label)
        self.history = History()
        self.seq = 0
        self.target = 0
        """The end of the log when the first fold started (progress while catching up)."""
        self.ready = anyio.Event()
        self.broken: str | None = None
        """Why the feed stopped observing a shared fold (None: it did not)."""
        self._own = ClusterState()
        self._shared: SharedFold | None = None
        self._changed = anyio.Event()
        self._signalled = False
        self._past: Moment | None = None
        self._past_lock = anyio.Lock()

    @property
    def state(self) -> ClusterState:
        """The live state: the feed's own fold, or the shared one (read only)."""
        return self._shared.state if self._shared is not None else self._own

    def share(self, fold: SharedFold) -> None:
        """Show `fold`'s state instead of folding the log (before `run`); the feed observes each event it folds.

        The ended jobs the past states hold are then copies: no state the
        dashboard folds (a past point, a story) holds an object of the daemon's.
        """
        self._shared = fold
        self.past = PastStates(self.past.every, copy=True)
        fold.on_fold(self._on_shared)

    # ------------------------------------------------------------ folding

    async def run(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Fold to the end (or wait for the shared fold to), then follow; reports started at once.

        With stored snapshots the own fold starts from the newest trusted one,
        so the live pages answer after the log's tail; the books then read the
        log from the start behind them, as beside a shared fold.
        """
        task_status.started()
        if self._shared is not None:
            await self._run_shared(self._shared)
            return
        self.target = await self.source.last_seq()
        if self.snapshots is not None:
            loaded = await self.snapshots.nearest(max_seq=self.target, verify=self.verify)
            self._own, self.seq = loaded.state, loaded.seq
        warm = self.seq > 0
        self.past.begin(self._own, self.seq)
        async with anyio.create_task_group() as tg:
            async for batch in self.source.batches(self.seq + 1, self.target):
                with no_gc():
                    for seq, ev in batch:
                        self._fold(seq, ev, books=not warm)
                self._advanced()
                await anyio.lowlevel.checkpoint()  # a file log never awaits: let the server answer meanwhile
            self.seq = max(self.seq, self.target)
            if warm:
                tg.start_soon(self.books.follow, self.store)  # behind the live pages, not before them
            else:
                self.books.seq = self.seq
                self.books.ready.set()
            self.ready.set()
            self._advanced()
            if self.store is None:
                return
            async with contextlib.aclosing(self.store.follow(self.seq + 1)) as events:
                async for seq, ev in events:
                    self._fold(seq, ev, books=not warm)
                    self._advanced()

    def _fold(self, seq: int, ev: Event, *, books: bool) -> None:
        evolve(self._own, ev)
        self._observe(seq, ev, self._own)
        if books:
            self.books.observe(seq, ev)

    def _observe(self, seq: int, ev: Event, state: ClusterState) -> None:
        self.past.observe(seq, ev, state)
        self.history.observe(seq, state)
        self.seq = seq

    async def _run_shared(self, fold: SharedFold) -> None:
        while not fold.ready:  # the loop says so by a flag only: look after each event it folds, or now and then
            with anyio.move_on_after(SHARED_POLL):
                await self.changed()
        if self.past.first is None and self.broken is None:
            self._join(fold.state, fold.folded_seq)  # it folded nothing since we joined: start where it is
        self.target = self.seq
        self.ready.set()
        self._advanced()
        await self.books.follow(self.store)

    def _join(self, state: ClusterState, seq: int) -> None:
        self.past.begin(state, seq)
        self.seq = seq

    def _on_shared(self, seq: int, ev: Event, accepted: bool) -> None:
        if self.broken is not None or seq <= self.seq:
            return
        try:
            state = self._shared.state if self._shared is not None else self._own
            if self.past.first is None:
                self._join(state, seq)
            else:
                self._observe(seq, ev, state)
            self._advanced()
        except Exception as exc:  # the daemon's fold goes on; the dashboard keeps what it had
            self.broken = f"{type(exc).__name__}: {exc}"
            log.exception("the dashboard stopped following the daemon's fold", seq=seq)

    def _advanced(self) -> None:
        # called after every event of a shared fold: a flag, not a new Event each time
        if not self._signalled:
            self._signalled = True
            self._changed.set()

    async def changed(self) -> None:
        """Wait until the fold advances (after this call)."""
        if self._signalled:
            self._signalled = False
            self._changed = anyio.Event()
        await self._changed.wait()

    # ------------------------------------------------------------ reading

    @contextlib.asynccontextmanager
    async def at(self, point: Point) -> AsyncIterator[Moment]:
        """The log as of `point`, for the time a page is built from it.

        The end of the log is the live state. A past point is built from the
        last past moment when it lies ahead of it by at most `every` events (a
        slider moved forward, another page at the same point), else from the
        checkpoint before it (`state_at`). Past moments are built one at a
        time and their state belongs to the page being built until the block
        ends.
        """
        if point.time is None and (point.seq is None or point.seq >= self.seq):
            yield Moment(self.state, self.seq, self.seq, True, self.state.now, self.history.until(self.seq))
            return
        async with self._past_lock:
            yield await self._past_moment(point)

    async def _past_moment(self, point: Point) -> Moment:
        recent = self._past
        if (
            recent is not None
            and point.time is None
            and point.seq is not None
            and 0 <= point.seq - recent.seq <= self.past.every
        ):
            await fold_range(self.source, recent.state, recent.seq + 1, point.seq)
            moment = Moment(recent.state, point.seq, self.seq, False, recent.state.now, self.history.until(point.seq))
        else:
            # never past what this feed folded: its checkpoints and history end there
            upto = Point(seq=self.seq if point.seq is None else point.seq, time=point.time, text=point.text)
            past = await self.state_at(upto)
            now = as_of(point, past.state.now)
            moment = Moment(past.state, past.seq, self.seq, False, now, self.history.until(past.seq))
        self._past = moment
        return moment

    async def state_at(self, point: Point) -> Past:
        """A new state, the fold of the log up to `point` (not past the live end): the caller's to change."""
        if self.past.covers(point):
            return await self.past.state_at(self.source, point, self.seq)
        upto = Point(seq=self.seq if point.seq is None else min(point.seq, self.seq), time=point.time)
        replayed = await state_at(self.source, upto, self.snapshots, verify=self.verify)
        return Past(replayed.state, replayed.seq)

    async def billing_at(self, moment: Moment) -> BillingState:
        """The billing state (settled, rows summed by queue) as of a moment given by `at`, inside its block."""
        if moment.live or moment.seq >= self.books.seq:
            return self.books.live()
        return await self.books.at(moment.seq)
