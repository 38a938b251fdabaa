"""Measuring a what-if's two runs the same way, and comparing them per queue, per job and for the cluster.

`Tally` counts, from a stream of events, what both sides are compared on:
admission wait (submission to first admission), preemptions, GPU-seconds held
and borrowed (per flavor too, where jobs ran on flavors), utilization: the
cluster's, and per queue its share of the cluster and its use of its own
nominal quota. `WhatIf` holds the real run and the what-if run (`Side`) and
gives the rows `muster whatif` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from muster.events.types import (
    Event,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobRejected,
    JobSubmitted,
    NodeAdded,
    NodeRemoved,
    NodeUpdated,
    QueueConfigured,
)
from muster.projections.resources import gpus_of
from muster.projections.state import ClusterState


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
