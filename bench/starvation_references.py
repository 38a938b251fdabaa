"""Reference schedulers for `bench_starvation`: FIFO and SJF over one pool of GPUs or on the nodes, and EASY backfill.

None has quotas; each returns every job's wait (`replay.waits.Wait`) as a
`muster sim` run is measured, so the goal lines compare like with like.
"""

from __future__ import annotations

import heapq
import math

from starvation_traces import Trace, TraceJob, gpus_per_pod

from muster.replay.waits import Wait


def run_reference(trace: Trace, order: str) -> list[Wait]:
    """One pool of the cluster's GPUs: `fifo` (the head blocks) or `sjf` (shortest first, pass what does not fit)."""
    free = sum(trace.nominal.values())
    arrivals = sorted(trace.jobs, key=lambda j: (j.submit, j.job))
    ends: list[tuple[int, int]] = []
    pending: list[tuple[int, int, TraceJob]] = []
    waits: list[Wait] = []
    i, now = 0, 0
    while i < len(arrivals) or ends:
        due = [arrivals[i].submit] if i < len(arrivals) else []
        now = min([*due, ends[0][0]] if ends else due)
        while ends and ends[0][0] <= now:
            free += heapq.heappop(ends)[1]
        while i < len(arrivals) and arrivals[i].submit <= now:
            j = arrivals[i]
            key = i if order == "fifo" else j.runtime
            heapq.heappush(pending, (key, i, j))
            i += 1
        passed: list[tuple[int, int, TraceJob]] = []
        while pending and free > 0:
            entry = heapq.heappop(pending)
            j = entry[2]
            if j.gpus <= free:
                free -= j.gpus
                heapq.heappush(ends, (now + j.runtime, j.gpus))
                waits.append(Wait(j.queue, j.gpus, now - j.submit, True))
            elif order == "fifo":
                passed.append(entry)
                break
            else:
                passed.append(entry)
        for entry in passed:
            heapq.heappush(pending, entry)
    waits.extend(Wait(j.queue, j.gpus, now - j.submit, False) for _, _, j in pending)
    return waits


class Nodes:
    """The cluster's 8-GPU nodes for a node-aware reference: a gang of pods of `gpus_per_pod` GPUs is placed all
    or nothing, each pod on the tightest node that holds it (as muster packs), or not at all."""

    def __init__(self, gpus: int) -> None:
        self.free = [8] * (gpus // 8)

    def fits(self, pods: int, per_pod: int) -> bool:
        return sum(f // per_pod for f in self.free) >= pods

    def take(self, pods: int, per_pod: int) -> list[int]:
        """The nodes of the gang's pods, one per pod (the caller checked `fits`)."""
        on: list[int] = []
        for _ in range(pods):
            i = min((i for i, f in enumerate(self.free) if f >= per_pod), key=lambda i: (self.free[i], i))
            self.free[i] -= per_pod
            on.append(i)
        return on

    def give(self, on: list[int], per_pod: int) -> None:
        for i in on:
            self.free[i] += per_pod


def run_reference_nodes(trace: Trace, order: str) -> list[Wait]:
    """`fifo-nodes` and `sjf-nodes`: the same orders as `run_reference`, but pods are placed on the cluster's
    8-GPU nodes (a 64-GPU gang needs 8 free nodes), as a real FIFO or SJF scheduler without quota would."""
    nodes = Nodes(sum(trace.nominal.values()))
    arrivals = sorted(trace.jobs, key=lambda j: (j.submit, j.job))
    ends: list[tuple[int, int, list[int], int]] = []
    # pending gangs by shape (pods, GPUs per pod), each in admission order: a shape that does not fit now
    # fits no job of its shape until a gang ends, so a cycle judges shapes, not jobs
    pending: dict[tuple[int, int], list[tuple[int, int, TraceJob]]] = {}
    waits: list[Wait] = []
    i, now, ended = 0, 0, 0
    while i < len(arrivals) or ends:
        due = [arrivals[i].submit] if i < len(arrivals) else []
        now = min([*due, ends[0][0]] if ends else due)
        while ends and ends[0][0] <= now:
            _, _, on, per_pod = heapq.heappop(ends)
            nodes.give(on, per_pod)
        while i < len(arrivals) and arrivals[i].submit <= now:
            j = arrivals[i]
            per_pod = gpus_per_pod(j.gpus)
            key = i if order == "fifo" else j.runtime
            heapq.heappush(pending.setdefault((j.gpus // per_pod, per_pod), []), (key, i, j))
            i += 1
        while True:
            fitting = [s for s, q in pending.items() if q and nodes.fits(*s)]
            if order == "fifo":  # the head blocks: only the first submitted gang may go
                heads = [s for s, q in pending.items() if q]
                first = min(heads, key=lambda s: pending[s][0][:2], default=None)
                fitting = [first] if first in fitting else []
            if not fitting:
                break
            shape = min(fitting, key=lambda s: pending[s][0][:2])
            _, _, j = heapq.heappop(pending[shape])
            ended += 1
            heapq.heappush(ends, (now + j.runtime, ended, nodes.take(*shape), shape[1]))
            waits.append(Wait(j.queue, j.gpus, now - j.submit, True))
    waits.extend(Wait(j.queue, j.gpus, now - j.submit, False) for q in pending.values() for _, _, j in q)
    return waits


def run_reference_easy(trace: Trace, after: int, limit_factor: float) -> list[Wait]:
    """`easy-nodes`: the textbook answer to starvation, EASY backfill on the cluster's nodes (no quota). Jobs go
    shortest declared limit first (a limit is the runtime times `limit_factor`, as in `reserve+limits`); the
    oldest job that has waited `after` seconds is the head: nothing passes it unless it fits now and its limit
    ends by the head's shadow time (when, by the running jobs' limits, the head fits), so the head starts by
    then. One reservation at a time; a job that would not touch the head's nodes is not let through (no node
    plan), so this is the conservative EASY."""
    nodes = Nodes(sum(trace.nominal.values()))
    arrivals = sorted(trace.jobs, key=lambda j: (j.submit, j.job))
    limit = {j.job: math.ceil(j.runtime * limit_factor) for j in trace.jobs}
    ends: list[tuple[int, int, list[int], int, int]] = []
    """(actual end, tie, nodes, GPUs per pod, declared end) of each running gang."""
    by_shape: dict[tuple[int, int], list[tuple[int, int, TraceJob]]] = {}
    """Pending gangs by shape, shortest limit first (a shape whose shortest does not fit the window: none does)."""
    oldest: list[tuple[int, TraceJob]] = []
    gone: set[str] = set()
    waits: list[Wait] = []
    i, now, n = 0, 0, 0

    def start(j: TraceJob) -> None:
        nonlocal n
        per_pod = gpus_per_pod(j.gpus)
        gone.add(j.job)
        n += 1
        on = nodes.take(j.gpus // per_pod, per_pod)
        heapq.heappush(ends, (now + j.runtime, n, on, per_pod, now + limit[j.job]))
        waits.append(Wait(j.queue, j.gpus, now - j.submit, True))

    def shadow(pods: int, per_pod: int) -> int | None:
        """When the head fits by the running gangs' declared ends (None: never)."""
        free = Nodes(0)
        free.free = list(nodes.free)
        for e in sorted(ends, key=lambda e: e[4]):
            free.give(e[2], e[3])
            if free.fits(pods, per_pod):
                return e[4]
        return None

    while i < len(arrivals) or ends:
        due = [arrivals[i].submit] if i < len(arrivals) else []
        now = min([*due, ends[0][0]] if ends else due)
        while ends and ends[0][0] <= now:
            _, _, on, per_pod, _ = heapq.heappop(ends)
            nodes.give(on, per_pod)
        while i < len(arrivals) and arrivals[i].submit <= now:
            j = arrivals[i]
            per_pod = gpus_per_pod(j.gpus)
            heapq.heappush(by_shape.setdefault((j.gpus // per_pod, per_pod), []), (limit[j.job], i, j))
            heapq.heappush(oldest, (i, j))
            i += 1
        while True:
            while oldest and oldest[0][1].job in gone:
                heapq.heappop(oldest)
            for q in by_shape.values():
                while q and q[0][2].job in gone:
                    heapq.heappop(q)
            head = oldest[0][1] if oldest and now - oldest[0][1].submit >= after else None
            window: int | None = None
            if head is not None:
                per_pod = gpus_per_pod(head.gpus)
                if nodes.fits(head.gpus // per_pod, per_pod):
                    start(head)
                    continue
                window = shadow(head.gpus // per_pod, per_pod)
            fitting = [
                q[0]
                for s, q in by_shape.items()
                if q and nodes.fits(*s) and (head is None or (window is not None and now + q[0][0] <= window))
            ]
            if not fitting:
                break
            start(min(fitting)[2])
    waits.extend(
        Wait(j.queue, j.gpus, now - j.submit, False) for q in by_shape.values() for _, _, j in q if j.job not in gone
    )
    return waits
