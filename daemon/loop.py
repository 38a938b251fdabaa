"""The scheduler loop: follow the log, fold it, and, while leading, decide, append and apply.

Every replica runs the same loop. It folds the whole log into a
`ClusterState` with the `evolve` that `muster sim` and the audit tools use,
then follows it. The replica whose lease is valid (`leader`) announces itself
with a fenced `LeaderElected` of the next epoch and, once that is folded,
leads a *term*: the cluster adapter pushes facts to the log, and the loop
runs scheduling cycles when something changed (debounced) or a timer is due
(`next_wakeup`), reading the clock once per cycle.

A cycle's decisions are appended fenced (`appending.ChainedAppender`, one
round trip): the first expects the log to end at the last event folded, each
next one expects its predecessor's msg id last, so they land right after the
state they were decided on, or not at all (`ConcurrencyConflict`: the loop
folds what it missed and decides again); a write by another process in the
middle of a cycle stores only a prefix of it (the rest is decided again).
Decision msg ids are `epoch:cycle:index:digest`, so a retried append stores
nothing twice. Once stored, decisions are folded at their sequences and
handed to the applier. This replica's own facts (from its cluster) wait for
a cycle's append to finish and are then appended together (group commit);
facts about a job carry ids derived from what they say (`fact_id`), so the
same fact reported by two terms' adapters is stored once.

Invariants:
- One task folds, in log order, each sequence once; the state is the fold of
  the log up to `folded_seq` (bad messages are skipped, and counted).
- Decisions are only appended by a replica whose lease is valid, whose epoch
  is the log's current one and that has folded everything its cluster pushed
  when its term started. A deposed leader's append fails on the fence, and
  the fold ignores decisions of a stale epoch anyway.
- Only decisions that are on the log (folded, not fenced or skipped by the
  fold) of this term's epoch, or the last decision of a live job from an
  earlier epoch (at the start of a term), are applied; nothing is applied,
  and no fact appended, without a valid lease (a paused leader waking up
  writes nothing before it finds out it was deposed).
- Errors in deciding or folding are logged and never stop the loop.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import anyio.lowlevel
import anyio.to_thread
import structlog
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from muster.daemon.appending import ChainedAppender
from muster.daemon.applier import DecisionApplier
from muster.daemon.cluster import Cluster, ClusterFactory, Sink
from muster.daemon.leader import Elector, SoleElector
from muster.daemon.metrics import DaemonMetrics
from muster.events.codec import encode
from muster.events.store import BadEvent, ConcurrencyConflict, EventStore, StoredEvent, StoreError
from muster.events.types import (
    Event,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobInadmissible,
    JobPreempted,
    JobRejected,
    JobStarted,
    JobSubmitted,
    LeaderElected,
)
from muster.projections.cluster import ClusterState, evolve
from muster.projections.scheduler import decide, next_wakeup

__all__ = ["Elector", "Hooks", "LoopOptions", "NoHooks", "SchedulerLoop", "SoleElector"]

log = structlog.get_logger("muster.loop")

_DECISIONS = (JobAdmitted, JobPreempted, JobInadmissible, JobRejected)
"""Decisions handed to the cluster: bindings, evictions, and what to tell users (why a job waits)."""
_ENDS = (JobFinished, JobFailed, JobCancelled, JobRejected)


def fact_id(event: Event) -> str | None:
    """The msg id a fact is its own witness of, or None when its content does not identify it.

    A job is submitted once and ends once, and a run starts once (at its `at`):
    whichever replica or term reports it, the id is the same, so JetStream
    stores it once within its duplicate window. Node facts get per-term ids:
    the same description may come back legitimately (a label set, removed,
    set again within a second).
    """
    if isinstance(event, JobSubmitted):
        return f"fact:submitted:{_id_part(event.job)}"
    if isinstance(event, (JobFinished, JobFailed, JobCancelled)):
        return f"fact:ended:{_id_part(event.job)}"
    if isinstance(event, JobStarted):
        return f"fact:started:{_id_part(event.job)}:{event.at}"
    return None


def _id_part(job: str) -> str:
    # job ids come from user-chosen names (any unicode, control characters): a NATS header takes
    # printable ASCII only, so anything else is named by its digest
    if job.isascii() and job.isprintable() and len(job) <= 200:
        return job
    return "sha256:" + hashlib.sha256(job.encode("utf-8", errors="surrogatepass")).hexdigest()[:32]


class Hooks(Protocol):
    """Points where a test may stop the loop as a pause of the process would."""

    async def before_append(self, events: list[Event]) -> None: ...


class NoHooks:
    async def before_append(self, events: list[Event]) -> None:
        pass


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


@dataclass
class _Facts:
    events: list[Event]
    ids: list[str]
    done: anyio.Event = field(default_factory=anyio.Event)


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
    sent: int = 0
    """Facts handed to the log in this term (numbers their msg ids)."""
    pending: list[_Facts] = field(default_factory=list)
    """Facts waiting for the write lock (appended together by whoever gets it)."""


Service = Callable[["SchedulerLoop", Term], Coroutine[Any, Any, None]]
"""Something that runs for a leadership term, e.g. the utilization scraper: `await service(loop, term)`."""


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
        decider: Callable[[ClusterState, int], list[Event]] = decide,
    ) -> None:
        """`services` are started in every term with (loop, term), e.g. the utilization scraper.

        `decider` is the scheduling policy, `projections.scheduler.decide` (tests give a slow one).
        """
        self.store = store
        self.elector = elector
        self.identity = elector.holder
        self.cluster_factory = cluster
        self.clock = clock
        self.options = options or LoopOptions()
        self.metrics = metrics or DaemonMetrics()
        self.hooks: Hooks = hooks or NoHooks()
        self.services = list(services)
        self.decider = decider
        self.state: ClusterState = ClusterState()
        self.metrics.watch(lambda: self.state)
        self.folded_seq = 0
        self.stream_end = 0
        self.ready = False
        self.heartbeat = 0.0
        """When the main loop last turned (monotonic); `/healthz` fails when it stops turning."""
        self.epoch = 0
        """This replica's epoch while it leads, else 0."""
        self.term: Term | None = None
        self.first_term = anyio.Event()
        """Set once this replica first leads a term whose cluster has synced (benchmarks and tests wait on it)."""
        self.last_decision: dict[str, Event] = {}
        """Live job -> its last admission or preemption on the log."""
        self.victims: dict[str, set[str]] = {}
        self.appended_decisions = 0
        self.cycles = 0
        self._term_cycles = 0
        """`cycles` when the current term began (its first cycle runs in a thread)."""
        self._cycle_seconds = 0.0
        self._dirty = False
        self._decided_at = 0
        self._wake_key: tuple[int, int] = (-1, -1)
        self._wake_at: int | None = None
        self._bad: list[int] = []
        """Heap of the sequences of bad messages not yet passed by the fold."""
        self._bad_seen: set[int] = set()
        self._stop = anyio.Event()
        self._appender = ChainedAppender(store)
        self._writing = anyio.Lock()
        """Held by every append of this replica: its own facts never cut a cycle's decisions in two."""
        self._recv: MemoryObjectReceiveStream[StoredEvent | None] | None = None
        self._poke_send: MemoryObjectSendStream[StoredEvent | None] | None = None
        self._tg: TaskGroup | None = None
        self._on_fold: list[Callable[[int, Event, bool], None]] = []
        store.on_bad = self._on_bad

    # ------------------------------------------------------------ public

    @property
    def leading(self) -> bool:
        """Whether this replica leads a term now (its epoch is the log's and its lease is valid)."""
        return self.epoch != 0 and self.elector.leading()

    def on_fold(self, callback: Callable[[int, Event, bool], None]) -> None:
        """Call `callback(seq, event, accepted)` for every event folded (the demo's live view uses it)."""
        self._on_fold.append(callback)

    def stop(self) -> None:
        """Ask the loop to step down (releasing the lease) and return from `run`."""
        self._stop.set()
        self.poke()

    def poke(self) -> None:
        """Wake the loop (a leadership change)."""
        if self._poke_send is not None:
            with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._poke_send.send_nowait(None)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Fold the log, follow it, lead when elected; returns after `stop()`, or runs until cancelled.

        Cancelled, it ends like a crash: the lease is left to expire. `stop()` resigns it.
        """
        send, recv = anyio.create_memory_object_stream[StoredEvent | None](self.options.follow_buffer)
        self._recv = recv
        self._poke_send = send.clone()
        self.elector.on_change = self.poke
        try:
            async with anyio.create_task_group() as tg, send, recv:
                self._tg = tg
                await self._replay()
                tg.start_soon(self._follow, send.clone())
                tg.start_soon(self._watch_lag)
                await tg.start(self.elector.run)
                self.ready = True
                log.info("caught up with the log", seq=self.folded_seq, events=self.state.applied)
                task_status.started()
                await self._main(recv)
                tg.cancel_scope.cancel()
        finally:
            self.ready = False
            self.metrics.leader.set(0)
            if self._poke_send is not None:
                self._poke_send.close()
            await self._appender.close()

    # ------------------------------------------------------------ reading the log

    async def _replay(self) -> None:
        """Fold what the stream holds now, in batches (the fast path for a restart)."""
        end = await self.store.last_seq()
        self.stream_end = end
        if end <= self.folded_seq:
            return
        async with contextlib.aclosing(self.store.iter_batches(self.folded_seq + 1, end)) as batches:
            async for batch in batches:
                for stored in batch:
                    self._fold(stored.seq, stored.event)
        self._skip_bad(end + 1)

    async def _follow(self, send: MemoryObjectSendStream[StoredEvent | None]) -> None:
        async with send, contextlib.aclosing(self.store.follow(self.folded_seq + 1)) as events:
            async for stored in events:
                await send.send(stored)

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

    async def _watch_lag(self) -> None:
        while True:
            await anyio.sleep(self.options.lag_every)
            try:
                self.stream_end = max(self.stream_end, await self.store.last_seq())
            except Exception as exc:  # NATS away: the follower waits it out
                log.debug("stream info failed", error=str(exc))
            self.metrics.lag.set(max(0, self.stream_end - self.folded_seq))

    # ------------------------------------------------------------ folding

    def _fold(self, seq: int, event: Event, *, own: bool = False) -> None:
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
            self._track(event)
        if not own:
            self._dirty = True
        for callback in self._on_fold:
            callback(seq, event, accepted)

    def _track(self, event: Event) -> None:
        """Bookkeeping of accepted events: what to apply, and what to re-apply in a new term."""
        term = self.term
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
        if (
            isinstance(event, _DECISIONS)
            and term is not None
            and term.applier is not None
            and event.epoch == term.epoch
        ):
            term.applier.submit(event)
        elif isinstance(event, JobCancelled) and term is not None and term.applier is not None:
            from muster.daemon.k8s.cancelling import by_user  # the Kubernetes client only when a job is cancelled

            if by_user(event):
                term.applier.submit(event)  # the user's cancel: the cluster's workload must stop

    def _take(self, item: StoredEvent | None) -> None:
        if item is not None:
            self._fold(item.seq, item.event)

    async def _drain(self, limit: int = 10_000, chunk: int = 1000) -> None:
        """Fold what the follower has buffered (at most `limit`), `chunk` events at a time with a checkpoint between.

        A replica far behind (a long pause, a busy cycle) may find tens of
        thousands buffered: folded in one go they would hold the event loop
        (and the lease refresh on it) for seconds. The limit lets the caller
        look at its lease however fast the log grows.
        """
        assert self._recv is not None
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

    async def _catch_up(self, target: int) -> bool:
        """Fold until `folded_seq >= target`; False if that took longer than the catch-up timeout."""
        assert self._recv is not None
        with anyio.move_on_after(self.options.catch_up_timeout):
            while self.folded_seq < target:
                self._skip_bad(self.folded_seq + 2)
                if self.folded_seq >= target:
                    break
                self._take(await self._recv.receive())
            return True
        log.warning("catching up with the log timed out", folded=self.folded_seq, target=target)
        return False

    # ------------------------------------------------------------ the main loop

    async def _main(self, recv: MemoryObjectReceiveStream[StoredEvent | None]) -> None:
        while not self._stop.is_set():
            self.heartbeat = anyio.current_time()
            item: StoredEvent | None = None
            got = False
            with anyio.move_on_after(self._timeout()):
                item = await recv.receive()
                got = True
            if got:
                self._take(item)
            await self._drain()
            await self._leadership()
            if self._may_decide() and (self._dirty or self._timer_due()):
                if self.options.debounce > 0:
                    await anyio.sleep(self.options.debounce)
                    await self._drain()
                await self._schedule()
        await self._step_down("stopping", resign=True)

    def _timeout(self) -> float:
        timeout = self.options.lease_check
        if self._may_decide():
            wake = self._next_wake()
            if wake is not None:
                timeout = min(timeout, max(0.0, wake - self.clock()))
        return timeout

    def _next_wake(self) -> int | None:
        """When a cycle falls due with no new event (idle reclaim), after the last cycle; cached per fold."""
        if self.state.idle_reclaim is None:
            return None
        key = (self.state.applied, self._decided_at)
        if key != self._wake_key:
            self._wake_key = key
            self._wake_at = next_wakeup(self.state, self._decided_at)
        return self._wake_at

    def _timer_due(self) -> bool:
        wake = self._next_wake()
        return wake is not None and wake <= self._now()

    def _now(self) -> int:
        # event time never goes backwards on the log, even if this replica's clock is behind
        return max(int(self.clock()), int(self.state.now))

    def _may_decide(self) -> bool:
        term = self.term
        return (
            term is not None
            and self.leading
            and term.synced_seq is not None
            and self.folded_seq >= term.synced_seq
            and self.state.epoch == term.epoch
        )

    # ------------------------------------------------------------ leadership

    async def _leadership(self) -> None:
        state = self.state
        if self.epoch:
            if not self.elector.leading():
                await self._step_down("lease lost")
            elif state.epoch != self.epoch or state.leader != self.identity:
                await self._step_down(f"deposed by {state.leader} (epoch {state.epoch})", resign=True)
        elif self.elector.leading() and not self._stop.is_set():
            await self._announce()
        self.metrics.leader.set(1 if self.leading else 0)

    async def _announce(self) -> None:
        """Append a fenced LeaderElected of the next epoch; lead once it is folded."""
        while self.elector.leading():
            try:
                end = await self.store.last_seq()
            except Exception as exc:
                log.warning("cannot read the stream end; announcing later", error=str(exc))
                return
            if not await self._catch_up(end):
                return
            epoch = self.state.epoch + 1
            event = LeaderElected(at=self._now(), epoch=epoch, holder=self.identity)
            try:
                async with self._writing:
                    seqs = await self.store.append(
                        [event], expected_last_seq=self.folded_seq, msg_ids=[f"leader:{epoch}:{self.identity}"]
                    )
            except ConcurrencyConflict as exc:
                await self._catch_up(exc.actual)
                continue
            except StoreError as exc:
                log.warning("announcing leadership failed; retrying", error=str(exc))
                return
            if seqs[0] == self.folded_seq + 1:
                self._fold(seqs[0], event, own=True)
            elif not await self._catch_up(seqs[0]):
                return
            if self.state.epoch == epoch and self.state.leader == self.identity:
                self._begin(epoch)
            return

    def _begin(self, epoch: int) -> None:
        self.epoch = epoch
        term = Term(epoch)
        self.term = term
        self._term_cycles = self.cycles
        self._dirty = True
        log.info("leading", epoch=epoch, holder=self.identity, seq=self.folded_seq)
        assert self._tg is not None
        self._tg.start_soon(self._run_term, term)

    async def _step_down(self, reason: str, *, resign: bool = False) -> None:
        term, self.term = self.term, None
        if term is not None:
            log.info("stepping down", epoch=term.epoch, reason=reason)
            term.scope.cancel()
        self.epoch = 0
        self.metrics.leader.set(0)
        if resign:
            await self.elector.resign()

    async def _run_term(self, term: Term) -> None:
        # every line logged by the term's tasks (applier, adapter, scraper) carries its epoch
        with term.scope, structlog.contextvars.bound_contextvars(epoch=term.epoch):
            async with anyio.create_task_group() as tg:
                if self.cluster_factory is not None:
                    cluster = self.cluster_factory(lambda: self.state)
                    applier = DecisionApplier(
                        cluster,
                        leading=lambda: self.leading and self.epoch == term.epoch,
                        victims=self.victims,
                        metrics=self.metrics,
                        victim_wait=self.options.victim_wait,
                        concurrency=self.options.apply_concurrency,
                    )
                    term.cluster, term.applier = cluster, applier
                    await tg.start(applier.run)
                    await tg.start(cluster.run, self.fact_sink(term))
                    self._reconcile(term)
                for service in self.services:
                    tg.start_soon(service, self, term)
                term.synced_seq = max(self.folded_seq, term.facts)
                self.first_term.set()
                self.poke()
                await anyio.sleep_forever()

    def _reconcile(self, term: Term) -> None:
        """Re-apply the last decision of every live job from earlier epochs (idempotent in the cluster)."""
        assert term.applier is not None
        n = 0
        for job_id in sorted(self.last_decision):
            event = self.last_decision[job_id]
            job = self.state.jobs.get(job_id)
            if job is None or getattr(event, "epoch", 0) >= term.epoch:
                continue
            if (isinstance(event, JobAdmitted) and job.status == "admitted") or (
                isinstance(event, JobPreempted) and job.status == "pending"
            ):
                term.applier.submit(event)
                n += 1
        if n:
            log.info("re-applying decisions of earlier terms", count=n, epoch=term.epoch)

    def fact_sink(self, term: Term) -> Sink:
        """Append the cluster's facts (unfenced: facts are true whoever writes them), retrying until stored.

        Group commit: facts pushed while the write lock is busy (a cycle deciding, another append)
        queue up, and whoever gets the lock next appends all of them at once.
        """

        async def sink(events: list[Event]) -> None:
            if not events:
                return
            # a job's facts are named by what they say; others numbered per term, whichever sink of
            # the term writes: a retry reuses its ids, nothing else does
            start = term.sent
            term.sent += len(events)
            ids = [fact_id(ev) or f"fact:{self.identity}:{term.epoch}:{start + i}" for i, ev in enumerate(events)]
            entry = _Facts(events, ids)
            term.pending.append(entry)
            delay = 0.1
            while not entry.done.is_set():
                failed = False
                # The lease, like for applying: a lapse waits (a slow refresh comes back); a lease lost
                # ends the term, which cancels this. A leader paused past its lease writes nothing.
                while not (self.term is term and self.leading):  # noqa: ASYNC110 - no "renewed" notification
                    await anyio.sleep(0.05)
                async with self._writing:
                    if entry.done.is_set():
                        break
                    batch, term.pending = term.pending, []
                    flat = [ev for b in batch for ev in b.events]
                    try:
                        seqs = await self.store.append(flat, msg_ids=[i for b in batch for i in b.ids])
                    except StoreError as exc:
                        term.pending[:0] = batch
                        failed = True
                        log.warning("appending cluster facts failed; retrying", error=str(exc), count=len(flat))
                    else:
                        if seqs == list(range(self.folded_seq + 1, self.folded_seq + 1 + len(flat))):
                            # right after what we folded: fold now rather than when the follower
                            # brings them back, so the next cycle decides on them without waiting
                            for seq, ev in zip(seqs, flat, strict=True):
                                self._fold(seq, ev)
                        term.facts = max(term.facts, *seqs)
                        for ev in flat:
                            self.metrics.facts.labels(type(ev).__name__).inc()
                        for b in batch:
                            b.done.set()
                if failed:
                    await anyio.sleep(delay)
                    delay = min(5.0, delay * 2)
            self.poke()

        return sink

    # ------------------------------------------------------------ scheduling

    async def _schedule(self) -> None:
        """Cycles until one admits and preempts nothing (or the term ends).

        Each cycle holds the write lock from the drain to the append, so this
        replica's own facts (pushed by the cluster while applying) cannot land
        between the state decided on and its decisions.
        """
        for _ in range(self.options.max_cycles):
            async with self._writing:
                await self._drain()
                self._dirty = False  # the cycle below sees everything folded so far
                if not self._may_decide():
                    return
                now = self._now()
                self._decided_at = now
                expected = self.folded_seq  # the state decided on ends here; the append is fenced on it
                started = time.perf_counter()
                try:
                    events = await self._decide(now, term_first=self.cycles == self._term_cycles)
                except Exception:
                    log.exception("decide failed; waiting for the next change", seq=self.folded_seq)
                    self.metrics.cycles.labels("error").inc()
                    return
                self._cycle_seconds = time.perf_counter() - started
                self.metrics.cycle_seconds.observe(self._cycle_seconds)
                self.cycles += 1
                if not events:
                    self.metrics.cycles.labels("idle").inc()
                    return
                outcome = await self._append(events, expected)
            if isinstance(outcome, int):
                # refused or unsure: fold what the log holds up to there, then decide again
                # (the core keeps a cycle's parked verdicts only once its decisions are folded)
                await self._catch_up(outcome)
                await self._leadership()
                if self._stop.is_set() or not self._may_decide():
                    return
                continue
            self.metrics.cycles.labels("decided").inc()
            if not any(isinstance(ev, (JobAdmitted, JobPreempted)) for ev in events):
                return
        log.warning("scheduling did not settle", cycles=self.options.max_cycles, seq=self.folded_seq)

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
        if term_first or self._cycle_seconds > self.options.decide_inline:
            return await anyio.to_thread.run_sync(self.decider, self.state, now)
        return self.decider(self.state, now)

    def _msg_ids(self, events: list[Event]) -> list[str]:
        ids = []
        for i, ev in enumerate(events):
            digest = hashlib.sha256(encode(ev)).hexdigest()[:16]
            ids.append(f"{getattr(ev, 'epoch', 0)}:{getattr(ev, 'cycle', 0)}:{i}:{digest}")
        return ids

    async def _append(self, events: list[Event], expected: int) -> int | None:
        """Append one cycle's decisions fenced on `expected` and fold them (the write lock is held).

        None when they are on the log and folded; else the sequence to fold up
        to before deciding again.
        """
        ids = self._msg_ids(events)
        if not self.leading:
            return expected
        await self.hooks.before_append(events)
        try:
            seqs = await self._appender.append(events, expected_last_seq=expected, msg_ids=ids)
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
        if seqs != list(range(expected + 1, expected + 1 + len(events))):
            return int(max(seqs))  # earlier copies of these: they come back through the follower
        for seq, ev in zip(seqs, events, strict=True):
            self._fold(seq, ev, own=True)
            self.metrics.decisions.labels(type(ev).__name__).inc()
        self.appended_decisions += len(events)
        return None
