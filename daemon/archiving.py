"""The leader's sealer: the stream's past goes into the archive, and only then off the stream.

The stream keeps a bounded window (`retention` in the daemon's config: age and
bytes); `muster replay`, `explain`, `audit` and `whatif` read the archive's
sealed segments and then the window as one log (`replay.source.ArchivedLog`).
While its replica leads, the sealer runs as a term service; every `interval`
seconds it
1. seals the messages after the archive's end in whole segments of
   `segment_events` (`events.archive.seal_new`), one every `state_every`
   events with the state before its first sequence (`replay.sealedstate`),
   into a directory or a JetStream object store bucket
   (`events.archive.open_archive`);
2. purges the stream before the first message it must keep (`keep_from`):
   the first one not sealed, not acknowledged by every configured consumer,
   or still inside the window, whichever comes first.
JetStream's own limits on the stream are a safety ceiling well above the window
(`retention.ceiling_factor`), reached only when no sealer has run for long.

Invariants:
- One writer: only the leader seals and purges (a term service), so segments
  never race; a segment is contiguous with the archive's end or refused.
- Nothing leaves the stream before it is sealed, nor before every configured
  durable consumer (billing's, `consumers`) has acknowledged it: the stream
  still holds what a lagging reader has to read. A consumer that does not
  exist yet holds sealing and purging back (floor 0).
- A sealed state is the fold of everything before its segment: it is folded
  on from the state sealed in an earlier segment (or the empty state) through
  the archived events in between.
- Trouble (NATS, the archive's disk, events that left the stream before they
  were sealed: a hole) is logged and counted, never stops the term; the next
  pass tries again. A stream created with `deny_purge` (NATS never lifts it)
  is sealed but not purged, and said so once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio
import structlog

from muster.daemon.warmstart import Start
from muster.events.archive import Archive, SegmentRef, seal_new
from muster.events.store import EventStore, Retention, StoreError
from muster.replay.points import Point
from muster.replay.rebuild import state_at
from muster.replay.sealedstate import Sealed, nearest_sealed, seal_state
from muster.replay.snapshots import Snapshots, fold_range
from muster.replay.snapshotstores import SnapshotBackend
from muster.replay.source import ArchivedLog, NatsLog

if TYPE_CHECKING:
    from muster.daemon.loop import SchedulerLoop
    from muster.daemon.terms import Term

__all__ = ["ArchiveStart", "Pass", "Sealer", "SealerOptions", "keep_from"]

log = structlog.get_logger("muster.archive")

NO_LIMIT = Retention()


@dataclass(frozen=True)
class SealerOptions:
    segment_events: int = 10_000
    """Messages per segment (the last, partial one waits until it is whole)."""
    interval: float = 30.0
    """Seconds between passes."""
    consumers: Sequence[str] = ("muster-billing",)
    """Durable consumers of the stream whose ack floor sealing and purging never pass."""
    window: Retention = NO_LIMIT
    """What the stream keeps (age and bytes); older sealed messages are purged. No limit: nothing is purged."""
    state_every: int = 50_000
    """A segment holds the state at its start when the last state sealed is at least this many events older."""


class Pass(NamedTuple):
    """What one pass did: the segments it sealed and the messages it purged."""

    sealed: list[SegmentRef]
    purged: int


def keep_from(*, sealed: int, floor: int, window_start: int) -> int:
    """The first sequence the stream must keep: unsealed, unacknowledged by a consumer, or in the window."""
    return min(sealed + 1, floor + 1, window_start)


class Sealer:
    def __init__(
        self,
        store: EventStore,
        archive: Archive,
        options: SealerOptions | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.archive = archive
        self.options = options or SealerOptions()
        self.clock = clock
        """Wall-clock seconds, for the window's age (JetStream's messages carry wall-clock times)."""
        self.failures = 0
        """Passes that failed (logged), for tests and metrics."""
        self.purge_denied = False
        """The stream was created with `deny_purge`: the sealer only seals (said once)."""

    async def floor(self) -> int:
        """The last sequence every configured consumer has acknowledged (the stream's end without any)."""
        floor = await self.store.last_seq()
        for durable in self.options.consumers:
            try:
                info: Any = await self.store.js.consumer_info(self.store.stream, durable)
            except Exception as exc:  # not there yet, or NATS trouble: seal nothing past what it might need
                log.info("a consumer's position is unknown; sealing waits for it", consumer=durable, error=str(exc))
                return 0
            floor = min(floor, int(info.ack_floor.stream_seq or 0))
        return floor

    async def window_start(self, state: Any) -> int:
        """The first sequence the window keeps: none older than `max_age`, at most `max_bytes` from the end.

        Bytes are counted at the stream's (`state`, JetStream's) average stored size per message.
        """
        window = self.options.window
        start = int(state.first_seq)
        if window.max_bytes and state.messages and state.bytes > window.max_bytes:
            kept = int(window.max_bytes // (state.bytes / state.messages))
            start = max(start, int(state.last_seq) + 1 - kept)
        if window.max_age:
            start = max(start, await self.store.first_seq_since(self.clock() - window.max_age))
        return start

    async def seal(self) -> list[SegmentRef]:
        """Seal every whole segment up to the floor, each with the state before it."""
        through = await self.floor()
        whole = ArchivedLog(self.archive, NatsLog(self.store))  # one pass's: it keeps the segment it read last
        start: Sealed | None = None

        async def state_before(seq: int) -> bytes:
            # folded on from the last state sealed (in this pass, else the archive's nearest) when one is due
            nonlocal start
            if start is None:
                start = await nearest_sealed(whole, max_seq=seq - 1)
            if seq - 1 - start.seq < self.options.state_every:
                return b""
            await fold_range(whole, start.state, start.seq + 1, seq - 1)
            start.seq = seq - 1
            return seal_state(start.state, start.seq)

        sealed = await seal_new(
            self.store, self.archive, through=through, every=self.options.segment_events, snapshot_at=state_before
        )
        if sealed:
            log.info("sealed", segments=len(sealed), first=sealed[0].first, last=sealed[-1].last, floor=through)
        return sealed

    async def purge(self) -> int:
        """Drop from the stream what is sealed, acknowledged and past the window; how many messages went."""
        window = self.options.window
        if not (window.max_age or window.max_bytes):
            return 0
        info: Any = await self.store.js.stream_info(self.store.stream)
        if info.config.deny_purge:
            if not self.purge_denied:  # once: the stream cannot change, and its own limits do the dropping
                log.warning(
                    "the stream denies purge (created so; NATS never lifts it): its own limits stay its window",
                    stream=self.store.stream,
                )
            self.purge_denied = True
            return 0
        refs = await self.archive.segments()
        first = keep_from(
            sealed=refs[-1].last if refs else 0,
            floor=await self.floor(),
            window_start=await self.window_start(info.state),
        )
        if first <= info.state.first_seq:
            return 0
        purged = await self.store.purge_before(first)
        log.info("purged", before=first, messages=purged)
        return purged

    async def step(self) -> Pass:
        """One pass: seal, then purge."""
        sealed = await self.seal()
        return Pass(sealed, await self.purge())

    async def run(self, loop: SchedulerLoop, term: Term) -> None:
        """A term service: a pass every `interval` seconds while the term lasts."""
        while True:
            try:
                await self.step()
            except Exception as exc:  # the next pass tries again; the term goes on
                self.failures += 1
                log.error("sealing failed", error=f"{type(exc).__name__}: {exc}", archive=self.archive.name)
            await anyio.sleep(self.options.interval)


class ArchiveStart:
    """Where a replica's fold starts when the stream's past may be in the archive (a `warmstart.StartingPoint`).

    The stream alone would start a fold at its first message, silently without the purged past
    (JetStream reads from a purged sequence start later). This folds archive and stream as one
    log up to the stream's end, from the nearest trusted state: a snapshot of the sidecar's
    `snapshots` (checked against the archive where the stream no longer holds its event) or a
    state sealed with a segment. A hole (events that left unsealed) raises StoreError: a replica
    never starts on a log with its past missing.
    """

    ATTEMPTS = 3
    """A purge between listing the segments and reading the stream looks like a hole: list again."""

    def __init__(self, store: EventStore, archive: Archive, snapshots: SnapshotBackend | None = None) -> None:
        self.store = store
        self.archive = archive
        self.snapshots = snapshots

    async def load(self, end: int) -> Start | None:
        for attempt in range(1, self.ATTEMPTS + 1):
            whole = ArchivedLog(self.archive, NatsLog(self.store))
            snapshots = Snapshots(self.snapshots, whole) if self.snapshots is not None else None
            try:
                replayed = await state_at(whole, Point(seq=end), snapshots)
            except StoreError as exc:
                if attempt == self.ATTEMPTS:
                    raise
                log.warning("reading archive and stream failed; reading again", error=str(exc))
                continue
            except Exception as exc:  # the snapshots' bucket, not the log: go on without them
                if snapshots is None:
                    raise
                log.warning("cannot use the snapshots; folding without them", error=f"{type(exc).__name__}: {exc}")
                self.snapshots = None
                continue
            log.info(
                "starting from archive and stream",
                seq=replayed.seq,
                snapshot=replayed.snapshot.seq if replayed.snapshot is not None else None,
                sealed_state=replayed.sealed,
                folded=replayed.folded,
            )
            return Start(replayed.state, replayed.seq) if replayed.seq else None
        return None
