"""The scheduler's derived index of a `ClusterState`: topology, quota tree, queues.

Derived means rebuildable: everything here is a function of the state, kept
in step incrementally from the state's dirty sets so a cycle does not pay for
the whole cluster. It also holds the *parking* memo: a job found inadmissible
is not tried again until something that could change the answer happens:
- its cohort tree's usage or any configuration changed (`tree_gen`), or
- capacity was given back somewhere (`state.released`) and the cluster's free
  GPUs reach the job's threshold (its GPUs minus what preemption could free).
Both are sound: while neither happens, the same job is still inadmissible for
the same reason, so skipping it changes no decision. `decide` on a fresh index
(replay, audit) gives the same events as on a long-lived one.
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
    __slots__ = ("kind", "released", "root", "stamp", "threshold", "tree_gen")

    def __init__(self, kind: str, root: str, tree_gen: int, released: int, threshold: int, stamp: int) -> None:
        self.kind = kind
        self.root = root
        self.tree_gen = tree_gen
        self.released = released
        self.threshold = threshold
        self.stamp = stamp


class SchedulerIndex:
    def __init__(self, state: ClusterState) -> None:
        self.structure = state.structure
        self.topology = TopologyIndex(state)
        self.quota = QuotaTree(state)
        self.roots: dict[str, str] = {q: self.quota.root_of(q) for q in state.queues}
        self.tree_gen: dict[str, int] = {}
        self.released_seen = state.released
        self.active: dict[str, list[tuple[int, int, str]]] = {q: [] for q in state.queues}
        """Per queue, the pending jobs to try, in queue order (-priority, seq, id)."""
        self.keys: dict[str, tuple[int, int, str]] = {}
        self.parked: dict[str, Parked] = {}
        self.parked_by_root: dict[str, set[str]] = {}
        self.capacity_heap: list[tuple[int, int, str, int]] = []
        self.stamp = 0
        self.new_jobs: set[str] = set()
        """Pending jobs not yet validated."""
        self.running: dict[str, set[str]] = {q: set() for q in state.queues}
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
        running = self.running.get(job.queue)
        if running is not None:
            running.discard(job.id)
        self.orphans.discard(job.id)

    def _track(self, state: ClusterState, job: JobState) -> None:
        if job.status == "pending":
            self.new_jobs.add(job.id)
        elif job.status == "admitted":
            self.running.setdefault(job.queue, set()).add(job.id)

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

    def park(self, state: ClusterState, job: JobState, kind: str, threshold: int) -> None:
        root = self.roots.get(job.queue, job.queue)
        self.stamp += 1
        p = Parked(kind, root, self.tree_gen.get(root, 0), state.released, threshold, self.stamp)
        self.parked[job.id] = p
        self.parked_by_root.setdefault(root, set()).add(job.id)
        if kind == "capacity":
            heapq.heappush(self.capacity_heap, (threshold, job.seq, job.id, p.stamp))
        self.deactivate(job)

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

    def wake_tree(self, state: ClusterState, root: str) -> None:
        for job_id in sorted(self.parked_by_root.get(root, ())):
            self.unpark(job_id, state=state)

    def wake_capacity(self, state: ClusterState) -> None:
        free = self.topology.gpu_free_total
        heap = self.capacity_heap
        while heap and heap[0][0] <= free:
            _, _, job_id, stamp = heapq.heappop(heap)
            p = self.parked.get(job_id)
            if p is not None and p.stamp == stamp:
                self.unpark(job_id, state=state)

    # ------------------------------------------------------------ sync

    def sync(self, state: ClusterState) -> None:
        """Bring the index in line with the state's changes since the last sync."""
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
            # more usage without a new borrower cannot help a waiting job (fewer
            # free GPUs, less quota, and new victims only give back what they took)
            if self.quota.set_usage(q) or state.fair_sharing:
                root = self.roots.get(name, name)
                self.tree_gen[root] = self.tree_gen.get(root, 0) + 1
                self.wake_tree(state, root)
        state.dirty_queues.clear()
        for job_id in sorted(state.dirty_jobs):
            job = state.jobs.get(job_id)
            if job is None:
                continue
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
