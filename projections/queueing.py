"""Queueing strategies: which pending job of a queue may be tried now.

A queue's `queueing_strategy` is Kueue's `.spec.queueingStrategy`:

- `best_effort_fifo` (the default): jobs are ordered by priority, then
  submission; a job that cannot be admitted does not hold back the jobs
  behind it (this module never answers for such a queue).
- `strict_fifo`: the same order, and the head of the queue (its first
  pending job in that order that this cycle has not placed) blocks the rest
  of its queue: no job behind it is admitted, nor preempts, while it waits.
  Other queues go on.

The head is judged on the cycle's view: the jobs the index holds pending
(to try or parked) less the ones admitted or given room in this cycle. A job
held back is skipped without an event and without being parked, so the
parking memo decides the same bytes on or off: a parked job would only have
been held back or refused again, and a held-back job stays one to try.
"""

from __future__ import annotations

from muster.projections.index import STRICT_FIFO, SchedulerIndex, order_key
from muster.projections.state import ClusterState, JobState

__all__ = ["STRICT_FIFO", "StrictHeads"]


class StrictHeads:
    """One cycle's heads of the `strict_fifo` queues, built per queue when first asked."""

    def __init__(self, state: ClusterState, idx: SchedulerIndex) -> None:
        self.state = state
        self.idx = idx
        self.strict = idx.strict_fifo
        self._order: dict[str, list[str]] | None = None
        """Per strict queue, its pending jobs in queue order (as the cycle first asked)."""
        self._head: dict[str, int] = {}
        """Per strict queue, the index in `_order` of its head (placed jobs are stepped over)."""

    def blocker(self, job: JobState, placed: dict[str, dict[str, str]]) -> str | None:
        """The head that holds `job` back in its `strict_fifo` queue, or None when `job` may be tried."""
        if job.queue not in self.strict:
            return None
        if self._order is None:
            self._order = self._pending()
        order = self._order.get(job.queue, [])
        i = self._head.get(job.queue, 0)
        while i < len(order) and order[i] in placed:
            i += 1
        self._head[job.queue] = i
        if i == len(order) or order[i] == job.id:
            return None
        return order[i]

    def _pending(self) -> dict[str, list[str]]:
        """Every strict queue's pending jobs, in one pass over the index."""
        state, strict = self.state, self.strict
        by_queue: dict[str, dict[str, JobState]] = {}
        for job_id in self.idx.group_of:  # the validated pending jobs, to try or parked
            job = state.jobs.get(job_id)
            if job is not None and job.queue in strict and job.status == "pending":
                by_queue.setdefault(job.queue, {})[job_id] = job
        # the one admission order with the quota position left out (as `views.queue_order` shows it)
        return {
            q: sorted(members, key=lambda j: order_key(state.priority_of(members[j]), members[j].order_seq))
            for q, members in by_queue.items()
        }
