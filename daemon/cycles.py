"""Scheduling cycles: decide on the folded state, append the decisions fenced, fold them.

A cycle reads the clock once (`WakeTimer.now`), runs the pure `decide` on the
state folded so far, and appends its decisions fenced on the last sequence
folded (`EventStore.append(expected_last_seq=)`: one atomic batch per 1,000
decisions on NATS 2.12+, one chained round trip elsewhere): they land right
after the state they were decided on, or not at all (`ConcurrencyConflict`:
the loop folds what it missed and decides again); a cycle of more than 1,000
decisions, or one on a server without atomic batches, may be cut by another
writer, and then only a prefix of it is stored (the rest is decided again).
Decision msg ids (`msgids.decision_ids`) make a retried append store nothing
twice. Once stored, decisions are folded at their sequences (which hands this
term's to the applier). A cycle that decided nothing but judged jobs appends
its `CycleSettled` the same way: refused, its parks are dropped (`parking`)
and the jobs judged again by the next cycle.

Invariants:
- A cycle holds the write lock from its last drain to its append, so this
  replica's own facts cannot land between the state decided on and its
  decisions; and it first folds every fact this replica appended in the
  term, so its own writes never make the fence refuse it (a refused cycle
  costs a whole `decide`, seconds over a big backlog).
- Nothing is appended without a valid lease (a paused leader waking up writes
  nothing before it finds out it was deposed).
- Errors in deciding are logged and never stop the loop.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import anyio
import anyio.to_thread
import structlog

from muster.daemon.following import LogFollower
from muster.daemon.metrics import DaemonMetrics
from muster.daemon.msgids import decision_ids
from muster.daemon.terms import Leadership, Term
from muster.daemon.timers import WakeTimer
from muster.events.store import ConcurrencyConflict, EventStore, StoreError
from muster.events.types import CycleSettled, Event
from muster.projections.settling import Settling
from muster.projections.state import ClusterState

__all__ = ["CycleOptions", "CycleRunner", "Hooks", "NoHooks"]

log = structlog.get_logger("muster.loop")

Decider = Callable[[ClusterState, int], list[Event]]


class Hooks(Protocol):
    """Points where a test may stop the loop as a pause of the process would."""

    async def before_append(self, events: list[Event]) -> None: ...


class NoHooks:
    async def before_append(self, events: list[Event]) -> None:
        pass


@dataclass(frozen=True)
class CycleOptions:
    max_cycles: int
    """Cycles per wake-up at most (a cycle that admits or preempts asks for another)."""
    decide_inline: float
    """A cycle runs on the event loop only if the previous one took less (seconds); else in a worker thread."""


class CycleRunner:
    def __init__(
        self,
        store: EventStore,
        follower: LogFollower,
        leadership: Leadership,
        timer: WakeTimer,
        *,
        decider: Decider,
        options: CycleOptions,
        metrics: DaemonMetrics,
        hooks: Hooks,
        writing: anyio.Lock,
        stopping: Callable[[], bool],
    ) -> None:
        self.store = store
        self.follower = follower
        self.leadership = leadership
        self.timer = timer
        self.decider = decider
        self.options = options
        self.metrics = metrics
        self.hooks = hooks
        self.writing = writing
        self.stopping = stopping
        self.cycles = 0
        self.term_cycles = 0
        """`cycles` when the current term began (its first cycle runs in a thread)."""
        self.appended_decisions = 0
        self._cycle_seconds = 0.0

    async def run(self, drain: Callable[[], Awaitable[None]]) -> None:
        """One instant's cycles (`settling`): until one admits and preempts nothing, or the term ends.

        `drain` folds what the follower brought.
        """
        follower, leadership = self.follower, self.leadership
        settling = Settling(self.options.max_cycles)
        for _ in settling:
            first_of: Term | None = None
            try:
                async with self.writing:
                    await drain()
                    term = leadership.term
                    if term is not None and not await follower.catch_up(term.facts):
                        return  # the follower is stuck: the next wake-up tries again
                    follower.dirty = False  # the cycle below sees everything folded so far
                    if not leadership.may_decide():
                        return
                    now = self.timer.now()
                    self.timer.decided_at = now
                    expected = follower.folded_seq  # the state decided on ends here; the append is fenced on it
                    started = time.perf_counter()
                    term_first = self.cycles == self.term_cycles
                    first_of = term if term_first else None
                    try:
                        events = await self._decide(now, term_first=term_first)
                    except Exception:
                        log.exception("decide failed; waiting for the next change", seq=follower.folded_seq)
                        self.metrics.cycles.labels("error").inc()
                        return
                    self._cycle_seconds = time.perf_counter() - started
                    self.metrics.cycle_seconds.observe(self._cycle_seconds)
                    self.cycles += 1
                    if not events:
                        self.metrics.cycles.labels("idle").inc()
                        return
                    outcome = await self._append(events, expected)
            finally:
                if first_of is not None:
                    # the takeover is over (`terms`): the collector runs again, earlier terms' decisions are applied
                    leadership.quiet.resume()
                    first_of.decided.set()
            if isinstance(outcome, int):
                # refused or unsure: fold what the log holds up to there, then decide again
                # (the core keeps a cycle's parked verdicts only once its decisions are folded)
                await follower.catch_up(outcome)
                await leadership.check(stopping=self.stopping())
                if self.stopping() or not leadership.may_decide():
                    return
                continue
            # "settled": it decided nothing but judged jobs (`CycleSettled`)
            settled = all(isinstance(ev, CycleSettled) for ev in events)
            self.metrics.cycles.labels("settled" if settled else "decided").inc()
            settling.decided(events)
        if settling.settled:
            return
        log.warning("scheduling did not settle", cycles=self.options.max_cycles, seq=follower.folded_seq)

    async def _decide(self, now: int, *, term_first: bool) -> list[Event]:
        """`decide` on the state, in a worker thread when it may be long (the write lock is held).

        A cycle over a big backlog, or a term's first (which builds the
        scheduler index from scratch), can take seconds of pure computation;
        on the event loop it would stop the lease refresh, the follower and
        the applier for that long, and a lease that lapses mid-cycle churns
        leadership. In a thread the loop keeps turning (the GIL is handed over
        every few milliseconds). Nothing folds meanwhile: folding happens in
        the main task, which waits here, or under the write lock, which this
        cycle holds, so `decide` sees one state; the loop's other tasks only
        read it. Short cycles stay on the loop (a thread hop costs latency).
        """
        state = self.follower.state
        if term_first or self._cycle_seconds > self.options.decide_inline:
            return await anyio.to_thread.run_sync(self.decider, state, now)
        return self.decider(state, now)

    async def _append(self, events: list[Event], expected: int) -> int | None:
        """Append one cycle's decisions fenced on `expected` and fold them (the write lock is held).

        None when they are on the log and folded; else the sequence to fold up
        to before deciding again.
        """
        ids = decision_ids(events)
        if not self.leadership.leading:
            return expected
        await self.hooks.before_append(events)
        try:
            seqs = await self.store.append(events, expected_last_seq=expected, msg_ids=ids)
        except ConcurrencyConflict as exc:
            # someone appended after the state we decided on
            self.metrics.conflicts.inc()
            self.metrics.cycles.labels("conflict").inc()
            log.debug("decisions refused by the fence", expected=exc.expected, actual=exc.actual, stored=exc.stored)
            return int(exc.actual)
        except StoreError as exc:
            # stored or not, we cannot tell: fold whatever the stream holds before deciding again
            log.warning("appending decisions failed", error=str(exc))
            self.metrics.cycles.labels("error").inc()
            try:
                return int(await self.store.last_seq())
            except Exception:
                return expected
        if not self.follower.fold_appended(seqs, events, own=True):
            return int(max(seqs))  # earlier copies of these: they come back through the follower
        for ev in events:
            self.metrics.decisions.labels(type(ev).__name__).inc()
        self.appended_decisions += len(events)
        return None
