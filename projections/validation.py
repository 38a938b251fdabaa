"""Which job specs are invalid, and why, in words a person understands.

An invalid job is answered with `JobRejected` and never runs; a valid job that
cannot run now stays pending with a `JobInadmissible` reason instead.

This module also states the one bound on numbers, `MAX_QUANTITY`, that every
edge applies (`muster submit`, `queues apply`, `muster sim`, the Kubernetes
adapter): an edge refuses a number past it, and a job already on the log
that carries one is rejected here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from muster.events.types import PodSet
from muster.projections.state import ClusterState, JobState

MAX_PODS_PER_JOB = 10_000
MAX_PODSETS = 8
HOST = "host"

MAX_QUANTITY = 2**50
"""The largest number muster accepts for a quantity (a pod's request, a job's total, a node's
capacity, a quota) or a duration: about 10**15, i.e. 1 PiB of memory, 10**12 CPUs, 10**15 GPUs or
35 million years, past any real cluster. Below it, sums over a cluster and GPU-seconds over an
hour stay within the 64-bit integers of SQLite, PostgreSQL and msgpack (billing, snapshots)."""


def quantity_problem(resources: Mapping[str, int]) -> str | None:
    """`name=value is more than ...` for the first quantity past MAX_QUANTITY, or None."""
    for name, value in sorted(resources.items()):
        if abs(value) > MAX_QUANTITY:
            return f"{name}={value} is more than muster accepts (at most {MAX_QUANTITY})"
    return None


def bounds_problem(
    podsets: Iterable[PodSet], runtime: int | None, checkpoint_every: int | None, max_runtime: int | None = None
) -> str | None:
    """Why a job's numbers are past MAX_QUANTITY (a request, a count, the gang's total, a duration), or None."""
    totals: dict[str, int] = {}
    for ps in podsets:
        if ps.count > MAX_QUANTITY:
            return f"podset {ps.name!r}: count {ps.count} is more than muster accepts (at most {MAX_QUANTITY})"
        problem = quantity_problem(ps.requests)
        if problem is not None:
            return f"podset {ps.name!r}: request {problem}"
        for name, amount in ps.requests.items():
            totals[name] = totals.get(name, 0) + amount * max(ps.count, 0)
    problem = quantity_problem(totals)
    if problem is not None:
        return f"the gang's total {problem}"
    for what, seconds in (("runtime", runtime), ("checkpoint_every", checkpoint_every), ("max_runtime", max_runtime)):
        if seconds is not None and abs(seconds) > MAX_QUANTITY:
            return f"{what} {seconds} is more than muster accepts (at most {MAX_QUANTITY} seconds)"
    return None


def invalid_reason(state: ClusterState, job: JobState) -> str | None:
    """Why the job's spec is invalid, or None when it is valid."""
    if not job.id:
        return "the job has no id"
    if not job.queue:
        # only a source outside a scenario can leave it out: say where a pod's queue comes from
        return (
            "the job names no queue (a pod takes one from its label muster.dev/queue or kueue.x-k8s.io/queue-name, "
            "its owner's, or its namespace's default queue)"
        )
    if job.queue not in state.queues:
        known = ", ".join(sorted(state.queues)[:10]) or "none"
        return f"queue {job.queue!r} does not exist (known: {known})"
    if job.priority_class is not None and job.priority_class not in state.priority_classes:
        known = ", ".join(sorted(state.priority_classes)) or "none"
        return f"priority class {job.priority_class!r} does not exist (known: {known})"
    if not job.podsets:
        return "the job has no pods"
    if len(job.podsets) > MAX_PODSETS:
        return f"the job has {len(job.podsets)} podsets; at most {MAX_PODSETS} are allowed"
    names: set[str] = set()
    pods = 0
    levels = [*state.levels, HOST]
    for ps in job.podsets:
        if not ps.name:
            return "a podset has an empty name"
        if ps.name in names:
            return f"podset {ps.name!r} appears twice"
        names.add(ps.name)
        if ps.count < 1:
            return f"podset {ps.name!r}: count {ps.count} must be at least 1"
        pods += ps.count
        for r, v in sorted(ps.requests.items()):
            if v < 0:
                return f"podset {ps.name!r}: request {r}={v} is negative"
            if "@" in r:
                return f"podset {ps.name!r}: resource name {r!r} may not contain '@' (it names flavors)"
        unknown = [f for f in ps.flavors if f not in state.flavors]
        if unknown:
            return (
                f"podset {ps.name!r}: flavor {unknown[0]!r} does not exist (known: {', '.join(sorted(state.flavors))})"
            )
        if ps.flavors and not state.queues[job.queue].resource_groups:
            # a plain queue's quota is one pool over every node: nothing would keep the pods to the flavor's
            # nodes, and running them elsewhere would bind them where the user said they must not go
            return (
                f"podset {ps.name!r} names flavors ({', '.join(ps.flavors)}), but queue {job.queue!r} has no "
                "resource_groups: its quota is one pool over every node, so it keeps no podset to a flavor's "
                "nodes (give the queue resource_groups, or drop the podset's flavors)"
            )
        topo = ps.topology
        if topo is not None:
            if topo.required is not None and topo.preferred is not None:
                return f"podset {ps.name!r}: topology sets both required and preferred"
            level = topo.required if topo.required is not None else topo.preferred
            if level is not None and level not in levels:
                return f"podset {ps.name!r}: topology level {level!r} does not exist (levels: {', '.join(levels)})"
    if pods > MAX_PODS_PER_JOB:
        return f"the job has {pods} pods; at most {MAX_PODS_PER_JOB} are allowed per job"
    bounds = bounds_problem(job.podsets, job.runtime, job.checkpoint_every, job.max_runtime)
    if bounds is not None:
        return bounds
    if job.runtime is not None and job.runtime < 0:
        return f"runtime {job.runtime} is negative"
    if job.checkpoint_every is not None and job.checkpoint_every <= 0:
        return f"checkpoint_every {job.checkpoint_every} must be positive"
    return max_runtime_problem(job.max_runtime)


def max_runtime_problem(max_runtime: int | None) -> str | None:
    """Why a declared time limit is invalid (not a positive number of seconds), or None."""
    if max_runtime is not None and max_runtime <= 0:
        return f"max_runtime {max_runtime} must be a positive number of seconds"
    return None
