"""What a person wants to see of a `ClusterState`: queues, topology domains, nodes, jobs.

Role: pure read-only views (plain dicts, JSON-ready) shared by `muster
replay`, `explain` and `whatif`; rendering lives in the CLI modules.

Definitions:
- a queue's `borrowed` is its usage above its nominal quota;
- its `lent` is the part of its unused nominal quota (at most its lending
  limit) that other queues of its cohort tree are using: the tree's total
  borrowing is split over the lenders in proportion to what each leaves
  unused (largest remainder, ties by name), so the lent amounts add up to
  what is borrowed;
- a domain is a value of the innermost topology level (`b0/r1`); its free
  GPUs count schedulable nodes only;
- pending jobs are listed in queue order: higher priority first, then
  submission order (the order `decide` tries them within a queue).
"""

from __future__ import annotations

from typing import Any

from muster.projections.index import queue_order_key
from muster.projections.resources import gpus_of
from muster.projections.state import ClusterState, JobState


def job_shape(job: JobState) -> str:
    """`4x8` (pods x GPUs per pod); podsets joined by `+`; `2x(cpu=4)` for GPU-less pods."""
    parts = []
    for ps in job.podsets:
        gpu = ps.requests.get("gpu", 0)
        if gpu:
            parts.append(f"{ps.count}x{gpu}")
        else:
            parts.append(f"{ps.count}x(" + " ".join(f"{k}={v}" for k, v in sorted(ps.requests.items())) + ")")
    return "+".join(parts) or "-"


def priority_label(state: ClusterState, job: JobState) -> str:
    value = state.priority_of(job)
    return f"{job.priority_class} ({value})" if job.priority_class else f"lowest ({value})"


def lent_by_queue(state: ClusterState) -> dict[str, dict[str, int]]:
    """Per queue and resource, the part of its unused nominal quota other queues of its tree use."""
    trees: dict[str, list[str]] = {}
    for name in sorted(state.queues):
        trees.setdefault(state.cohort_root(name), []).append(name)
    out: dict[str, dict[str, int]] = {name: {} for name in state.queues}
    for names in trees.values():
        if len(names) < 2:
            continue
        resources = sorted({r for n in names for r in state.queues[n].nominal})
        for r in resources:
            borrowed = 0
            lendable: dict[str, int] = {}
            for n in names:
                q = state.queues[n]
                if r not in q.nominal:
                    continue
                use = q.usage.get(r, 0)
                borrowed += max(0, use - q.nominal[r])
                spare = max(0, q.nominal[r] - use)
                if q.lending_limit is not None and r in q.lending_limit:
                    spare = min(spare, q.lending_limit[r])
                if spare:
                    lendable[n] = spare
            total = sum(lendable.values())
            lent = min(borrowed, total)
            if not lent:
                continue
            shares = {n: lent * v // total for n, v in lendable.items()}
            rest = lent - sum(shares.values())
            for n in sorted(lendable, key=lambda n: (-(lent * lendable[n] % total), n))[:rest]:
                shares[n] += 1
            for n, v in shares.items():
                if v:
                    out[n][r] = v
    return out


def queue_gpus_used(state: ClusterState) -> dict[str, int]:
    """Per queue, the GPUs its admitted jobs hold, plain (`gpu`) or per flavor (`gpu@h100`) alike."""
    return {name: gpus_of(q.usage) for name, q in state.queues.items()}


def queue_rows(state: ClusterState) -> list[dict[str, Any]]:
    lent = lent_by_queue(state)
    running: dict[str, int] = {}
    pending: dict[str, int] = {}
    for job in state.jobs.values():
        if job.status == "admitted":
            running[job.queue] = running.get(job.queue, 0) + 1
        elif job.status == "pending":
            pending[job.queue] = pending.get(job.queue, 0) + 1
    rows = []
    for name in sorted(state.queues):
        q = state.queues[name]
        usage = {r: v for r, v in sorted(q.usage.items()) if v}
        borrowed = {r: v - q.nominal[r] for r, v in usage.items() if r in q.nominal and v > q.nominal[r]}
        rows.append(
            {
                "queue": name,
                "cohort": q.cohort,
                "nominal": dict(sorted(q.nominal.items())),
                "borrowing_limit": q.borrowing_limit,
                "lending_limit": q.lending_limit,
                "used": usage,
                "borrowed": borrowed,
                "lent": lent.get(name, {}),
                "running": running.get(name, 0),
                "pending": pending.get(name, 0),
            }
        )
    return rows


def domain_rows(state: ClusterState) -> list[dict[str, Any]]:
    """Free GPUs per domain of the innermost topology level (the whole cluster when there are no levels)."""
    levels = state.levels
    groups: dict[tuple[str, ...], list[str]] = {}
    for name in sorted(state.nodes):
        node = state.nodes[name]
        groups.setdefault(tuple(node.labels.get(lv, "") for lv in levels), []).append(name)
    rows = []
    for path in sorted(groups):
        names = groups[path]
        gpus = used = free = largest = down = 0
        for n in names:
            node = state.nodes[n]
            cap = node.capacity.get("gpu", 0)
            gpus += cap
            used += node.used.get("gpu", 0)
            f = node.free().get("gpu", 0)
            free += max(0, f)
            largest = max(largest, f)
            if not node.schedulable:
                down += 1
        rows.append(
            {
                "domain": "/".join(path) if levels else "cluster",
                "labels": dict(zip(levels, path, strict=True)),
                "nodes": len(names),
                "unschedulable": down,
                "gpus": gpus,
                "used": used,
                "free": free,
                "largest_free": largest,
            }
        )
    return rows


def node_rows(state: ClusterState) -> list[dict[str, Any]]:
    rows = []
    for name in sorted(state.nodes):
        node = state.nodes[name]
        status = "ready" if node.ready else "down"
        if node.cordoned or node.unschedulable:
            status += ", cordoned"
        rows.append(
            {
                "node": name,
                "labels": dict(sorted(node.labels.items())),
                "status": status,
                "gpus": node.capacity.get("gpu", 0),
                "used": node.used.get("gpu", 0),
                "free": max(0, node.free().get("gpu", 0)),
                "jobs": dict(sorted(node.jobs.items())),
            }
        )
    return rows


def pending_reason(job: JobState) -> str:
    reason: str = job.reason
    if reason:
        return reason
    if job.nominated:
        return "its victims were evicted; it is tried first in the next cycle"
    if job.preemptions:
        return "requeued after preemption; not judged since"
    return "not judged yet"


def queue_order(state: ClusterState, queue: str) -> list[JobState]:
    """The queue's pending jobs in `order_key` order (their quota position aside, which the cycle judges)."""
    jobs = [j for j in state.jobs.values() if j.queue == queue and j.status == "pending"]
    jobs.sort(key=lambda j: queue_order_key(state, j))
    return jobs


def pending_rows(state: ClusterState) -> list[dict[str, Any]]:
    by_queue: dict[str, list[JobState]] = {}
    for job in state.jobs.values():
        if job.status == "pending":
            by_queue.setdefault(job.queue, []).append(job)
    rows = []
    for queue in sorted(by_queue):
        jobs = sorted(by_queue[queue], key=lambda j: queue_order_key(state, j))
        for pos, job in enumerate(jobs, start=1):
            rows.append(
                {
                    "queue": queue,
                    "position": pos,
                    "job": job.id,
                    "priority_class": job.priority_class,
                    "priority": state.priority_of(job),
                    "gpus": job.gpus,
                    "shape": job_shape(job),
                    "submitted_at": job.submitted_at,
                    "preemptions": job.preemptions,
                    "reason": pending_reason(job),
                }
            )
    return rows


def running_rows(state: ClusterState) -> list[dict[str, Any]]:
    rows = []
    for job in sorted(state.jobs.values(), key=lambda j: (j.queue, j.seq)):
        if job.status != "admitted":
            continue
        rows.append(
            {
                "queue": job.queue,
                "job": job.id,
                "priority_class": job.priority_class,
                "gpus": job.gpus,
                "shape": job_shape(job),
                "admitted_at": job.admitted_at,
                "borrowed": dict(job.borrowed),
                "nodes": sorted(set(job.placement.values())),
            }
        )
    return rows


def job_counts(state: ClusterState) -> dict[str, int]:
    out: dict[str, int] = {}
    for job in state.jobs.values():
        out[job.status] = out.get(job.status, 0) + 1
    return dict(sorted(out.items()))
