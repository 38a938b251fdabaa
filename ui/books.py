"""The dashboard's books: the billing fold with checkpoints, and where each job's story starts.

Role: fold the log (`observe`, event by event, from sequence 1) into the
billing state (`projections.billing.evolve_billing`) and keep, all derived
from the log alone:
- billing checkpoints every `every` events: the tracker's bytes and the
  ledger rows accrued since the previous checkpoint, so the ledger at a past
  point is the sum of the deltas before it plus a short fold. The rows are
  kept summed per queue and priority class (`by_queue`): the dashboard bills
  by queue and GPU model, and a report by queue is the same over the sums
  (every column is additive; prices depend on hour, model and class only);
- the sequence of each job's (first) `JobSubmitted`, where its story starts.

The books need no cluster state, so they are kept the same way whoever folds
the cluster: inline with `muster ui`'s own fold, or by a reader of the log of
their own beside the daemon's fold (`follow`), filled in from the start while
the live pages already answer.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import anyio
import anyio.lowlevel
import msgspec

from muster.events.store import EventStore
from muster.events.types import Event, JobSubmitted
from muster.projections.billing import evolve_billing, settle
from muster.projections.ledger import (
    DEFAULT_GPU_LABEL,
    BillingState,
    Ledger,
    decode_tracker,
    drain,
    encode_tracker,
    merge_into,
    new_billing_state,
)
from muster.replay.heap import no_gc
from muster.replay.source import LogSource

EVERY = 5_000
"""Events between two billing checkpoints: a past chargeback costs at most this many events of billing fold."""


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
class BillingCheckpoint:
    """The billing fold at `seq`: its tracker, and the ledger rows accrued since the previous checkpoint."""

    seq: int
    tracker: bytes
    delta: Ledger


class Books:
    """The billing fold of the log from sequence 1 and the submission index; `seq`: the last event observed."""

    def __init__(self, source: LogSource, *, every: int = EVERY, gpu_label: str = DEFAULT_GPU_LABEL) -> None:
        self.source = source
        self.every = every
        self.billing = new_billing_state(gpu_label)
        self.ledger = Ledger()
        """Every billing row drained so far, summed `by_queue` (the live ledger)."""
        self.checkpoints = [BillingCheckpoint(0, encode_tracker(self.billing.tracker), Ledger())]
        self.submissions: dict[str, int] = {}
        """Job id -> sequence of its (first) JobSubmitted: where its story starts."""
        self.seq = 0
        self.ready = anyio.Event()
        """Set once the books reached the end of the log as it was when they started."""
        self._past: tuple[int, BillingState] | None = None

    def observe(self, seq: int, ev: Event) -> None:
        evolve_billing(self.billing, seq, ev)
        if isinstance(ev, JobSubmitted):
            self.submissions.setdefault(ev.job, seq)
        self.seq = seq
        if seq // self.every > self.checkpoints[-1].seq // self.every:
            self._checkpoint(seq)

    async def follow(self, store: EventStore | None) -> None:
        """Read the log from sequence 1 to its end (then follow `store`, when given), observing each event."""
        end = await self.source.last_seq()
        async for batch in self.source.batches(1, end):
            with no_gc():
                for seq, ev in batch:
                    self.observe(seq, ev)
            await anyio.lowlevel.checkpoint()
        self.seq = max(self.seq, end)
        self.ready.set()
        if store is None:
            return
        async with contextlib.aclosing(store.follow(self.seq + 1)) as events:
            async for seq, ev in events:
                self.observe(seq, ev)

    def _checkpoint(self, seq: int) -> None:
        delta = by_queue(drain(self.billing))
        merge_into(self.ledger, delta)
        tracker = encode_tracker(self.billing.tracker)
        last = self.checkpoints[-1]
        if last.seq == seq:  # a reader settled again at the same point: one checkpoint per sequence
            merge_into(last.delta, delta)
            last.tracker = tracker
        else:
            self.checkpoints.append(BillingCheckpoint(seq, tracker, delta))

    def live(self) -> BillingState:
        """The billing state now, settled: the running jobs booked up to the latest event (rows `by_queue`).

        The rows are kept as a checkpoint (sums do not depend on where runs are cut).
        """
        settle(self.billing)
        self._checkpoint(self.seq)
        return BillingState(tracker=self.billing.tracker, ledger=self.ledger)

    async def at(self, seq: int) -> BillingState:
        """The billing state (settled, rows `by_queue`) as of `seq` (not past `self.seq`): deltas, then a fold."""
        if self._past is not None and self._past[0] == seq:
            return self._past[1]
        base = next(c for c in reversed(self.checkpoints) if c.seq <= seq)
        state = BillingState(tracker=decode_tracker(base.tracker), ledger=Ledger())
        for c in self.checkpoints:
            if c.seq > base.seq:
                break
            merge_into(state.ledger, c.delta)
        if seq > base.seq:
            async for batch in self.source.batches(base.seq + 1, seq):
                with no_gc():  # not across the read: the server's other tasks run meanwhile
                    for s, ev in batch:
                        evolve_billing(state, s, ev)
        settle(state)
        state.ledger = by_queue(state.ledger)  # the deltas' sums and the fold's per-job rows, summed alike
        self._past = (seq, state)
        return state
