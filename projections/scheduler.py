"""The scheduling policy: `decide(state, now) -> events`, pure and deterministic.

One call is one scheduling cycle. It reads like Kueue's `schedule()`:

1. sync the derived index (topology, quota tree, queues) with the state;
2. reject jobs whose spec is invalid (`JobRejected`);
3. evict jobs that lost a node (`JobPreempted`, reason NodeFailure);
4. heads: the first job to try of every queue, in admission order: jobs that
   fit within their queue's nominal quota first (judged when tried), then the
   lowest fair share (with fair sharing), then higher priority, then FIFO;
5. for each head: admit the whole gang if quota and placement allow; else
   find a minimal set of victims the policies allow (`JobPreempted`; the
   preemptor is admitted by a later cycle at the same instant); else explain
   why it waits (`JobInadmissible`, only when the reason changed) and park it;
   5b. reserve room for the jobs that waited longest (`reservations`; reserved room is
   held back from every other job but those whose declared limit ends before it is needed);
6. reclaim jobs idle for long enough when a pending job could use their room;
7. undo every tentative change: the state is left exactly as it was found
   (the derived index's nodes and quotas are put back at its next sync, but
   those the fold of the decisions changes: see `topology`).

The caller folds the returned events and calls again while a cycle admits or
preempts something (`muster sim` and the daemon do so).

Nothing here reads a clock: time is `now`. Iteration is over sorted keys.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import Counter
from collections.abc import Mapping
from typing import Literal, NamedTuple, cast

from msgspec import UNSET

from muster.events.types import (
    Event,
    JobAdmitted,
    JobId,
    JobInadmissible,
    JobPreempted,
    JobRejected,
    NodeName,
    QueueName,
)
from muster.projections.assignment import Admit, Evict, Refusal, Wait, attempt, choose
from muster.projections.cluster import node_pods
from muster.projections.duplicates import refuse_taken_ids
from muster.projections.eviction import Preemptor, chain_may_shrink, evicts_from_others, may_evict
from muster.projections.flavors import on_any_flavor, order_requests, placement_request, summary, unassigned
from muster.projections.index import (
    Group,
    OrderKey,
    SchedulerIndex,
    Shape,
    index_of,
    order_key,
    take_new_jobs,
)
from muster.projections.parking import Block, Member, Wake
from muster.projections.preemption import Result, Victim, find_victims, overlaps
from muster.projections.queueing import StrictHeads
from muster.projections.reservations import Fence, decide_reservations, released_on_admission
from muster.projections.resources import fmt
from muster.projections.state import ClusterState, JobState
from muster.projections.topology import Transaction

POLICY_VERSION = "muster/1"


class _HeapEntry(NamedTuple):
    """A group in the cycle's admission heap: popping it tries the group's first job. A group woken
    into mid-cycle can be in the heap twice: the push number keeps the comparison off `group`."""

    key: OrderKey
    """Its first job's order key when pushed (a lower bound: keys only grow within a cycle, and a
    group's first job changes only by leaving it or by a wake, which pushes the group again)."""
    push: int
    group: Group


class QuotaPosition(NamedTuple):
    """A shape's place in `order_key` by quota, as of quota `version`."""

    version: int
    over_nominal: int
    share: int


class Verdict(NamedTuple):
    """Why a job class failed on the cycle's view, and what must happen before it may change."""

    reason: str
    wake: Wake


class EvictNewAnswer(NamedTuple):
    """`_may_evict_new`'s answer, good while the tree's admitted list has `admitted` jobs."""

    admitted: int
    answer: bool


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
        self.epoch = state.epoch
        self.topo = Transaction(idx.topology)
        self.current: OrderKey | None = None
        """Order key of the job being tried (None while nominated preemptors go first)."""
        self.heap: list[_HeapEntry] | None = None
        self.pushes = itertools.count()
        self.consumed: dict[tuple[str, str], int] = {}
        """Usage taken in this cycle, per (tree, resource)."""
        self.failed_classes: dict[tuple[object, ...], Verdict] = {}
        """Verdicts of jobs that failed on the current view, by job class (cleared on any change)."""
        self.doomed: dict[Group, Verdict] = {}
        """Groups whose first job failed for its class on the current view: the rest of each
        fail the same way when their turn comes, unless the view changes first (`_park_doomed`)."""
        self.quota_keys: dict[Shape, QuotaPosition] = {}
        """`_lowest_key`'s quota part by (queue, requests)."""
        self.may_evict_new: dict[tuple[str, int, tuple[str, ...]], EvictNewAnswer] = {}
        self.nodes_judged: dict[tuple[object, ...], Refusal | None] = {}
        """`assignment`'s placement verdicts on flavors, by admissions so far and podsets (see there)."""
        """`_may_evict_new` by (queue, priority, resources)."""
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
        self.parked_on_reserved: list[Block] = []
        """Jobs parked on a view that holds room for a preemptor: judged again next cycle."""
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
        """Place every podset (taking the capacity); on failure take nothing and say why."""
        mark = self.topo.mark()
        placement: dict[str, str] = {}
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
                return None, why if len(job.podsets) == 1 else _capacity_reason(job)
            name = ps.name
            for i, node in enumerate(nodes):
                placement[f"{name}-{i}"] = node
            # one take per node, not per pod (a gang of 64 pods takes 8 nodes)
            req = ps.requests
            for node, n in Counter(nodes).items():
                self.topo.take(node, {k: v * n for k, v in req.items()} if n > 1 else req)
        return placement, ""

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
        need: int = job.gpus
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
                    first = _lowest_key(self, self.state.jobs[active[-1].job])
                    heapq.heappush(heap, _HeapEntry(first, next(self.pushes), group))
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
        if (quota.is_borrowing(job.queue) and not was_borrowing) or self.state.fair_sharing:
            due.update((b.stamp, b) for b in idx.parking.tree(root))
        for r, v in sorted(job.requests.items()):
            if v > 0:
                key = (root, r)
                self.consumed[key] = self.consumed.get(key, 0) + v
                level = idx.parking.consumed_total.get(key, 0) + self.consumed[key]
                due.update((b.stamp, b) for b in idx.parking.due_on_consumption(key, level))
        due = {s: b for s, b in due.items() if b.members and b.cycle != self.number}
        if not due:
            return
        # whose turn came before this admission is judged on the keys as they were before it
        # (keys only grow within a cycle: a job whose key now exceeds the current one may
        # still have come up, and been judged, before it)
        quota.add(job.queue, job.requests, -1, record=False)
        jobs = self.state.jobs
        before = {s: _lowest_key(self, jobs[b.members[-1].job]) for s, b in due.items()}
        quota.add(job.queue, job.requests, 1, record=False)
        for stamp in sorted(due):
            self._wake(due[stamp], before[stamp])

    def _wake(self, block: Block, before: OrderKey) -> None:
        """Wake a block parked before this cycle, but its members whose turn came before the change
        (they stay as judged); `before` is its first member's key before the change."""
        keep = 0
        current = self.current
        if current is not None:
            if before[:3] < current[:3]:
                return
            if before[:3] == current[:3]:
                # members with a smaller seq than the current job came up before it
                members = block.members
                keep = len(members) - bisect.bisect_right(members, -current[3], key=_neg_seq)
        self.idx.parking.wake(block, keep)
        group = cast(Group, block.group)
        active = self.idx.groups.get(group)
        if self.heap is not None and active:
            first = self.state.jobs[active[-1].job]
            heapq.heappush(self.heap, _HeapEntry(_lowest_key(self, first), next(self.pushes), group))

    def finish(self) -> None:
        """Undo every tentative change, and hand the cycle's parks to the memo as a proposal.

        The parks stand once the cycle's decisions are folded as decided (see
        `parking`). Jobs parked while room was held for a preemptor are tried
        again whatever happens.
        """
        # the topology's and quota's changes are undone at the next sync, but where the fold
        # changes the node or queue (`TopologyIndex.settle`, `QuotaTree.settle`)
        self.topo.defer()
        for block in self.parked_on_reserved:
            block.reason = None  # woken before its verdicts are folded
            self.idx.parking.wake(block)
        for job in self.taken:
            self.idx.activate(self.state, job)
        decisions = sum(1 for ev in self.events if getattr(ev, "cycle", 0) == self.number)
        self.idx.parking.end_cycle(self.number, decisions)

    # ------------------------------------------------------------ events

    def preempt(self, victim: Victim, preemptor: str | None) -> None:
        job = victim.job
        self.events.append(
            JobPreempted(
                at=self.now,
                job=JobId(job.id),
                preemptor=JobId(preemptor) if preemptor is not None else None,
                reason=victim.reason,
                lost_gpu_seconds=job.lost_gpu_seconds(self.now),
                cycle=self.number,
                epoch=self.epoch,
            )
        )
        self.remove(job)


def _lowest_key(cycle: Cycle, job: JobState) -> OrderKey:
    """The job's `order_key` on the cycle's view (its quota position cached per shape and quota version)."""
    idx = cycle.idx
    quota = idx.quota
    # a job to try has its class, which holds its shape and priority (one look-up, not two)
    group = idx.group_of.get(job.id)
    shape, priority = (group[0], group[1]) if group is not None else (idx.shape(job), idx.priority(job))
    known = cycle.quota_keys.get(shape)
    if known is not None and known.version == quota.version:
        borrows, share = known.over_nominal, known.share
    else:
        requests = order_requests(cycle.state, job)
        borrows = 0 if quota.within_nominal(job.queue, requests) else 1
        share = quota.share(job.queue, requests) if cycle.state.fair_sharing else 0
        cycle.quota_keys[shape] = QuotaPosition(quota.version, borrows, share)
    return order_key(priority, job.seq, borrows, share)


def _job_class(cycle: Cycle, job: JobState) -> tuple[object, ...] | None:
    """Jobs of one class get the same verdict on the same view (None: this job's verdict is its own)."""
    if (
        job.nominated
        or job.evicted_by is not None
        or cycle.idx.equal_in_queue(job.queue)
        or job.queue in cycle.heads.strict
        or cycle.fence.own_verdict(job)
    ):
        # its candidates depend on its own history (the jobs it spares, see `eviction`) or on its
        # own submission order (equal priorities, by seq); in a strict_fifo queue the jobs after a
        # refused head are held behind it, not refused with it; a job that may use reserved room
        # sees more than its class
        return None
    group = cycle.idx.group_of.get(job.id) or cycle.idx.group(job)
    return group[:4]  # the group less whose job it is (when the job is grouped alone)


Outcome = Literal["admitted", "preempting", "parked", "held"]
"""What `_try` did with a job: admitted it, evicted victims for it (the cycle ends), set it aside, or
left it behind the head of its strict_fifo queue (`queueing`)."""


def _try(cycle: Cycle, job: JobState) -> Outcome:
    """Admit, preempt for, or park one job. Returns what happened."""
    if cycle.heads.blocker(job, cycle.placed) is not None:
        return "held"
    cls = _job_class(cycle, job)
    if cls is not None:
        known = cycle.failed_classes.get(cls)
        if known is not None:
            # a job just like it failed on this very view: so does this one, for the same reason
            _park(cycle, job, known.reason, known.wake)
            return "parked"
    state, idx = cycle.state, cycle.idx
    preemptible = state.preemptible(job)
    # non-preemptible work never borrows, so no guarantee depends on evicting it
    allow_borrow = preemptible
    if unassigned(state, job):
        return _take_step(cycle, job, cls, attempt(cycle, job, allow_borrow))
    quota_reason = idx.quota.blocking(job.queue, job.requests, allow_borrow)
    reason = quota_reason or ""
    if quota_reason is None:
        opened = cycle.fence.open(job)
        if cycle.could_place(job):
            borrowed = idx.quota.borrowed_by(job.queue, job.requests)
            placement, reason = cycle.place(job)
            cycle.fence.close(opened)
            if placement is not None:
                _admitted(cycle, job, placement, borrowed)
                return "admitted"
        else:
            cycle.fence.close(opened)
            reason = _capacity_reason(job)
    result = find_victims(cycle, job, allow_borrow)
    if result.victims:
        _evict_for(cycle, job, result.victims)
        return "preempting"
    wake = _wake_rule(cycle, job, allow_borrow, quota_reason is not None, result.quota_possible, result)
    if wake.freed_short is not None:
        wake.freed_short -= cycle.fence.held_gpus(job)  # it also sees the reserved room it may use
    if cls is not None:
        cycle.failed_classes[cls] = Verdict(reason, wake)
    _park(cycle, job, reason, wake)
    return "parked"


def _evict_for(cycle: Cycle, job: JobState, victims: list[Victim]) -> None:
    """Evict the victims and hold the room they leave for `job` (the cycle ends)."""
    for victim in victims:
        cycle.preempt(victim, job.id)
    placement, _ = cycle.place(job)
    if placement is not None:
        cycle.take(job, placement)
    cycle.reserved = True


def _admitted(cycle: Cycle, job: JobState, placement: dict[str, str], borrowed: dict[str, int]) -> None:
    """Take the job's room and write its admission (`job` on its flavors, if its queue has them)."""
    cycle.take(job, placement)
    explanation = "within nominal quota" if not borrowed else f"borrowing {fmt(borrowed)} from the cohort"
    if job.flavors:
        explanation = f"on flavors {summary(job.flavors)}, {explanation}"
    cycle.events.append(
        JobAdmitted(
            at=cycle.now,
            job=JobId(job.id),
            queue=QueueName(job.queue),
            placement={pod: NodeName(node) for pod, node in placement.items()},
            borrowed=borrowed,
            cycle=cycle.number,
            epoch=cycle.epoch,
            policy_version=POLICY_VERSION,
            explanation=explanation,
            flavors=job.flavors if job.flavors else UNSET,
        )
    )
    cycle.events.extend(released_on_admission(cycle.state, job, cycle.now, cycle.number, cycle.epoch))


def _take_step(cycle: Cycle, job: JobState, cls: tuple[object, ...] | None, step: Admit | Evict | Wait) -> Outcome:
    """Do what `assignment.attempt` says for a job of a queue with flavors."""
    if isinstance(step, Admit):
        _admitted(cycle, step.job, step.placement, step.borrowed)
        return "admitted"
    if isinstance(step, Evict):
        _evict_for(cycle, step.job, step.victims)
        return "preempting"
    if cls is not None:
        cycle.failed_classes[cls] = Verdict(step.reason, step.wake)
    _park(cycle, job, step.reason, step.wake)
    return "parked"


def _park(cycle: Cycle, job: JobState, reason: str, wake: Wake) -> None:
    """Say why the job waits (when that changed) and set it aside until `wake`."""
    idx = cycle.idx
    if reason != job.reason:
        cycle.events.append(
            JobInadmissible(at=cycle.now, job=JobId(job.id), reason=reason, cycle=cycle.number, epoch=cycle.epoch)
        )
    block = idx.park(job, wake, reason, cycle.number)
    if (
        cycle.reserved
        or _may_evict_new(cycle, on_any_flavor(cycle.state, job))
        or chain_may_shrink(cycle.state.jobs, job)
    ):
        # judged without the jobs just admitted in its tree as possible victims, or
        # sparing jobs it may evict once the waiting job between them runs again
        cycle.parked_on_reserved.append(block)


def _park_doomed(cycle: Cycle, bound: OrderKey | None) -> None:
    """Park the jobs of the doomed groups whose turn comes before `bound` (None: all of them).

    Tried one by one, each would find its class's verdict on an unchanged view
    (`_try`): parked for the same reason, with the same wake. So each group's
    are parked as one block, and only those whose recorded reason differs get a
    `JobInadmissible`, in the order they would have been tried.
    """
    doomed = cycle.doomed
    if not doomed:
        return
    idx, jobs = cycle.idx, cycle.state.jobs
    now, number, epoch = cycle.now, cycle.number, cycle.epoch
    waits: list[tuple[OrderKey, JobInadmissible]] = []
    for group, verdict in list(doomed.items()):
        members = idx.groups.get(group)
        if not members:
            del doomed[group]
            continue
        first = jobs[members[-1].job]
        key = _lowest_key(cycle, first)
        start = 0
        if bound is not None:
            if bound[:3] < key[:3]:
                continue
            if bound[:3] == key[:3]:
                start = bisect.bisect_right(members, -bound[3], key=_neg_seq)
                if start == len(members):
                    continue
        if start == 0:
            run = members
            del idx.groups[group]
            del doomed[group]
            uniform = idx.group_reason.pop(group, None)
        else:
            run = members[start:]
            del members[start:]
            uniform = idx.group_reason.get(group)
        reason = verdict.reason
        if uniform != reason:
            for m in run:
                if uniform is not None or jobs[m.job].reason != reason:
                    wait = JobInadmissible(at=now, job=JobId(m.job), reason=reason, cycle=number, epoch=epoch)
                    waits.append(((key[0], key[1], key[2], -m.neg_seq), wait))
        block = idx.park_members(group, run, first, verdict.wake, reason, number)
        if cycle.reserved or _may_evict_new(cycle, on_any_flavor(cycle.state, first)):
            cycle.parked_on_reserved.append(block)
    waits.sort(key=lambda w: w[0])
    cycle.events.extend(w for _, w in waits)


def _neg_seq(m: Member) -> int:
    return m.neg_seq


def _may_evict_new(cycle: Cycle, job: JobState) -> bool:
    """Whether a job admitted earlier in this cycle could be a victim for `job`.

    Those jobs are not candidates while the cycle lasts (they run only once the
    decisions are folded), so a verdict that might count them is judged again.
    It asks the rule `preemption._candidates` asks, leaving open what depends on
    the moment (the job's quota position, submission order, lenders' borrowing).
    """
    state, idx = cycle.state, cycle.idx
    admitted = cycle.admitted_by_root.get(idx.roots.get(job.queue, job.queue))
    if not admitted:
        return False
    # the answer depends on the queue, the priority and the resources asked for, and on
    # the admitted list, which only grows: a backlog of one shape asks once per admission
    key = (job.queue, state.priority_of(job), tuple(sorted(r for r, v in job.requests.items() if v > 0)))
    known = cycle.may_evict_new.get(key)
    if known is not None and known.admitted == len(admitted):
        return known.answer
    answer = _may_evict_any(cycle, job, admitted)
    cycle.may_evict_new[key] = EvictNewAnswer(len(admitted), answer)
    return answer


def _may_evict_any(cycle: Cycle, job: JobState, admitted: list[JobState]) -> bool:
    """Whether `eviction.may_evict` lets `job` take any of `admitted`, in some quota position and order."""
    state = cycle.state
    queue = state.queues[job.queue]
    rule = Preemptor(job.queue, state.priority_of(job), queue.preemption, queue.cohort is not None, None, None)
    for other in admitted:
        if not overlaps(other, job):
            continue
        prio = state.priority_of(other) if state.preemptible(other) else None
        if may_evict(rule, other.queue, prio, other.seq):
            return True
    return False


def _wake_rule(
    cycle: Cycle, job: JobState, allow_borrow: bool, quota_blocked: bool, quota_possible: bool, result: Result
) -> Wake:
    """What must happen before this verdict (and its words) can change; see `index`."""
    wake = Wake()
    if job.chained_eviction(cycle.now) or result.order_matters:
        wake.at_time = cycle.now + 1
    headroom = cycle.idx.quota.headroom(job.queue, job.requests, allow_borrow)
    if quota_blocked:
        # quota fits only once every short resource has been given back in the
        # tree, less what evicting every candidate would give back
        short = {r: -h - result.candidate_requests.get(r, 0) for r, h in headroom.items() if h < 0}
        if short:
            r = max(sorted(short), key=lambda k: short[k])
            wake.released[r] = max(1, short[r])
        elif headroom:  # pragma: no cover - blocking and headroom agree; never park for good
            wake.released[min(headroom)] = 1
        if quota_possible:
            wake.freed_short = job.gpus - result.candidate_gpus
    else:
        # placement blocked: wake when GPUs free up, or when quota would block instead
        wake.freed_short = job.gpus - result.candidate_gpus
        for r, h in headroom.items():
            wake.consumed[r] = h + 1
    # back within nominal quota, the queue may reclaim what its cohort borrowed
    queue = cycle.state.queues[job.queue]
    policy = queue.preemption
    if queue.cohort is not None and evicts_from_others(policy, None):
        over = cycle.idx.quota.over_nominal(job.queue, job.requests)
        if over:
            r = max(sorted(over), key=lambda k: over[k])
            wake.own_released[r] = over[r]
    return wake


def _capacity_reason(job: JobState) -> str:
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


def decide(state: ClusterState, now: int) -> list[Event]:
    """One scheduling cycle at time `now`: the decisions to append, in order."""
    # 1. sync the derived index
    idx = index_of(state)
    idx.parking.wake_at(now)
    cycle = Cycle(state, idx, now)
    try:
        # 2. reject invalid specs, and submissions of a job id the log already holds
        for job, why in take_new_jobs(state, idx):
            cycle.events.append(
                JobRejected(at=now, job=JobId(job.id), reason=why, cycle=cycle.number, epoch=cycle.epoch)
            )
        cycle.events.extend(refuse_taken_ids(state, now, cycle.number, cycle.epoch))
        # 3. evict jobs from failed or removed nodes; a cycle that evicts admits
        #    nothing, so within a cycle the view only ever fills up (see `index`)
        if not _evict_lost_nodes(cycle):
            # 4-5. heads in admission order; admit, preempt (which ends the cycle) or park
            _admit(cycle)
            if not cycle.reserved:
                # 5b. room held for the jobs that waited longest, from the next cycle on
                reserving = decide_reservations(state, idx, cycle.fence, cycle.placed, cycle.number, cycle.epoch)
                cycle.events.extend(reserving)
        # 6. idle reclaim
        _reclaim_idle(cycle)
    finally:
        # 7. leave the state as found
        cycle.finish()
    return cycle.events


def _evict_lost_nodes(cycle: Cycle) -> bool:
    state, idx = cycle.state, cycle.idx
    doomed: set[str] = set(idx.orphans)
    for name in sorted(idx.down_nodes):
        node = state.nodes.get(name)
        if node is not None:
            doomed.update(node.jobs)
    for job_id in sorted(doomed, key=lambda j: state.jobs[j].seq):
        job = state.jobs[job_id]
        if job.status == "admitted" and job_id not in cycle.removed:
            cycle.preempt(Victim(job, "NodeFailure"), None)
    return bool(cycle.removed)


def _admit(cycle: Cycle) -> None:
    state, idx = cycle.state, cycle.idx
    # preemptors whose victims were evicted go first, so the room they made is theirs
    nominated = sorted((state.jobs[j] for j in idx.nominated if idx.is_active(j)), key=lambda j: j.seq)
    for job in nominated:
        if _try(cycle, job) == "preempting":
            return
    # One order over every job to try: its key is judged when the job comes up
    # (keys only grow within a cycle, so a stale key is a lower bound and the
    # lazy heap still yields the job with the smallest current key). Parked jobs
    # are absent, and would only have failed without changing anything. Jobs of
    # one class always have the same key but for their seq, so the heap holds
    # groups: popping one tries its first job, which leaves the group (parked or
    # taken). A group whose first job failed for its class is doomed: its jobs
    # are parked in bulk when a job after them in the order is tried, or at the
    # end, unless an admission changes the view first (`_park_doomed`, `take`).
    jobs = state.jobs
    groups = idx.groups
    heap = [_HeapEntry(_lowest_key(cycle, jobs[m[-1].job]), next(cycle.pushes), g) for g, m in groups.items()]
    heapq.heapify(heap)
    cycle.heap = heap
    while heap:
        key, _, group = heapq.heappop(heap)
        members = groups.get(group)
        if not members:
            continue
        job = jobs[members[-1].job]
        fresh = _lowest_key(cycle, job)
        if fresh != key and heap and fresh > heap[0].key:
            heapq.heappush(heap, _HeapEntry(fresh, next(cycle.pushes), group))
            continue
        _park_doomed(cycle, fresh)
        cycle.current = fresh
        outcome = _try(cycle, job)
        if outcome == "preempting":
            # the room being freed is the preemptor's: the next cycle starts from it
            return
        if outcome == "held":
            # it waits behind its strict_fifo head, and so does the rest of its group: not visited again
            continue
        members = groups.get(group)
        if not members:
            continue
        cls = _job_class(cycle, job) if outcome == "parked" else None
        verdict = cycle.failed_classes.get(cls) if cls is not None else None
        if verdict is not None:
            cycle.doomed[group] = verdict
        else:
            heapq.heappush(heap, _HeapEntry(_lowest_key(cycle, jobs[members[-1].job]), next(cycle.pushes), group))
    _park_doomed(cycle, None)


def _reclaim_idle(cycle: Cycle) -> None:
    state, idx = cycle.state, cycle.idx
    policy = state.idle_reclaim
    if policy is None:
        return
    now = cycle.now
    idle: list[JobState] = []
    for queue in sorted(idx.running):
        for job_id in idx.running[queue]:
            job = state.jobs[job_id]
            if job.idle_since is None or now - job.idle_since < policy.after or job_id in cycle.removed:
                continue
            if not state.preemptible(job):
                continue
            if policy.only_borrowing and not (job.borrowed and idx.quota.is_borrowing(job.queue)):
                continue
            idle.append(job)
    if not idle:
        return
    idle.sort(key=lambda j: (j.idle_since or 0, j.seq))
    candidates = set(idx.group_of) - set(cycle.placed)
    waiting = sorted((state.jobs[j] for j in candidates), key=lambda j: order_key(state.priority_of(j), j.seq))
    for job in idle:
        cycle.remove(job)
        useful = any(cycle.fits(p, state.preemptible(p)) for p in waiting)
        cycle.restore(job)
        if useful:
            cycle.preempt(Victim(job, "IdleReclaim"), None)


def next_wakeup(state: ClusterState, now: int) -> int | None:
    """The next time a cycle is due without any new event: an idle job's reclaim deadline.

    Nothing else: in particular no cycle is due only because a job evicted at an
    instant may preempt after it. Such a job is tried at the next cycle, as every
    pending job is; a cycle of its own would depend on whether the parking memo
    happened to hold it (decisions would then differ from a run without the memo),
    and it let chains of evictions repeat once a second.
    """
    best: int | None = None
    policy = state.idle_reclaim
    if policy is None:
        return best
    for job in state.jobs.values():
        if job.status == "admitted" and job.idle_since is not None:
            due = job.idle_since + policy.after
            if due > now and (best is None or due < best):
                best = due
    return best
