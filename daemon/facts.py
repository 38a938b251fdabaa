"""Appending the facts a term's cluster reports (nodes, pods started and ended), group-committed.

Facts are true whoever writes them, so they are appended unfenced; but a
leader paused past its lease writes nothing, so each append waits for a
valid lease of the term that reported it. Facts pushed while the write lock
is busy (a cycle deciding, another append) queue up, and whoever gets the
lock next appends all of them at once (group commit): this replica's own
facts never land between the state a cycle decided on and its decisions.
Each fact carries a msg id (`msgids.term_fact_id`), so a retry stores
nothing twice, and the same job fact from two terms is stored once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import structlog

from muster.daemon.cluster import Sink
from muster.daemon.following import LogFollower
from muster.daemon.metrics import DaemonMetrics
from muster.daemon.msgids import term_fact_id
from muster.daemon.terms import Term
from muster.events.store import EventStore, StoreError
from muster.events.types import Event

__all__ = ["FactWriter"]

log = structlog.get_logger("muster.loop")


@dataclass
class _Facts:
    events: list[Event]
    ids: list[str]
    done: anyio.Event = field(default_factory=anyio.Event)


@dataclass
class _TermFacts:
    """A term's facts in flight."""

    sent: int = 0
    """Facts handed to the log in this term (numbers their msg ids)."""
    pending: list[_Facts] = field(default_factory=list)
    """Facts waiting for the write lock (appended together by whoever gets it)."""


class FactWriter:
    def __init__(
        self,
        store: EventStore,
        follower: LogFollower,
        *,
        identity: str,
        metrics: DaemonMetrics,
        writing: anyio.Lock,
        may_write: Callable[[Term], bool],
        poke: Callable[[], None],
    ) -> None:
        """`may_write(term)`: the term is still being led under a valid lease."""
        self.store = store
        self.follower = follower
        self.identity = identity
        self.metrics = metrics
        self.writing = writing
        self.may_write = may_write
        self.poke = poke
        self._terms: dict[int, _TermFacts] = {}

    def sink(self, term: Term) -> Sink:
        """Append the cluster's facts for `term`, retrying until stored (every sink of a term shares its queue)."""
        facts = self._terms.setdefault(term.epoch, _TermFacts())

        async def sink(events: list[Event]) -> None:
            if not events:
                return
            start = facts.sent
            facts.sent += len(events)
            ids = [term_fact_id(ev, self.identity, term.epoch, start + i) for i, ev in enumerate(events)]
            entry = _Facts(events, ids)
            facts.pending.append(entry)
            delay = 0.1
            while not entry.done.is_set():
                # The lease, like for applying: a lapse waits (a slow refresh comes back); a lease lost
                # ends the term, which cancels this. A leader paused past its lease writes nothing.
                while not self.may_write(term):  # noqa: ASYNC110 - no "renewed" notification
                    await anyio.sleep(0.05)
                if not await self._commit(term, facts, entry):
                    await anyio.sleep(delay)
                    delay = min(5.0, delay * 2)
            self.poke()

        return sink

    async def _commit(self, term: Term, facts: _TermFacts, entry: _Facts) -> bool:
        """Append every queued fact of the term at once; False when that failed (they stay queued)."""
        async with self.writing:
            if entry.done.is_set():
                return True
            batch, facts.pending = facts.pending, []
            flat = [ev for b in batch for ev in b.events]
            try:
                seqs = await self.store.append(flat, msg_ids=[i for b in batch for i in b.ids])
            except StoreError as exc:
                facts.pending[:0] = batch
                log.warning("appending cluster facts failed; retrying", error=str(exc), count=len(flat))
                return False
            # right after what we folded: fold now rather than when the follower brings them
            # back, so the next cycle decides on them without waiting
            self.follower.fold_appended(seqs, flat)
            term.facts = max(term.facts, *seqs)
            for ev in flat:
                self.metrics.facts.labels(type(ev).__name__).inc()
            for b in batch:
                b.done.set()
            return True

    def end(self, term: Term) -> None:
        """Forget a finished term's queue."""
        self._terms.pop(term.epoch, None)
