"""Re-derive every recorded decision: proof that each was the code's, and the alarm when code changes the past.

A *batch* is one scheduling cycle as recorded: consecutive decision events
(`JobAdmitted`, `JobPreempted`, `JobInadmissible`, `JobRejected`, ...) with the
same `(epoch, cycle)`, or one `CycleSettled` (a cycle that decided nothing but
judged jobs: it shares its number with the next cycle that decides). For each
batch the audit calls `decide(state, at)` on the state folded up to just
before the batch, at the batch's time, and compares the result with the
recorded events, byte for byte (the stored JSON encoding), position by
position.

How it stays exact and fast:
- ONE running state is folded forward through the log; `decide` is called on
  it just before each batch and never sees the batch. This relies on the
  core's parking memo being exact and a function of the log: a cycle that
  parked jobs is recorded (its decisions, or its `CycleSettled`), one that
  neither decided nor parked leaves no trace and need not be re-run. After a
  difference the scheduler index is dropped so a tampered decision cannot
  leave a stale memo behind.
- A `CycleSettled` says how many jobs the writer's memo judged, which only a
  memo with the same history can re-derive: the audit's is, from the log's
  start and from each new leader's election on (the fold rebuilds the
  scheduler index there, for every reader alike). In a window that starts
  later, or after a difference, until the next election, a `CycleSettled` is
  checked only to decide nothing else (`settled_unchecked`).
- The recorded events, not the re-derived ones, are folded: the log is the
  truth, and every later batch is judged on what really happened.
- Decision events with `cycle` 0 are inputs (the daemon's input translation
  rejects malformed jobs that way; so does `muster sim` for unparsable
  quantities): folded, not audited.
- Decisions of an epoch older than the log's latest `LeaderElected` are
  *fenced*: the fold ignores them, so they are counted and shown as fenced,
  never as differences.
- A window that starts inside a batch skips the rest of that batch (its
  start is not in the window), so no half-folded state is ever judged.

`decide` raising is reported as a difference with the error, never a crash.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from muster.events.codec import encode
from muster.events.types import (
    DECISION_TYPES,
    CycleSettled,
    Event,
    JobAdmitted,
    JobInadmissible,
    JobPreempted,
    JobRejected,
    ReservationMade,
    ReservationReleased,
    SubmissionRejected,
)
from muster.projections import index as scheduler_index
from muster.projections.cluster import evolve
from muster.projections.fencing import fenced
from muster.projections.resources import fmt
from muster.projections.scheduler import decide
from muster.projections.settling import unsettled
from muster.projections.state import ClusterState
from muster.replay.points import Point
from muster.replay.rebuild import state_before
from muster.replay.snapshots import Snapshots, Verify
from muster.replay.source import LogSource


@dataclass
class Batch:
    """One recorded cycle, and what the code re-derives for it."""

    first_seq: int
    last_seq: int
    epoch: int
    cycle: int
    at: int
    recorded: list[Event]
    seqs: list[int] = field(default_factory=list)
    """The sequence of each recorded event."""
    derived: list[Event] = field(default_factory=list)
    identical: int = 0
    differ: int = 0
    error: str | None = None


@dataclass
class AuditReport:
    source: str
    from_seq: int
    to_seq: int
    cycles: int = 0
    cycles_identical: int = 0
    identical: int = 0
    """Decisions re-derived identically."""
    differ: int = 0
    """Recorded decisions that differ, plus re-derived ones that were not recorded."""
    fenced: int = 0
    inputs: int = 0
    """Decisions with cycle 0 (input translation), folded and not audited."""
    skipped_partial: int = 0
    """Decisions of a batch that started before the window."""
    differences: list[Batch] = field(default_factory=list)
    unrecorded: list[Batch] = field(default_factory=list)
    """Settling cycles (see `audit`) for which the code decides something the log does not show."""
    fenced_seqs: list[int] = field(default_factory=list)
    settled_unchecked: int = 0
    """`CycleSettled` records judged on a memo the audit could not rebuild (see the module docstring)."""
    events: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.differ == 0

    def headline(self) -> str:
        return f"{self.identical:,} decisions re-derived identically, {self.differ:,} differ"


def _compare(batch: Batch, memo_in_step: bool) -> int:
    """Compare a batch's recorded and derived decisions; returns the `CycleSettled` left unchecked."""
    recorded, derived = batch.recorded, batch.derived
    unchecked = 0
    if not memo_in_step:
        unchecked = sum(1 for e in recorded if isinstance(e, CycleSettled))
        recorded = [e for e in recorded if not isinstance(e, CycleSettled)]
        derived = [e for e in derived if not isinstance(e, CycleSettled)]
    rec = [encode(e) for e in recorded]
    der = [encode(e) for e in derived]
    same = sum(1 for a, b in zip(rec, der, strict=False) if a == b)
    batch.identical = same
    batch.differ = max(len(rec), len(der)) - same
    return unchecked


def _joins(batch: Batch, key: tuple[int, int], ev: Event) -> bool:
    """Whether a decision of cycle `key` belongs to the batch being read: same cycle, and neither is a
    `CycleSettled` (a cycle that decided nothing is a batch of its own)."""
    return (
        key == (batch.epoch, batch.cycle)
        and not isinstance(ev, CycleSettled)
        and not isinstance(batch.recorded[-1], CycleSettled)
    )


def _reset_index(state: ClusterState) -> None:
    """Drop the scheduler's derived index; the next `decide` rebuilds it from the state alone."""
    state.__dict__.pop(scheduler_index._ATTR, None)


async def audit(
    source: LogSource,
    *,
    start: Point | None = None,
    end: Point | None = None,
    snapshots: Snapshots | None = None,
    verify: Verify = "marks",
    on_batch: Callable[[Batch], None] | None = None,
) -> AuditReport:
    """Audit every batch that starts inside [start, end] (default: the whole log)."""
    t0 = time.perf_counter()
    last = await source.last_seq()
    before = await state_before(source, start, snapshots, verify=verify)
    state, from_seq = before.state, before.from_seq
    end_seq = last if end is None or end.seq is None else min(end.seq, last)
    end_time = end.time if end is not None else None
    report = AuditReport(source.name, from_seq, end_seq)

    batch: Batch | None = None
    partial_key = (state.epoch, state.cycle) if state.cycle_decisions else None
    settle_at: int | None = None
    """Time of the last audited cycle that admitted or preempted: its caller decided again at that instant."""
    in_step = from_seq <= 1
    """Whether the audit's parking memo has the writer's history (see the module docstring)."""

    def flush() -> None:
        nonlocal batch, settle_at, in_step
        b = batch
        if b is None:
            return
        batch = None
        try:
            b.derived = decide(state, b.at)
        except Exception as exc:  # the audit reports a crashing core, it does not share the crash
            b.error = f"{type(exc).__name__}: {exc}"
            b.derived = []
        report.settled_unchecked += _compare(b, in_step)
        report.cycles += 1
        report.identical += b.identical
        report.differ += b.differ
        if b.differ or b.error:
            if b.error and not b.differ:
                report.differ += 1
                b.differ = 1
            report.differences.append(b)
        else:
            report.cycles_identical += 1
        for ev in b.recorded:
            evolve(state, ev)
        if b.differ:
            _reset_index(state)
            in_step = False
        if unsettled(b.recorded):
            settle_at = b.at
        if on_batch is not None:
            on_batch(b)

    def settle(seq: int, ev: Event | None) -> None:
        """The caller's next cycle at the same instant, when the log shows it decided nothing.

        `muster sim` and the daemon decide again after a cycle that admits or
        preempts; the next recorded batch at that instant is that cycle.
        Otherwise it decided nothing, and so must the code. The daemon first
        folds the facts that arrived meanwhile (pods terminating, a new job),
        and its clock is wall-clock seconds, which may tick between two
        cycles: facts up to one second later are folded before that cycle is
        run, and a batch up to one second later is that cycle. (A sim log's
        settling cycles are checked exactly by tests/projections/test_invariants.)
        """
        nonlocal settle_at
        at = settle_at
        if at is None:
            return
        if ev is not None and isinstance(ev, DECISION_TYPES) and ev.cycle != 0 and at <= ev.at <= at + 1:
            settle_at = None  # this batch is that cycle
            return
        if ev is not None and not isinstance(ev, DECISION_TYPES) and ev.at <= at + 1:
            return  # a fact the caller may have folded before its next cycle
        settle_at = None
        try:
            derived = decide(state, at)
        except Exception as exc:
            derived = []
            report.unrecorded.append(Batch(seq, seq, state.epoch, state.cycle + 1, at, [], [], error=str(exc)))
            return
        if not in_step:
            derived = [e for e in derived if not isinstance(e, CycleSettled)]
        if derived:
            report.unrecorded.append(Batch(seq, seq, state.epoch, state.cycle + 1, at, [], [], derived))

    async for chunk in source.batches(from_seq, None):
        for seq, ev in chunk:
            beyond = seq > end_seq or (end_time is not None and ev.at > end_time)
            if isinstance(ev, DECISION_TYPES) and ev.cycle != 0:
                key = (ev.epoch, ev.cycle)
                if batch is not None and _joins(batch, key, ev):
                    # a batch that started in the window is audited whole
                    batch.recorded.append(ev)
                    batch.seqs.append(seq)
                    batch.last_seq = seq
                    report.events += 1
                    continue
                flush()
                if beyond:
                    return _finish(report, t0)
                report.events += 1
                if partial_key is not None and key == partial_key:
                    report.skipped_partial += 1
                    evolve(state, ev)
                    continue
                partial_key = None
                if fenced(ev.epoch, state.epoch):
                    settle(seq, None)
                    report.fenced += 1
                    report.fenced_seqs.append(seq)
                    evolve(state, ev)
                    continue
                settle(seq, ev)
                batch = Batch(seq, seq, ev.epoch, ev.cycle, ev.at, [ev], [seq])
                continue
            flush()
            if beyond:
                return _finish(report, t0)
            settle(seq, ev)
            report.events += 1
            partial_key = None
            if isinstance(ev, DECISION_TYPES):
                report.inputs += 1
            epoch = state.epoch
            evolve(state, ev)
            if state.epoch != epoch:
                in_step = True  # a new leader: its memo, and the audit's, start afresh (`cluster`)
    flush()
    settle(end_seq + 1, None)
    return _finish(report, t0)


def _finish(report: AuditReport, t0: float) -> AuditReport:
    report.seconds = time.perf_counter() - t0
    return report


# ---------------------------------------------------------------- presentation


def brief(ev: Event) -> str:
    """One line for a decision event."""
    if isinstance(ev, JobAdmitted):
        nodes = sorted(set(ev.placement.values()))
        where = ", ".join(nodes[:6]) + (f" +{len(nodes) - 6} more" if len(nodes) > 6 else "")
        pods = ", ".join(f"{p}->{n}" for p, n in sorted(ev.placement.items())[:8])
        more = f" +{len(ev.placement) - 8} pods" if len(ev.placement) > 8 else ""
        borrowed = f", borrowing {fmt(ev.borrowed)}" if ev.borrowed else ""
        return f"admit {ev.job} on {where} [{pods}{more}]{borrowed}"
    if isinstance(ev, JobPreempted):
        by = f"for {ev.preemptor}" if ev.preemptor else "(no preemptor)"
        return f"preempt {ev.job} {by}: {ev.reason}, {ev.lost_gpu_seconds} GPU-s lost"
    if isinstance(ev, JobInadmissible):
        return f"pending {ev.job}: {ev.reason}"
    if isinstance(ev, (JobRejected, SubmissionRejected)):
        return f"reject {ev.job}: {ev.reason}"
    if isinstance(ev, ReservationMade):
        start = f"expected at {ev.expected_start}" if ev.expected_start is not None else "start unknown"
        return f"reserve {', '.join(ev.nodes)} for {ev.job} ({start}): {ev.reason}"
    if isinstance(ev, ReservationReleased):
        return f"release the reservation of {ev.job}: {ev.reason}"
    if isinstance(ev, CycleSettled):
        return f"settled: {ev.judged} jobs judged still waiting, their verdicts stand (#{ev.serial})"
    return f"{type(ev).__name__}"


def batch_document(b: Batch) -> dict[str, Any]:
    import json

    return {
        "first_seq": b.first_seq,
        "last_seq": b.last_seq,
        "epoch": b.epoch,
        "cycle": b.cycle,
        "at": b.at,
        "identical": b.identical,
        "differ": b.differ,
        "error": b.error,
        "recorded": [{"seq": q, "event": json.loads(encode(e))} for q, e in zip(b.seqs, b.recorded, strict=True)],
        "derived": [json.loads(encode(e)) for e in b.derived],
    }


def report_document(r: AuditReport) -> dict[str, Any]:
    return {
        "source": r.source,
        "from_seq": r.from_seq,
        "to_seq": r.to_seq,
        "summary": r.headline(),
        "identical": r.identical,
        "differ": r.differ,
        "cycles": r.cycles,
        "cycles_identical": r.cycles_identical,
        "fenced": r.fenced,
        "fenced_seqs": r.fenced_seqs[:1000],
        "settled_unchecked": r.settled_unchecked,
        "inputs": r.inputs,
        "skipped_partial": r.skipped_partial,
        "events": r.events,
        "seconds": round(r.seconds, 3),
        "differences": [batch_document(b) for b in r.differences],
        "unrecorded": [batch_document(b) for b in r.unrecorded],
    }
