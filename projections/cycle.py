"""One scheduling cycle's tentative view (`Cycle`): the derived index plus undo logs.

`decide` (`scheduler`) opens a `Cycle` over the state and its index; every
change a cycle makes (an eviction, a placement, quota taken) is tentative and
recorded so that `finish` can leave the state exactly as it was found. An
admission (`take`) also wakes, within the cycle, the parked jobs whose verdict
it may change. Here too: a job's order key on the cycle's view (`lowest_key`)
and the words for a gang the free GPUs cannot hold (`capacity_reason`).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import Counter
from collections.abc import Mapping
from typing import Any, NamedTuple, cast

from muster.events.types import CycleSettled, Event, JobId, JobPreempted
from muster.projections.assignment import Refusal, choose
from muster.projections.cluster import node_pods
from muster.projections.flavorplan import order_requests
from muster.projections.flavors import PodsetsKey, placement_request, podsets_key, unassigned
from muster.projections.holdback import Fence
from muster.projections.index import Group, OrderKey, SchedulerIndex, Shape, ahead_of_seq, order_key
from muster.projections.jobfacts import gpus, lost_gpu_seconds
from muster.projections.parking import Block, Member, Wake
from muster.projections.preemption import Victim
from muster.projections.queueing import StrictHeads
from muster.projections.resources import fmt
from muster.projections.state import ClusterState, JobState
from muster.projections.topology import Transaction


class HeapEntry:
    """A group in the cycle's admission heap: popping it tries the group's first job. Ordered by (key,
    push): a group woken into mid-cycle can be in the heap twice, and the push number keeps the
    comparison off `group`. A class, not a NamedTuple: the compiled core builds and compares it in C."""

    __slots__ = ("group", "key", "push")

    def __init__(self, key: OrderKey, push: int, group: Group) -> None:
        self.key = key
        """Its first job's order key when pushed (a lower bound: keys only grow within a cycle, and a
        group's first job changes only by leaving it or by a wake, which pushes the group again)."""
        self.push = push
        self.group = group

    def __lt__(self, other: HeapEntry) -> bool:
        return self.key < other.key or (self.key == other.key and self.push < other.push)


class QuotaPosition:
    """A shape's place in `order_key` by quota, as of quota `version`."""

    __slots__ = ("over_nominal", "share", "version")

    def __init__(self, version: int, over_nominal: int, share: int) -> None:
        self.version = version
        self.over_nominal = over_nominal
        self.share = share


class Verdict:
    """Why a job class failed on the cycle's view, and what must happen before it may change."""

    __slots__ = ("reason", "wake")

    def __init__(self, reason: str, wake: Wake) -> None:
        self.reason = reason
        self.wake = wake


class EvictNewAnswer(NamedTuple):
    """`may_evict_new`'s answer, good while the tree's admitted list has `admitted` jobs."""

    admitted: int
    answer: bool


class View(NamedTuple):
    """The topology's tentative state in a cycle, as a token (`Cycle.view`): the same token, the same free room.
    Within a cycle the undo log only grows or is rolled back, and each entry is a new object: its length and
    its last entry, by identity (an equal entry may follow a rollback), name the state."""

    length: int
    last: Any
    """The log's last entry, compared by identity (`Any`: mypyc cannot build a NamedTuple field typed `object`)."""

    def same(self, other: View | None) -> bool:
        return other is not None and self.length == other.length and self.last is other.last


class Removal(NamedTuple):
    """A tentative eviction's place in the cycle's undo logs: from the marks before it to those after."""

    topo_start: int
    quota_start: int
    topo_end: int
    quota_end: int


class Cycle:
    """One scheduling cycle's tentative view: the index plus undo logs."""

    def __init__(self, state: ClusterState, idx: SchedulerIndex, now: int) -> None:
        self.state = state
        self.idx = idx
        self.now = now
        self.number = state.cycle + 1
        """Its decisions' `cycle` (one that decides nothing leaves the number to the next: `CycleSettled`)."""
        self.parked_before = idx.parking.stamp
        """Blocks of a higher stamp were parked by this cycle (not woken by its own admissions)."""
        self.epoch = state.epoch
        self.topo = Transaction(idx.topology)
        self.current: OrderKey | None = None
        """Order key of the job being tried (None while nominated preemptors go first)."""
        self.heap: list[HeapEntry] | None = None
        self.pushes = itertools.count()
        self.consumed: dict[tuple[str, str], int] = {}
        """Usage taken in this cycle, per (tree, resource)."""
        self.tried_class: tuple[object, ...] | None = None
        """The class of the job `trying.try_job` tried last (None: its verdict is its own)."""
        self.failed_classes: dict[tuple[object, ...], Verdict] = {}
        """Verdicts of jobs that failed on the current view, by job class (cleared on any change)."""
        self.doomed: dict[Group, Verdict] = {}
        """Groups whose first job failed for its class on the current view: the rest of each
        fail the same way when their turn comes, unless the view changes first (`park_doomed`)."""
        self.quota_keys: dict[Shape, QuotaPosition] = {}
        """`lowest_key`'s quota part by shape (`SchedulerIndex.shape`)."""
        self.may_evict_new: dict[tuple[str, int, tuple[str, ...]], EvictNewAnswer] = {}
        """`may_evict_new` by (queue, priority, resources)."""
        self.nodes_judged: dict[tuple[object, ...], Refusal | None] = {}
        """`assignment`'s placement verdicts on flavors, by admissions so far and podsets (see there)."""
        self.found_view: View | None = None
        self.found: dict[PodsetsKey, list[list[str]]] = {}
        """Nodes per podset that `look` found on the view `found_view`, by `podsets_key`: `place` takes them."""
        self.admitted_by_root: dict[str, list[JobState]] = {}
        """Jobs admitted (or holding room as preemptors) in this cycle, per tree: new victims next cycle."""
        self.removed: set[str] = set()
        """Jobs evicted (tentatively) in this cycle."""
        self.removals: dict[str, Removal] = {}
        """Where each `remove` sits in the undo logs (a `restore` right after it takes it out)."""
        self.placed: dict[str, dict[str, str]] = {}
        """Jobs admitted or reserved (tentatively) in this cycle, with their placement."""
        self.reserved = False
        """Whether room was held for a preemptor (a change no decision event will fold)."""
        self.told_held: set[str] = set()
        """Jobs told in this cycle that they wait behind their `strict_fifo` head (`verdicts.say_held`): their
        group may come up again in the cycle, and the reason is not folded before its end."""
        self.set_aside: list[tuple[Group, list[Member]]] = []
        """Jobs judged on a narrow view (`verdicts`): not parked, only left out of this cycle and
        tried again at the next, whatever happens (a park would be woken at `finish` anyway)."""
        self.taken: list[JobState] = []
        """Jobs admitted or reserved for: no longer to try in this cycle, and to try again if the
        decisions are not folded (they are jobs to try again at `finish`)."""
        self.events: list[Event] = []
        self.heads = StrictHeads(state, idx)
        self.fence = Fence(state, self.topo, now)
        """The room reservations hold back in this cycle (`reservations`)."""

    # ------------------------------------------------------------ tentative changes

    def remove(self, job: JobState) -> None:
        """Evict a running job tentatively: give back its node and quota usage."""
        topo, quota = self.topo, self.idx.quota
        before = (topo.mark(), quota.mark())
        for node, n, req in node_pods(job.podsets, job.placement):
            topo.give(node, {k: v * n for k, v in req.items()} if n > 1 else req)
        quota.add(job.queue, job.requests, -1)
        self.removed.add(job.id)
        self.removals[job.id] = Removal(*before, topo.mark(), quota.mark())

    def restore(self, job: JobState) -> None:
        """Undo `remove` (used while minimising a victim set)."""
        self.removed.discard(job.id)
        topo, quota = self.topo, self.idx.quota
        r = self.removals.pop(job.id, None)
        if r is not None and r.topo_end == topo.mark() and r.quota_end == quota.mark():
            # nothing changed since: take the removal out of the undo logs (a victim search
            # removes and restores thousands of jobs, which the logs would otherwise keep)
            topo.rollback(r.topo_start)
            quota.rollback(r.quota_start)
            return
        for node, n, req in node_pods(job.podsets, job.placement):
            topo.take(node, {k: v * n for k, v in req.items()} if n > 1 else req)
        quota.add(job.queue, job.requests, 1)

    def place(self, job: JobState) -> tuple[dict[str, str] | None, str]:
        """Place every podset (taking the capacity); on failure take nothing and say why.

        The nodes a `look` at the job found on this very view are taken as found (an admission on
        flavors looks first, then places: the placement search is not made twice)."""
        nodes = self._kept(job) if self.found else None  # a plain queue's job never looks first
        if nodes is not None:
            for ps, on in zip(job.podsets, nodes, strict=True):
                self._take_nodes(ps.requests, on)
        else:
            nodes, why = self._find(job)
            if nodes is None:
                return None, why
        placement: dict[str, str] = {}
        for ps, on in zip(job.podsets, nodes, strict=True):
            name = ps.name
            for i, node in enumerate(on):
                placement[f"{name}-{i}"] = node
        return placement, ""

    def look(self, job: JobState, key: PodsetsKey | None) -> str:
        """Why the nodes cannot hold the job now, in `place`'s words ("" when they can), taking nothing.

        With the job's `podsets_key`, the nodes found are kept for `place` while the view stays this one."""
        view = self.view()
        if len(job.podsets) == 1:
            ps = job.podsets[0]
            t = ps.topology
            topology = self.idx.topology
            one, why = topology.place(
                ps.count,
                placement_request(job, ps.name, ps.requests, topology.tainted),
                t.required if t is not None else None,
                t.preferred if t is not None else None,
            )
            nodes = [one] if one is not None else None
        else:
            mark = self.topo.mark()
            nodes, why = self._find(job)
            self.topo.rollback(mark)  # the view is again the one looked at (`view`)
        if nodes is None:
            return why
        if key is not None:
            if not view.same(self.found_view):
                self.found_view, self.found = view, {}
            self.found[key] = nodes
        return ""

    def view(self) -> View:
        """The topology's tentative state now, as a token (see `View`)."""
        log = self.topo.log
        return View(len(log), log[-1] if log else None)

    def _kept(self, job: JobState) -> list[list[str]] | None:
        """The nodes per podset a `look` found for the job's pods on this very view, if any."""
        if not self.found or not self.view().same(self.found_view):
            return None
        return self.found.get(podsets_key(job, self.idx.topology.tainted))

    def _find(self, job: JobState) -> tuple[list[list[str]] | None, str]:
        """Nodes per podset, each podset placed on what those before it left (taken); on failure none
        taken, and why."""
        mark = self.topo.mark()
        out: list[list[str]] = []
        topology = self.idx.topology
        for ps in job.podsets:
            t = ps.topology
            nodes, why = topology.place(
                ps.count,
                placement_request(job, ps.name, ps.requests, topology.tainted),
                t.required if t is not None else None,
                t.preferred if t is not None else None,
            )
            if nodes is None:
                self.topo.rollback(mark)
                # a gang of several podsets gets words that do not depend on which podset
                # failed first (that changes with free capacity, and the memo must not see it)
                return None, why if len(job.podsets) == 1 else capacity_reason(job)
            self._take_nodes(ps.requests, nodes)
            out.append(nodes)
        return out, ""

    def _take_nodes(self, req: Mapping[str, int], nodes: list[str]) -> None:
        """Take the room of one pod of `req` on each of `nodes`: one take per node, not per pod (a gang
        of 64 pods takes 8 nodes)."""
        if len(nodes) == 1:
            self.topo.take(nodes[0], req)
            return
        for node, n in Counter(nodes).items():
            self.topo.take(node, {k: v * n for k, v in req.items()} if n > 1 else req)

    def fits(self, job: JobState, allow_borrow: bool) -> bool:
        """Whether the job fits quota and nodes now (leaves nothing taken)."""
        if unassigned(self.state, job):
            return choose(self, job, allow_borrow).admit is not None
        if not self.idx.quota.fits(job.queue, job.requests, allow_borrow):
            return False
        if not self.could_place(job):
            return False
        if len(job.podsets) == 1:
            ps = job.podsets[0]
            t = ps.topology
            required, preferred = (t.required, t.preferred) if t is not None else (None, None)
            return self.idx.topology.can_place(
                ps.count, placement_request(job, ps.name, ps.requests, self.idx.topology.tainted), required, preferred
            )
        mark = self.topo.mark()
        placement, _ = self.place(job)
        self.topo.rollback(mark)
        return placement is not None

    def could_place(self, job: JobState) -> bool:
        """A cheap necessary condition for placement: enough free GPUs in the whole cluster."""
        free: int = self.idx.topology.gpu_free_total
        need: int = gpus(job)
        return need <= free

    def take(self, job: JobState, placement: Mapping[str, str]) -> None:
        """Account a job's quota usage (its nodes were taken by `place`)."""
        quota, idx = self.idx.quota, self.idx
        self.failed_classes.clear()
        heap = self.heap
        if heap is not None:
            # the view changes: the doomed groups' next jobs are judged afresh
            for group in self.doomed:
                active = idx.groups.get(group)
                if active:
                    first = lowest_key(self, self.state.jobs[active[-1].job])
                    heapq.heappush(heap, HeapEntry(first, next(self.pushes), group))
        self.doomed.clear()
        if idx.deactivate(job):
            self.taken.append(job)
        was_borrowing = quota.is_borrowing(job.queue)
        quota.add(job.queue, job.requests, 1)
        self.placed[job.id] = dict(placement)
        # Parked jobs whose verdict or words this admission changes, and whose
        # turn in this cycle's order has not come yet, are tried in this cycle,
        # exactly as they would be had they never been parked.
        root = idx.roots.get(job.queue, job.queue)
        self.admitted_by_root.setdefault(root, []).append(job)
        due: dict[int, Block] = {}
        if self.state.fair_sharing:
            due.update((b.stamp, b) for b in idx.parking.tree(root))
        elif quota.is_borrowing(job.queue) and not was_borrowing:
            due.update((b.stamp, b) for b in idx.parking.tree(root) if b.new_victims)
        for r, v in sorted(job.requests.items()):
            if v > 0:
                key = (root, r)
                self.consumed[key] = self.consumed.get(key, 0) + v
                level = idx.parking.consumed_total.get(key, 0) + self.consumed[key]
                due.update((b.stamp, b) for b in idx.parking.due_on_consumption(key, level))
        due = {s: b for s, b in due.items() if b.members and b.stamp <= self.parked_before}
        if not due:
            return
        # whose turn came before this admission is judged on the keys as they were before it
        # (keys only grow within a cycle: a job whose key now exceeds the current one may
        # still have come up, and been judged, before it)
        quota.add(job.queue, job.requests, -1, record=False)
        jobs = self.state.jobs
        before = {s: lowest_key(self, jobs[b.members[-1].job]) for s, b in due.items()}
        quota.add(job.queue, job.requests, 1, record=False)
        for stamp in sorted(due):
            self._wake(due[stamp], before[stamp])

    def _wake(self, block: Block, before: OrderKey) -> None:
        """Wake a block parked before this cycle, but its members whose turn came before the change
        (they stay as judged); `before` is its first member's key before the change."""
        keep = 0
        current = self.current
        if current is not None:
            if ahead_of_seq(before) < ahead_of_seq(current):
                return
            if ahead_of_seq(before) == ahead_of_seq(current):
                # members with a smaller seq than the current job came up before it
                members = block.members
                keep = len(members) - bisect.bisect_right(members, -current[-1], key=neg_seq)
        self.idx.parking.wake(block, keep)
        group = cast(Group, block.group)
        active = self.idx.groups.get(group)
        if self.heap is not None and active:
            first = self.state.jobs[active[-1].job]
            heapq.heappush(self.heap, HeapEntry(lowest_key(self, first), next(self.pushes), group))

    def finish(self) -> None:
        """Undo every tentative change, and hand the cycle's parks to the memo as a proposal.

        The parks stand once the cycle's decisions are folded as decided, or, for a
        cycle that decided nothing but parked jobs, the `CycleSettled` it adds here
        (see `parking`). Jobs set aside on a narrow view are tried again whatever happens.
        """
        # the topology's and quota's changes are undone at the next sync, but where the fold
        # changes the node or queue (`TopologyIndex.settle`, `QuotaTree.settle`)
        self.topo.defer()
        self.found = {}  # the undo log starts again empty: its tokens (`View`) no longer name the state
        for group, members in self.set_aside:
            self.idx.reactivate(group, members)  # their verdicts are not folded yet: no reason known
        for job in self.taken:
            self.idx.activate(self.state, job)
        decisions = sum(1 for ev in self.events if getattr(ev, "cycle", 0) == self.number)
        serial = self.state.settles + 1
        judged = self.idx.parking.end_cycle(self.number, decisions, serial)
        if decisions == 0 and judged:
            # its parks stand only once this record is folded, as a deciding cycle's once its decisions are
            self.events.append(
                CycleSettled(at=self.now, judged=judged, serial=serial, cycle=self.number, epoch=self.epoch)
            )

    # ------------------------------------------------------------ events

    def preempt(self, victim: Victim, preemptor: str | None) -> None:
        job = victim.job
        self.events.append(
            JobPreempted(
                at=self.now,
                job=JobId(job.id),
                preemptor=JobId(preemptor) if preemptor is not None else None,
                reason=victim.reason,
                lost_gpu_seconds=lost_gpu_seconds(job, self.now),
                cycle=self.number,
                epoch=self.epoch,
            )
        )
        self.remove(job)


def lowest_key(cycle: Cycle, job: JobState) -> OrderKey:
    """The job's `order_key` on the cycle's view (its quota position cached per shape and quota version)."""
    idx = cycle.idx
    quota = idx.quota
    # a job to try has its class, which holds its shape and priority (one look-up, not two)
    group = idx.group_of.get(job.id)
    if group is not None:
        shape, priority, limit = group[0], group[1], group[4]
    else:
        shape, priority, limit = idx.shape(job), idx.priority(job), idx.limit(job)
    known = cycle.quota_keys.get(shape)
    if known is None or known.version != quota.version:
        requests = order_requests(cycle, job)
        borrows = 0 if quota.within_nominal(job.queue, requests) else 1
        share = quota.share(job.queue, requests) if cycle.state.fair_sharing else 0
        known = cycle.quota_keys[shape] = QuotaPosition(quota.version, borrows, share)
    return order_key(priority, job.order_seq, known.over_nominal, known.share, limit)


def neg_seq(m: Member) -> int:
    return m.neg_seq


def capacity_reason(job: JobState) -> str:
    """What `place` says when the cluster's free GPUs cannot hold the job (same words)."""
    if len(job.podsets) > 1:
        parts = []
        for ps in job.podsets:
            part = f"{ps.name}: {ps.count} pod{'s' if ps.count != 1 else ''} of {fmt(ps.requests)}"
            if ps.topology is not None and (ps.topology.required or ps.topology.preferred):
                level = ps.topology.required or ps.topology.preferred
                part += f" {'in one' if ps.topology.required else 'preferably in one'} {level}"
            parts.append(part)
        return f"the gang ({'; '.join(parts)}) does not fit on the schedulable nodes"
    ps = job.podsets[0]
    what = f"{ps.count} pod{'s' if ps.count != 1 else ''} of {fmt(ps.requests)}"
    if ps.topology is not None and ps.topology.required is not None:
        return f"no {ps.topology.required} has room for {what}"
    return f"{what} do not fit on the schedulable nodes"
