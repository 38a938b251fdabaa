"""The chargeback ledger: a pure fold of the event log into GPU, CPU and memory accounting.

`evolve_billing(state, seq, event)` applies one stored event. The state
(`ledger.BillingState`) has two halves:

- `Tracker`, the working memory the fold needs to go on (jobs that are pending
  or hold resources, nodes, the leader epoch, the last applied sequence). It is
  small, msgspec-encodable, and the subscriber stores it as a snapshot in the
  same transaction as the ledger rows.
- `Ledger`, additive accumulators: per (job, hour, GPU model) usage rows, per
  (hour, GPU model) cluster capacity, job and queue descriptions, and the
  sequences of events that were skipped. A shell may `drain()` it after a batch
  and add the rows to a database (`value = value + delta`); a test may keep it
  whole. Either way the sums are the same.

What is counted (GPU quantities are whole GPUs times seconds):
- allocated: GPUs held from `JobAdmitted` to `JobFinished`, `JobFailed`,
  `JobCancelled` or `JobPreempted`, split per hour and per GPU model of the
  nodes the gang was placed on (node label `gpu_label`, "" when absent). On a
  cluster with resource flavors the "model" of a node is its flavor (the first
  by name whose labels it carries; the label when it has none), so the ledger,
  the capacity and the rate card are per flavor;
- sampled/used: from a `GpuUtilizationSampled` on, utilization is piecewise
  constant until the next sample or the end of the run; `sampled` is the
  allocation covered by samples and `used` is allocation x utilization, kept in
  milli-GPU-seconds with utilization rounded to 0.1 %; idle = sampled - used;
- borrowed: `JobAdmitted.borrowed` GPUs (`gpu`, or `gpu@FLAVOR` per flavor) x time held;
- lost: `JobPreempted.lost_gpu_seconds`, booked in the hour of the preemption;
- CPU milli-core-seconds and memory MiB-seconds from the gang's requests
  (memory rounded up to whole MiB per pod);
- capacity: GPUs (capacity minus reserved) of ready nodes over time.

Invariants:
- Deterministic and integer: the same events give equal ledgers; no floats are
  stored. Every quantity is additive over time (g * (b - a) + g * (c - b) =
  g * (c - a)), so where a run is cut into pieces does not change any sum.
- Exactly once at the fold: an event whose sequence is not above
  `tracker.seq` changes nothing.
- Mirrors the cluster fold's acceptance rules (epoch fencing by `fencing`, placement must
  name every pod on a known node, one run at a time) so that billing counts the
  runs the scheduler believes in; an event that does not fit is counted in
  `tracker.ignored` and changes nothing else.
- Event time never goes back for the ledger: an event stamped before the
  latest one seen counts as happening at the latest time (`tracker.clock`).
  Together with additivity this makes the ledger independent of when runs are
  booked: a running job is booked at each of its events, at every hour
  boundary of event time, and whenever a shell calls `settle` (the subscriber
  does when it has caught up), and any mix of those gives the same sums.
- Terminal jobs leave the tracker (their rows stay in the ledger), so memory is
  bounded by jobs pending or running.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from muster.events.types import (
    Event,
    FlavorConfigured,
    GpuUtilizationSampled,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobRejected,
    JobStarted,
    JobSubmitted,
    LeaderElected,
    NodeAdded,
    NodeRemoved,
    NodeUpdated,
    QueueConfigured,
)
from muster.projections.fencing import fenced, newer_leader
from muster.projections.flavors import carries
from muster.projections.ledger import (
    HOUR,
    MIB,
    ActiveJob,
    BillingState,
    JobRecord,
    Ledger,
    NodeInfo,
    PodSetReq,
    QueueRecord,
    Run,
    Slice,
    Tracker,
    Usage,
    new_billing_state,
)
from muster.projections.resources import gpus_of

# ---------------------------------------------------------------- accrual


def _row(ledger: Ledger, job: ActiveJob, hour: int, model: str) -> Usage:
    key = (job.record.job, hour, model)
    row = ledger.usage.get(key)
    if row is None:
        row = ledger.usage[key] = Usage(queue=job.record.queue, priority_class=job.record.priority_class)
    return row


def _accrue(ledger: Ledger, job: ActiveJob, run: Run, until: int) -> None:
    """Book the run's holding from `run.since` to `until`, cut at hour boundaries (the fold's hot path)."""
    t = run.since
    if until <= t:
        return
    run.since = until
    usage = ledger.usage
    name = job.record.job
    util = run.util_pm
    while t < until:
        hour = t - t % HOUR
        end = hour + HOUR
        if end > until:
            end = until
        dt = end - t
        for s in run.slices:
            key = (name, hour, s.model)
            row = usage.get(key)
            if row is None:
                row = usage[key] = Usage(queue=job.record.queue, priority_class=job.record.priority_class)
            gs = s.gpus * dt
            row.alloc_gpu_s += gs
            if util >= 0:
                row.sampled_gpu_s += gs
                row.used_mgpu_s += gs * util
            if s.borrowed:
                row.borrowed_gpu_s += s.borrowed * dt
            row.cpu_mcore_s += s.cpu_milli * dt
            row.mem_mib_s += s.mem_mib * dt
        t = end


def _accrue_capacity(tracker: Tracker, ledger: Ledger, until: int) -> None:
    """Book the ready nodes' GPUs from `tracker.cap_since` to `until`."""
    t = tracker.cap_since
    if t is None or until <= t:
        return
    tracker.cap_since = until
    cap = ledger.capacity
    while t < until:
        hour = t - t % HOUR
        end = min(until, hour + HOUR)
        dt = end - t
        for model, gpus in tracker.capacity.items():
            if gpus > 0:
                key = (hour, model)
                cap[key] = cap.get(key, 0) + gpus * dt
        t = end


def _settle_to(state: BillingState, until: int) -> None:
    ledger = state.ledger
    for job in state.tracker.jobs.values():
        if job.run is not None:
            _accrue(ledger, job, job.run, until)
    _accrue_capacity(state.tracker, ledger, until)


def settle(state: BillingState) -> BillingState:
    """Book every running job and the capacity up to the latest event time.

    Not needed for correct totals (every quantity is additive, so where runs are
    cut does not matter); a shell calls it when caught up so that the ledger's
    current hour is up to date.
    """
    clock = state.tracker.clock
    if clock is not None:
        _settle_to(state, clock)
    return state


def _advance_clock(state: BillingState, at: int) -> int:
    """The event's effective time (event time never goes back); books everything up to a crossed hour."""
    tracker = state.tracker
    clock = tracker.clock
    if clock is None:
        tracker.clock = tracker.cap_since = at
        return at
    if at <= clock:
        return clock
    tracker.clock = at
    boundary = at - at % HOUR
    if boundary > clock:
        _settle_to(state, boundary)
    return at


# ---------------------------------------------------------------- handlers


def _ignore(state: BillingState) -> None:
    state.tracker.ignored += 1


def _dirty(state: BillingState, job: ActiveJob) -> None:
    state.ledger.jobs[job.record.job] = job.record


def _on_submitted(state: BillingState, ev: JobSubmitted, now: int) -> None:
    if ev.job in state.tracker.jobs:
        return _ignore(state)
    podsets = [PodSetReq(ps.name, ps.count, dict(ps.requests)) for ps in ev.podsets]
    record = JobRecord(
        job=ev.job,
        queue=ev.queue,
        priority_class=ev.priority_class or "",
        gpus=sum(p.count * p.requests.get("gpu", 0) for p in podsets),
        submitted_at=ev.at,
    )
    job = ActiveJob(record=record, podsets=podsets)
    state.tracker.jobs[ev.job] = job
    _dirty(state, job)


def _slices(tracker: Tracker, job: ActiveJob, placement: Mapping[str, str], borrowed_gpus: int) -> list[Slice] | None:
    """Per GPU model: GPUs, CPU and memory of the pods placed there; None if the placement does not fit."""
    per_pod = {p.name: p.requests for p in job.podsets}
    expected = {f"{p.name}-{i}" for p in job.podsets for i in range(p.count)}
    if placement.keys() != expected:
        return None
    by_model: dict[str, list[int]] = {}
    for pod, node_name in placement.items():
        node = tracker.nodes.get(node_name)
        if node is None:
            return None
        req = per_pod[pod.rpartition("-")[0]]
        acc = by_model.setdefault(node.model, [0, 0, 0])
        acc[0] += req.get("gpu", 0)
        acc[1] += req.get("cpu", 0)
        acc[2] += -(-req.get("memory", 0) // MIB)
    slices = []
    left = max(0, borrowed_gpus)
    # Borrowed GPUs are booked on models in name order: which physical GPU is
    # "the borrowed one" is not defined, only how many are.
    for model in sorted(by_model):
        gpus, cpu, mem = by_model[model]
        b = min(left, gpus)
        left -= b
        slices.append(Slice(model, gpus, b, cpu, mem))
    return slices


def _on_admitted(state: BillingState, ev: JobAdmitted, now: int) -> None:
    tracker = state.tracker
    if fenced(ev.epoch, tracker.epoch):
        return _ignore(state)
    job = tracker.jobs.get(ev.job)
    if job is None or job.run is not None:
        return _ignore(state)
    slices = _slices(tracker, job, ev.placement, gpus_of(ev.borrowed))
    if slices is None:
        return _ignore(state)
    job.run = Run(since=now, slices=slices)
    record = job.record
    record.status = "admitted"
    if record.first_admitted_at is None:
        record.first_admitted_at = ev.at
    _dirty(state, job)


def _primary_model(run: Run) -> str:
    best = min(run.slices, key=lambda s: (-s.gpus, s.model), default=None)
    return best.model if best is not None else ""


def _close(state: BillingState, job: ActiveJob, now: int) -> Run | None:
    run = job.run
    if run is not None:
        _accrue(state.ledger, job, run, now)
        job.run = None
    return run


def _on_preempted(state: BillingState, ev: JobPreempted, now: int) -> None:
    tracker = state.tracker
    if fenced(ev.epoch, tracker.epoch):
        return _ignore(state)
    job = tracker.jobs.get(ev.job)
    if job is None or job.run is None:
        return _ignore(state)
    run = _close(state, job, now)
    assert run is not None
    if ev.lost_gpu_seconds > 0:
        _row(state.ledger, job, now - now % HOUR, _primary_model(run)).lost_gpu_s += ev.lost_gpu_seconds
    job.record.status = "pending"
    job.record.preemptions += 1
    _dirty(state, job)


def _end(state: BillingState, job_id: str, at: int, now: int, status: str) -> None:
    job = state.tracker.jobs.get(job_id)
    if job is None:
        return _ignore(state)
    _close(state, job, now)
    job.record.status = status
    job.record.ended_at = at
    _dirty(state, job)
    del state.tracker.jobs[job_id]


def _on_finished(state: BillingState, ev: JobFinished, now: int) -> None:
    _end(state, ev.job, ev.at, now, "finished")


def _on_failed(state: BillingState, ev: JobFailed, now: int) -> None:
    _end(state, ev.job, ev.at, now, "failed")


def _on_cancelled(state: BillingState, ev: JobCancelled, now: int) -> None:
    _end(state, ev.job, ev.at, now, "cancelled")


def _on_rejected(state: BillingState, ev: JobRejected, now: int) -> None:
    if fenced(ev.epoch, state.tracker.epoch):
        return _ignore(state)
    job = state.tracker.jobs.get(ev.job)
    if job is None or job.run is not None:
        # the cluster fold rejects only pending jobs; a running one keeps running
        return _ignore(state)
    _end(state, ev.job, ev.at, now, "rejected")


def _on_started(state: BillingState, ev: JobStarted, now: int) -> None:
    # Allocation is counted from admission: the GPUs are held while pods start.
    job = state.tracker.jobs.get(ev.job)
    if job is None or job.run is None:
        _ignore(state)


def _on_utilization(state: BillingState, ev: GpuUtilizationSampled, now: int) -> None:
    job = state.tracker.jobs.get(ev.job)
    if job is None or job.run is None or not math.isfinite(ev.gpu):
        return _ignore(state)
    run = job.run
    _accrue(state.ledger, job, run, now)
    run.util_pm = round(min(1.0, max(0.0, ev.gpu)) * 1000)


def _on_node(state: BillingState, ev: NodeAdded | NodeUpdated, now: int) -> None:
    tracker = state.tracker
    _accrue_capacity(tracker, state.ledger, now)
    old = tracker.nodes.get(ev.node)
    gpus = max(0, ev.capacity.get("gpu", 0) - ev.reserved.get("gpu", 0)) if ev.ready else 0
    node = NodeInfo(_model(tracker, ev.labels), gpus, dict(ev.labels) if tracker.flavors else {})
    _set_capacity(tracker, old, node)
    tracker.nodes[ev.node] = node


def _model(tracker: Tracker, labels: Mapping[str, str]) -> str:
    """What a node's GPUs are booked and priced as: its flavor (the first by name), else its model label."""
    for name in sorted(tracker.flavors):
        if carries(labels, tracker.flavors[name]):
            return name
    return labels.get(tracker.gpu_label, "")


def _on_flavor(state: BillingState, ev: FlavorConfigured, now: int) -> None:
    """A flavor (re)defined: capacity so far stays where it was; from now on nodes count under their flavor.
    Runs already going keep their rows' model until they end; a node seen before the first flavor is
    matched by its model label only."""
    tracker = state.tracker
    _accrue_capacity(tracker, state.ledger, now)
    tracker.flavors[ev.name] = dict(ev.node_labels)
    for name, old in sorted(tracker.nodes.items()):
        # a node seen before the first flavor kept only its model label
        labels = old.labels or ({tracker.gpu_label: old.model} if old.model else {})
        new = NodeInfo(_model(tracker, labels), old.gpus, labels)
        _set_capacity(tracker, old, new)
        tracker.nodes[name] = new


def _on_node_removed(state: BillingState, ev: NodeRemoved, now: int) -> None:
    tracker = state.tracker
    _accrue_capacity(tracker, state.ledger, now)
    old = tracker.nodes.pop(ev.node, None)
    if old is None:
        return _ignore(state)
    _set_capacity(tracker, old, None)


def _set_capacity(tracker: Tracker, old: NodeInfo | None, new: NodeInfo | None) -> None:
    cap = tracker.capacity
    if old is not None:
        cap[old.model] = cap.get(old.model, 0) - old.gpus
    if new is not None:
        cap[new.model] = cap.get(new.model, 0) + new.gpus


def _on_queue(state: BillingState, ev: QueueConfigured, now: int) -> None:
    nominal = ev.nominal.get("gpu", 0)
    for group in ev.resource_groups or []:
        nominal += sum(fq.nominal.get("gpu", 0) for fq in group.flavors)
    state.ledger.queues[ev.name] = QueueRecord(queue=ev.name, cohort=ev.cohort or "", nominal_gpu=max(0, nominal))


def _on_leader(state: BillingState, ev: LeaderElected, now: int) -> None:
    if not newer_leader(ev.epoch, state.tracker.epoch):
        return _ignore(state)
    state.tracker.epoch = ev.epoch


_HANDLERS: dict[type[Event], Any] = {
    JobSubmitted: _on_submitted,
    JobAdmitted: _on_admitted,
    JobPreempted: _on_preempted,
    JobFinished: _on_finished,
    JobFailed: _on_failed,
    JobCancelled: _on_cancelled,
    JobRejected: _on_rejected,
    JobStarted: _on_started,
    GpuUtilizationSampled: _on_utilization,
    NodeAdded: _on_node,
    NodeUpdated: _on_node,
    NodeRemoved: _on_node_removed,
    QueueConfigured: _on_queue,
    LeaderElected: _on_leader,
    FlavorConfigured: _on_flavor,
}


def evolve_billing(state: BillingState, seq: int, event: Event) -> BillingState:
    """Apply the event stored at `seq` (in place) and return the state; a replayed sequence changes nothing."""
    tracker = state.tracker
    if seq <= tracker.seq:
        return state
    tracker.seq = seq
    tracker.applied += 1
    # The clock moves on every event, so hourly roll-over follows event time
    # even when an event is not about billing at all.
    now = _advance_clock(state, event.at)
    handler = _HANDLERS.get(type(event))
    if handler is not None:
        handler(state, event, now)
    return state


def skip_bad(state: BillingState, seq: int, reason: str) -> BillingState:
    """Record that the event at `seq` could not be decoded; it moves the cursor and nothing else."""
    tracker = state.tracker
    if seq <= tracker.seq:
        return state
    tracker.seq = seq
    tracker.skipped += 1
    state.ledger.skipped.append((seq, reason))
    return state


def fold_billing(events: Iterable[tuple[int, Event]], state: BillingState | None = None) -> BillingState:
    """Fold (sequence, event) pairs into a (new, unless given) state, then `settle` it."""
    s = state if state is not None else new_billing_state()
    for seq, ev in events:
        evolve_billing(s, seq, ev)
    return settle(s)
