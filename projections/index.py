"""The scheduler's derived index of a `ClusterState`: topology, quota tree, queues.

Derived means rebuildable: everything here is a function of the state, kept
in step incrementally from the state's dirty sets so a cycle does not pay for
the whole cluster. It also holds the *parking* memo: a job found inadmissible
is not tried again until something happens that could change the verdict or
the words of its reason:
- quota blocked it: usage in its cohort tree went down by at least its
  deficit (a release of d raises any queue's available quota by at most d);
- placement blocked it: the cluster's free GPUs reach its GPUs minus what
  preemption could free, or usage in its tree went up by more than its quota
  slack (then quota would block it, and the reason would read differently);
- a queue of its tree started borrowing (new victims), fair sharing is on and
  usage moved, or any configuration changed (the index is rebuilt);
- time moved on, for a job evicted at this instant (it may preempt later) and
  for one whose failed victim search depended on the candidates' order (lost
  work, which orders them, grows with time);
- its tree admitted, in the same cycle, a job that could be its victim.
While none of these happens the same job is inadmissible for the same reason,
so skipping it changes no event: `decide` on a fresh index (replay, audit)
gives the same bytes as on a long-lived one, which tests check.
"""

from __future__ import annotations

import bisect
import heapq

from muster.projections.cluster import TERMINAL, ClusterState, JobState
from muster.projections.quota import QuotaTree
from muster.projections.topology import TopologyIndex
from muster.projections.validation import invalid_reason

_ATTR = "_scheduler_index"

PARKING = True
"""Switch for the parking memo; off, every pending job is tried every cycle (tests prove both agree)."""


class Parked:
    __slots__ = ("root", "stamp")

    def __init__(self, root: str, stamp: int) -> None:
        self.root = root
        self.stamp = stamp


class Wake:
    """When a parked job must be tried again (see the module docstring)."""

    __slots__ = ("at_time", "capacity_below", "consumed", "consumed_in_cycle", "own_released", "released")

    def __init__(self) -> None:
        self.capacity_below: int | None = None
        """Try again once the cluster has at least this many free GPUs (less new victims)."""
        self.consumed_in_cycle = 0
        """GPUs taken in the job's tree earlier in the cycle that judged it."""
        self.at_time: int | None = None
        """Try again in the first cycle at or after this time (the verdict may change with time)."""
        self.released: dict[str, int] = {}
        """Resource -> usage decrease in the tree after which to try again."""
        self.consumed: dict[str, int] = {}
        """Resource -> usage increase in the tree after which to try again."""
        self.own_released: dict[str, int] = {}
        """Resource -> usage decrease in the job's own queue after which to try again."""


class SchedulerIndex:
    def __init__(self, state: ClusterState) -> None:
        self.structure = state.structure
        self.topology = TopologyIndex(state)
        self.quota = QuotaTree(state)
        self.roots: dict[str, str] = {q: self.quota.root_of(q) for q in state.queues}
        self.tree_queues: dict[str, list[str]] = {}
        """Cohort-tree root -> its queues, sorted."""
        for q in sorted(state.queues):
            self.tree_queues.setdefault(self.roots[q], []).append(q)
        self.released_seen = state.released
        self.active: dict[str, list[tuple[int, int, str]]] = {q: [] for q in state.queues}
        """Per queue, the pending jobs to try, in queue order (-priority, seq, id)."""
        self.keys: dict[str, tuple[int, int, str]] = {}
        self.parked: dict[str, Parked] = {}
        self.parked_by_root: dict[str, set[str]] = {}
        self.capacity_heaps: dict[str, list[tuple[int, int, str, int]]] = {}
        """Per tree: (GPUs needed - candidate GPUs + tree consumption at park, ...)."""
        self.released_total: dict[tuple[str, str], int] = {}
        """(root, resource) -> cumulative usage decrease in that tree."""
        self.consumed_total: dict[tuple[str, str], int] = {}
        self.release_heaps: dict[tuple[str, str], list[tuple[int, int, str, int]]] = {}
        self.consume_heaps: dict[tuple[str, str], list[tuple[int, int, str, int]]] = {}
        self.nominated: set[str] = set()
        self.time_heap: list[tuple[int, int, str, int]] = []
        self.seen_released: dict[str, dict[str, int]] = {
            q: dict(v) for q, v in getattr(state, "queue_released", {}).items()
        }
        self.seen_consumed: dict[str, dict[str, int]] = {
            q: dict(v) for q, v in getattr(state, "queue_consumed", {}).items()
        }
        self.provisional: tuple[int, int, list[str]] | None = None
        """(cycle, decisions, jobs): jobs parked on a cycle's view, valid once its decisions are folded."""
        self.stamp = 0
        self.new_jobs: set[str] = set()
        """Pending jobs not yet validated."""
        self.running: dict[str, set[str]] = {q: set() for q in state.queues}
        self.running_version: dict[str, int] = {}
        self.victim_cache: dict[str, tuple[int, int, int, list[tuple[int, int, int, int, JobState]]]] = {}
        """Queue -> (time, running version, up to priority, running jobs in victim order)."""
        self.victim_entries: dict[
            str, tuple[int, int | None, int | None, tuple[int, int, int, int, JobState] | None]
        ] = {}
        """Job -> (time of the entry, admitted at, priority or None when not preemptible, entry)."""
        self.down_nodes: set[str] = {n for n, node in state.nodes.items() if not node.ready}
        self.orphans: set[str] = set()
        for job in state.jobs.values():
            self._track(state, job)
        for job in state.jobs.values():
            if job.status == "admitted" and any(n not in state.nodes for n in job.placement.values()):
                self.orphans.add(job.id)
        state.dirty_nodes.clear()
        state.dirty_queues.clear()
        state.dirty_jobs.clear()

    # ------------------------------------------------------------ job tracking

    def _untrack(self, job: JobState) -> None:
        self.deactivate(job)
        self.unpark(job.id, reactivate=False)
        self.new_jobs.discard(job.id)
        self.nominated.discard(job.id)
        self.victim_entries.pop(job.id, None)
        running = self.running.get(job.queue)
        if running is not None and job.id in running:
            running.discard(job.id)
            self.running_version[job.queue] = self.running_version.get(job.queue, 0) + 1
        self.orphans.discard(job.id)

    def _track(self, state: ClusterState, job: JobState) -> None:
        if job.status == "pending":
            self.new_jobs.add(job.id)
            if job.nominated:
                self.nominated.add(job.id)
        elif job.status == "admitted":
            self.running.setdefault(job.queue, set()).add(job.id)
            self.running_version[job.queue] = self.running_version.get(job.queue, 0) + 1

    def activate(self, state: ClusterState, job: JobState) -> None:
        """Put a validated pending job in its queue's list of jobs to try."""
        if job.id in self.keys:
            return
        key = (-state.priority_of(job), job.seq, job.id)
        self.keys[job.id] = key
        bisect.insort(self.active.setdefault(job.queue, []), key)

    def deactivate(self, job: JobState) -> None:
        key = self.keys.pop(job.id, None)
        if key is None:
            return
        lst = self.active.get(job.queue, [])
        i = bisect.bisect_left(lst, key)
        if i < len(lst) and lst[i] == key:
            del lst[i]

    # ------------------------------------------------------------ parking

    def park(self, job: JobState, wake: Wake) -> None:
        root = self.roots.get(job.queue, job.queue)
        self.stamp += 1
        stamp = self.stamp
        self.parked[job.id] = Parked(root, stamp)
        self.parked_by_root.setdefault(root, set()).add(job.id)
        if wake.capacity_below is not None:
            # compared with free GPUs + the tree's consumption: an admission in the
            # tree leaves that level as it was (it may be a new victim for this job),
            # a release anywhere raises it, an admission elsewhere lowers it
            target = wake.capacity_below + self.consumed_total.get((root, "gpu"), 0) + wake.consumed_in_cycle
            heapq.heappush(self.capacity_heaps.setdefault(root, []), (target, job.seq, job.id, stamp))
        for r, amount in wake.released.items():
            key = (root, r)
            target = self.released_total.get(key, 0) + amount
            heapq.heappush(self.release_heaps.setdefault(key, []), (target, job.seq, job.id, stamp))
        if wake.at_time is not None:
            heapq.heappush(self.time_heap, (wake.at_time, job.seq, job.id, stamp))
        for r, amount in wake.own_released.items():
            key = (f"own:{job.queue}", r)
            target = self.released_total.get(key, 0) + amount
            heapq.heappush(self.release_heaps.setdefault(key, []), (target, job.seq, job.id, stamp))
        for r, amount in wake.consumed.items():
            key = (root, r)
            target = self.consumed_total.get(key, 0) + amount
            heapq.heappush(self.consume_heaps.setdefault(key, []), (target, job.seq, job.id, stamp))
        self.deactivate(job)

    def _pop_due(self, state: ClusterState, heap: list[tuple[int, int, str, int]], level: int) -> None:
        while heap and heap[0][0] <= level:
            _, _, job_id, stamp = heapq.heappop(heap)
            p = self.parked.get(job_id)
            if p is not None and p.stamp == stamp:
                self.unpark(job_id, state=state)

    def usage_moved(self, state: ClusterState, queue: str, root: str, diff: dict[str, int]) -> None:
        """Count a queue's usage change (in its tree and itself) and wake the jobs it concerns."""
        for r, d in sorted(diff.items()):
            key = (root, r)
            if d < 0:
                total = self.released_total[key] = self.released_total.get(key, 0) - d
                self._pop_due(state, self.release_heaps.get(key, []), total)
                own = (f"own:{queue}", r)
                total = self.released_total[own] = self.released_total.get(own, 0) - d
                self._pop_due(state, self.release_heaps.get(own, []), total)
            elif d > 0:
                total = self.consumed_total[key] = self.consumed_total.get(key, 0) + d
                self._pop_due(state, self.consume_heaps.get(key, []), total)

    def unpark(self, job_id: str, reactivate: bool = True, state: ClusterState | None = None) -> None:
        p = self.parked.pop(job_id, None)
        if p is None:
            return
        s = self.parked_by_root.get(p.root)
        if s is not None:
            s.discard(job_id)
        if reactivate and state is not None:
            job = state.jobs.get(job_id)
            if job is not None and job.status == "pending":
                self.activate(state, job)

    def due_on_consumption(self, key: tuple[str, str], level: int) -> list[str]:
        """Parked jobs whose consumption wake is due at `level`; the entries stay for the next sync."""
        heap = self.consume_heaps.get(key)
        out: list[str] = []
        if not heap:
            return out
        popped = []
        while heap and heap[0][0] <= level:
            entry = heapq.heappop(heap)
            popped.append(entry)
            p = self.parked.get(entry[2])
            if p is not None and p.stamp == entry[3]:
                out.append(entry[2])
        for entry in popped:
            heapq.heappush(heap, entry)
        return out

    def wake_tree(self, state: ClusterState, root: str) -> None:
        for job_id in sorted(self.parked_by_root.get(root, ())):
            self.unpark(job_id, state=state)

    def wake_at(self, state: ClusterState, now: int) -> None:
        """Try again the jobs whose wake time has come."""
        self._pop_due(state, self.time_heap, now)

    def wake_capacity(self, state: ClusterState) -> None:
        free = self.topology.gpu_free_total
        for root in sorted(self.capacity_heaps):
            self._pop_due(state, self.capacity_heaps[root], free + self.consumed_total.get((root, "gpu"), 0))

    # ------------------------------------------------------------ sync

    def sync(self, state: ClusterState) -> None:
        """Bring the index in line with the state's changes since the last sync."""
        if self.provisional is not None:
            cycle, decisions, jobs = self.provisional
            self.provisional = None
            if state.cycle != cycle or state.cycle_decisions != decisions:
                # the cycle's decisions were not folded as decided: judge those jobs again
                for job_id in jobs:
                    self.unpark(job_id, state=state)
        topo = self.topology
        for name in sorted(state.dirty_nodes):
            node = state.nodes.get(name)
            if node is None:
                # a removed node: its jobs are orphans until evicted
                for job_id in sorted(j for s in self.running.values() for j in s):
                    job = state.jobs[job_id]
                    if name in job.placement.values():
                        self.orphans.add(job_id)
                self.down_nodes.discard(name)
                continue
            topo.sync_node(state, name)
            if node.ready:
                self.down_nodes.discard(name)
            else:
                self.down_nodes.add(name)
        state.dirty_nodes.clear()
        for name in sorted(state.dirty_queues):
            q = state.queues.get(name)
            if q is None:
                continue
            root = self.roots.get(name, name)
            net, started_borrowing = self.quota.set_usage(q)
            # wake on every release and consumption since the last look, not their net
            diff: dict[str, int] = {}
            for r, total in state.queue_released.get(name, {}).items():
                seen = self.seen_released.setdefault(name, {})
                if total != seen.get(r, 0):
                    diff[r] = -(total - seen.get(r, 0))
                    seen[r] = total
            if diff:
                self.usage_moved(state, name, root, diff)
            grown: dict[str, int] = {}
            for r, total in state.queue_consumed.get(name, {}).items():
                seen = self.seen_consumed.setdefault(name, {})
                if total != seen.get(r, 0):
                    grown[r] = total - seen.get(r, 0)
                    seen[r] = total
            if grown:
                self.usage_moved(state, name, root, grown)
            diff = net
            # a new borrower brings new victims; fair shares move with any usage
            if started_borrowing or (diff and state.fair_sharing):
                self.wake_tree(state, root)
        state.dirty_queues.clear()
        for job_id in sorted(state.dirty_jobs):
            dirty = state.jobs.get(job_id)
            if dirty is None:
                continue
            job = dirty
            self._untrack(job)
            if job.status not in TERMINAL:
                self._track(state, job)
        state.dirty_jobs.clear()
        if state.released != self.released_seen:
            self.released_seen = state.released
            self.wake_capacity(state)


def index_of(state: ClusterState) -> SchedulerIndex:
    """The state's scheduler index, rebuilt when the state changed shape, else synced."""
    idx: SchedulerIndex | None = state.__dict__.get(_ATTR)
    if idx is None or idx.structure != state.structure:
        idx = SchedulerIndex(state)
        state.__dict__[_ATTR] = idx
    else:
        idx.sync(state)
    if not PARKING:
        for job_id in sorted(idx.parked):
            idx.unpark(job_id, state=state)
    return idx


def forget_verdicts(state: ClusterState) -> None:
    """The last cycle's decisions never reached the fold (refused by the fence, failed, dropped).

    Parking assumes a cycle's decisions are folded: a job parked on a verdict
    whose JobInadmissible was never stored would wait, unanswered, for a wake
    that only that verdict's reason justified. So every parked job is judged
    again at the next cycle, as a run without the memo would.
    """
    idx: SchedulerIndex | None = state.__dict__.get(_ATTR)
    if idx is None:
        return
    for job_id in sorted(idx.parked):
        idx.unpark(job_id, state=state)


def take_new_jobs(state: ClusterState, idx: SchedulerIndex) -> list[tuple[JobState, str]]:
    """Validate jobs seen for the first time; returns the invalid ones with their reason.

    Invalid jobs stay in `new_jobs` until their rejection is folded, so calling
    `decide` again on the same state rejects them again.
    """
    rejected: list[tuple[JobState, str]] = []
    for job_id in sorted(idx.new_jobs, key=lambda j: state.jobs[j].seq):
        job = state.jobs[job_id]
        reason = invalid_reason(state, job)
        if reason is not None:
            rejected.append((job, reason))
        else:
            idx.activate(state, job)
            idx.new_jobs.discard(job_id)
    return rejected
