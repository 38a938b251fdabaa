"""The scheduler's derived index of a `ClusterState`: topology, quota tree, queues, parked jobs.

Derived means rebuildable: everything here is a function of the state, kept
in step incrementally from the state's dirty sets so a cycle does not pay for
the whole cluster. The parking memo (`parking.Parking`) lives here and is
woken from the same sync, from counters the fold keeps (see `parking`).
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, NamedTuple, cast

from muster.projections import parking
from muster.projections.eviction import evicts_no_one, reach
from muster.projections.flavors import MARKER, UNTAINTED
from muster.projections.holdings import Holdings
from muster.projections.jobfacts import preemptible, priority_of
from muster.projections.parking import Block, Member, Parking
from muster.projections.planning import Replanned
from muster.projections.quota import QuotaTree
from muster.projections.state import TERMINAL, ClusterState, JobState
from muster.projections.topology import TopologyIndex
from muster.projections.validation import invalid_reason

if TYPE_CHECKING:
    from muster.projections.flavorplan import Plan

_ATTR = "_scheduler_index"


class VictimEntry:
    """A running job in victim order: by (priority, lost, neg_admitted, neg_seq), smallest first (seq
    is unique, so the job is never compared). A class, not a NamedTuple: the compiled core builds and
    compares it in C (victim orders are sorted again at every instant)."""

    __slots__ = ("job", "lost", "neg_admitted", "neg_seq", "priority")

    def __init__(self, priority: int, lost: int, neg_admitted: int, neg_seq: int, job: JobState) -> None:
        self.priority = priority
        self.lost = lost
        """GPU-seconds of work lost if evicted now (since its last checkpoint)."""
        self.neg_admitted = neg_admitted
        """Minus its admission time: the most recently admitted first."""
        self.neg_seq = neg_seq
        self.job = job

    def __lt__(self, other: VictimEntry) -> bool:
        if self.priority != other.priority:
            return self.priority < other.priority
        if self.lost != other.lost:
            return self.lost < other.lost
        if self.neg_admitted != other.neg_admitted:
            return self.neg_admitted < other.neg_admitted
        return self.neg_seq < other.neg_seq


class VictimList(NamedTuple):
    """A queue's running jobs in victim order, as computed at `at` for its running set `version`."""

    at: int
    version: int
    upto: int
    """Jobs of priority above this are left out."""
    entries: list[VictimEntry]


class VictimMemo(NamedTuple):
    """A running job's entry, good for the instant `at` and the admission `admitted_at`."""

    at: int
    admitted_at: int | None
    priority: int | None
    """None: not preemptible."""
    entry: VictimEntry | None


Shape = tuple[str, tuple[tuple[str, int], ...], tuple[tuple[str, ...], ...]]
"""(queue, requests, per podset its flavor restrictions, or () when none): jobs with the same one weigh the
same on quota."""
Group = tuple[Shape, int, bool, tuple[object, ...], int, str]
"""A job class: (shape, priority, preemptible, podsets, limit rank (`limit_rank`), ""), or the job's
id last for a job whose verdict is its own (a preemptor, a job evicted to make room). Pending jobs of
one class get the same verdict on the same view, and their admission order keys differ only by their
seq."""
OrderKey = tuple[int, int, int, int, int]
"""Admission order (see `order_key`): (over nominal, fair share, -priority, limit rank, seq). Its last
item is the seq; the items before it are what the jobs of a `Group` share (`ahead_of_seq`)."""


def order_key(priority: int, seq: int, over_nominal: int = 0, share: int = 0, limit: int = 0) -> OrderKey:
    """The one admission order, smallest first: within nominal quota, then the smaller fair
    share, then the higher priority, then (in a `shortest_limit_first` queue) the shorter
    declared limit (`limit_rank`), then the first submitted (seq is unique).

    The cycle judges the quota position as it goes (`cycle.lowest_key`); views of one
    queue's backlog leave it at 0. Within a `Group` only seq differs, so its members are
    kept by seq (`groups`).
    """
    return (over_nominal, share, -priority, limit, seq)


def ahead_of_seq(key: OrderKey) -> tuple[int, ...]:
    """The part of an order key before the seq: the same for every job of a `Group`."""
    return key[:-1]


STRICT_FIFO = "strict_fifo"
"""The queueing strategy whose head blocks the rest of its queue (see `queueing`)."""
SHORTEST_LIMIT_FIRST = "shortest_limit_first"
"""The queueing strategy that orders a queue's jobs of equal priority by declared limit (`limit_rank`)."""
NO_LIMIT = 1 << 62
"""`limit_rank` of a job without a declared limit in a `shortest_limit_first` queue: after every limit."""


def limit_rank(strategy: str, max_runtime: int | None) -> int:
    """A job's place by declared limit in its queue's order: its limit in a `shortest_limit_first` queue
    (jobs without one last, then by submission), 0 in any other queue (priority, then submission)."""
    if strategy != SHORTEST_LIMIT_FIRST:
        return 0
    return NO_LIMIT if max_runtime is None else max_runtime


def queue_order_key(state: ClusterState, job: JobState) -> OrderKey:
    """A pending job's `order_key` with its quota position left out: its place in its queue's backlog
    (strict heads, reservations' heads, views), as the cycle's heap orders it but for quota."""
    queue = state.queues.get(job.queue)
    strategy = queue.queueing_strategy if queue is not None else ""
    return order_key(priority_of(state, job), job.order_seq, limit=limit_rank(strategy, job.max_runtime))


class SchedulerIndex:
    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.structure = state.structure
        self.topology = TopologyIndex(state)
        self.quota = QuotaTree(state)
        self.roots: dict[str, str] = {q: self.quota.root_of(q) for q in state.queues}
        self.tree_queues: dict[str, list[str]] = {}
        """Cohort-tree root -> its queues, sorted."""
        for q in sorted(state.queues):
            self.tree_queues.setdefault(self.roots[q], []).append(q)
        self._prio: dict[str, int] = {}
        self._shape: dict[str, Shape] = {}
        self._equal_in_queue: dict[str, bool] = {}
        self._evicts_no_one: dict[tuple[str, int], bool] = {}
        self.strict_fifo = frozenset(name for name, q in state.queues.items() if q.queueing_strategy == STRICT_FIFO)
        """The queues whose head blocks the rest (`queueing`); the index is rebuilt when a queue changes."""
        self.shortest_first = frozenset(
            name for name, q in state.queues.items() if q.queueing_strategy == SHORTEST_LIMIT_FIRST
        )
        """The queues ordered by declared limit (`limit_rank`)."""
        self.reserving: frozenset[str] | None = None
        """The queues that make reservations (`reservations.reserving_queues`), found on first use."""
        self.replanned: dict[str, Replanned] = {}
        """Holder -> its reservation when last planned again (`reservations._plan_stands`)."""
        self.group_of: dict[str, Group] = {}
        """The validated pending jobs (to try or parked), with their group."""
        self.groups: dict[Group, list[Member]] = {}
        """The jobs to try (not parked) by group, as sorted `Member`s: the first in `order_key` order last."""
        self.group_reason: dict[Group, str | None] = {}
        """Per group with jobs to try: the reason all of them have (None: not known to be one)."""
        self.parking = Parking(self._woken)
        self.parking.freed_seen = state.gpus_freed
        self.seen_node_freed: dict[str, int] = dict(state.node_gpus_freed)
        """Per node, the fold's `node_gpus_freed` at the last sync (what its flavors' counts took in)."""
        self.seen_released: dict[str, dict[str, int]] = {q: dict(v) for q, v in state.queue_released.items()}
        self.seen_consumed: dict[str, dict[str, int]] = {q: dict(v) for q, v in state.queue_consumed.items()}
        self.seen_borrow_starts: dict[str, int] = dict(state.borrow_starts)
        self.nominated: set[str] = set()
        self.new_jobs: set[str] = set()
        """Pending jobs not yet validated."""
        self.running: dict[str, set[str]] = {q: set() for q in state.queues}
        self.running_version: dict[str, int] = {}
        self.victim_cache: dict[str, VictimList] = {}
        """Queue -> its running jobs in victim order (see `candidates.victim_order`)."""
        self.running_changes: dict[str, list[str]] = {}
        """Queue -> the jobs that joined or left its running set since its victim order was built."""
        self.victim_entries: dict[str, VictimMemo] = {}
        """Job -> its victim-order entry."""
        self.holdings = Holdings(self.topology)
        """Per queue and priority, what its preemptible running GPU jobs hold (`preemption._hopeless`)."""
        self.flavor_plans: dict[Group, Plan] = {}
        """Per class of flavored jobs, what `assignment.choose` reads of their queue and podsets (`flavorplan`)."""
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
        active = self.deactivate(job)
        group = self.group_of.pop(job.id, None)
        if group is not None and not active:
            # a job to try is parked in no block (looking through its class's blocks costs one per block)
            self.parking.unpark(group, -job.order_seq, job.id)
        self._prio.pop(job.id, None)
        self._shape.pop(job.id, None)
        self.new_jobs.discard(job.id)
        self.nominated.discard(job.id)
        self.victim_entries.pop(job.id, None)
        running = self.running.get(job.queue)
        if running is not None and job.id in running:
            running.discard(job.id)
            self._running_moved(job)
        self.holdings.discard(job.id)
        self.orphans.discard(job.id)

    def _track(self, state: ClusterState, job: JobState) -> None:
        # the one place a held job is left out: never validated, activated or woken until released
        if job.status == "pending" and not job.held:
            self.new_jobs.add(job.id)
            if job.nominated:
                self.nominated.add(job.id)
        elif job.status == "admitted":
            self.running.setdefault(job.queue, set()).add(job.id)
            self._running_moved(job)
            if preemptible(state, job):
                self.holdings.add(job, priority_of(state, job))

    def _running_moved(self, job: JobState) -> None:
        """The job joined or left its queue's running set: its victim order is stale."""
        queue = job.queue
        self.running_version[queue] = self.running_version.get(queue, 0) + 1
        if queue in self.victim_cache:
            changes = self.running_changes.setdefault(queue, [])
            changes.append(job.id)
            if len(changes) > len(self.running[queue]) + 64:
                # more changes than a rebuild's work: rebuild instead
                del self.victim_cache[queue]
                del self.running_changes[queue]

    def priority(self, job: JobState) -> int:
        """The job's priority value (classes change only with the index's structure)."""
        p = self._prio.get(job.id)
        if p is None:
            p = self._prio[job.id] = priority_of(self.state, job)
        return p

    def shape(self, job: JobState) -> Shape:
        """(queue, requests, its podsets' flavor restrictions) as a key: jobs with the same one weigh the same on
        quota (a restriction decides which flavor's quota a pending job is judged on: `flavors.order_requests`)."""
        k = self._shape.get(job.id)
        if k is None:
            restricted = tuple(tuple(ps.flavors) for ps in job.podsets) if any(ps.flavors for ps in job.podsets) else ()
            k = self._shape[job.id] = (job.queue, tuple(sorted(job.requests.items())), restricted)
        return k

    def equal_in_queue(self, queue: str) -> bool:
        """Whether the queue's policy lets a job evict its equals (then a job's verdict is its own)."""
        known = self._equal_in_queue.get(queue)
        if known is None:
            known = self._equal_in_queue[queue] = reach(self.state.queues[queue].preemption, None).equal_in_queue
        return known

    def evicts_no_one(self, queue: str, priority: int) -> bool:
        """`eviction.evicts_no_one` for a job of `queue` at `priority` (policies and classes change only
        with the index's structure)."""
        key = (queue, priority)
        known = self._evicts_no_one.get(key)
        if known is None:
            state = self.state
            known = evicts_no_one(state.queues[queue].preemption, priority, state.lowest_priority())
            self._evicts_no_one[key] = known
        return known

    def group(self, job: JobState) -> Group:
        """The job's class (see `Group`)."""
        own = job.id if job.nominated or job.evicted_by is not None else ""
        podsets = tuple(
            (ps.name, ps.count, tuple(sorted(ps.requests.items())), ps.topology, tuple(ps.flavors))
            for ps in job.podsets
        )
        return (self.shape(job), self.priority(job), preemptible(self.state, job), podsets, self.limit(job), own)

    def limit(self, job: JobState) -> int:
        """The job's `limit_rank` in its queue's order."""
        return limit_rank(SHORTEST_LIMIT_FIRST if job.queue in self.shortest_first else "", job.max_runtime)

    def activate(self, state: ClusterState, job: JobState) -> None:
        """Make a validated pending job one to try."""
        group = self.group_of.get(job.id)
        if group is None:
            group = self.group_of[job.id] = self.group(job)
        self._add(group, [Member(-job.order_seq, job.id)], job.reason)

    def activate_all(self, jobs: list[JobState]) -> None:
        """`activate` every job, a group at a time (a deep backlog arrives in one sync)."""
        by_group: dict[Group, list[JobState]] = {}
        for job in jobs:
            group = self.group_of.get(job.id)
            if group is None:
                group = self.group_of[job.id] = self.group(job)
            by_group.setdefault(group, []).append(job)
        for group, members in by_group.items():
            reasons = {j.reason for j in members}
            reason = reasons.pop() if len(reasons) == 1 else None
            self._add(group, sorted(Member(-j.order_seq, j.id) for j in members), reason)

    def _add(self, group: Group, members: list[Member], reason: str | None) -> None:
        """Add sorted members (the list becomes the group's own) with the reason they all have."""
        current = self.groups.get(group)
        if not current:
            self.groups[group] = members
            self.group_reason[group] = reason
            return
        if len(members) == 1:
            bisect.insort(current, members[0])
        elif members[-1] < current[0]:
            members.extend(current)  # the woken come first in the list (later in queue order)
            self.groups[group] = members
        elif current[-1] < members[0]:
            current.extend(members)
        else:
            current.extend(members)
            current.sort()  # two sorted runs: a merge
        if self.group_reason.get(group) != reason:
            self.group_reason[group] = None

    def reactivate(self, group: Group, members: list[Member]) -> None:
        """Make jobs of `group` set aside in a cycle (sorted, the list becomes the group's own) ones to try
        again, with no reason known for them all (their verdicts are not folded)."""
        self._add(group, members, None)

    def is_active(self, job_id: str) -> bool:
        """Whether a job is one to try (validated, pending, not parked)."""
        job = self.state.jobs.get(job_id)
        group = self.group_of.get(job_id)
        if job is None or group is None:
            return False
        members = self.groups.get(group)
        if not members:
            return False
        target = Member(-job.order_seq, job_id)
        i = bisect.bisect_left(members, target)
        return i < len(members) and members[i] == target

    def deactivate(self, job: JobState) -> bool:
        """It is no longer a job to try (parked, or tried and taken); whether it was one."""
        group = self.group_of.get(job.id)
        if group is None:
            return False
        members = self.groups.get(group)
        if not members:
            return False
        target = Member(-job.order_seq, job.id)
        if members[-1] == target:
            # the usual case: the group's first job in queue order, just tried
            members.pop()
        else:
            i = bisect.bisect_left(members, target)
            if i == len(members) or members[i] != target:
                return False
            del members[i]
        if not members:
            del self.groups[group]
            self.group_reason.pop(group, None)
        return True

    def park(self, job: JobState, wake: parking.Wake, reason: str) -> Block:
        """Set a job aside (see `parking`); it is no longer one to try."""
        self.deactivate(job)
        return self.park_members(self.group_of[job.id], [Member(-job.order_seq, job.id)], job, wake, reason)

    def park_members(
        self, group: Group, members: list[Member], like: JobState, wake: parking.Wake, reason: str
    ) -> Block:
        """Set aside jobs of `group` (no longer to try) judged like `like`, with one wake."""
        root = self.roots.get(like.queue, like.queue)
        return self.parking.park(members, group, like.queue, root, wake, self.topology.gpu_free_total, reason)

    def _woken(self, block: Block, members: list[Member]) -> None:
        self._add(cast(Group, block.group), members, block.reason)

    # ------------------------------------------------------------ sync

    def sync(self, state: ClusterState) -> None:
        """Bring the index in line with the state's changes since the last sync."""
        self.state = state
        memo = self.parking
        memo.settle(parking.Folded(state.cycle, state.cycle_decisions, state.settles))
        topo = self.topology
        # the last cycle's tentative changes, but where the fold changed the node or queue
        topo.settle(state.dirty_nodes)
        self.quota.settle(state.dirty_queues)
        freed_on: dict[str, int] = {}
        freed_in: dict[tuple[str, ...], int] = {}
        if state.dirty_nodes:
            self._sync_nodes(state, freed_on, freed_in)
        state.dirty_nodes.clear()
        for name in sorted(state.dirty_queues) if state.dirty_queues else ():
            q = state.queues.get(name)
            if q is None:
                continue
            self.quota.set_usage(q)
            # wake on every release and consumption since the last look, not their net
            released = _moved(state.queue_released.get(name), self.seen_released, name)
            consumed = _moved(state.queue_consumed.get(name), self.seen_consumed, name)
            if not released and not consumed:
                continue
            root = self.roots.get(name, name)
            memo.usage_moved(name, root, released, consumed)
            # a new borrower brings new victims; fair shares move with any usage
            starts = state.borrow_starts.get(name, 0)
            if starts != self.seen_borrow_starts.get(name, 0) or state.fair_sharing:
                self.seen_borrow_starts[name] = starts
                memo.wake_tree(root, new_victims=not state.fair_sharing)
        state.dirty_queues.clear()
        if state.dirty_jobs:
            for job_id in sorted(state.dirty_jobs):
                dirty = state.jobs.get(job_id)
                if dirty is None:
                    continue
                self._untrack(dirty)
                if dirty.status not in TERMINAL:
                    self._track(state, dirty)
            state.dirty_jobs.clear()
        if state.gpus_freed != memo.freed_seen:
            memo.gpus_freed(state.gpus_freed)
        if freed_on:
            for flavor in sorted(freed_on):
                memo.flavor_gpus_freed(flavor, freed_on[flavor])
        if freed_in:
            for path in sorted(freed_in):
                memo.domain_gpus_freed(path, freed_in[path])

    def _sync_nodes(self, state: ClusterState, freed_on: dict[str, int], freed_in: dict[tuple[str, ...], int]) -> None:
        """Set the changed nodes' hosts from the state; add up the GPUs freed on them per flavor and domain."""
        topo = self.topology
        node_freed, seen_freed = state.node_gpus_freed, self.seen_node_freed
        hosts, markers = topo.hosts, topo.markers
        for name in sorted(state.dirty_nodes):
            total = node_freed.get(name, 0)
            freed = total - seen_freed.get(name, 0)
            if freed:
                seen_freed[name] = total
                host = hosts.get(name)
                if host is not None:
                    for path in topo.freed_in_domains(host):
                        freed_in[path] = freed_in.get(path, 0) + freed
                if markers:
                    for marker in markers.get(name, {}):
                        if marker != UNTAINTED:
                            flavor = marker.removeprefix(MARKER)
                            freed_on[flavor] = freed_on.get(flavor, 0) + freed
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


def _moved(totals: dict[str, int] | None, seen_by_queue: dict[str, dict[str, int]], queue: str) -> dict[str, int]:
    """What grew in a queue's `totals` since it was last seen (brought up to date in `seen_by_queue`)."""
    out: dict[str, int] = {}
    if not totals:
        return out
    seen = seen_by_queue.get(queue)
    if seen is None:
        seen = seen_by_queue[queue] = {}
    for r, total in totals.items():
        d = total - seen.get(r, 0)
        if d:
            out[r] = d
            seen[r] = total
    return out


def index_of(state: ClusterState) -> SchedulerIndex:
    """The state's scheduler index, rebuilt when the state changed shape, else synced."""
    idx: SchedulerIndex | None = state.__dict__.get(_ATTR)
    if idx is None or idx.structure != state.structure:
        idx = SchedulerIndex(state)
        state.__dict__[_ATTR] = idx
    else:
        idx.sync(state)
    if not parking.PARKING:
        idx.parking.wake_all()
    return idx


def take_new_jobs(state: ClusterState, idx: SchedulerIndex) -> list[tuple[JobState, str]]:
    """Validate jobs seen for the first time; returns the invalid ones with their reason.

    Invalid jobs stay in `new_jobs` until their rejection is folded, so calling
    `decide` again on the same state rejects them again.
    """
    rejected: list[tuple[JobState, str]] = []
    if not idx.new_jobs:
        return rejected
    valid: list[JobState] = []
    for job_id in sorted(idx.new_jobs, key=lambda j: state.jobs[j].seq):
        job = state.jobs[job_id]
        reason = invalid_reason(state, job)
        if reason is not None:
            rejected.append((job, reason))
        else:
            valid.append(job)
            idx.new_jobs.discard(job_id)
    idx.activate_all(valid)
    return rejected
