"""The scheduler loop: follow the log, fold it, and, while leading, decide, append and apply.

Every replica runs the same loop, composed of one part per concern:

- `following.LogFollower` folds the log into a `ClusterState` and keeps
  following it (every replica, leading or not);
- `terms.Leadership` announces, begins and ends leadership terms as the lease
  and the log say; `terms.DecisionBook` hands a term's decisions to its
  applier as they are folded, and at its start what earlier terms decided
  that the cluster must reflect (`reapply`);
- `facts.FactWriter` appends what the term's cluster reports (group commit);
- `cycles.CycleRunner` runs scheduling cycles and appends their decisions,
  fenced; `timers.WakeTimer` says when a cycle falls due with no new event;
- `msgids` names every write, so a retry stores nothing twice.

The loop itself turns: it waits for the follower (or a timer, or a poke),
looks at its lease, and runs cycles when something changed (debounced) or a
timer is due. A term runs the cluster adapter, the applier and the services
in a task group of its own, cancelled when the term ends.

Invariants (the parts' docstrings have theirs):
- Nothing is applied, and no fact or decision appended, without a valid lease.
- Errors in deciding or folding are logged and never stop the loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import structlog
from anyio.abc import TaskGroup, TaskStatus

from muster.daemon.applier import DecisionApplier
from muster.daemon.cluster import ClusterFactory, Sink
from muster.daemon.cycles import CycleOptions, CycleRunner, Decider, Hooks, NoHooks
from muster.daemon.facts import FactWriter
from muster.daemon.following import FoldListener, LogFollower
from muster.daemon.leader import Elector, SoleElector
from muster.daemon.metrics import DaemonMetrics
from muster.daemon.terms import DecisionBook, Leadership, Term
from muster.daemon.timers import WakeTimer
from muster.daemon.warmstart import StartingPoint
from muster.events.store import EventStore
from muster.projections.scheduler import decide
from muster.projections.state import ClusterState

__all__ = ["Elector", "Hooks", "LoopOptions", "NoHooks", "SchedulerLoop", "SoleElector", "Standby", "Term"]

log = structlog.get_logger("muster.loop")


@dataclass
class LoopOptions:
    debounce: float = 0.002
    """Seconds to gather more changes before a cycle (after the first change)."""
    max_cycles: int = 10_000
    """Cycles per wake-up at most (a cycle that admits or preempts asks for another)."""
    victim_wait: float = 90.0
    apply_concurrency: int = 64
    catch_up_timeout: float = 30.0
    follow_buffer: int = 50_000
    lease_check: float = 0.25
    """Seconds between checks of the lease while idle."""
    lag_every: float = 2.0
    decide_inline: float = 0.02
    """A cycle runs on the event loop only if the previous one took less (seconds); else in a worker thread."""
    reapply_after: float = 5.0
    """Seconds a new term waits for its first cycle before it applies again what earlier terms decided."""


Service = Callable[["SchedulerLoop", Term], Coroutine[Any, Any, None]]
"""Something that runs for a leadership term, e.g. the utilization scraper: `await service(loop, term)`."""
Standby = Callable[..., Coroutine[Any, Any, None]]
"""Something that runs for the replica's whole life, leading or not, started with `await tg.start(standby)`:
what a term starts from, kept warm (`cluster.KubeClusters.standby`, the standing watch of the cluster)."""


class SchedulerLoop:
    def __init__(
        self,
        store: EventStore,
        *,
        elector: Elector,
        cluster: ClusterFactory | None = None,
        clock: Callable[[], float] = time.time,
        options: LoopOptions | None = None,
        metrics: DaemonMetrics | None = None,
        hooks: Hooks | None = None,
        services: Sequence[Service] = (),
        standby: Sequence[Standby] = (),
        decider: Decider = decide,
        start: StartingPoint | None = None,
    ) -> None:
        """`services` are started in every term with (loop, term), e.g. the utilization scraper; `standby`
        once, for the replica's life.

        `decider` is the scheduling policy, `projections.scheduler.decide` (tests give a slow one).
        `start` gives the state to fold the log's tail onto (`warmstart.SnapshotStart`); None: fold it all.
        """
        self.store = store
        self.elector = elector
        self.identity = elector.holder
        self.cluster_factory = cluster
        self.options = opts = options or LoopOptions()
        self.metrics = metrics or DaemonMetrics()
        self.services = list(services)
        self.standby = list(standby)
        self.start = start
        self.ready = False
        self.heartbeat = 0.0
        """When the main loop last turned (monotonic); `/healthz` fails when it stops turning."""
        self.first_term = anyio.Event()
        """Set once this replica first leads a term whose cluster has synced (benchmarks and tests wait on it)."""
        self._stop = anyio.Event()
        self._tg: TaskGroup | None = None
        writing = anyio.Lock()
        """Held by every append of this replica: its own facts never cut a cycle's decisions in two."""
        self.follower = follower = LogFollower(
            store, self.metrics, buffer=opts.follow_buffer, catch_up_timeout=opts.catch_up_timeout
        )
        self.metrics.watch(lambda: follower.state)
        # a job's events go on its queue's subjects, which that queue's identity may read
        store.queue_of = lambda job: j.queue if (j := follower.state.jobs.get(job)) is not None else None
        self.book = DecisionBook(self.metrics)
        follower.on_accepted = self.book.track
        self.timer = WakeTimer(lambda: follower.state, clock)
        self.leadership = Leadership(
            store,
            elector,
            follower,
            self.book,
            metrics=self.metrics,
            writing=writing,
            now=self.timer.now,
            begin=self._begin,
        )
        self.facts = FactWriter(
            store,
            follower,
            identity=self.identity,
            metrics=self.metrics,
            writing=writing,
            may_write=lambda term: self.leadership.term is term and self.leading,
            poke=self.poke,
        )
        self.runner = CycleRunner(
            store,
            follower,
            self.leadership,
            self.timer,
            decider=decider,
            options=CycleOptions(max_cycles=opts.max_cycles, decide_inline=opts.decide_inline),
            metrics=self.metrics,
            hooks=hooks or NoHooks(),
            writing=writing,
            stopping=self._stop.is_set,
        )

    # ------------------------------------------------------------ public

    @property
    def state(self) -> ClusterState:
        return self.follower.state

    @property
    def folded_seq(self) -> int:
        return self.follower.folded_seq

    @property
    def leading(self) -> bool:
        """Whether this replica leads a term now (its epoch is the log's and its lease is valid)."""
        return self.leadership.leading

    @property
    def epoch(self) -> int:
        """This replica's epoch while it leads, else 0."""
        return self.leadership.epoch

    @property
    def term(self) -> Term | None:
        return self.leadership.term

    @property
    def cycles(self) -> int:
        return self.runner.cycles

    def on_fold(self, callback: FoldListener) -> None:
        """Call `callback(seq, event, accepted)` for every event folded (the demo's live view uses it)."""
        self.follower.listeners.append(callback)

    def fact_sink(self, term: Term) -> Sink:
        """Where a term's cluster and services push facts (appended unfenced, retried until stored)."""
        return self.facts.sink(term)

    def stop(self) -> None:
        """Ask the loop to step down (releasing the lease) and return from `run`."""
        self._stop.set()
        self.poke()

    def poke(self) -> None:
        """Wake the loop (a leadership change)."""
        self.follower.poke()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Fold the log, follow it, lead when elected; returns after `stop()`, or runs until cancelled.

        Cancelled, it ends like a crash: the lease is left to expire. `stop()` resigns it.
        """
        follower = self.follower
        self.elector.on_change = self.poke
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                if self.start is not None:
                    await follower.start_from(self.start)
                await follower.replay()
                tg.start_soon(follower.follow)
                tg.start_soon(follower.watch_lag, self.options.lag_every)
                for service in self.standby:  # warm before it campaigns: a term it wins starts from them
                    await tg.start(service)
                await tg.start(self.elector.run)
                self.ready = True
                log.info("caught up with the log", seq=follower.folded_seq, events=follower.state.applied)
                task_status.started()
                await self._main()
                tg.cancel_scope.cancel()
        finally:
            self.ready = False
            self.metrics.leader.set(0)
            # cancelled between the lease won and the term's first cycle, no step-down ran: the
            # collector is the whole process's, paused for this loop alone (in-process replicas,
            # a demo, a test), so it must not stay paused after the loop is gone
            self.leadership.quiet.resume()
            follower.close()

    # ------------------------------------------------------------ the main loop

    async def _main(self) -> None:
        follower, leadership = self.follower, self.leadership
        while not self._stop.is_set():
            self.heartbeat = anyio.current_time()
            idle = self.options.lease_check
            with anyio.move_on_after(self.timer.timeout(idle) if leadership.may_decide() else idle):
                await follower.receive()
            await follower.drain()
            await leadership.check(stopping=self._stop.is_set())
            if leadership.may_decide() and (follower.dirty or self.timer.due()):
                if self.options.debounce > 0:
                    await anyio.sleep(self.options.debounce)
                    await follower.drain()
                await self.runner.run(follower.drain)
        await leadership.step_down("stopping", resign=True)

    # ------------------------------------------------------------ a term

    def _begin(self, term: Term) -> None:
        self.runner.term_cycles = self.runner.cycles
        self.follower.dirty = True
        assert self._tg is not None
        self._tg.start_soon(self._run_term, term)

    async def _run_term(self, term: Term) -> None:
        """The term's cluster, applier and services, until the term ends (its scope is cancelled)."""
        # every line logged by the term's tasks (applier, adapter, scraper) carries its epoch
        try:
            with term.scope, structlog.contextvars.bound_contextvars(epoch=term.epoch):
                async with anyio.create_task_group() as tg:
                    if self.cluster_factory is not None:
                        cluster = self.cluster_factory(lambda: self.follower.state)
                        applier = DecisionApplier(
                            cluster,
                            leading=lambda: self.leading and self.epoch == term.epoch,
                            victims=self.book.victims,
                            metrics=self.metrics,
                            victim_wait=self.options.victim_wait,
                            concurrency=self.options.apply_concurrency,
                        )
                        term.cluster, term.applier = cluster, applier
                        await tg.start(applier.run)
                        await tg.start(cluster.run, self.fact_sink(term))
                        self.book.adopt_victims(self.follower.state)
                    for service in self.services:
                        tg.start_soon(service, self, term)
                    term.synced_seq = max(self.follower.folded_seq, term.facts)
                    self.first_term.set()
                    self.poke()
                    if term.cluster is not None:
                        # what earlier terms owe the cluster, once this term decided first (`terms`)
                        with anyio.move_on_after(self.options.reapply_after):
                            await term.decided.wait()
                        self.book.reconcile(term, self.follower.state)
                    await anyio.sleep_forever()
        finally:
            self.facts.end(term)
