"""The leader's sealer: the stream's past goes into the archive before the stream's window drops it.

The stream keeps a bounded window (JetStream's `max_age` and `max_bytes`,
`retention` in the daemon's config); `muster replay`, `explain`, `audit` and
`whatif` read the archive's sealed segments and then the window as one log
(`replay.source.ArchivedLog`). While its replica leads, the sealer runs as a
term service: every `interval` seconds it seals the messages after the
archive's end in whole segments of `segment_events` (`events.archive.seal_new`),
into a directory or a JetStream object store bucket (`events.archive.open_archive`).

Invariants:
- One writer: only the leader seals (a term service), so segments never
  race; a segment is contiguous with the archive's end or refused.
- Sealing never passes the ack floor of a configured durable consumer
  (billing's, `consumers`): what is sealed is what every such reader has
  consumed, and the segment is the copy a reader that fell behind reads
  again. A consumer that does not exist yet holds sealing back (floor 0).
- Trouble (NATS, the archive's disk, events that left the window before
  they were sealed: a hole) is logged and counted, never stops the term;
  the next pass tries again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import structlog

from muster.events.archive import Archive, SegmentRef, seal_new
from muster.events.store import EventStore

if TYPE_CHECKING:
    from muster.daemon.loop import SchedulerLoop
    from muster.daemon.terms import Term

__all__ = ["Sealer", "SealerOptions"]

log = structlog.get_logger("muster.archive")


@dataclass(frozen=True)
class SealerOptions:
    segment_events: int = 10_000
    """Messages per segment (the last, partial one waits until it is whole)."""
    interval: float = 30.0
    """Seconds between passes."""
    consumers: Sequence[str] = ("muster-billing",)
    """Durable consumers of the stream whose ack floor sealing never passes."""


class Sealer:
    def __init__(self, store: EventStore, archive: Archive, options: SealerOptions | None = None) -> None:
        self.store = store
        self.archive = archive
        self.options = options or SealerOptions()
        self.failures = 0
        """Passes that failed (logged), for tests and metrics."""

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

    async def seal(self) -> list[SegmentRef]:
        """One pass: seal every whole segment up to the floor."""
        through = await self.floor()
        sealed = await seal_new(self.store, self.archive, through=through, every=self.options.segment_events)
        if sealed:
            log.info("sealed", segments=len(sealed), first=sealed[0].first, last=sealed[-1].last, floor=through)
        return sealed

    async def run(self, loop: SchedulerLoop, term: Term) -> None:
        """A term service: seal every `interval` seconds while the term lasts."""
        while True:
            try:
                await self.seal()
            except Exception as exc:  # the next pass tries again; the term goes on
                self.failures += 1
                log.error("sealing failed", error=f"{type(exc).__name__}: {exc}", archive=self.archive.name)
            await anyio.sleep(self.options.interval)
