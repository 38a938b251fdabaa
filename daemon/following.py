"""Following the log: the replica's fold of it, kept up to date.

Every replica, leading or not, folds the whole log into one `ClusterState`
with the `evolve` that `muster sim` and the audit tools use: first what the
stream holds at start (`replay`, in batches, from the newest verified
snapshot when there is one: `warmstart`), then each new event as the
follower task brings it (`follow` into a buffer that the loop drains). The
loop also folds its own appends at once (`fold`), when they land right after
what it folded, so a cycle decides on them without waiting for the follower.

Invariants:
- One task folds, in log order, each sequence once; the state is the fold of
  the log up to `folded_seq`. Bad messages are reported by the store, counted
  once, and passed over once everything before them is folded.
- A fold error is logged and counted, never raised (design invariant 7).
- A hole is never folded past: events after `folded_seq` that left the stream
  unread (purged, dropped by limits; without an archive that holds them) stop
  the replica with LogHole, logged with the missing range, at the start
  (before it campaigns for the lease) or while following.
- Draining is bounded per call and checkpoints between chunks, so a replica
  far behind never holds the event loop (and the lease refresh on it) for long.
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Callable, Iterator, Sequence

import anyio
import anyio.lowlevel
import structlog

from muster.daemon.metrics import DaemonMetrics
from muster.daemon.warmstart import Start, StartingPoint
from muster.events.store import BadEvent, EventStore, LogHole, StoredEvent
from muster.events.types import Event
from muster.projections.cluster import evolve
from muster.projections.state import ClusterState

__all__ = ["FoldListener", "LogFollower"]

log = structlog.get_logger("muster.loop")

FoldListener = Callable[[int, Event, bool], None]
"""`listener(seq, event, accepted)`: called for every event folded (accepted: not skipped or fenced by the fold)."""


class LogFollower:
    """The fold of the log up to `folded_seq`, and the buffer of what the follower task brought since."""

    def __init__(self, store: EventStore, metrics: DaemonMetrics, *, buffer: int, catch_up_timeout: float) -> None:
        self.store = store
        self.metrics = metrics
        self.catch_up_timeout = catch_up_timeout
        self.state = ClusterState()
        self.folded_seq = 0
        self.stream_end = 0
        self.dirty = False
        """Something was folded that this replica did not decide itself (a cycle may have work)."""
        self.on_accepted: Callable[[Event], None] = lambda event: None
        self.listeners: list[FoldListener] = []
        self._bad: list[int] = []
        """Heap of the sequences of bad messages not yet passed by the fold."""
        self._bad_seen: set[int] = set()
        self._send, self._recv = anyio.create_memory_object_stream[StoredEvent | None](buffer)
        store.on_bad = self._on_bad

    # ------------------------------------------------------------ the follower's buffer

    def poke(self) -> None:
        """Wake whoever waits in `receive` (a leadership change, a bad event)."""
        with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._send.send_nowait(None)

    async def receive(self) -> None:
        """Wait for the follower to bring an event (or for a poke), and fold it."""
        self._take(await self._recv.receive())

    def close(self) -> None:
        self._send.close()
        self._recv.close()

    # ------------------------------------------------------------ reading

    async def start_from(self, start: StartingPoint) -> Start | None:
        """Take `start`'s state (a warm start) if it has one for the stream as it ends now; before `replay`."""
        assert self.folded_seq == 0, "a warm start replaces the empty state only"
        with self._holes():
            trusted = await start.load(await self.store.last_seq())
        if trusted is not None:
            self.state, self.folded_seq = trusted.state, trusted.seq
            self.metrics.folded_seq.set(trusted.seq)
        return trusted

    async def replay(self) -> None:
        """Fold what the stream holds now, in batches (the fast path for a restart)."""
        end = await self.store.last_seq()
        self.stream_end = end
        with self._holes():
            await self.store.check_holds(self.folded_seq + 1)
        if end <= self.folded_seq:
            return
        async with contextlib.aclosing(self.store.iter_batches(self.folded_seq + 1, end)) as batches:
            async for batch in batches:
                for stored in batch:
                    self.fold(stored.seq, stored.event)
        self._skip_bad(end + 1)

    async def follow(self) -> None:
        """Bring every event after `folded_seq` into the buffer, forever (run as a task)."""
        with self._holes():
            async with (
                self._send.clone() as send,
                contextlib.aclosing(self.store.follow(self.folded_seq + 1)) as events,
            ):
                async for stored in events:
                    try:  # no trip through the event loop per event while the buffer has room
                        send.send_nowait(stored)
                    except anyio.WouldBlock:
                        await send.send(stored)

    @contextlib.contextmanager
    def _holes(self) -> Iterator[None]:
        """Say which events are missing when the log has a hole, and let LogHole stop the replica."""
        try:
            yield
        except LogHole as hole:
            log.error(
                "the log has a hole: events left the stream unread; not folding past them",
                stream=hole.stream,
                missing=f"{hole.first}..{hole.last}",
                folded=self.folded_seq,
                error=str(hole),
                hint="an archive (archive.directory or archive.bucket) that sealed them lets a replica start",
            )
            raise

    async def watch_lag(self, every: float) -> None:
        """Keep the lag metric (stream end - folded) current, forever (run as a task)."""
        while True:
            await anyio.sleep(every)
            try:
                self.stream_end = max(self.stream_end, await self.store.last_seq())
            except Exception as exc:  # NATS away: the follower waits it out
                log.debug("stream info failed", error=str(exc))
            self.metrics.lag.set(max(0, self.stream_end - self.folded_seq))

    def _on_bad(self, bad: BadEvent) -> None:
        # every reader of the store reports here, possibly more than once per message: count each once
        if bad.seq in self._bad_seen or bad.seq <= self.folded_seq:
            return
        self._bad_seen.add(bad.seq)
        log.warning("bad event skipped", seq=bad.seq, subject=bad.subject, error=bad.error)
        self.metrics.bad_events.inc()
        heapq.heappush(self._bad, bad.seq)
        self.poke()

    def _skip_bad(self, before: int) -> None:
        """Count bad sequences below `before` as folded, once everything before them is."""
        while self._bad and self._bad[0] < before:
            seq = heapq.heappop(self._bad)
            self._bad_seen.discard(seq)
            if seq == self.folded_seq + 1:
                self.folded_seq = seq

    # ------------------------------------------------------------ folding

    def fold(self, seq: int, event: Event, *, own: bool = False) -> None:
        """Fold `event` at `seq` (once; `own`: decided by this replica, so no reason for another cycle)."""
        if seq <= self.folded_seq:
            return
        self._skip_bad(seq)
        state = self.state
        skipped, fenced = state.skipped, state.fenced
        try:
            evolve(state, event)
        except Exception:
            # Invariant 7: a fold error is a bug to report, never a reason to stop.
            log.exception("fold failed; event skipped", seq=seq, type=type(event).__name__)
            self.metrics.fold_errors.inc()
            state.skipped += 1
        self.folded_seq = seq
        self.stream_end = max(self.stream_end, seq)
        self.metrics.folded_seq.set(seq)
        accepted = state.skipped == skipped and state.fenced == fenced
        if accepted:
            self.on_accepted(event)
        if not own:
            self.dirty = True
        for listener in self.listeners:
            listener(seq, event, accepted)

    def fold_appended(self, seqs: Sequence[int], events: Sequence[Event], *, own: bool = False) -> bool:
        """Fold what this replica just appended, if it landed right after what is folded; whether it did.

        A message the store took for a repeat (its msg id already stored) answers with the first
        copy's sequence: a repeat of one earlier in the same batch, or of one already folded, is
        passed over (the log holds the first copy, which is what gets folded).
        """
        end = self.folded_seq
        fresh: list[tuple[int, Event]] = []
        for seq, event in zip(seqs, events, strict=True):
            if seq == end + 1:
                fresh.append((seq, event))
                end = seq
            elif seq > end:
                return False  # someone else's events in between, or earlier copies: the follower brings them
        for seq, event in fresh:
            self.fold(seq, event, own=own)
        return True

    def _take(self, item: StoredEvent | None) -> None:
        if item is not None:
            self.fold(item.seq, item.event)

    async def drain(self, limit: int = 10_000, chunk: int = 1000) -> None:
        """Fold what the follower has buffered (at most `limit`), `chunk` events at a time with a checkpoint between.

        A replica far behind (a long pause, a busy cycle) may find tens of
        thousands buffered: folded in one go they would hold the event loop
        (and the lease refresh on it) for seconds. The limit lets the caller
        look at its lease however fast the log grows.
        """
        for _ in range(0, limit, chunk):
            for _ in range(chunk):
                try:
                    item = self._recv.receive_nowait()
                except anyio.WouldBlock:
                    self._skip_bad(self.folded_seq + 2)
                    return
                self._take(item)
            await anyio.lowlevel.checkpoint()
        self._skip_bad(self.folded_seq + 2)

    async def catch_up(self, target: int) -> bool:
        """Fold until `folded_seq >= target`; False if that took longer than the catch-up timeout."""
        with anyio.move_on_after(self.catch_up_timeout):
            while self.folded_seq < target:
                self._skip_bad(self.folded_seq + 2)
                if self.folded_seq >= target:
                    break
                self._take(await self._recv.receive())
            return True
        log.warning("catching up with the log timed out", folded=self.folded_seq, target=target)
        return False
