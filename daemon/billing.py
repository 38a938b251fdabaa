"""The billing subscriber: a durable JetStream consumer that folds the log into the chargeback ledger.

Role: the imperative shell around `projections.billing`. It pulls batches
from its own durable consumer (explicit acks), decodes and folds them, writes
the batch's rows together with the cursor in one database transaction, and
only then acks.

Invariants (design invariant 5, exactly-once effects):
- Write before ack. A crash after the fetch loses nothing (the messages are
  delivered again); a crash after the write and before the acks makes the
  stream deliver messages the ledger already holds: any sequence at or below
  the stored cursor is acked and ignored.
- Events are applied in stream order. On start the consumer is put back at
  the stored cursor + 1 unless it already stands exactly there with nothing
  awaiting an ack; a gap in what a fetch returns (a delivery lost in a
  reconnect) stops the batch at the gap and repositions the consumer the same
  way. Only a sequence the stream no longer holds is stepped over.
- Bad input never stops billing (invariant 7): a message that does not decode
  is logged with its sequence, counted, recorded in the `billing_skipped`
  table with the batch, and acked; it stays on the stream. So is an event
  whose rows the database cannot hold (a number past its 64-bit integers):
  a batch that fails to write for that reason is written again one event at
  a time, and the event that fails alone is skipped (never a crash loop).
- A NATS outage is waited out: the client reconnects, the subscriber backs
  off and repositions its consumer at the cursor, and goes on.
- Crash points are injectable through `CrashHooks` (tests use it to kill the
  subscriber between fetch, write and ack).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import nats.errors
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from muster.daemon.billing_store import LedgerDB, LedgerError
from muster.events.codec import DecodeError, decode
from muster.events.store import subject_problem
from muster.projections.billing import evolve_billing, settle, skip_bad
from muster.projections.ledger import (
    DEFAULT_GPU_LABEL,
    BillingState,
    Ledger,
    Tracker,
    drain,
    merge_into,
    new_billing_state,
)

log = structlog.get_logger("muster.billing")

DEFAULT_DURABLE = "muster-billing"
RETRY_MIN = 0.25
RETRY_MAX = 5.0
DEFAULT_STREAM = "MUSTER"


class StreamMissing(RuntimeError):
    """The stream to bill does not exist (the daemon has not created it yet, or a wrong name)."""


class CrashHooks(Protocol):
    """Points in a batch where a test may stop the subscriber as a crash would."""

    def after_fetch(self, seqs: Sequence[int]) -> None: ...

    def after_write(self, seq: int) -> None: ...

    def after_ack(self, seq: int) -> None: ...


class NoCrash:
    """The production hooks: nothing happens."""

    def after_fetch(self, seqs: Sequence[int]) -> None:
        pass

    def after_write(self, seq: int) -> None:
        pass

    def after_ack(self, seq: int) -> None:
        pass


def _unstorable(exc: BaseException) -> bool:
    """Whether a failed write is the data's fault (a number SQLite, PostgreSQL or msgpack cannot hold),
    not the database's or the code's (those stop the subscriber, which resumes at its cursor: a bug
    must not turn into skipped events)."""
    if isinstance(exc, OverflowError):
        return True
    return any(cls.__name__ == "DataError" for cls in type(exc).__mro__)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class BillingMetrics:
    """Prometheus metrics of one subscriber, in their own registry."""

    KINDS = ("allocated", "used", "idle", "borrowed", "lost")

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.gpu_hours = Counter(
            "muster_billing_gpu_hours", "GPU-hours booked into the ledger", ["queue", "kind"], registry=r
        )
        self.lag = Gauge("muster_billing_lag_events", "Stream messages not yet in the ledger", registry=r)
        self.applied_seq = Gauge("muster_billing_applied_sequence", "Last stream sequence in the ledger", registry=r)
        self.event_time = Gauge(
            "muster_billing_last_event_time_seconds", "Event time of the latest event in the ledger", registry=r
        )
        self.events = Counter("muster_billing_events", "Stream messages folded into the ledger", registry=r)
        self.skipped = Counter("muster_billing_skipped_events", "Malformed messages skipped", registry=r)
        self.redelivered = Counter(
            "muster_billing_redelivered_events", "Messages already in the ledger, acked and ignored", registry=r
        )

    def observe(self, delta: Ledger) -> None:
        per_queue: dict[str, list[int]] = {}
        for u in delta.usage.values():
            acc = per_queue.setdefault(u.queue, [0, 0, 0, 0, 0])
            acc[0] += u.alloc_gpu_s * 1000
            acc[1] += u.used_mgpu_s
            acc[2] += u.idle_mgpu_s
            acc[3] += u.borrowed_gpu_s * 1000
            acc[4] += u.lost_gpu_s * 1000
        for queue, values in per_queue.items():
            for kind, milli_s in zip(self.KINDS, values, strict=True):
                if milli_s > 0:
                    self.gpu_hours.labels(queue=queue, kind=kind).inc(milli_s / 3_600_000)


@dataclass
class SubscriberOptions:
    stream: str = DEFAULT_STREAM
    durable: str = DEFAULT_DURABLE
    batch: int = 1000
    fetch_timeout: float = 1.0
    ack_wait: float = 30.0
    """Seconds before the server delivers an unacked message again."""
    gpu_label: str = DEFAULT_GPU_LABEL
    settle_every: int = 60
    """When caught up, book running jobs up to the latest event at most this often (seconds of event time)."""
    from_stream_start: bool = False
    """Start a ledger whose next event the stream no longer holds (purged into an archive, dropped by its
    limits) at the stream's first message anyway; without it such a start is refused: the ledger would miss
    those events' GPU-hours without a word."""
    hooks: CrashHooks = field(default_factory=NoCrash)


class BillingSubscriber:
    """Folds one stream into one ledger. `await start()`, then `step()` or `run()`; `close()` at the end."""

    def __init__(self, js: Any, ledger: LedgerDB, options: SubscriberOptions, metrics: BillingMetrics) -> None:
        self.js = js
        self.ledger = ledger
        self.options = options
        self.metrics = metrics
        self.state: BillingState = new_billing_state(options.gpu_label)
        self.ready = False
        self._psub: Any = None
        self._settled: int | None = None
        self._reported: set[int] = set()
        """Skipped sequences of the current batch already logged and counted."""

    @property
    def tracker(self) -> Tracker:
        return self.state.tracker

    async def start(self) -> None:
        """Load the cursor and tracker from the ledger and put the consumer right after the cursor.

        Raises StreamMissing when the stream does not exist (yet)."""
        from nats.js.errors import NotFoundError

        try:
            info = await self.js.stream_info(self.options.stream)
        except NotFoundError:
            raise StreamMissing(f"no stream {self.options.stream!r} on this NATS server") from None
        seq, tracker = self.ledger.load()
        if seq > info.state.last_seq:
            raise LedgerError(
                f"the ledger has applied up to sequence {seq} but stream {self.options.stream!r} ends at "
                f"{info.state.last_seq}: the stream was recreated; bill it into a new ledger (--db)"
            )
        first = info.state.first_seq
        if first > seq + 1:
            gone = f"{seq + 1:,}" if first == seq + 2 else f"{seq + 1:,} to {first - 1:,}"
            if not self.options.from_stream_start:
                raise LedgerError(
                    f"the ledger has applied up to sequence {seq:,} but stream {self.options.stream!r} now starts at "
                    f"{first:,}: events {gone} left it (purged after sealing into the archive, or dropped by its "
                    "limits) before this ledger read them, so it would miss their GPU-hours; give billing its "
                    "database back (the chart: billing.persistence.existingClaim), or start it there knowingly "
                    "with --from-stream-start"
                )
            log.warning("billing.starts_after_missing_events", missing=gone, stream_first=first, ledger_seq=seq)
        self.state = BillingState(tracker=tracker) if tracker is not None else new_billing_state(self.options.gpu_label)
        await self._position()
        self.metrics.applied_seq.set(seq)
        self.ready = True
        log.info("billing.started", stream=self.options.stream, durable=self.options.durable, seq=seq)

    async def _position(self) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
        from nats.js.errors import NotFoundError

        o = self.options
        seq = self.tracker.seq
        if self._psub is not None:
            psub, self._psub = self._psub, None
            with contextlib.suppress(nats.errors.Error):
                await psub.unsubscribe()
        try:
            info = await self.js.consumer_info(o.stream, o.durable)
        except NotFoundError:
            info = None
        reuse = (
            info is not None
            and info.config.ack_policy == AckPolicy.EXPLICIT
            and not info.config.filter_subject
            and (info.num_ack_pending or 0) == 0
            and info.delivered is not None
            and info.delivered.stream_seq == seq
        )
        if not reuse:
            if info is not None:
                log.info(
                    "billing.consumer_reset",
                    durable=o.durable,
                    delivered=info.delivered.stream_seq if info.delivered else None,
                    ack_pending=info.num_ack_pending,
                    cursor=seq,
                )
                await self.js.delete_consumer(o.stream, o.durable)
            config = ConsumerConfig(
                durable_name=o.durable,
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE if seq > 0 else DeliverPolicy.ALL,
                opt_start_seq=seq + 1 if seq > 0 else None,
                ack_wait=o.ack_wait,
                max_ack_pending=max(4 * o.batch, 1000),
                max_deliver=-1,
                description="muster billing ledger",
            )
            await self.js.add_consumer(o.stream, config=config)
        self._psub = await self.js.pull_subscribe_bind(durable=o.durable, stream=o.stream)

    async def _missing(self, seq: int) -> bool:
        """Whether the stream no longer holds `seq` (deleted or expired), so a gap there is real."""
        from nats.js.errors import NotFoundError

        try:
            await self.js.get_msg(self.options.stream, seq)
        except NotFoundError:
            return True
        return False

    def _apply(self, seq: int, subject: str, raw: bytes) -> None:
        try:
            event = decode(raw)
        except DecodeError as exc:
            self._skip(seq, exc.message)
            return
        problem = subject_problem(subject.encode(), event)
        if problem is not None:  # the scheduler skips it too (EventStore readers): bill what it scheduled
            self._skip(seq, problem)
            return
        try:
            evolve_billing(self.state, seq, event)
        except Exception as exc:  # the fold is total; if it is not, one event must not stop billing
            if self._first_report(seq):
                log.exception("billing.fold_error", seq=seq)
            # evolve_billing moved the cursor past `seq` before it failed, so skip_bad would ignore it
            self.state.ledger.skipped.append((seq, f"fold error: {type(exc).__name__}: {exc}"))
            self.tracker.skipped += 1

    def _skip(self, seq: int, reason: str) -> None:
        if self._first_report(seq):
            log.warning("billing.skipped_event", seq=seq, error=reason)
        skip_bad(self.state, seq, reason)

    def _first_report(self, seq: int) -> bool:
        """Count and log a skipped event once, also when its batch is folded again one event at a time."""
        if seq in self._reported:
            return False
        self._reported.add(seq)
        self.metrics.skipped.inc()
        return True

    async def step(self) -> int:
        """Fetch one batch, fold it, write it with the cursor, ack it. Returns how many messages came."""
        hooks = self.options.hooks
        if self._psub is None:
            await self._position()
        try:
            msgs = await self._psub.fetch(self.options.batch, timeout=self.options.fetch_timeout)
        except TimeoutError:  # nats-py raises its own subclass or asyncio's: nothing came in time
            return 0
        if not msgs:  # a status message (e.g. the consumer was deleted) can end a fetch empty-handed
            await self._position()
            return 0
        seqs = [m.metadata.sequence.stream for m in msgs]
        self._reported = set()
        hooks.after_fetch(seqs)
        tracker = self.tracker
        start_seq = tracker.seq
        usable = len(msgs)
        for i, (msg, seq) in enumerate(zip(msgs, seqs, strict=True)):
            if seq <= tracker.seq:
                self.metrics.redelivered.inc()
                continue
            if seq > tracker.seq + 1 and tracker.seq > 0 and not await self._missing(tracker.seq + 1):
                # Out of order (a delivery lost on the way): fold nothing past the gap.
                log.warning("billing.delivery_gap", expected=tracker.seq + 1, got=seq)
                usable = i
                break
            self._apply(seq, msg.subject, msg.data)
        pending = msgs[-1].metadata.num_pending or 0
        clock = tracker.clock
        caught_up = usable == len(msgs) and pending == 0 and clock is not None
        if (
            caught_up
            and clock is not None
            and (self._settled is None or clock - self._settled >= self.options.settle_every)
        ):
            # bring running jobs' current hour up to date (any cut gives the same sums)
            settle(self.state)
            self._settled = clock
        delta = drain(self.state)
        if tracker.seq > start_seq:
            try:
                self.ledger.commit(delta, tracker)
            except Exception as exc:
                if not _unstorable(exc):
                    raise
                log.warning("billing.batch_unstorable", first=seqs[0], last=seqs[usable - 1], error=_why(exc))
                delta = self._commit_one_by_one(list(zip(msgs[:usable], seqs[:usable], strict=True)))
                tracker = self.tracker
            self.metrics.observe(delta)
            self.metrics.events.inc(tracker.seq - start_seq)
            self.metrics.applied_seq.set(tracker.seq)
            if tracker.clock is not None:
                self.metrics.event_time.set(tracker.clock)
        if usable == len(msgs):
            self.metrics.lag.set(pending)  # with the sequence, so a scrape never pairs a new one with an old lag
        hooks.after_write(tracker.seq)
        for msg, seq in zip(msgs[:usable], seqs[:usable], strict=True):
            await msg.ack()
            hooks.after_ack(seq)
        if usable < len(msgs):
            await self._position()
        return len(msgs)

    def _reload(self) -> None:
        """Back to the state of the last commit (the tracker stored with the cursor)."""
        _, tracker = self.ledger.load()
        self.state = BillingState(tracker=tracker) if tracker is not None else new_billing_state(self.options.gpu_label)

    def _commit_one_by_one(self, batch: list[tuple[Any, int]]) -> Ledger:
        """Write a batch whose rows could not be stored event by event; an event whose own rows cannot be
        stored (a number past the database's integers) is skipped and recorded. Returns what was written."""
        written = Ledger()
        self._reload()
        for msg, seq in batch:
            if seq <= self.tracker.seq:
                continue
            self._apply(seq, msg.subject, msg.data)
            delta = drain(self.state)
            try:
                self.ledger.commit(delta, self.tracker)
            except Exception as exc:
                if not _unstorable(exc):
                    raise
                self._reload()
                self._skip(seq, f"its rows cannot be stored in the ledger: {_why(exc)}")
                delta = drain(self.state)
                self.ledger.commit(delta, self.tracker)
            merge_into(written, delta)
        self._settled = None
        return written

    async def run(self, *, once: bool = False, stop: anyio.Event | None = None) -> None:
        """Fold until `stop` is set (checked between batches); with `once`, until the ledger holds
        everything the stream held at the start."""
        target = None
        if once:
            info = await self.js.stream_info(self.options.stream)
            target = info.state.last_seq
        delay = RETRY_MIN
        while stop is None or not stop.is_set():
            try:
                got = await self.step()
            except nats.errors.Error as exc:
                # NATS is away (the client reconnects by itself): wait, then put the consumer back at the cursor
                log.warning("billing.nats_error", error=f"{type(exc).__name__}: {exc}", retry_in=delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                with contextlib.suppress(nats.errors.Error):
                    await self._position()
                continue
            delay = RETRY_MIN
            if target is None:
                continue
            if self.tracker.seq >= target:
                return
            if got == 0:
                # A fetch can time out with messages still on their way; stop only when the
                # consumer has nothing left to deliver (the rest of the stream was deleted).
                info = await self.js.consumer_info(self.options.stream, self.options.durable)
                if not info.num_pending and not info.num_ack_pending:
                    log.warning("billing.drain_incomplete", applied=self.tracker.seq, stream_last=target)
                    return

    async def close(self) -> None:
        self.ready = False
        if self._psub is not None:
            with anyio.move_on_after(2, shield=True):
                await self._psub.unsubscribe()
            self._psub = None
