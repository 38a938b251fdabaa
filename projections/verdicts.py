"""Setting a job aside: why it waits (`JobInadmissible`) and what must happen before that may change.

`park` records a job's verdict and wake rule (`wake_rule`, see `index` and
`parking`); `park_doomed` parks in bulk the rest of a group whose first job
failed for its class on an unchanged view; `say_held` tells the jobs held
behind a `strict_fifo` head why they wait (they stay to be tried). A verdict that might change once
the jobs admitted earlier in the cycle run (`may_evict_new`) is judged again
next cycle.
"""

from __future__ import annotations

import bisect

from muster.events.types import JobId, JobInadmissible
from muster.projections.cycle import Cycle, EvictNewAnswer, lowest_key, neg_seq
from muster.projections.eviction import Preemptor, chain_may_shrink, evicts_more_within_nominal, may_evict
from muster.projections.flavors import on_any_flavor, placement_request
from muster.projections.index import Group, OrderKey, ahead_of_seq
from muster.projections.jobfacts import gpus, preemptible, priority_of
from muster.projections.parking import ROOM_DOMAINS, Member, RoomWait, Wake
from muster.projections.preemption import Result, overlaps
from muster.projections.state import JobState
from muster.projections.topology import RoomShort


def park(cycle: Cycle, job: JobState, reason: str, wake: Wake) -> None:
    """Say why the job waits (when that changed) and set it aside until `wake`."""
    idx = cycle.idx
    if reason != job.reason:
        cycle.events.append(
            JobInadmissible(at=cycle.now, job=JobId(job.id), reason=reason, cycle=cycle.number, epoch=cycle.epoch)
        )
    # or sparing jobs it may evict once the waiting job between them runs again
    if _judged_on_a_narrow_view(cycle, job) or chain_may_shrink(cycle.state.jobs, job):
        # tried again next cycle whatever happens: a park would only be woken at the cycle's end
        idx.deactivate(job)
        cycle.set_aside.append((idx.group_of[job.id], [Member(-job.order_seq, job.id)]))
        return
    idx.park(job, wake, reason)


def held_reason(queue: str) -> str:
    """Why a job waits behind the head of its `strict_fifo` queue. It does not name the head (`muster explain`
    does), so it is written once per job, not again at every change of head."""
    return f"waits behind the head of queue {queue} (strict_fifo: while its head waits, no job behind it goes)"


def say_held(cycle: Cycle, group: Group) -> None:
    """Tell the jobs of `group` never judged yet that they wait behind their `strict_fifo` head (spec: a pending
    job says why; such a job is not tried while its head waits). A job that was judged keeps its last reason:
    a parked one is not visited, so telling the others more would make the memo change what the log says."""
    idx = cycle.idx
    if idx.group_reason.get(group):
        return  # every member has the same reason, and it is not empty
    members = idx.groups.get(group)
    if not members:
        return
    jobs = cycle.state.jobs
    reason = held_reason(jobs[members[-1].job].queue)
    for m in reversed(members):  # in queue order
        if not jobs[m.job].reason and m.job not in cycle.told_held:
            cycle.told_held.add(m.job)
            cycle.events.append(
                JobInadmissible(at=cycle.now, job=JobId(m.job), reason=reason, cycle=cycle.number, epoch=cycle.epoch)
            )


def _judged_on_a_narrow_view(cycle: Cycle, job: JobState) -> bool:
    """Whether the job was judged without victims the next cycle may offer: in a cycle that evicts, without
    the jobs just admitted in its tree, or sparing those on reserved nodes (its block is tried again)."""
    return cycle.reserved or may_evict_new(cycle, job) or cycle.fence.judged_again(cycle.state, job)


def park_doomed(cycle: Cycle, bound: OrderKey | None) -> None:
    """Park the jobs of the doomed groups whose turn comes before `bound` (None: all of them).

    Tried one by one, each would find its class's verdict on an unchanged view
    (`try_job`): parked for the same reason, with the same wake. So each group's
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
        key = lowest_key(cycle, first)
        start = 0
        if bound is not None:
            if ahead_of_seq(bound) < ahead_of_seq(key):
                continue
            if ahead_of_seq(bound) == ahead_of_seq(key):
                start = bisect.bisect_right(members, -bound[-1], key=neg_seq)
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
                    waits.append(((key[0], key[1], key[2], key[3], -m.neg_seq), wait))
        if _judged_on_a_narrow_view(cycle, first):
            cycle.set_aside.append((group, run))
        else:
            idx.park_members(group, run, first, verdict.wake, reason)
    waits.sort(key=lambda w: w[0])
    cycle.events.extend(w for _, w in waits)


def may_evict_new(cycle: Cycle, job: JobState) -> bool:
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
    job = on_any_flavor(state, job)  # a pending flavored job may take room on any of its flavors
    # the answer depends on the queue, the priority and the resources asked for, and on
    # the admitted list, which only grows: a backlog of one shape asks once per admission
    key = (job.queue, priority_of(state, job), tuple(sorted(r for r, v in job.requests.items() if v > 0)))
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
    rule = Preemptor(job.queue, priority_of(state, job), queue.preemption, queue.cohort is not None, None, None)
    for other in admitted:
        if not overlaps(other, job):
            continue
        prio = priority_of(state, other) if preemptible(state, other) else None
        if may_evict(rule, other.queue, prio, other.order_seq):
            return True
    return False


def _wait_for_room(cycle: Cycle, job: JobState, result: Result, wake: Wake) -> None:
    """Wake the job once GPUs freed could let the nodes hold it, with every candidate evicted.

    A gang bound to one domain of a level waits for GPUs freed in a domain to reach what that
    domain lacks (a release in another rack or block does not wake it); any other job for GPUs
    freed anywhere to reach what the cluster lacks.
    """
    room = _room_short(cycle, job, result)
    if room is not None:
        wake.room = RoomWait(tuple((lack.path, lack.gpus) for lack in room.lacks), room.rest)
    else:
        wake.freed_short = gpus(job) - result.candidate_gpus


def _room_short(cycle: Cycle, job: JobState, result: Result) -> RoomShort | None:
    """Per domain, what a one-podset gang with a required level lacks (None: not such a gang, or its
    view is its own: reserved room it may use, no victim search at this instant)."""
    if len(job.podsets) != 1 or cycle.fence.held or job.chained_eviction(cycle.now):
        return None
    ps = job.podsets[0]
    if ps.topology is None or ps.topology.required is None:
        return None
    topology = cycle.idx.topology
    request = placement_request(job, ps.name, ps.requests, topology.tainted)
    return topology.room_short(ps.count, request, ps.topology.required, result.candidates, ROOM_DOMAINS)


def wake_rule(
    cycle: Cycle, job: JobState, allow_borrow: bool, quota_blocked: bool, quota_possible: bool, result: Result
) -> Wake:
    """What must happen before this verdict (and its words) can change; see `index`."""
    state = cycle.state
    queue = state.queues[job.queue]
    wake = Wake(new_victims=not cycle.idx.evicts_no_one(job.queue, priority_of(state, job)))
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
            _wait_for_room(cycle, job, result, wake)
    else:
        # placement blocked: wake when GPUs free up, or when quota would block instead
        _wait_for_room(cycle, job, result, wake)
        for r, h in headroom.items():
            wake.consumed[r] = h + 1
    if evicts_more_within_nominal(queue.preemption, queue.cohort is not None, job):
        over = cycle.idx.quota.over_nominal(job.queue, job.requests)
        if over:
            r = max(sorted(over), key=lambda k: over[k])
            wake.own_released[r] = over[r]
    return wake
