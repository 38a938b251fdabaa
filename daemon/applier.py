"""Applying the log's decisions to the cluster, for one leadership term.

The loop hands over decisions that are on the log (folded at their stream
sequence) and belong to this term's epoch, plus, when the term starts, the
last decision of every live job from earlier epochs (the old leader may have
died before applying it). This module makes them true in the cluster.

Invariants:
- Decisions of one job are applied in log order; different jobs in parallel
  (at most `concurrency` at once in `Cluster.apply`; their bounded waits in
  `Cluster.ready` run side by side, holding no slot).
- `backlog` (decisions handed over and not yet applied) is the gauge
  `muster_apply_backlog`.
- Nothing is applied while the lease is not held (`leading()`): a decision
  waits until it is valid again (a slow refresh), and the term's end (the
  lease lost, a deposed or paused leader waking up) cancels the wait, so
  what was queued is never applied.
- A preemptor is bound only once its victims' pods are gone (`Cluster.holds`),
  waiting at most `victim_wait` seconds: binding earlier would over-commit the
  node until the victims' grace periods end.
- Cluster trouble never escapes: `Cluster.apply` reports, this module counts
  and logs.
- Work a `Reapplying` cluster finds for an applied decision (a Job's successor
  pods to bind, `cluster.Reapply`) is queued like a decision of its job and
  obeys the same rules: after the job's earlier decisions, under the lease,
  within the concurrency limit. A deposed leader's cluster binds nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import anyio
import structlog
from anyio.abc import TaskGroup, TaskStatus

from muster.daemon.cluster import Cluster, Reapply, Reapplying
from muster.daemon.metrics import DaemonMetrics
from muster.daemon.slots import Slots
from muster.events.types import Event, JobAdmitted

__all__ = ["DecisionApplier"]

log = structlog.get_logger("muster.apply")


class DecisionApplier:
    def __init__(
        self,
        cluster: Cluster,
        *,
        leading: Callable[[], bool],
        victims: dict[str, set[str]],
        metrics: DaemonMetrics | None = None,
        victim_wait: float = 90.0,
        concurrency: int = 64,
        poll: float = 0.05,
    ) -> None:
        self.cluster = cluster
        self.leading = leading
        self.victims = victims
        """Preemptor -> jobs evicted for it (kept by the loop from the log)."""
        self.metrics = metrics
        self.victim_wait = victim_wait
        self.poll = poll
        self._limit = Slots(concurrency)
        self._queues: dict[str, deque[Event | Reapply]] = {}
        self._tg: TaskGroup | None = None
        if metrics is not None:
            metrics.apply_backlog.set_function(lambda: self.backlog)
        self.applied = 0
        self.waits = 0
        """Times a decision had to wait for the lease to be valid again."""

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            if isinstance(self.cluster, Reapplying):
                self.cluster.reapply_through(self.submit)
            task_status.started()
            await anyio.sleep_forever()

    def submit(self, event: Event | Reapply) -> None:
        """Queue a decision of the log (or a cluster's work for one) for application, after the job's earlier ones."""
        job = str(getattr(event, "job", ""))
        queue = self._queues.get(job)
        if queue is not None:
            queue.append(event)
            return
        assert self._tg is not None, "submit before run started"
        self._queues[job] = deque([event])
        self._tg.start_soon(self._work, job)

    @property
    def backlog(self) -> int:
        return sum(len(q) for q in self._queues.values())

    async def _work(self, job: str) -> None:
        queue = self._queues[job]
        try:
            while queue:
                await self._apply(queue[0])
                queue.popleft()
        finally:
            del self._queues[job]

    async def _apply(self, event: Event | Reapply) -> None:
        kind = event.kind if isinstance(event, Reapply) else type(event).__name__
        job = str(getattr(event, "job", ""))
        if isinstance(event, JobAdmitted):
            await self._wait_for_victims(job)
        if not self.leading():
            # A lease that lapsed for a moment (a slow refresh) comes back, and then this must still
            # be applied; a lease really lost ends the term, which cancels this wait.
            self.waits += 1
            log.info("applying waits for the lease", type=kind, job=job)
            while not self.leading():  # noqa: ASYNC110 - the lease has no "renewed" notification
                await anyio.sleep(self.poll)
        try:
            # waits for the cluster (an admission's pods) hold no slot: a slow gang stalls no other
            if isinstance(event, Reapply):
                async with self._limit:
                    result = await event.run()
            else:
                await self.cluster.ready(event)
                async with self._limit:
                    result = await self.cluster.apply(event)
            outcome = result.outcome
        except Exception:
            log.exception("applying a decision failed", type=kind, job=job)
            outcome = "error"
        self.applied += 1
        if self.metrics is not None:
            self.metrics.applied.labels(kind, outcome).inc()

    async def _wait_for_victims(self, job: str) -> None:
        victims = sorted(self.victims.get(job, ()))
        if not victims:
            return
        with anyio.move_on_after(self.victim_wait) as scope:
            # the Cluster interface has no "pod gone" notification: poll, bounded by victim_wait
            while any(self.cluster.holds(v) for v in victims):  # noqa: ASYNC110
                await anyio.sleep(self.poll)
        if scope.cancelled_caught:
            holding = [v for v in victims if self.cluster.holds(v)]
            log.warning("binding a preemptor while victims still hold nodes", job=job, victims=holding)
        self.victims.pop(job, None)
