"""Leadership terms: when this replica leads, and what it hands its cluster while it does.

The replica whose lease is valid (`Elector.leading`) announces itself with a
fenced `LeaderElected` of the next epoch and, once that is folded, leads a
*term*. A term ends when the lease is lost, when the log names another
leader, or when the loop stops (which resigns the lease).

`DecisionBook` keeps, from the fold, what a term applies: each accepted
decision of the term's own epoch goes to its applier as it is folded, and at
the start of a term the last decision of every live job from earlier epochs
the decision each job's cluster must reflect is applied again (`reapply`,
idempotent in the cluster), since a deposed leader may have stored decisions
it never applied, and a user's cancel may have been folded while no term ran.

A takeover is timed from the lease won to the term's first cycle: the
cyclic garbage collector is paused over it (`QuietStart`), and what earlier
terms owe the cluster is handed to the applier only after that cycle (its
decisions do not depend on it; the victims preemptors wait for are known
before any binding).

Invariants:
- Decisions are only taken by a replica whose lease is valid, whose epoch is
  the log's current one and that has folded everything its cluster pushed
  when its term started (`may_decide`).
- Only decisions that are on the log (folded, not fenced or skipped by the
  fold) of this term's epoch, users' cancels, or (at the start of a term)
  what the fold says the cluster must reflect, are applied.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import structlog

from muster.daemon import reapply
from muster.daemon.applier import DecisionApplier
from muster.daemon.cancels import by_user
from muster.daemon.cluster import Cluster, FlavorAware
from muster.daemon.following import LogFollower
from muster.daemon.leader import Elector
from muster.daemon.metrics import DaemonMetrics
from muster.daemon.msgids import leader_id
from muster.events.store import ConcurrencyConflict, EventStore, StoreError
from muster.events.types import (
    Event,
    FlavorConfigured,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobInadmissible,
    JobPreempted,
    JobRejected,
    LeaderElected,
)
from muster.projections.state import ClusterState

__all__ = ["DecisionBook", "Leadership", "QuietStart", "Term"]

log = structlog.get_logger("muster.loop")

_APPLIED = (JobAdmitted, JobPreempted, JobInadmissible, JobRejected)
"""Decisions handed to the cluster: bindings, evictions, and what to tell users (why a job waits)."""
_ENDS = (JobFinished, JobFailed, JobCancelled, JobRejected)


@dataclass
class Term:
    """One leadership term of this replica."""

    epoch: int
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    cluster: Cluster | None = None
    applier: DecisionApplier | None = None
    synced_seq: int | None = None
    """Set once the cluster's initial facts are appended: decide only after folding up to here."""
    facts: int = 0
    """Sequence of the last fact appended in this term."""
    decided: anyio.Event = field(default_factory=anyio.Event)
    """Set once the term's first cycle has decided (whatever it decided)."""


class DecisionBook:
    """What the fold tells the applier (each live job's last decision, the victims of each preemptor) and the
    cluster (its flavors changed)."""

    def __init__(self, metrics: DaemonMetrics) -> None:
        self.metrics = metrics
        self.term: Term | None = None
        """The term being led, whose applier gets this epoch's decisions as they are folded."""
        self.last_decision: dict[str, Event] = {}
        """Live job -> its last admission or preemption folded since this replica started."""
        self.victims: dict[str, set[str]] = {}

    def track(self, event: Event) -> None:
        """Bookkeeping of an accepted event: what to apply, and what to re-apply in a new term."""
        if isinstance(event, LeaderElected):
            self.metrics.epoch.set(event.epoch)
            return
        if isinstance(event, (JobAdmitted, JobPreempted)):
            self.last_decision[event.job] = event
            if isinstance(event, JobPreempted):
                self.metrics.preemptions.labels(event.reason).inc()
                if event.preemptor is not None:
                    self.victims.setdefault(event.preemptor, set()).add(event.job)
            else:
                self.metrics.admissions.labels(event.queue).inc()
        if isinstance(event, _ENDS):
            self.last_decision.pop(event.job, None)
            self.victims.pop(event.job, None)
        term = self.term
        if isinstance(event, FlavorConfigured) and term is not None and isinstance(term.cluster, FlavorAware):
            term.cluster.flavors_changed()
        if term is None or term.applier is None:
            return
        if isinstance(event, _APPLIED) and event.epoch == term.epoch:
            term.applier.submit(event)
        elif isinstance(event, JobCancelled) and by_user(event):
            term.applier.submit(event)  # the user's cancel: the cluster's workload must stop

    def adopt_victims(self, state: ClusterState) -> None:
        """Who each waiting preemptor waits for, also from earlier terms (`reapply.victims`): before any binding."""
        for preemptor, evicted in reapply.victims(state).items():
            self.victims.setdefault(preemptor, set()).update(evicted)

    def reconcile(self, term: Term, state: ClusterState) -> None:
        """Apply again what earlier terms decided and the cluster must reflect (`reapply`), idempotently.

        Called once the term's first cycle has decided: nothing it decides depends on these (they are on
        the log already), and their bindings would compete with that cycle for the event loop.
        """
        assert term.applier is not None and term.cluster is not None
        # this term's own decisions went to the applier as they were folded
        owed = [e for e in reapply.owed(state, self.last_decision, term.cluster.holds) if _epoch(e) != term.epoch]
        for event in owed:
            term.applier.submit(event)
        if owed:
            log.info("re-applying decisions of earlier terms", count=len(owed), epoch=term.epoch)


class QuietStart:
    """No cyclic garbage collection from the lease won to the end of the term's first cycle.

    A replica's heap holds the folded state and its mirror's objects of the
    cluster, hundreds of thousands of objects, and a full collection walks
    them all. A term's start allocates fast (the cluster translated into
    gangs, the first cycle's index built from scratch), fast enough to set
    off several: they were most of the CPU of a term's sync from the
    standby's mirror (6,000 pods, in-process with the API double: 0.24 s,
    0.07 s without the collector). What the start
    allocates lives on (the term's view of the cluster), so pausing costs
    little memory. The collector runs again after the term's first cycle,
    when the term ends, when the loop returns or is cancelled (`SchedulerLoop.run`),
    or `limit` seconds after the pause whatever happens.
    """

    def __init__(self, limit: float = 30.0) -> None:
        self.limit = limit
        self._until: float | None = None
        """When the pause ends at the latest (monotonic), while paused."""

    def pause(self) -> None:
        if self._until is None and gc.isenabled():
            gc.disable()
            self._until = anyio.current_time() + self.limit

    def resume(self) -> None:
        if self._until is not None:
            self._until = None
            gc.enable()

    def expire(self) -> None:
        """Resume if the pause outlived its limit (a term whose first cycle never comes)."""
        if self._until is not None and anyio.current_time() >= self._until:
            self.resume()


def _epoch(event: Event) -> int:
    """The epoch of the term that took a decision (0: none, or rebuilt from the state)."""
    epoch: int = getattr(event, "epoch", 0)
    return epoch


class Leadership:
    """Announce, begin and end terms as the lease and the log say."""

    def __init__(
        self,
        store: EventStore,
        elector: Elector,
        follower: LogFollower,
        book: DecisionBook,
        *,
        metrics: DaemonMetrics,
        writing: anyio.Lock,
        now: Callable[[], int],
        begin: Callable[[Term], None],
    ) -> None:
        """`begin(term)` starts what runs for a term (the loop's cluster, applier and services)."""
        self.store = store
        self.elector = elector
        self.identity = elector.holder
        self.follower = follower
        self.book = book
        self.metrics = metrics
        self.writing = writing
        self.now = now
        self._begin = begin
        self.epoch = 0
        """This replica's epoch while it leads, else 0."""
        self.term: Term | None = None
        self.quiet = QuietStart()

    @property
    def leading(self) -> bool:
        """Whether this replica leads a term now (its epoch is the log's and its lease is valid)."""
        return self.epoch != 0 and self.elector.leading()

    def may_decide(self) -> bool:
        """Leading a term whose cluster has synced, with that and the term's epoch folded."""
        term = self.term
        return (
            term is not None
            and self.leading
            and term.synced_seq is not None
            and self.follower.folded_seq >= term.synced_seq
            and self.follower.state.epoch == term.epoch
        )

    async def check(self, *, stopping: bool) -> None:
        """Step down when the lease is lost or the log names another leader; announce when the lease is won."""
        self.quiet.expire()
        state = self.follower.state
        if self.epoch:
            if not self.elector.leading():
                await self.step_down("lease lost")
            elif state.epoch != self.epoch or state.leader != self.identity:
                await self.step_down(f"deposed by {state.leader} (epoch {state.epoch})", resign=True)
        elif self.elector.leading() and not stopping:
            await self._announce()
        self.metrics.leader.set(1 if self.leading else 0)

    async def _announce(self) -> None:
        """Append a fenced LeaderElected of the next epoch; lead once it is folded."""
        follower = self.follower
        self.quiet.pause()  # resumed by the term's first cycle, or when no term begins
        try:
            while self.elector.leading():
                try:
                    end = await self.store.last_seq()
                except Exception as exc:
                    log.warning("cannot read the stream end; announcing later", error=str(exc))
                    return
                if not await follower.catch_up(end):
                    return
                epoch = follower.state.epoch + 1
                event = LeaderElected(at=self.now(), epoch=epoch, holder=self.identity)
                try:
                    async with self.writing:
                        seqs = await self.store.append(
                            [event], expected_last_seq=follower.folded_seq, msg_ids=[leader_id(epoch, self.identity)]
                        )
                except ConcurrencyConflict as exc:
                    await follower.catch_up(exc.actual)
                    continue
                except StoreError as exc:
                    log.warning("announcing leadership failed; retrying", error=str(exc))
                    return
                if not follower.fold_appended(seqs, [event], own=True) and not await follower.catch_up(seqs[0]):
                    return
                if follower.state.epoch == epoch and follower.state.leader == self.identity:
                    self.epoch = epoch
                    self.term = self.book.term = Term(epoch)
                    log.info("leading", epoch=epoch, holder=self.identity, seq=follower.folded_seq)
                    self._begin(self.term)
                return
        finally:
            if self.term is None:
                self.quiet.resume()

    async def step_down(self, reason: str, *, resign: bool = False) -> None:
        term, self.term, self.book.term = self.term, None, None
        if term is not None:
            log.info("stepping down", epoch=term.epoch, reason=reason)
            term.scope.cancel()
        self.epoch = 0
        self.quiet.resume()
        self.metrics.leader.set(0)
        if resign:
            await self.elector.resign()
