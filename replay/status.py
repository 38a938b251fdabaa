"""The status views of `muster jobs` and `muster queues`: plain rows (JSON-ready) of a `ClusterState`.

Role: pure read-only views, like `views.py` (whose queue and order rules they reuse);
rendering lives in the CLI modules.

Definitions:
- a job's `state` is its fold status, with `admitted` shown as `running` (squeue's word)
  and a pending job a user held as `held`;
- `position` is a pending job's place in its queue's admission order (`index.order_key`,
  as `views.queue_order`; held jobs left out: they are not tried); `age` is the time since its submission;
- `namespace` is the Kubernetes namespace of a job that came from a cluster (from its
  source `Kind/namespace/name`), empty for one from `muster submit` or a simulation;
- a queue's `fair_share` is the scheduler's weighted dominant resource share, per mille
  (`QuotaTree.share`): 0 within nominal quota, above 0 when it borrows;
- a cohort's figures add up those of every queue in its subtree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from muster.projections.index import order_key
from muster.projections.quota import QuotaTree
from muster.projections.resources import gpus_of, gpus_over
from muster.projections.state import ClusterState, JobState, QueueState
from muster.replay.jobnames import display_names
from muster.replay.views import job_shape, lent_by_queue, pending_reason

STATES = ("pending", "held", "running", "finished", "failed", "cancelled", "rejected")
LIVE = frozenset({"pending", "held", "running"})


def job_state(job: JobState) -> str:
    if job.status == "admitted":
        return "running"
    if job.status == "pending" and job.held:
        return "held"
    return str(job.status)


def namespace_of(job: JobState) -> str:
    parts = job.source.split("/")
    return parts[1] if len(parts) == 3 else ""


@dataclass(frozen=True)
class JobFilter:
    queues: frozenset[str] = frozenset()
    states: frozenset[str] = LIVE
    namespaces: frozenset[str] = frozenset()

    def admits(self, job: JobState, state: str) -> bool:
        """Whether the filter shows `job`, whose `job_state` is `state`."""
        return (
            state in self.states
            and (not self.queues or job.queue in self.queues)
            and (not self.namespaces or namespace_of(job) in self.namespaces)
        )


def positions(state: ClusterState, queues: set[str]) -> dict[str, int]:
    """Each pending, not held job of `queues`: its place in its queue's admission order (1 first).

    One pass over the jobs (not one per queue: a log holds every job it ever saw)."""
    by_queue: dict[str, list[JobState]] = {q: [] for q in queues}
    for job in state.jobs.values():
        waiting = by_queue.get(job.queue)
        if waiting is not None and job.status == "pending" and not job.held:
            waiting.append(job)
    out: dict[str, int] = {}
    for jobs in by_queue.values():
        jobs.sort(key=lambda j: order_key(state.priority_of(j), j.order_seq))
        out.update((j.id, pos) for pos, j in enumerate(jobs, start=1))
    return out


def job_rows(state: ClusterState, flt: JobFilter, now: int) -> list[dict[str, Any]]:
    """The jobs `flt` admits, by queue then submission order; `now` measures their age.

    `muster jobs --all` makes a row of every job the log ever saw: each job's state is found
    once, and what many jobs share (a priority class's value) once per class.
    """
    admits = flt.admits
    chosen = [(job, st) for job in state.jobs.values() if admits(job, st := job_state(job))]
    chosen.sort(key=lambda pair: (pair[0].queue, pair[0].seq))
    names = display_names((j.id for j, _ in chosen), state.jobs)
    pos = positions(state, {j.queue for j, st in chosen if st == "pending"})
    priorities: dict[str | None, int] = {}
    rows = []
    for job, st in chosen:
        if st == "pending":
            reason = pending_reason(job)
        elif st == "held":
            reason = "held by a user (muster release to let it run)"
        else:
            reason = job.reason
        cls = job.priority_class
        priority = priorities.get(cls)
        if priority is None:
            priority = priorities[cls] = state.priority_of(job)
        rows.append(
            {
                "job": job.id,
                "name": names[job.id],
                "queue": job.queue,
                "namespace": namespace_of(job),
                "state": st,
                "position": pos.get(job.id),
                "gpus": job.gpus,
                "shape": job_shape(job),
                "priority_class": cls,
                "priority": priority,
                "submitted_at": job.submitted_at,
                "age": max(0, now - job.submitted_at),
                "admitted_at": job.admitted_at,
                "finished_at": job.finished_at,
                "preemptions": job.preemptions,
                "nodes": sorted(set(job.placement.values())) if job.placement else [],
                "reason": reason,
                "source": job.source,
            }
        )
    return rows


def _gpu(resources: dict[str, int] | None) -> int | None:
    return None if resources is None else resources.get("gpu", 0)


def queue_status(state: ClusterState) -> list[dict[str, Any]]:
    """Per queue: quota (GPUs), borrowed, lent, admitted and pending gangs and GPUs, held, fair share; a queue
    with flavors also per flavor (`flavors`)."""
    lent = lent_by_queue(state)
    tree = QuotaTree(state)
    counts: dict[str, dict[str, int]] = {q: dict.fromkeys(_COUNTS, 0) for q in state.queues}
    for job in state.jobs.values():
        c = counts.get(job.queue)
        if c is None:
            continue
        st = job_state(job)
        if st in ("running", "pending", "held"):
            c[f"{st}_jobs"] += 1
            c[f"{st}_gpus"] += job.gpus
    rows = []
    for name in sorted(state.queues):
        q = state.queues[name]
        used = gpus_of(q.usage)
        nominal = gpus_of(q.nominal)
        rows.append(
            {
                "queue": name,
                "cohort": q.cohort,
                "weight": q.weight,
                "nominal": nominal,
                "borrowing_limit": _gpu(q.borrowing_limit),
                "lending_limit": _gpu(q.lending_limit),
                "used": used,
                "borrowed": gpus_over(q.usage, q.nominal),
                "lent": gpus_of(lent.get(name, {})),
                **counts[name],
                "fair_share": tree.share(name),
                "flavors": _per_flavor(q, lent.get(name, {})),
            }
        )
    return rows


def _per_flavor(q: QueueState, lent: dict[str, int]) -> list[dict[str, Any]]:
    """A queue with flavors: its GPU figures per flavor (GPUs of unlike models are not added up); else []."""
    rows = []
    for key in sorted(k for k in q.nominal if k.startswith("gpu@")):
        nominal, used = q.nominal[key], q.usage.get(key, 0)
        limit = q.borrowing_limit.get(key) if q.borrowing_limit is not None else None
        rows.append(
            {
                "flavor": key.partition("@")[2],
                "nominal": nominal,
                "borrowing_limit": limit,
                "used": used,
                "borrowed": max(0, used - nominal),
                "lent": lent.get(key, 0),
            }
        )
    return rows


_COUNTS = ("running_jobs", "running_gpus", "pending_jobs", "pending_gpus", "held_jobs", "held_gpus")
_SUMMED = ("nominal", "used", "borrowed", "lent", *_COUNTS)
_FLAVOR_SUMMED = ("nominal", "used", "borrowed", "lent")


def cohort_status(state: ClusterState, queues: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cohort: its parent, its queues (the whole subtree) and the sums of their figures."""
    members: dict[str, list[str]] = {c: [] for c in state.cohorts}
    for name, q in sorted(state.queues.items()):
        cohort, seen = q.cohort, set()
        while cohort is not None and cohort not in seen:
            seen.add(cohort)
            members.setdefault(cohort, []).append(name)
            cohort = state.cohorts.get(cohort)
    by_queue = {r["queue"]: r for r in queues}
    rows = []
    for cohort in sorted(members):
        names = members[cohort]
        row: dict[str, Any] = {"cohort": cohort, "parent": state.cohorts.get(cohort), "queues": names}
        for key in _SUMMED:
            row[key] = sum(by_queue[n][key] for n in names)
        flavors: dict[str, dict[str, int]] = {}
        for n in names:
            for f in by_queue[n]["flavors"]:
                acc = flavors.setdefault(f["flavor"], dict.fromkeys(_FLAVOR_SUMMED, 0))
                for key in _FLAVOR_SUMMED:
                    acc[key] += f[key]
        row["flavors"] = [{"flavor": f, **v} for f, v in sorted(flavors.items())]
        rows.append(row)
    return rows
