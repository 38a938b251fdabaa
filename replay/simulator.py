"""Virtual-time runs of the real scheduler core (`muster sim`, what-if, benchmarks).

The simulator plays the world: it appends the scenario's inputs at their
times, finishes jobs when their work is done, ends a run that reaches its
declared time limit first (`JobFailed`, reason DeadlineExceeded, as
Kubernetes does at a Job's `activeDeadlineSeconds`), and between those runs
scheduling cycles (`decide`, the same code the daemon runs) until a cycle
admits and preempts nothing (`settling.Settling`, the daemon's loop too).
Every event goes through `evolve` in log order, so the returned log replays
to the same state and decisions.

Order at one instant: jobs due to finish (or past their limit), then the inputs
in file order, then cycles. Work done exactly at the limit finishes the job.
Deterministic: no clock, no randomness, sorted iteration.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec

from muster.events.types import (
    Event,
    GpuUtilizationSampled,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobId,
    JobPreempted,
    JobRejected,
    JobSubmitted,
    NodeAdded,
    NodeCordoned,
    NodeName,
    NodeRemoved,
    NodeUpdated,
    QueueConfigured,
)
from muster.projections.cluster import evolve
from muster.projections.resources import gpus_of
from muster.projections.scheduler import decide, next_wakeup
from muster.projections.settling import Settling
from muster.projections.state import ClusterState, JobState
from muster.replay.heap import fewer_collections
from muster.replay.scenario import Scenario
from muster.replay.timelinespec import Input

MAX_CYCLES_PER_INSTANT = 10_000

DEADLINE_EXCEEDED = "DeadlineExceeded"
"""`JobFailed.reason` of a run the simulated cluster ended at its declared time limit."""


class RunEnd(NamedTuple):
    """When an admitted run ends by itself: its work done, or its time limit reached first."""

    at: int
    seq: int
    job: str
    admitted_at: int
    deadline: bool


def run_end(job: JobState, admitted_at: int) -> RunEnd | None:
    """How the run admitted at `admitted_at` ends, or None when it runs until something stops it."""
    remaining = job.remaining()
    limit = job.max_runtime
    if limit is not None and (remaining is None or limit < remaining):
        return RunEnd(admitted_at + limit, job.seq, job.id, admitted_at, True)
    if remaining is None:
        return None
    return RunEnd(admitted_at + remaining, job.seq, job.id, admitted_at, False)


class SimulationError(RuntimeError):
    """The core did not settle at one instant (a preemption loop): a bug, reported, never hidden."""


@dataclass
class JobStats:
    submitted: int
    admitted: int | None = None
    finished: int | None = None
    preemptions: int = 0
    status: str = "pending"


@dataclass
class QueueStats:
    gpu_seconds: int = 0
    borrowed_gpu_seconds: int = 0


@dataclass
class Accounting:
    """GPU-seconds held and borrowed per queue, and cluster capacity, integrated over virtual time."""

    jobs: dict[str, JobStats] = field(default_factory=dict)
    queues: dict[str, QueueStats] = field(default_factory=dict)
    running: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    """job -> (queue, gpus, borrowed gpus)."""
    flavors: dict[str, dict[str, QueueStats]] = field(default_factory=dict)
    """Queue -> flavor -> its GPU-seconds there (queues with flavors only)."""
    running_flavors: dict[str, list[tuple[str, int, int]]] = field(default_factory=dict)
    """job -> ("queue@flavor", gpus, borrowed gpus) per flavor it holds GPUs of."""
    capacity_gpu_seconds: int = 0
    used_gpu_seconds: int = 0
    last: int = 0
    capacity: int | None = None
    """GPUs of ready nodes; recounted after a node event."""
    held: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Queue -> (GPUs, borrowed GPUs) of its running jobs."""
    since: dict[str, int] = field(default_factory=dict)
    """Queue -> the time up to which its `held` GPUs are counted in its `QueueStats`: a queue's
    seconds are added when its holding changes (and at the end), not at every instant, so an
    instant costs the same with 10 queues or 1,000."""
    in_use: int = 0
    """GPUs held by running jobs, all queues."""
    running_keys: set[str] = field(default_factory=set)
    """The `queue@flavor` holders of `held` (counted in `flavors`, not in `queues` or `in_use`)."""

    def advance(self, state: ClusterState, now: int) -> None:
        dt = now - self.last
        if dt <= 0:
            return
        if self.capacity is None:
            self.capacity = sum(n.capacity.get("gpu", 0) for n in state.nodes.values() if n.ready)
        self.capacity_gpu_seconds += self.capacity * dt
        self.used_gpu_seconds += self.in_use * dt
        self.last = now

    def settle(self) -> None:
        """Count every queue's holding up to `last` (done at the end of a run)."""
        for queue in self.held:
            self._count(queue)

    def _count(self, queue: str) -> None:
        gpus, borrowed = self.held.get(queue, (0, 0))
        dt = self.last - self.since.get(queue, self.last)
        if queue in self.running_keys:
            name, _, flavor = queue.partition("@")
            qs = self.flavors.setdefault(name, {}).setdefault(flavor, QueueStats())
        else:
            qs = self.queues.setdefault(queue, QueueStats())
        qs.gpu_seconds += gpus * dt
        qs.borrowed_gpu_seconds += borrowed * dt
        self.since[queue] = self.last

    def _hold(self, job: str, entry: tuple[str, int, int] | None, sign: int) -> None:
        if entry is None:
            return
        queue, gpus, borrowed = entry
        self._count(queue)
        g, b = self.held.get(queue, (0, 0))
        self.held[queue] = (g + sign * gpus, b + sign * borrowed)
        if queue not in self.running_keys:
            self.in_use += sign * gpus

    def record(self, state: ClusterState, ev: Event) -> None:
        if isinstance(ev, (NodeAdded, NodeUpdated, NodeRemoved)):
            self.capacity = None
        elif isinstance(ev, JobSubmitted):
            self.jobs.setdefault(ev.job, JobStats(submitted=ev.at))
        elif isinstance(ev, JobAdmitted):
            js = self.jobs.get(ev.job)
            job = state.jobs.get(ev.job)
            if js is not None and job is not None and job.status == "admitted":
                if js.admitted is None:
                    js.admitted = ev.at
                js.status = "running"
                entry = (job.queue, job.gpus, gpus_of(ev.borrowed))
                self.running[ev.job] = entry
                self._hold(ev.job, entry, 1)
                if job.flavors:
                    self.running_flavors[ev.job] = _per_flavor(job, ev.borrowed)
                    for part in self.running_flavors[ev.job]:
                        self.running_keys.add(part[0])
                        self._hold(ev.job, part, 1)
        elif isinstance(ev, JobPreempted):
            js = self.jobs.get(ev.job)
            held = self.running.pop(ev.job, None)
            self._hold(ev.job, held, -1)
            self._release_flavors(ev.job)
            if js is not None and held is not None:
                js.preemptions += 1
                js.status = "pending"
        elif isinstance(ev, (JobFinished, JobCancelled, JobRejected, JobFailed)):
            js = self.jobs.get(ev.job)
            self._hold(ev.job, self.running.pop(ev.job, None), -1)
            self._release_flavors(ev.job)
            if js is not None and js.status not in _ENDED.values():
                js.status = _ENDED[type(ev)]
                if isinstance(ev, JobFinished):
                    js.finished = ev.at

    def _release_flavors(self, job: str) -> None:
        for held in self.running_flavors.pop(job, []):
            self._hold(job, held, -1)


def _per_flavor(job: JobState, borrowed: dict[str, int]) -> list[tuple[str, int, int]]:
    """A flavored job's GPUs per flavor: ("queue@flavor", gpus, borrowed gpus)."""
    gpus: dict[str, int] = {}
    for ps in job.podsets:
        flavor = job.flavors.get(ps.name, {}).get("gpu")
        if flavor is not None:
            gpus[flavor] = gpus.get(flavor, 0) + ps.count * ps.requests.get("gpu", 0)
    return [(f"{job.queue}@{f}", n, borrowed.get(f"gpu@{f}", 0)) for f, n in sorted(gpus.items())]


_ENDED: dict[type[Event], str] = {
    JobFinished: "finished",
    JobCancelled: "cancelled",
    JobRejected: "rejected",
    JobFailed: "failed",
}
"""A job's final status in the accounting, by the event that ended it."""


@dataclass
class SimResult:
    events: list[Event]
    state: ClusterState
    accounting: Accounting
    end: int
    cycles: int


@fewer_collections()
def simulate(
    scenario: Scenario,
    *,
    on_event: Callable[[Event], None] | None = None,
    keep_events: bool = True,
) -> SimResult:
    """Run the scenario to its end (`until`, or until nothing more can happen)."""
    state = ClusterState()
    log: list[Event] = []
    acct = Accounting()
    finishes: list[RunEnd] = []
    queues: dict[str, QueueConfigured] = dict(scenario.queues)
    cycles = 0

    def append(ev: Event) -> None:
        evolve(state, ev)
        acct.record(state, ev)
        if keep_events:
            log.append(ev)
        if on_event is not None:
            on_event(ev)
        if isinstance(ev, JobAdmitted):
            job = state.jobs.get(ev.job)
            if job is not None and job.status == "admitted":
                end = run_end(job, ev.at)
                if end is not None:
                    heapq.heappush(finishes, end)

    for ev in scenario.config:
        append(ev)

    def apply(inp: Input, now: int) -> None:
        d = inp.data
        kind = inp.kind
        if kind == "submit":
            append(
                JobSubmitted(
                    at=now,
                    job=d["job"],
                    queue=d["queue"],
                    priority_class=d["priority_class"],
                    podsets=d["podsets"],
                    runtime=d["runtime"],
                    checkpoint_every=d["checkpoint_every"],
                    max_runtime=d.get("max_runtime"),
                )
            )
            if d.get("invalid"):
                append(JobRejected(at=now, job=d["job"], reason=d["invalid"], cycle=0, epoch=state.epoch))
        elif kind in ("node_down", "node_up"):
            node = state.nodes[d["name"]]
            append(
                NodeUpdated(
                    at=now,
                    node=NodeName(node.name),
                    labels=node.labels,
                    capacity=node.capacity,
                    reserved=node.reserved,
                    ready=kind == "node_up",
                    unschedulable=node.unschedulable,
                )
            )
        elif kind in ("cordon", "uncordon"):
            append(NodeCordoned(at=now, node=d["name"], cordoned=kind == "cordon"))
        elif kind == "cancel":
            append(JobCancelled(at=now, job=d["name"]))
        elif kind == "utilization":
            append(GpuUtilizationSampled(at=now, job=d["job"], gpu=d["gpu"]))
        elif kind == "event":
            # any input event, as is, at this instant (what-if runs replay a real log's node and
            # configuration changes this way)
            append(msgspec.structs.replace(d["event"], at=now))
        elif kind == "queue_update":
            current = queues[d["name"]]
            update = d["queue"]
            merged = msgspec.structs.replace(current, at=now, **{f: getattr(update, f) for f in d["fields"]})
            queues[d["name"]] = merged
            append(merged)

    inputs = scenario.inputs
    i = 0
    now = 0
    until = scenario.until
    while True:
        candidates = []
        if i < len(inputs):
            candidates.append(inputs[i].at)
        if finishes:
            candidates.append(finishes[0][0])
        wake = next_wakeup(state, now)
        if wake is not None:
            candidates.append(wake)
        if cycles == 0:
            candidates.append(0)
        if not candidates:
            break
        t = max(min(candidates), now)
        if until is not None and t > until:
            break
        acct.advance(state, t)
        now = t
        while finishes and finishes[0][0] <= now:
            due = heapq.heappop(finishes)
            job = state.jobs.get(due.job)
            if job is not None and job.status == "admitted" and job.admitted_at == due.admitted_at:
                if due.deadline:
                    append(JobFailed(at=now, job=JobId(due.job), reason=DEADLINE_EXCEEDED))
                else:
                    append(JobFinished(at=now, job=JobId(due.job)))
        while i < len(inputs) and inputs[i].at <= now:
            apply(inputs[i], now)
            i += 1
        settling = Settling(MAX_CYCLES_PER_INSTANT)
        for _ in settling:
            decisions = decide(state, now)
            cycles += 1
            for ev in decisions:
                append(ev)
            settling.decided(decisions)
        if not settling.settled:
            raise SimulationError(f"scheduling did not settle at t={now} after {MAX_CYCLES_PER_INSTANT} cycles")
    end = until if until is not None else now
    acct.advance(state, end)
    acct.settle()
    return SimResult(log, state, acct, end, cycles)
