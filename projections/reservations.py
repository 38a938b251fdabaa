"""Reservations: room held for the jobs that waited longest, and backfill of that room.

The rules (docs/spec/scenario.md, Reservations and backfill):

- Who: over every queue with `reserve_after` set, whatever the queue, the
  pending jobs that have waited `reserve_after` seconds (their queue's)
  since they last became pending, longest waiting first (then by
  submission), as many at once as there are such queues (a queue may hold
  several; Slurm's backfill reserves for its top jobs the same way). Aside
  from that bound, a queue's head (first by priority, then submission) is
  reserved for at once when its queue's usage with it admitted stays within
  its nominal quota (the guarantee). None for a job its own queue's limits
  leave no room for, nor for one that fits the free room now (then quota,
  not nodes, holds it back: held nodes would not help).
- Where: among the domains of the level its podsets require (every host
  when none is required), the one where it fits soonest, counting the
  running jobs' declared ends (admission + `max_runtime`); a job without a
  limit has an unknown end and is counted after every known one, in
  submission order, and before any holder's ahead (`planning.comes_back`).
  A reservation already held counts as a running job whose holder takes
  its `needs` until its expected start plus its limit, so a job may be
  reserved for behind another on the same hosts (stacked);
  a plan counts every reservation but its own and those behind it
  (`planning`). Holders and the jobs due one are planned in one order,
  longest waiting first, and an older job may pass the younger holders
  that are not a nominal-quota gang's (nor one such a gang is stacked
  behind): a holder planned again when that moves it, a job due one when
  that makes it start sooner (else its next cycle, planning it again,
  would move it: replay and a new leader would see a move the recorded
  run did not make). The younger ones it then shares hosts with are
  planned again behind it (a nominal-quota gang's start is never pushed
  back). The reservation holds the
  fewest hosts of that domain that hold the job then (on each, what its
  pods take there), and names the jobs there it waits for. At the end of every cycle a held
  reservation moves (`replaced`) where the job would start sooner: an
  earlier known start, a known start where its own is unknown, or, both
  unknown, fewer running jobs to wait for; older holders move first.
- What it holds back, and who may use it (backfill): `holdback`, where the
  `Fence` that applies it lives.
- When: decided at the end of a cycle that evicted nothing, for the jobs
  left pending (`ReservationMade`); it holds from the next cycle on.
  Released (`ReservationReleased`) as `admitted` in the cycle that admits
  its holder, `cancelled` once the holder is no longer pending (it ended, or
  was held), `replaced` when it moves (a reserved host left or cannot take
  pods, or a sooner place came up: a new reservation for the same job
  follows at once). A cycle that makes or releases one calls for another
  at the same instant (`settling.unsettled`): the jobs the released room
  wakes are judged then, as after a job ends, and the reservations are
  planned again on the view the new ones leave.

Memory is the log: what a cycle holds back is a function of
`state.reservations` (folded from those events) and `now`. A release, or a
holder that leaves, counts the room it held as GPUs freed in the fold
(`cluster`), so the jobs parked on placement that the room could serve wake
as they do when a job ends, and the parking memo stays exact; a new
reservation wakes nothing, since held room only shrinks what the others see
(their parked verdicts stand, and their wakes come early, never late).
Within a cycle the held room only shrinks, as admissions shrink it. The same
count tells when a held reservation need not be planned again: a plan starts
sooner only when room came back (`_plan_stands`, remembered on the index and
off with the parking memo, so replay, audit and a new leader, whose index is
fresh and plans every holder once, decide the same bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from typing import NamedTuple

from muster.events.types import (
    Event,
    JobId,
    NodeName,
    QueueName,
    ReservationMade,
    ReservationReleased,
)
from muster.projections import parking
from muster.projections.cluster import node_pods
from muster.projections.holdback import Fence, in_force, waiting_on
from muster.projections.index import OrderKey, SchedulerIndex, order_key
from muster.projections.jobfacts import preemptible
from muster.projections.planning import Plan, Replanned, Running, comes_back, plan_for
from muster.projections.state import ClusterState, JobState, Reservation, reservation_of


def released_on_admission(state: ClusterState, job: JobState, now: int, cycle: int, epoch: int) -> list[Event]:
    """The release that goes with admitting a job that holds a reservation."""
    if job.id not in state.reservations:
        return []
    return [ReservationReleased(at=now, job=JobId(job.id), reason="admitted", cycle=cycle, epoch=epoch)]


def reserving_queues(state: ClusterState, idx: SchedulerIndex) -> frozenset[str]:
    """The queues that make reservations: those with `reserve_after`, except a queue with quota per flavor
    (a reservation's room is counted in plain resources). Kept on the index, which is rebuilt when a queue
    changes, so a cycle does not look at every queue."""
    if idx.reserving is None:
        idx.reserving = frozenset(
            q for q, qs in state.queues.items() if qs.reserve_after is not None and not qs.resource_groups
        )
    return idx.reserving


def decide_reservations(
    state: ClusterState,
    idx: SchedulerIndex,
    fence: Fence,
    placed: Mapping[str, Mapping[str, str]],
    cycle: int,
    epoch: int,
) -> list[Event]:
    """Release the reservations whose holder left, move those a sooner place exists for (or whose hosts
    left), and reserve for the jobs due one, longest waiting first.

    Judged on the cycle's view at its end (`placed`: the jobs it admitted; `fence`: what it holds back).
    """
    now = fence.now
    events: list[Event] = []
    kept: list[Reservation] = []
    for job_id, res in sorted(state.reservations.items()):
        if job_id in placed:
            continue  # released with its admission
        if not in_force(state, job_id):
            events.append(ReservationReleased(at=now, job=JobId(job_id), reason="cancelled", cycle=cycle, epoch=epoch))
        else:
            kept.append(res)
    if len(idx.replanned) > len(kept):
        idx.replanned = {r.job: seen for r in kept if (seen := idx.replanned.get(r.job)) is not None}
    queues = reserving_queues(state, idx)
    if not queues and not kept:
        return events
    holders = {res.job for res in kept}
    due = _due_jobs(state, idx, queues, holders, placed, now)
    if not kept and not due:
        return events
    running = Lazy(lambda: _running(state, idx, now, placed))
    # a holder admitted in this cycle runs from now on: those behind it may start sooner than it was planned
    admitted = any(job_id in placed for job_id in state.reservations)
    current = {res.job: res for res in kept}
    """The reservations as this cycle leaves them: a plan queues behind every one but those behind it."""
    # older first, holders and jobs due one alike: a sooner place goes to the job that has waited longest,
    # whether it holds a reservation yet or not (a job due one is planned as it would be planned again)
    turns = sorted(
        [Turn(_wait_key(state.jobs[r.job]), state.jobs[r.job], r) for r in kept]
        + [Turn(_wait_key(job), job, reason) for job, reason in due],
        key=lambda t: t.wait,
    )
    # as many reservations as queues make them (the guarantee's aside), to the longest waiting jobs
    slots = len(queues) - sum(1 for r in kept if not _nominal(r))
    full = False
    displaced: set[str] = set()
    for i, turn in enumerate(turns):
        job, claim = turn.job, turn.claim
        if isinstance(claim, Due):
            reason = claim
            if full or (slots <= 0 and not reason.nominal):
                full = True  # the longest waiting jobs only: none after one the bound left out
                continue
            plan = _plan(state, job, current, running(), fence, idx)
            if plan is None or not plan.waits_for:
                continue  # nowhere, or it fits now: what holds it back is not room that nodes could hold
            made = _made(job, plan, reason.text, now, cycle, epoch)
            younger = _younger(current, turns[i + 1 :], displaced)
            passing = _plan(state, job, current, running(), fence, idx, younger) if younger else None
            if passing is not None and _sooner(state, passing, reservation_of(made), now):
                # past younger holders, as its next cycle would move it (`_sooner`): those it shares hosts
                # with are planned again, behind it
                plan, made = passing, _made(job, passing, reason.text, now, cycle, epoch)
                displaced.update(_sharing(current, younger, plan))
            if not reason.nominal:
                slots -= 1
            events.append(made)
            current[job.id] = reservation_of(made)
            continue
        res = claim
        gone = res.job in displaced or not all(_usable(state, n) for n in res.nodes)
        if not gone and not events and not admitted and _plan_stands(state, idx, res):
            continue
        younger = _younger(current, turns[i + 1 :], displaced)
        plan = _plan(state, job, current, running(), fence, idx, younger)
        _planned(state, idx, job, res, plan)
        if gone or (plan is not None and _sooner(state, plan, res, now)):
            # its hosts left, or room comes back sooner elsewhere: the same holder is reserved for there
            events.append(ReservationReleased(at=now, job=JobId(res.job), reason="replaced", cycle=cycle, epoch=epoch))
            del current[res.job]
            if plan is None:
                if not _nominal(res):
                    slots += 1  # its slot goes to the jobs due one after it
                continue
            made = _made(job, plan, res.reason, now, cycle, epoch)
            events.append(made)
            current[res.job] = reservation_of(made)
            # the younger ones it now shares hosts with are planned again, behind it
            displaced.update(_sharing(current, younger, plan))
    return events


def _plan_stands(state: ClusterState, idx: SchedulerIndex, res: Reservation) -> bool:
    """Whether planning a held reservation again cannot move it: it was planned, as it is, when the fold had
    counted as many GPUs freed as now, and in this cycle no holder was admitted and no reservation moved or
    left before it (its caller asks only then). Room only comes back sooner when GPUs are freed (a job ends
    or is evicted, a reservation is released, a node joins: `ClusterState.gpus_freed`) or a holder starts
    before its expected start; admissions of other jobs, new reservations and time passing only push a plan
    later. So the plan would start no sooner than the one that did not move it. Off with the parking memo
    (`parking.PARKING`), whose equivalence test checks it decides the same bytes."""
    seen = idx.replanned.get(res.job)
    return parking.PARKING and seen is not None and seen.freed == state.gpus_freed and seen.res == res


def _planned(state: ClusterState, idx: SchedulerIndex, job: JobState, res: Reservation, plan: Plan | None) -> None:
    """Remember that `res` was planned again now (`_plan_stands`), when its plan is one that less room can only
    make later: a known start for a gang of one podset (the greedy fit of several podsets, and the count of
    jobs waited for when the start is unknown, need not grow with less room)."""
    if plan is not None and plan.expected_start is not None and len(job.podsets) == 1:
        idx.replanned[res.job] = Replanned(res, state.gpus_freed)
    else:
        idx.replanned.pop(res.job, None)


class Lazy:
    """A value computed on first use (a cycle whose plans all stand needs no running jobs' ends)."""

    def __init__(self, make: Callable[[], list[Running]]) -> None:
        self._make = make
        self._value: list[Running] | None = None

    def __call__(self) -> list[Running]:
        if self._value is None:
            self._value = self._make()
        return self._value


def _plan(
    state: ClusterState,
    job: JobState,
    current: Mapping[str, Reservation],
    running: list[Running],
    fence: Fence,
    idx: SchedulerIndex,
    passed: AbstractSet[str] = frozenset(),
) -> Plan | None:
    """Where `job` fits soonest, behind every reservation in `current` but its own, those behind it and those
    it may pass (`passed`, which then move behind it): a
    reservation once made is never pushed back by another's plan (so a nominal-quota gang's expected start
    holds, whoever moves later)."""
    now = fence.now
    behind = waiting_on(current, job.id)
    ahead: list[Running] = []
    excluded: set[str] = set()
    for other in current.values():
        if other.job == job.id or other.job in behind or other.job in passed:
            continue
        if not other.needs:
            excluded.update(other.nodes)  # made before `needs` was recorded: it holds the whole hosts
            continue
        holder = state.jobs[other.job]
        start, limit = other.expected_start, holder.max_runtime
        end = None if start is None or limit is None else max(now, start) + limit
        ahead.append(Running(end, holder.seq, other.job, other.needs, ahead=True))
    return plan_for(job, idx.topology, running, ahead, excluded, now, fence.taken)


class Turn(NamedTuple):
    """A job planned at the end of a cycle: a holder, with its reservation, or a job due one, with why."""

    wait: tuple[int, int]
    """`_wait_key`: longest waiting first."""
    job: JobState
    claim: Reservation | Due


def _younger(current: Mapping[str, Reservation], after: list[Turn], displaced: set[str]) -> set[str]:
    """The younger holders an older job may pass: not a nominal-quota gang's (the guarantee), nor one a
    nominal-quota gang is stacked behind (its start would move with it)."""
    return {t.job.id for t in after if isinstance(t.claim, Reservation) and _passable(current, t.claim, displaced)}


def _sharing(current: Mapping[str, Reservation], younger: AbstractSet[str], plan: Plan) -> list[str]:
    """The younger holders a plan that passed them shares hosts with: they are planned again, behind it."""
    return [j for j in younger if not set(current[j].nodes).isdisjoint(plan.nodes)]


def _passable(current: Mapping[str, Reservation], res: Reservation, displaced: set[str]) -> bool:
    """Whether an older job's plan may pass `res`: no nominal-quota gang's start hangs on it."""
    if _nominal(res) or res.job in displaced:
        return False
    return not any(_nominal(current[j]) for j in waiting_on(current, res.job))


def _sooner(state: ClusterState, plan: Plan, res: Reservation, now: int) -> bool:
    """Whether `plan` starts the holder sooner than its reservation will: an earlier known start, a known
    start where it has none, or, both unknown, fewer running jobs to wait for."""
    left = [w for w in res.waits_for if _in_way(state, w.job, res)]
    if plan.expected_start is None:
        return any(w.end is None for w in left) and len(plan.waits_for) < len(left)
    if any(w.end is None for w in left):
        return True
    return plan.expected_start < max((w.end or now for w in left), default=now)


def _in_way(state: ClusterState, job_id: str, res: Reservation) -> bool:
    """Whether a job `res` waits for is still in its way: the same run of a running job, or one running
    on its hosts since (a holder it was stacked behind), or a holder still waiting on its reservation."""
    job = state.jobs.get(job_id)
    if job is None:
        return False
    if job.status == "admitted":
        return (job.admitted_at or 0) <= res.since or any(n in res.nodes for n in job.placement.values())
    return job.status == "pending" and job_id in state.reservations


NOMINAL = "within its queue's nominal quota"


def _nominal(res: Reservation) -> bool:
    return res.reason == NOMINAL


class Due(NamedTuple):
    """Why a job is due a reservation; `nominal`: its queue's head within its nominal quota (the guarantee,
    never held back by the bound)."""

    text: str
    nominal: bool


def _due_jobs(
    state: ClusterState,
    idx: SchedulerIndex,
    queues: frozenset[str],
    holders: set[str],
    placed: Mapping[str, object],
    now: int,
) -> list[tuple[JobState, Due]]:
    """The pending jobs due a reservation, longest waiting first (then by submission), whatever their queue."""
    quota = idx.quota
    heads = _heads(state, idx, queues, placed)
    out: list[tuple[int, int, JobState, Due]] = []
    for job_id in idx.group_of:  # the validated pending jobs, to try or parked
        job = state.jobs.get(job_id)
        if job is None or job.queue not in queues or job_id in placed or job_id in holders:
            continue
        if job.status != "pending" or job.held:
            continue
        since = job.pending_since()
        if heads.get(job.queue) is job and quota.within_nominal(job.queue, job.requests):
            due = Due(NOMINAL, True)
        else:
            after = state.queues[job.queue].reserve_after
            if after is None or now - since < after or not _own_room(idx, job, preemptible(state, job)):
                continue
            due = Due(f"waited {now - since} s (reserve_after {after} s)", False)
        out.append((since, job.seq, job, due))
    out.sort(key=lambda d: (d[0], d[1]))
    return [(job, due) for _, _, job, due in out]


def _wait_key(job: JobState) -> tuple[int, int]:
    """Longest waiting first: when it last became pending, then submission order."""
    return job.pending_since(), job.seq


def _made(job: JobState, plan: Plan, reason: str, now: int, cycle: int, epoch: int) -> ReservationMade:
    return ReservationMade(
        at=now,
        job=JobId(job.id),
        queue=QueueName(job.queue),
        nodes=[NodeName(n) for n in plan.nodes],
        domain=plan.domain,
        expected_start=plan.expected_start,
        waits_for=plan.waits_for,
        reason=reason,
        cycle=cycle,
        epoch=epoch,
        needs={NodeName(n): r for n, r in sorted(plan.needs.items())},
    )


def _usable(state: ClusterState, node: str) -> bool:
    n = state.nodes.get(node)
    return n is not None and n.schedulable


def _heads(
    state: ClusterState, idx: SchedulerIndex, queues: frozenset[str], placed: Mapping[str, object]
) -> dict[str, JobState]:
    """Each queue's first pending job in queue order (priority, then submission), less those just admitted."""
    best: dict[str, tuple[OrderKey, JobState]] = {}
    for job_id in idx.group_of:  # the validated pending jobs, to try or parked
        job = state.jobs.get(job_id)
        if job is None or job.queue not in queues or job_id in placed or job.status != "pending":
            continue
        key = order_key(idx.priority(job), job.order_seq, limit=idx.limit(job))
        known = best.get(job.queue)
        if known is None or key < known[0]:
            best[job.queue] = (key, job)
    return {q: j for q, (_, j) in best.items()}


def _own_room(idx: SchedulerIndex, job: JobState, allow_borrow: bool) -> bool:
    """Whether the job's own queue has room for it by its limits, so that only the rest of its cohort's
    usage (which ends with running jobs) can block its quota: then held nodes help it."""
    node = idx.quota.queues[job.queue]
    limits = node.borrowing_limit or {}
    for r, v in job.requests.items():
        if v <= 0 or r not in node.nominal:
            continue
        most = node.nominal[r]
        if allow_borrow and node.parent is not None:
            if r not in limits:
                continue
            most += limits[r]
        if node.usage.get(r, 0) + v > most:
            return False
    return True


def _running(
    state: ClusterState, idx: SchedulerIndex, now: int, placed: Mapping[str, Mapping[str, str]]
) -> list[Running]:
    """The running jobs (with those just admitted) in the order their room comes back (`comes_back`)."""
    out: list[Running] = []
    ids = sorted({j for jobs in idx.running.values() for j in jobs} | set(placed))
    for job_id in ids:
        job = state.jobs[job_id]
        placement = placed.get(job_id, job.placement)
        started = now if job_id in placed else job.admitted_at
        if job_id not in placed and job.status != "admitted":
            continue
        end = None if job.max_runtime is None or started is None else max(now, started + job.max_runtime)
        room: dict[str, dict[str, int]] = {}
        for node, n, req in node_pods(job.podsets, placement):
            host = room.setdefault(node, {})
            for k, v in req.items():
                host[k] = host.get(k, 0) + v * n
        out.append(Running(end, job.seq, job_id, room))
    out.sort(key=comes_back)
    return out
