"""Who a preemptor may take, listed: every running job the eviction rule lets it evict, in victim order.

Victim order is Kueue's: other queues first, then lower priority, least work lost
(GPU-seconds since the last checkpoint), most recently admitted. Lost work moves
with time, so a queue's order is kept for the instant it was built at (and moved
by the jobs that came or went since, `index.running_changes`), and each job's
entry for its admission and the instant (`index.victim_entries`); at a new instant
the last order's entries are moved to it (their lost work read afresh) and sorted
again, not looked up job by job.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import TYPE_CHECKING

from muster.projections.eviction import LOWEST, Preemptor, may_evict, reach
from muster.projections.index import VictimEntry, VictimList, VictimMemo
from muster.projections.jobfacts import lost_gpu_seconds, preemptible, priority_of
from muster.projections.state import JobState

if TYPE_CHECKING:
    from muster.projections.cycle import Cycle

UNREACHABLE = 1 << 62
"""Above every priority: the whole victim order."""


def list_candidates(cycle: Cycle, job: JobState, p: Preemptor) -> list[JobState]:
    """Every running job `eviction.may_evict` lets `p` take that holds something `job` asks for.

    Other queues' first (in victim order across them), then its own queue's.
    """
    idx = cycle.idx
    # the room reserved for another gang is not the preemptor's to free: no victim there (`reservations`)
    removed = cycle.removed | cycle.fence.spared(job, cycle.state.nodes) if cycle.fence.held else cycle.removed
    prio = p.priority
    own: list[JobState] = []
    rule = reach(p.policy, p.mode)
    if p.policy.within_queue != "Never":
        # in victim order, priorities rise: stop at the first the rule refuses whatever the order
        equal = rule.equal_in_queue
        # jobs the rule refuses whatever the order are left out of the order (their lost work
        # is not computed)
        for entry in victim_order(cycle, job.queue, prio if equal else prio - 1):
            cp, c = entry.priority, entry.job
            if cp > prio or (cp == prio and not equal):
                break
            if c.id in removed or not overlaps(c, job):
                continue
            if may_evict(p, job.queue, cp, c.order_seq, job=c.id):
                own.append(c)
    others: list[VictimEntry] = []
    if p.in_cohort and rule.others:
        upto = UNREACHABLE if rule.above_in_others else prio - 1
        for other in idx.tree_queues.get(idx.roots.get(job.queue, job.queue), ()):
            if other == job.queue or not idx.running.get(other):
                continue
            borrowing = idx.quota.is_borrowing(other, job.requests)
            if not may_evict(p, other, LOWEST, 0, borrowing):
                continue  # not even its lowest priority: none of its jobs (the order is not needed)
            for entry in victim_order(cycle, other, upto):
                cp, c = entry.priority, entry.job
                if not may_evict(p, other, cp, c.order_seq, borrowing):
                    break  # for other queues the rule only narrows as priority rises
                if c.id in removed or not overlaps(c, job) or not may_evict(p, other, cp, c.order_seq, borrowing, c.id):
                    continue
                others.append(entry)
    others.sort()  # victim order (`VictimEntry`)
    return [e.job for e in others] + own


def victim_order(cycle: Cycle, queue: str, upto: int) -> list[VictimEntry]:
    """A queue's preemptible running jobs of priority <= `upto` in victim order (priority,
    lost work, newest); kept for the instant. Callers walk it in order and stop at a priority
    they may not take, so a longer list serves them too."""
    idx, now = cycle.idx, cycle.now
    if upto < cycle.state.lowest_priority():
        # no job is below the lowest class (a scavenger's search): nothing to order, however many run
        return []
    version = idx.running_version.get(queue, 0)
    hit = idx.victim_cache.get(queue)
    if hit is None or hit.upto < upto:
        idx.running_changes.pop(queue, None)
        keys = victim_entries(cycle, idx.running.get(queue, ()), upto)
        keys.sort()
        idx.victim_cache[queue] = VictimList(now, version, upto, keys)
        return keys
    if hit.at == now and hit.version == version:
        return hit.entries
    # the jobs that came or went since (admissions, ends, evictions folded) are looked up afresh; every
    # other job's entry holds for its admission but its lost work, which moves with time
    changed = set(idx.running_changes.pop(queue, ()))
    if hit.at == now:
        keys = [e for e in hit.entries if e.job.id not in changed]
    else:
        keys = [
            VictimEntry(e.priority, lost_gpu_seconds(e.job, now), e.neg_admitted, e.neg_seq, e.job)
            for e in hit.entries
            if e.job.id not in changed
        ]
    running = idx.running.get(queue, set())
    fresh = victim_entries(cycle, sorted(j for j in changed if j in running), hit.upto)
    if hit.at == now:
        for entry in fresh:
            bisect.insort(keys, entry)
    else:
        # the last instant's order, moved by lost work and the new jobs: sorting it costs little more
        # than a pass (the kept entries mostly keep their order)
        keys.extend(fresh)
        keys.sort()
    idx.victim_cache[queue] = VictimList(now, version, hit.upto, keys)
    return keys


def victim_entries(cycle: Cycle, job_ids: Iterable[str], upto: int) -> list[VictimEntry]:
    """The running jobs' places in victim order at the cycle's instant, leaving out those not preemptible
    or above `upto` (in the order given: the caller sorts).

    A job's entry holds for the instant (and its admission): several cycles at one instant reuse it
    (`index.victim_entries`); whether it is preemptible, and its priority, hold for its admission. One
    loop over a queue's jobs, not a call per job: a queue's whole order is built here when none is kept.
    """
    idx, now, state = cycle.idx, cycle.now, cycle.state
    jobs, memos = state.jobs, idx.victim_entries
    out: list[VictimEntry] = []
    for job_id in job_ids:
        c = jobs[job_id]
        admitted_at = c.admitted_at
        memo = memos.get(job_id)
        if memo is not None and memo.admitted_at == admitted_at:
            prio = memo.priority
            if prio is None or prio > upto:
                continue  # not preemptible, or out of reach
            if memo.at == now and memo.entry is not None:
                out.append(memo.entry)
                continue
        else:
            prio = priority_of(state, c) if preemptible(state, c) else None
            if prio is None or prio > upto:
                memos[job_id] = VictimMemo(-1, admitted_at, prio, None)
                continue
        entry = VictimEntry(prio, lost_gpu_seconds(c, now), -(admitted_at or 0), -c.seq, c)
        memos[job_id] = VictimMemo(now, admitted_at, prio, entry)
        out.append(entry)
    return out


def overlaps(candidate: JobState, job: JobState) -> bool:
    """A candidate helps only if it holds something the preemptor asks for."""
    # a loop, not `any` over a generator: asked of every running job of the preemptor's cohort
    held = candidate.requests
    for r, v in job.requests.items():
        if v > 0 and held.get(r, 0) > 0:
            return True
    return False
