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
6. reclaim jobs idle for long enough when a pending job that will come before them needs
   their room (a reclaimed job is requeued behind the jobs waiting then);
7. undo every tentative change: the state is left exactly as it was found
   (the derived index's nodes and quotas are put back at its next sync, but
   those the fold of the decisions changes: see `topology`).

The caller folds the returned events and calls again while a cycle admits or
preempts something (`muster sim` and the daemon do so).

Nothing here reads a clock: time is `now`. Iteration is over sorted keys.

This module holds the cycle's steps; the cycle's tentative view and its undo
logs are `cycle.Cycle`, trying one job (step 5) is `trying.try_job`, and
parking a job with its words and wake rule is `verdicts`.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

from muster.events.types import Event, JobId, JobRejected
from muster.projections.cycle import Cycle, HeapEntry, lowest_key
from muster.projections.duplicates import refuse_taken_ids
from muster.projections.eviction import Preemptor, may_evict
from muster.projections.index import Group, index_of, queue_order_key, take_new_jobs
from muster.projections.jobfacts import preemptible, priority_of
from muster.projections.preemption import Victim, preemptor_rule
from muster.projections.reservations import decide_reservations
from muster.projections.state import ClusterState, JobState
from muster.projections.trying import try_job
from muster.projections.verdicts import park_doomed, say_held


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
    if not idx.orphans and not idx.down_nodes:
        return False
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
    if idx.nominated:
        nominated = sorted((state.jobs[j] for j in idx.nominated if idx.is_active(j)), key=lambda j: j.seq)
        for job in nominated:
            if try_job(cycle, job) == "preempting":
                return
    # One order over every job to try: its key is judged when the job comes up
    # (keys only grow within a cycle, so a stale key is a lower bound and the
    # lazy heap still yields the job with the smallest current key). Parked jobs
    # are absent, and would only have failed without changing anything. Jobs of
    # one class always have the same key but for their seq, so the heap holds
    # groups: popping one tries its first job, which leaves the group (parked or
    # taken). A group whose first job failed for its class is doomed: its jobs
    # are parked in bulk when a job after them in the order is tried, or at the
    # end, unless an admission changes the view first (`park_doomed`, `take`),
    # or one of them holds a reservation (`_holds`).
    jobs = state.jobs
    groups = idx.groups
    if not groups:
        return  # nothing to try, and nothing doomed yet
    heap = [HeapEntry(lowest_key(cycle, jobs[m[-1].job]), next(cycle.pushes), g) for g, m in groups.items()]
    heapq.heapify(heap)
    cycle.heap = heap
    while heap:
        top = heapq.heappop(heap)
        key, group = top.key, top.group
        members = groups.get(group)
        if not members:
            continue
        job = jobs[members[-1].job]
        fresh = lowest_key(cycle, job)
        if fresh != key and heap and fresh > heap[0].key:
            heapq.heappush(heap, HeapEntry(fresh, next(cycle.pushes), group))
            continue
        park_doomed(cycle, fresh)
        cycle.current = fresh
        outcome = try_job(cycle, job)
        if outcome == "preempting":
            # the room being freed is the preemptor's: the next cycle starts from it
            return
        if outcome == "held":
            # it waits behind its strict_fifo head, and so does the rest of its group: not visited again
            say_held(cycle, group)
            continue
        members = groups.get(group)
        if not members:
            continue
        cls = cycle.tried_class if outcome == "parked" else None
        verdict = cycle.failed_classes.get(cls) if cls is not None else None
        if verdict is not None and not _holds(cycle, group):
            cycle.doomed[group] = verdict
        else:
            heapq.heappush(heap, HeapEntry(lowest_key(cycle, jobs[members[-1].job]), next(cycle.pushes), group))
    park_doomed(cycle, None)


def _holds(cycle: Cycle, group: Group) -> bool:
    """Whether a job of `group` holds a reservation: its verdict is its own (`Fence.own_verdict`), so the group is
    not doomed with its class's (the holder would be parked untried behind a class-mate that cannot use its room)."""
    held = cycle.fence.held
    return bool(held) and any(cycle.idx.group_of.get(j) == group for j in held)


def _reclaim_idle(cycle: Cycle) -> None:
    """Evict idle jobs whose room a waiting job that will keep it needs (spec, Idle reclamation).

    A reclaimed job loses its place: the fold requeues it behind the jobs waiting now
    (`JobState.order_seq`). A waiting job counts only if the reclaimed job would not take the room
    back: it comes first in the next cycle's order (its key, but for the place, is no larger),
    and once it runs the reclaimed job may not evict it (`eviction.may_evict`, with the job's
    new place). And only if it needs this job's room: one that fits without it (in the room of
    a job reclaimed or preempted just before) takes that room instead.
    """
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
            if not preemptible(state, job):
                continue
            if policy.only_borrowing and not (job.borrowed and idx.quota.is_borrowing(job.queue)):
                continue
            idle.append(job)
    if not idle:
        return
    idle.sort(key=lambda j: (j.idle_since or 0, j.seq))
    candidates = set(idx.group_of) - set(cycle.placed)
    waiting = sorted((state.jobs[j] for j in candidates), key=lambda j: queue_order_key(state, j))
    for job in idle:
        # on the next cycle's view: without the job, which is then pending at the reclaim's place
        cycle.remove(job)
        requeued = _Requeued(
            lowest_key(cycle, job)[:-1], preemptor_rule(cycle, job, reclaimed=True).placed_at(state.places + 1)
        )
        fitting = [p for p in waiting if _keeps_the_room(cycle, p, requeued) and cycle.fits(p, preemptible(state, p))]
        cycle.restore(job)
        if any(not cycle.fits(p, preemptible(state, p)) for p in fitting):
            cycle.preempt(Victim(job, "IdleReclaim"), None)


class _Requeued(NamedTuple):
    """A job about to be reclaimed, as it will be once requeued at its new place."""

    key: tuple[int, ...]
    """Its order key but for the place (the seq, last)."""
    rule: Preemptor
    """What it may evict once it runs again, read with its new place."""


def _keeps_the_room(cycle: Cycle, waiting: JobState, reclaimed: _Requeued) -> bool:
    """Whether `waiting` comes before the `reclaimed` job and keeps what it takes."""
    key = lowest_key(cycle, waiting)
    if key[:-1] > reclaimed.key:
        return False
    priority = priority_of(cycle.state, waiting) if preemptible(cycle.state, waiting) else None
    # once admitted, it borrows if it does not fit within its queue's nominal quota now
    return not may_evict(reclaimed.rule, waiting.queue, priority, waiting.order_seq, key[0] == 1, waiting.id)


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
