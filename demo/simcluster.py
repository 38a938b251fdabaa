"""An in-process simulated cluster behind the `Cluster` interface (tests, benchmarks, `--simulated-cluster`).

No Kubernetes at all: the nodes are given, an admitted gang "runs" from the
moment its admission is applied (JobStarted) for its remaining `runtime`
divided by `speed` (then JobFinished); a gang without a runtime runs until it
is preempted. A preempted gang's pods are gone after `grace_seconds / speed`.

Invariants (those of the Kubernetes adapter that the loop relies on):
- `run` reports started once the nodes the log lacks (or describes
  differently) are in the sink; the sink is called by one task at a time.
- `apply` is idempotent: admitting a running gang or preempting a gone one
  changes nothing.
- `applied` records every decision handed to `apply`, in order, for tests.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable

import anyio
from anyio.abc import TaskStatus

from muster.daemon.cluster import Sink
from muster.events.types import (
    Event,
    JobAdmitted,
    JobCancelled,
    JobFinished,
    JobId,
    JobPreempted,
    JobStarted,
    NodeAdded,
    NodeName,
)
from muster.projections.state import ClusterState

__all__ = ["SimApplied", "SimulatedCluster", "block_rack_nodes"]


def block_rack_nodes(
    blocks: int = 4, racks: int = 4, nodes: int = 4, gpus: int = 8, *, at: int = 0, prefix: str = ""
) -> list[NodeAdded]:
    """`blocks x racks x nodes` nodes of `gpus` GPUs, labelled `muster.dev/block` and `muster.dev/rack`."""
    out = []
    for b in range(blocks):
        for r in range(racks):
            for n in range(nodes):
                out.append(
                    NodeAdded(
                        at=at,
                        node=NodeName(f"{prefix}b{b}-r{r}-n{n}"),
                        labels={"muster.dev/block": f"b{b}", "muster.dev/rack": f"b{b}-r{r}"},
                        capacity={"gpu": gpus, "cpu": 96_000, "memory": 1 << 40},
                    )
                )
    return out


class SimApplied:
    def __init__(self, ok: bool, outcome: str) -> None:
        self.ok = ok
        self.outcome = outcome


class SimulatedCluster:
    def __init__(
        self,
        nodes: list[NodeAdded],
        state: Callable[[], ClusterState],
        *,
        speed: float = 1.0,
        grace_seconds: float = 0.0,
        report_started: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.nodes = nodes
        self._state = state
        self.speed = speed
        self.grace_seconds = grace_seconds
        self.report_started = report_started
        self._clock = clock
        self.applied: list[Event] = []
        self.running: dict[str, int] = {}
        """Job -> run number of its current run (a stale finish timer is ignored)."""
        self._leaving: dict[str, float] = {}
        """Preempted job -> monotonic time its pods are gone."""
        self._timers: list[tuple[float, int, str, int]] = []
        self._runs = itertools.count(1)
        self._wake = anyio.Event()
        self._lock = anyio.Lock()
        self._sink: Sink | None = None

    # ------------------------------------------------------------ Cluster

    async def run(self, sink: Sink, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        state = self._state()
        at = int(self._clock())
        missing: list[Event] = []
        for node in self.nodes:
            known = state.nodes.get(node.node)
            if known is None or known.capacity != node.capacity or known.labels != node.labels:
                missing.append(NodeAdded(at=at, node=node.node, labels=node.labels, capacity=node.capacity))
        self._sink = sink
        if missing:
            await self._push(missing)
        task_status.started()
        while True:
            self._wake = anyio.Event()
            if not self._timers:
                await self._wake.wait()
                continue
            delay = self._timers[0][0] - anyio.current_time()
            if delay > 0:
                with anyio.move_on_after(delay):
                    await self._wake.wait()
                continue
            _, _, job, run = heapq.heappop(self._timers)
            if self.running.get(job) == run:
                del self.running[job]
                await self._push([JobFinished(at=int(self._clock()), job=JobId(job))])

    async def ready(self, event: Event) -> None:
        """Nothing to wait for: the simulated cluster's jobs need no pods."""

    async def apply(self, event: Event) -> SimApplied:
        self.applied.append(event)
        if isinstance(event, JobAdmitted):
            if event.job in self.running:
                return SimApplied(True, "noop")
            job = self._state().jobs.get(event.job)
            run = next(self._runs)
            self.running[event.job] = run
            remaining = job.remaining() if job is not None else None
            if remaining is not None:
                due = anyio.current_time() + remaining / self.speed
                heapq.heappush(self._timers, (due, run, event.job, run))
                self._wake.set()
            if self.report_started:
                started = JobStarted(at=int(self._clock()), job=event.job, run=job.preemptions if job else 0)
                await self._push([started])
            return SimApplied(True, "applied")
        if isinstance(event, JobPreempted):
            if self.running.pop(event.job, None) is None:
                return SimApplied(True, "noop")
            self._leaving[event.job] = anyio.current_time() + self.grace_seconds / self.speed
            return SimApplied(True, "applied")
        if isinstance(event, JobCancelled):  # a user's cancel: the run stops, no JobFinished follows
            return SimApplied(True, "applied" if self.running.pop(event.job, None) is not None else "noop")
        return SimApplied(True, "skipped")

    def holds(self, job: str) -> bool:
        if job in self.running:
            return True
        gone_at = self._leaving.get(job)
        if gone_at is None:
            return False
        if anyio.current_time() >= gone_at:
            del self._leaving[job]
            return False
        return True

    # ------------------------------------------------------------ internals

    async def _push(self, events: list[Event]) -> None:
        if self._sink is None:
            return
        async with self._lock:
            await self._sink(events)
