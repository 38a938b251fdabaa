"""What if the queues had been configured otherwise? A real log's jobs, run again through the core.

Role: take the submissions, cancellations and node changes of a window of a
real log and run them through the scheduler core in virtual time
(`simulator.simulate`, the code `muster sim` runs) with another queue
configuration, then compare per queue and per job with what really happened.

How the log becomes a scenario:
- time is rebased to the window start `t0` (sim time 0);
- the cluster at `t0` (nodes, cordons) is the scenario's cluster; jobs that
  were pending or running at `t0` are submitted at 0, in their submission
  order, with the work they still had to do;
- `JobSubmitted` in the window -> a submission at its time. Its runtime is
  the work it really did up to its `JobFinished`/`JobFailed` (admission to
  finish, plus work saved at checkpoints before a preemption), anywhere later
  in the log; else `JobSubmitted.runtime` when set (a declared runtime is an
  estimate, and `muster demo` runs jobs `--speed` times faster than they
  declare); a job that did neither runs until the end;
- `JobCancelled` -> a cancellation; node events -> the same node events;
  configuration events of a kind the new configuration does not replace ->
  the same events; cycle-0 rejections (input translation) -> the same;
- decisions, utilization samples (a property of the real run, so idle
  reclaim is not replayed) and leader changes are dropped.

The configuration file holds the scenario sections `queues` (required),
`cohorts`, `priority_classes`, `flavors`, `fair_sharing`, `idle_reclaim` (spec/scenario.md);
a section it leaves out keeps the log's, and so does a queue it does not name
(a file changing one queue's quota need not repeat the others). Both sides are measured the same
way (`Tally`): admission wait (submission to first admission), preemptions,
GPU-seconds held and borrowed (per flavor too, where jobs ran on flavors),
utilization: the cluster's, and per queue its share of the cluster and its
use of its own nominal quota.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import yaml

from muster.events.types import (
    CohortConfigured,
    CohortName,
    Event,
    FlavorConfigured,
    FlavorFungibility,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobRejected,
    JobSubmitted,
    NodeAdded,
    NodeCordoned,
    NodeName,
    NodeRemoved,
    NodeUpdated,
    PriorityClassConfigured,
    QueueConfigured,
    QueueName,
    SchedulerConfigured,
)
from muster.projections.cluster import ClusterState, QueueState, evolve
from muster.projections.resources import gpus_of
from muster.replay.points import Point
from muster.replay.rebuild import state_at
from muster.replay.scenario import Scenario, loads
from muster.replay.simulator import simulate
from muster.replay.snapshotcodec import no_gc
from muster.replay.snapshots import Snapshots
from muster.replay.source import LogSource
from muster.replay.specreader import ScenarioError
from muster.replay.timelinespec import Input

CONFIG_SECTIONS = ("queues", "cohorts", "priority_classes", "flavors", "fair_sharing", "idle_reclaim")


# ---------------------------------------------------------------- measuring


@dataclass
class JobTally:
    queue: str
    gpus: int
    submitted: int
    in_window: bool
    admitted: int | None = None
    finished: int | None = None
    preemptions: int = 0
    gpu_seconds: int = 0
    status: str = "pending"
    podset_gpus: dict[str, int] = field(default_factory=dict)
    """GPUs of each podset (to split a flavored run's GPUs by flavor)."""


@dataclass
class QueueTally:
    gpu_seconds: int = 0
    borrowed_gpu_seconds: int = 0
    nominal_gpu_seconds: int = 0
    """The queue's nominal GPU quota integrated over time (its guaranteed GPU-seconds)."""
    flavor_gpu_seconds: dict[str, int] = field(default_factory=dict)
    """GPU-seconds held per flavor (runs admitted on flavors only)."""


class Tally:
    """Waits, preemptions and GPU-seconds from a stream of events (the same measure for both sides)."""

    def __init__(self, start: int) -> None:
        self.last = start
        self.jobs: dict[str, JobTally] = {}
        self.queues: dict[str, QueueTally] = {}
        self.nodes: dict[str, int] = {}
        """Node -> GPUs while ready."""
        self.running: dict[str, tuple[str, int, int]] = {}
        """Job -> (queue, GPUs, borrowed GPUs)."""
        self.on_flavors: dict[str, dict[str, int]] = {}
        """Running job -> its GPUs per flavor (runs admitted on flavors)."""
        self.nominal: dict[str, int] = {}
        """Queue -> its nominal GPU quota as configured now."""
        self.capacity_gpu_seconds = 0
        self.used_gpu_seconds = 0
        self.window = True

    def seed(self, state: ClusterState) -> None:
        """Start from a folded state: its nodes, and its pending and running jobs (not counted per job)."""
        for name, node in state.nodes.items():
            self.nodes[name] = node.capacity.get("gpu", 0) if node.ready else 0
        for qname, q in state.queues.items():
            self.nominal[qname] = gpus_of(q.nominal)
        for job in sorted(state.jobs.values(), key=lambda j: j.seq):
            if job.status in ("pending", "admitted"):
                per_podset = {ps.name: ps.requests.get("gpu", 0) * ps.count for ps in job.podsets}
                self.jobs[job.id] = JobTally(
                    job.queue, job.gpus, job.submitted_at, in_window=False, podset_gpus=per_podset
                )
            if job.status == "admitted":
                self.jobs[job.id].status = "running"
                self.running[job.id] = (job.queue, job.gpus, gpus_of(job.borrowed))
                self._on_flavors(job.id, job.flavors)

    def advance(self, now: int) -> None:
        dt = now - self.last
        if dt <= 0:
            return
        self.capacity_gpu_seconds += sum(self.nodes.values()) * dt
        for queue, nominal in self.nominal.items():
            if nominal:
                self.queues.setdefault(queue, QueueTally()).nominal_gpu_seconds += nominal * dt
        for job_id, (queue, gpus, borrowed) in self.running.items():
            qt = self.queues.setdefault(queue, QueueTally())
            qt.gpu_seconds += gpus * dt
            qt.borrowed_gpu_seconds += borrowed * dt
            self.used_gpu_seconds += gpus * dt
            self.jobs[job_id].gpu_seconds += gpus * dt
            for flavor, n in self.on_flavors.get(job_id, {}).items():
                qt.flavor_gpu_seconds[flavor] = qt.flavor_gpu_seconds.get(flavor, 0) + n * dt
        self.last = now

    def _on_flavors(self, job: str, flavors: dict[str, dict[str, str]] | Any) -> None:
        """Note a run's GPUs per flavor (nothing for a run without flavors)."""
        if not flavors:
            return
        per: dict[str, int] = {}
        for ps, gpus in self.jobs[job].podset_gpus.items():
            flavor = flavors.get(ps, {}).get("gpu")
            if flavor is not None and gpus:
                per[flavor] = per.get(flavor, 0) + gpus
        self.on_flavors[job] = per

    def feed(self, ev: Event) -> None:
        """Count one event (call `advance(ev.at)` first). Decisions the fold would skip are not sent here."""
        if isinstance(ev, (NodeAdded, NodeUpdated)):
            self.nodes[ev.node] = ev.capacity.get("gpu", 0) if ev.ready else 0
        elif isinstance(ev, QueueConfigured):
            groups = ev.resource_groups or []
            self.nominal[ev.name] = ev.nominal.get("gpu", 0) + sum(
                fq.nominal.get("gpu", 0) for g in groups for fq in g.flavors
            )
        elif isinstance(ev, NodeRemoved):
            self.nodes.pop(ev.node, None)
        elif isinstance(ev, JobSubmitted):
            if ev.job not in self.jobs:
                per_podset = {ps.name: ps.requests.get("gpu", 0) * ps.count for ps in ev.podsets}
                self.jobs[ev.job] = JobTally(
                    ev.queue, sum(per_podset.values()), ev.at, in_window=self.window, podset_gpus=per_podset
                )
        elif isinstance(ev, JobAdmitted):
            jt = self.jobs.get(ev.job)
            if jt is not None and ev.job not in self.running:
                if jt.admitted is None:
                    jt.admitted = ev.at
                jt.status = "running"
                self.running[ev.job] = (jt.queue, jt.gpus, gpus_of(ev.borrowed))
                self._on_flavors(ev.job, ev.flavors)
        elif isinstance(ev, JobPreempted):
            jt = self.jobs.get(ev.job)
            self.on_flavors.pop(ev.job, None)
            if jt is not None and self.running.pop(ev.job, None) is not None:
                jt.preemptions += 1
                jt.status = "pending"
        elif isinstance(ev, (JobFinished, JobFailed, JobCancelled, JobRejected)):
            jt = self.jobs.get(ev.job)
            self.running.pop(ev.job, None)
            self.on_flavors.pop(ev.job, None)
            if jt is not None and jt.status not in ("finished", "failed", "cancelled", "rejected"):
                jt.status = {JobFinished: "finished", JobFailed: "failed", JobCancelled: "cancelled"}.get(
                    type(ev), "rejected"
                )
                jt.finished = ev.at

    @property
    def utilization(self) -> float:
        return self.used_gpu_seconds / self.capacity_gpu_seconds if self.capacity_gpu_seconds else 0.0


# ---------------------------------------------------------------- the comparison


@dataclass
class Side:
    """One run (real or what-if), with times relative to the window start."""

    tally: Tally
    start: int
    end: int


@dataclass
class WhatIf:
    real: Side
    alt: Side
    t0: int
    from_seq: int
    to_seq: int
    queues_changed: list[str]
    notes: list[str] = field(default_factory=list)

    def job_rows(self) -> list[dict[str, Any]]:
        rows = []
        for job_id in sorted(self.real.tally.jobs, key=lambda j: (self.real.tally.jobs[j].submitted, j)):
            r = self.real.tally.jobs[job_id]
            if not r.in_window:
                continue
            a = self.alt.tally.jobs.get(job_id)
            rows.append(
                {
                    "job": job_id,
                    "queue": r.queue,
                    "gpus": r.gpus,
                    "submitted": r.submitted - self.t0,
                    "real": _job_side(r, self.t0, self.real.end),
                    "whatif": _job_side(a, 0, self.alt.end - self.alt.start) if a is not None else None,
                }
            )
        return rows

    def queue_rows(self) -> list[dict[str, Any]]:
        jobs = self.job_rows()
        names = sorted({j["queue"] for j in jobs} | set(self.real.tally.queues) | set(self.alt.tally.queues))
        out = []
        for q in names:
            mine = [j for j in jobs if j["queue"] == q]
            row: dict[str, Any] = {"queue": q, "jobs": len(mine), "changed": q in self.queues_changed}
            for side, tally in (("real", self.real.tally), ("whatif", self.alt.tally)):
                sides = [j[side] for j in mine if j[side] is not None]
                waits = sorted(s["wait"] for s in sides if s["wait"] is not None)
                censored = [s["waiting"] for s in sides if s["wait"] is None and s["status"] != "rejected"]
                qt = tally.queues.get(q, QueueTally())
                capacity = tally.capacity_gpu_seconds
                row[side] = {
                    "admitted": len(waits),
                    "never_admitted": len(censored),
                    "wait_mean": _mean(waits + censored),
                    "wait_p50": _pct(waits, 50),
                    "wait_p90": _pct(waits, 90),
                    "wait_max": max(waits + censored) if waits or censored else None,
                    "preemptions": sum(s["preemptions"] for s in sides),
                    "gpu_seconds": qt.gpu_seconds,
                    "borrowed_gpu_seconds": qt.borrowed_gpu_seconds,
                    # utilization: of the cluster's GPU-seconds, and of the queue's own guarantee
                    "cluster_share": round(qt.gpu_seconds / capacity, 6) if capacity else None,
                    "of_nominal": (
                        round(qt.gpu_seconds / qt.nominal_gpu_seconds, 6) if qt.nominal_gpu_seconds else None
                    ),
                    "flavor_gpu_seconds": dict(sorted(qt.flavor_gpu_seconds.items())),
                }
            out.append(row)
        return out

    def cluster(self) -> dict[str, Any]:
        return {
            side: {
                "seconds": s.end - s.start,
                "gpu_seconds_capacity": s.tally.capacity_gpu_seconds,
                "gpu_seconds_used": s.tally.used_gpu_seconds,
                "utilization": round(s.tally.utilization, 6),
            }
            for side, s in (("real", self.real), ("whatif", self.alt))
        }


def _job_side(t: JobTally, t0: int, end: int) -> dict[str, Any]:
    wait = t.admitted - t.submitted if t.admitted is not None else None
    return {
        "admitted": t.admitted - t0 if t.admitted is not None else None,
        "finished": t.finished - t0 if t.finished is not None else None,
        "wait": wait,
        # a rejected job never waited for anything: it has no wait to compare
        "waiting": (end - t.submitted) if wait is None and t.status != "rejected" else None,
        "preemptions": t.preemptions,
        "gpu_seconds": t.gpu_seconds,
        "status": t.status,
    }


def _mean(values: list[int]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


def _pct(sorted_values: list[int], p: int) -> int | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, (len(sorted_values) * p) // 100)]


# ---------------------------------------------------------------- building the run


class WhatIfError(Exception):
    """A configuration file that cannot be used (with file and line when known)."""


def load_config(text: str, name: str, state: ClusterState) -> tuple[list[Event], set[str]]:
    """Configuration events from the file, the log's state filling in the sections it leaves out.

    Returns the events (scheduler, classes, cohorts, queues) and the kinds the file replaces.
    """
    try:
        root = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WhatIfError(f"{name}: malformed YAML: {exc}") from None
    if not isinstance(root, dict):
        raise WhatIfError(f"{name}: expected a mapping with {', '.join(CONFIG_SECTIONS)}")
    unknown = sorted(set(root) - set(CONFIG_SECTIONS))
    if unknown:
        raise WhatIfError(
            f"{name}: unknown section {unknown[0]!r}: a what-if configuration holds only {', '.join(CONFIG_SECTIONS)}"
        )
    if "queues" not in root:
        raise WhatIfError(f"{name}: missing section 'queues'")
    extra = ""
    if "cohorts" not in root and state.cohorts:
        extra += "\ncohorts:\n" + "".join(
            f"  - {{name: {_q(c)}{', parent: ' + _q(p) if p else ''}}}\n" for c, p in sorted(state.cohorts.items())
        )
    if "priority_classes" not in root and state.priority_classes:
        extra += "\npriority_classes:\n" + "".join(
            f"  - {{name: {_q(pc.name)}, value: {pc.value}, preemptible: {'true' if pc.preemptible else 'false'}}}\n"
            for pc in sorted(state.priority_classes.values(), key=lambda p: p.name)
        )
    if "flavors" not in root and state.flavors:
        # JSON is YAML: label keys and values go through whatever they hold
        extra += "\nflavors:\n" + "".join(
            "  - "
            + json.dumps(
                {"name": f.name, "node_labels": f.node_labels, "taints": msgspec.to_builtins(f.taints)},
                sort_keys=True,
            )
            + "\n"
            for f in sorted(state.flavors.values(), key=lambda f: f.name)
        )
    try:
        scenario = loads(text.rstrip("\n") + "\n" + extra, name)
    except ScenarioError as exc:
        raise WhatIfError(str(exc)) from None
    events: list[Event] = []
    for ev in scenario.config:
        if isinstance(ev, SchedulerConfigured):
            ev = SchedulerConfigured(
                at=0,
                levels=list(state.levels),
                fair_sharing=ev.fair_sharing if "fair_sharing" in root else state.fair_sharing,
                idle_reclaim=ev.idle_reclaim if "idle_reclaim" in root else state.idle_reclaim,
            )
        events.append(ev)
    # a queue the file does not name keeps the log's configuration (as `queues apply` leaves it)
    named = {ev.name for ev in events if isinstance(ev, QueueConfigured)}
    for q in sorted(state.queues.values(), key=lambda q: q.name):
        if q.name not in named:
            events.append(_queue_event(q))
    replaced = {"QueueConfigured"}
    if "cohorts" in root:
        replaced.add("CohortConfigured")
    if "priority_classes" in root:
        replaced.add("PriorityClassConfigured")
    if "flavors" in root:
        replaced.add("FlavorConfigured")
    if "fair_sharing" in root or "idle_reclaim" in root:
        replaced.add("SchedulerConfigured")
    return events, replaced


def _queue_event(q: QueueState) -> QueueConfigured:
    """The configuration event a folded queue came from (its quota per flavor given back as groups)."""
    grouped = bool(q.resource_groups)
    return QueueConfigured(
        at=0,
        name=QueueName(q.name),
        cohort=CohortName(q.cohort) if q.cohort is not None else None,
        nominal={} if grouped else dict(q.nominal),
        borrowing_limit=dict(q.borrowing_limit) if q.borrowing_limit is not None and not grouped else None,
        lending_limit=dict(q.lending_limit) if q.lending_limit is not None and not grouped else None,
        weight=q.weight,
        preemption=q.preemption,
        queueing_strategy=q.queueing_strategy,  # type: ignore[arg-type]
        resource_groups=list(q.resource_groups) if grouped else msgspec.UNSET,
        flavor_fungibility=q.fungibility if grouped else msgspec.UNSET,
        reserve_after=q.reserve_after,
    )


def _q(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _node_events(state: ClusterState) -> list[Event]:
    out: list[Event] = []
    for name in sorted(state.nodes):
        n = state.nodes[name]
        out.append(
            NodeAdded(
                at=0,
                node=NodeName(name),
                labels=dict(n.labels),
                capacity=dict(n.capacity),
                reserved=dict(n.reserved),
                ready=n.ready,
                unschedulable=n.unschedulable,
            )
        )
    return out


async def whatif(
    source: LogSource,
    config_text: str,
    config_name: str = "<config>",
    *,
    start: Point | None = None,
    end: Point | None = None,
    snapshots: Snapshots | None = None,
) -> WhatIf:
    """Run the window [start, end] of the log again under the configuration; compare with reality."""
    last = await source.last_seq()
    if start is None or start.is_end:
        state, from_seq = ClusterState(), 1
    else:
        before = Point(seq=start.seq - 1) if start.seq is not None else Point(time=(start.time or 0) - 1)
        replayed = await state_at(source, before, snapshots)
        state, from_seq = replayed.state, replayed.seq + 1
    # read the rest of the log: the window, and beyond it the runtimes of jobs that end later
    window: list[tuple[int, Event]] = []
    later_ends: list[tuple[int, Event]] = []
    end_seq = last if end is None or end.seq is None else min(end.seq, last)
    end_time = end.time if end is not None else None
    with no_gc():
        async for batch in source.batches(from_seq, None):
            for seq, read in batch:
                if seq <= end_seq and (end_time is None or read.at <= end_time):
                    window.append((seq, read))
                elif isinstance(read, (JobFinished, JobFailed, JobAdmitted, JobPreempted)):
                    later_ends.append((seq, read))
    if start is not None and start.time is not None:
        t0 = start.time
    else:
        t0 = window[0][1].at if window else state.now
    t1 = end_time if end_time is not None else (window[-1][1].at if window else t0)
    bounded = end is not None and not end.is_end

    start_state = msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=ClusterState)

    # reality: fold the window, measuring; note each job's runtime when it ends (also after the window)
    real = Tally(t0)
    real.seed(state)
    runtimes: dict[str, int] = {}
    for _, ev in window:
        real.advance(max(ev.at, t0))
        evolve(state, ev)
        if isinstance(ev, (JobFinished, JobFailed)) and ev.job in state.jobs:
            runtimes[ev.job] = state.jobs[ev.job].work_done
        real.feed(ev)
    real.advance(t1)
    for _, ev in later_ends:
        evolve(state, ev)
        if isinstance(ev, (JobFinished, JobFailed)) and ev.job in state.jobs:
            runtimes.setdefault(ev.job, state.jobs[ev.job].work_done)

    # sections the file leaves out come from the log as configured at the window's end
    config, replaced = load_config(config_text, config_name, state)
    scenario = _scenario(config, start_state, window, runtimes, replaced, t0, (t1 - t0) if bounded else None)
    alt = Tally(0)
    for job in sorted(start_state.jobs.values(), key=lambda j: j.seq):
        if job.status in ("pending", "admitted"):
            alt.jobs[job.id] = JobTally(job.queue, job.gpus, 0, in_window=False)

    def on_event(ev: Event) -> None:
        alt.advance(ev.at)
        if isinstance(ev, JobSubmitted) and ev.job in alt.jobs and not alt.jobs[ev.job].in_window:
            return
        alt.feed(ev)

    result = simulate(scenario, on_event=on_event, keep_events=False)
    alt.advance(result.end)
    notes = []
    kept = sorted(set(state.queues) - _named_queues(config_text))
    if kept:
        notes.append(f"queues the configuration does not name keep the log's configuration: {', '.join(kept)}")
    if not runtimes and any(isinstance(ev, JobSubmitted) and ev.runtime is None for _, ev in window):
        notes.append("no job finished in the log: jobs without a declared runtime run until the end")
    changed = _changed_queues(state, config)
    return WhatIf(
        real=Side(real, t0, t1 if bounded else max(t1, real.last)),
        alt=Side(alt, 0, result.end),
        t0=t0,
        from_seq=from_seq,
        to_seq=window[-1][0] if window else from_seq - 1,
        queues_changed=changed,
        notes=notes,
    )


def _named_queues(text: str) -> set[str]:
    """The queue names a (valid) configuration file gives."""
    root = yaml.safe_load(text) or {}
    queues = root.get("queues") if isinstance(root, dict) else None
    return {str(q["name"]) for q in queues or [] if isinstance(q, dict) and "name" in q}


def _queues(config: list[Event]) -> list[QueueConfigured]:
    return [e for e in config if isinstance(e, QueueConfigured)]


def _changed_queues(state: ClusterState, config: list[Event]) -> list[str]:
    """The queues whose configuration differs from the log's (quota per flavor included)."""
    out = []
    for q in _queues(config):
        old = state.queues.get(q.name)
        if old is None or _same_terms(_queue_event(old)) != _same_terms(q):
            out.append(q.name)
    return sorted(out)


def _same_terms(q: QueueConfigured) -> QueueConfigured:
    """A queue's configuration with what the fold fills in made explicit (time aside)."""
    fungibility = (q.flavor_fungibility or FlavorFungibility()) if q.resource_groups else msgspec.UNSET
    return msgspec.structs.replace(q, at=0, flavor_fungibility=fungibility)


def _scenario(
    config: list[Event],
    state: ClusterState,
    window: list[tuple[int, Event]],
    runtimes: dict[str, int],
    replaced: set[str],
    t0: int,
    until: int | None,
) -> Scenario:
    inputs: list[Input] = []
    order = 0

    def add(at: int, kind: str, data: dict[str, Any]) -> None:
        nonlocal order
        inputs.append(Input(max(0, at - t0), order, kind, data))
        order += 1

    # the cluster's nodes as they were at t0; cordons as inputs at 0
    config = [*config, *_node_events(state)]
    for name in sorted(state.nodes):
        if state.nodes[name].cordoned:
            add(t0, "event", {"event": NodeCordoned(at=0, node=NodeName(name), cordoned=True)})
    # work in flight at t0, in submission order
    for job in sorted(state.jobs.values(), key=lambda j: j.seq):
        if job.status not in ("pending", "admitted"):
            continue
        total = runtimes.get(job.id, job.runtime)
        remaining = None if total is None else max(1, total - job.progress(t0))
        add(
            t0,
            "submit",
            _submit(
                job.id, job.queue, job.priority_class, job.podsets, remaining, job.checkpoint_every, job.max_runtime
            ),
        )
    for _, ev in window:
        if isinstance(ev, JobSubmitted):
            runtime = runtimes.get(ev.job, ev.runtime)
            add(
                ev.at,
                "submit",
                _submit(ev.job, ev.queue, ev.priority_class, ev.podsets, runtime, ev.checkpoint_every, ev.max_runtime),
            )
        elif isinstance(ev, JobCancelled):
            add(ev.at, "cancel", {"name": ev.job})
        elif (
            isinstance(ev, (NodeAdded, NodeUpdated, NodeRemoved, NodeCordoned))
            or (isinstance(ev, JobRejected) and ev.cycle == 0)
            or (
                isinstance(
                    ev,
                    (QueueConfigured, CohortConfigured, PriorityClassConfigured, FlavorConfigured, SchedulerConfigured),
                )
                and type(ev).__name__ not in replaced
            )
        ):
            add(ev.at, "event", {"event": ev})
    inputs.sort(key=lambda i: (i.at, i.order))
    queues: dict[str, QueueConfigured] = {q.name: q for q in _queues(config)}
    nodes: dict[str, NodeAdded] = {e.node: e for e in config if isinstance(e, NodeAdded)}
    return Scenario("whatif", config, inputs, until, list(state.levels), queues, nodes)


def _submit(
    job: str,
    queue: str,
    priority_class: str | None,
    podsets: Any,
    runtime: int | None,
    checkpoint_every: int | None,
    max_runtime: int | None,
) -> dict[str, Any]:
    return {
        "job": job,
        "queue": queue,
        "priority_class": priority_class,
        "podsets": list(podsets),
        "runtime": runtime,
        "checkpoint_every": checkpoint_every,
        "max_runtime": max_runtime,
    }


def read_config(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise WhatIfError(f"{path}: cannot read: {exc.strerror or exc}") from None


__all__ = ["WhatIf", "WhatIfError", "load_config", "read_config", "whatif"]
