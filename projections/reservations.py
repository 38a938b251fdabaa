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
  (`planning`), and, for an older holder planned again, the younger ones
  that are not a nominal-quota gang's (nor one such a gang is stacked
  behind): those it then shares hosts with are
  planned again behind it (a nominal-quota gang's start is never pushed
  back). The reservation holds the
  fewest hosts of that domain that hold the job then (on each, what its
  pods take there), and names the jobs there it waits for. At the end of every cycle a held
  reservation moves (`replaced`) where the job would start sooner: an
  earlier known start, a known start where its own is unknown, or, both
  unknown, fewer running jobs to wait for; older holders move first.
- What it holds back: on each reserved host, the free room up to what the
  holders' pods will take there; every job sees it as taken but the holder
  and, on their own reserved hosts, the holders whose plans counted it
  ahead (`Fence.behind`, the order plans were made in), unless its own
  declared limit ends by the expected start (backfill). With an unknown start (some
  job in the way declared no limit) nothing backfills; a job without a
  limit never does. A preemptor evicts nothing on a host whose held room
  it may not use (`Fence.spared`).
- When: decided at the end of a cycle that evicted nothing, for the jobs
  left pending (`ReservationMade`); it holds from the next cycle on.
  Released (`ReservationReleased`) as `admitted` in the cycle that admits
  its holder, `cancelled` once the holder is no longer pending (it ended, or
  was held), `replaced` when it moves (a reserved host left or cannot take
  pods, or a sooner place came up: a new reservation for the same job
  follows at once).

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

from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import NamedTuple

from muster.events.types import (
    Event,
    JobId,
    NodeName,
    PreemptionPolicy,
    QueueName,
    ReservationMade,
    ReservationReleased,
)
from muster.projections import parking
from muster.projections.cluster import node_pods
from muster.projections.index import OrderKey, SchedulerIndex, order_key
from muster.projections.jobfacts import preemptible
from muster.projections.planning import Plan, Replanned, Running, comes_back, plan_for
from muster.projections.state import ClusterState, JobState, NodeState, Reservation, reservation_of
from muster.projections.topology import Transaction


class Fence:
    """One cycle's reservations in force and the room they hold back on the cycle's view.

    A host may be held by several reservations (one planned behind another): it holds back the sum of
    what their holders take there, up to what is free. Who may use whose room is one rule (`may_use`).
    """

    def __init__(self, state: ClusterState, topo: Transaction, now: int) -> None:
        self.now = now
        self.topo = topo
        # in the order they were made (the fold appends to `state.reservations`): `behind` reads it
        self.held: dict[str, Reservation] = {
            job_id: res for job_id, res in state.reservations.items() if in_force(state, job_id)
        }
        self.taken: dict[str, dict[str, int]] = {}
        """Host -> what the fence holds back there now."""
        self.on: dict[str, list[Reservation]] = {}
        """Host -> the reservations that hold it."""
        self._spared: set[str] | None = None
        """`spared` for a job that may use no reservation (the folded state does not change in a cycle)."""
        self._behind: dict[str, frozenset[str]] = {}
        """Holder -> `behind` it (the held reservations change in a cycle only by `release`)."""
        for res in self.held.values():
            for node in res.nodes:
                self.on.setdefault(node, []).append(res)
        for node in sorted(self.on):
            self._hold(node, self.on[node])

    def _hold(self, node: str, holders: list[Reservation]) -> None:
        """Hold back the free room of `node` that `holders` need (what it holds there already counts)."""
        host = self.topo.index.hosts.get(node)
        if host is None:
            return
        need = _need(node, holders)
        held = self.taken.setdefault(node, {})
        room: dict[str, int] = {}
        for k, v in host.host_free.items():
            cap = v if need is None else min(v, need.get(k, 0) - held.get(k, 0))
            if cap > 0:
                room[k] = cap
        if room:
            self.topo.take(node, room)
            for k, v in room.items():
                held[k] = held.get(k, 0) + v

    def behind(self, job_id: str) -> frozenset[str]:
        """The holders whose plans counted `job_id`'s reservation ahead of theirs: those waiting for it
        (directly or through others), and those made after it that it does not wait for. A plan counts every
        reservation held when it is made but those waiting for its holder (`_plan`), so this is the order the
        plans assumed, and no two holders each keep the other out."""
        known = self._behind.get(job_id)
        if known is not None:
            return known
        waiting = _behind(self.held, job_id)
        waited = _waited_for(self.held, job_id)
        order = list(self.held)
        later = order[order.index(job_id) + 1 :] if job_id in self.held else []
        out = frozenset(waiting | {j for j in later if j not in waited})
        self._behind[job_id] = out
        return out

    def may_use(self, job: JobState, res: Reservation, node: str) -> bool:
        """The fencing rule: `job` may use the room `res` holds on `node` when it is its own, when its limit ends
        by the reservation's expected start (backfill), or when `node` is reserved for `job` too and `res` was
        planned behind it (`behind`). Everything else held stays held from it."""
        if res.job == job.id or backfills(job, res, self.now):
            return True
        own = self.held.get(job.id)
        return own is not None and node in own.nodes and res.job in self.behind(job.id)

    def _opens(self, job: JobState) -> list[str]:
        """The hosts where `job` may use some reservation's room (a holder's own hosts, those it backfills)."""
        return sorted(
            {n for res in self.held.values() if res.job == job.id or backfills(job, res, self.now) for n in res.nodes}
        )

    def open(self, job: JobState) -> list[str]:
        """Give `job` the room it may use (`may_use`; what the others hold on the same hosts stays held);
        returns the hosts opened (for `close`)."""
        opened: list[str] = []
        for node in self._opens(job):
            holders = self.on[node]
            others = [res for res in holders if not self.may_use(job, res, node)]
            if len(others) == len(holders):
                continue
            held = self.taken.pop(node, None)
            if held:
                self.topo.give(node, held)
                opened.append(node)
                if others:
                    self._hold(node, others)
        return opened

    def close(self, opened: list[str]) -> None:
        """Hold back again what is left of the hosts `open` gave."""
        for node in opened:
            self._hold(node, self.on[node])

    def release(self, job: JobState) -> None:
        """Hold nothing more for a holder admitted in this cycle: its hosts stay held for the others only
        (else a younger holder on the same host would find its room held for a job already running)."""
        res = self.held.pop(job.id, None)
        if res is None:
            return
        self._spared = None
        self._behind.clear()
        for node in res.nodes:
            others = [r for r in self.on.get(node, []) if r.job != job.id]
            held = self.taken.pop(node, None)
            if held:
                self.topo.give(node, held)
            if others:
                self.on[node] = others
                self._hold(node, others)
            else:
                self.on.pop(node, None)

    def held_gpus(self, job: JobState) -> int:
        """GPUs held back now on the reservations `job` may use (room it sees that others do not)."""
        if not self.held:
            return 0
        return sum(self.taken.get(n, {}).get("gpu", 0) for n in self._opens(job))

    def spared(self, job: JobState, nodes: Mapping[str, NodeState]) -> set[str]:
        """The running jobs on hosts holding room for a reservation `job` may not use: a preemptor evicts
        none of them, since the room it would free is promised to another gang (`preemption`)."""
        if not self.held:
            return set()
        uses_none = not self._opens(job)
        if uses_none and self._spared is not None:
            return self._spared  # most jobs may use none: the same set for all of them in the cycle
        closed = sorted(n for n, holders in self.on.items() if not all(self.may_use(job, r, n) for r in holders))
        out = {j for n in closed if (node := nodes.get(n)) is not None for j in node.jobs}
        if uses_none:
            self._spared = out
        return out

    def judged_again(self, state: ClusterState, job: JobState) -> bool:
        """Whether a parked job's verdict may have been judged without victims the fence spares (`spared`):
        then it is judged again next cycle, since a reservation's release or move frees them and wakes
        nothing the memo knows of."""
        if not self.held:
            return False
        policy = state.queues[job.queue].preemption
        if policy == PreemptionPolicy():
            return False  # it may evict nobody
        return bool(self.spared(job, state.nodes))

    def own_verdict(self, job: JobState) -> bool:
        """Whether `job` sees room its class does not (so its verdict is its own, not its class's)."""
        if not self.held:
            return False
        if job.id in self.held:
            return True
        return job.max_runtime is not None and any(r.expected_start is not None for r in self.held.values())


def _need(node: str, holders: Iterable[Reservation]) -> dict[str, int] | None:
    """What `holders` take on `node`, summed (None: one of them holds all that is free, as a reservation
    made before `needs` was recorded does)."""
    total: dict[str, int] = {}
    for res in holders:
        need = res.needs.get(node) if res.needs else None
        if need is None:
            return None
        for k, v in need.items():
            total[k] = total.get(k, 0) + v
    return total


def in_force(state: ClusterState, job_id: str) -> bool:
    """Whether a reservation holds room back: its holder is still a pending job, not held."""
    job = state.jobs.get(job_id)
    return job is not None and job.status == "pending" and not job.held


def backfills(job: JobState, res: Reservation, now: int) -> bool:
    """Slurm's backfill: a job may use reserved room when its declared limit ends by the expected start."""
    if job.max_runtime is None or res.expected_start is None or job.id == res.job:
        return False
    return now + job.max_runtime <= res.expected_start


# ---------------------------------------------------------------- decisions at the end of a cycle


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
    # older holders first: a sooner place goes to the job that has waited longest
    kept.sort(key=lambda r: _wait_key(state.jobs[r.job]))
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
    slots = len(queues)
    displaced: set[str] = set()
    for i, res in enumerate(kept):
        job = state.jobs[res.job]
        gone = res.job in displaced or not all(_usable(state, n) for n in res.nodes)
        if not gone and not events and not admitted and _plan_stands(state, idx, res):
            if not _nominal(res):
                slots -= 1
            continue
        # an older holder may take the place of a younger one, but not a nominal-quota gang's (the
        # guarantee), nor one a nominal-quota gang is stacked behind (its start would move with it)
        younger = {r.job for r in kept[i + 1 :] if _passable(current, r, displaced)}
        plan = _plan(state, job, current, running(), fence, idx, younger)
        _planned(state, idx, job, res, plan)
        if gone or (plan is not None and _sooner(state, plan, res, now)):
            # its hosts left, or room comes back sooner elsewhere: the same holder is reserved for there
            events.append(ReservationReleased(at=now, job=JobId(res.job), reason="replaced", cycle=cycle, epoch=epoch))
            del current[res.job]
            if plan is None:
                continue
            made = _made(job, plan, res.reason, now, cycle, epoch)
            events.append(made)
            current[res.job] = reservation_of(made)
            # the younger ones it now shares hosts with are planned again, behind it
            displaced.update(j for j in younger if not set(current[j].nodes).isdisjoint(plan.nodes))
        if not _nominal(res):
            slots -= 1
    # as many reservations as queues make them (the guarantee's aside), to the longest waiting jobs
    for job, reason in due:
        if slots <= 0 and not reason.nominal:
            break
        plan = _plan(state, job, current, running(), fence, idx)
        if plan is None or not plan.waits_for:
            continue  # nowhere, or it fits now: what holds it back is not room that nodes could hold
        if not reason.nominal:
            slots -= 1
        made = _made(job, plan, reason.text, now, cycle, epoch)
        events.append(made)
        current[job.id] = reservation_of(made)
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
    behind = _behind(current, job.id)
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


def _passable(current: Mapping[str, Reservation], res: Reservation, displaced: set[str]) -> bool:
    """Whether an older holder's plan may pass `res`: no nominal-quota gang's start hangs on it."""
    if _nominal(res) or res.job in displaced:
        return False
    return not any(_nominal(current[j]) for j in _behind(current, res.job))


def _behind(current: Mapping[str, Reservation], job_id: str) -> set[str]:
    """The holders whose reservations wait, directly or through others, for `job_id`'s to end."""
    behind: set[str] = set()
    grew = True
    while grew:
        grew = False
        for res in current.values():
            if res.job not in behind and any(w.job == job_id or w.job in behind for w in res.waits_for):
                behind.add(res.job)
                grew = True
    return behind


def _waited_for(current: Mapping[str, Reservation], job_id: str) -> set[str]:
    """The holders `job_id`'s reservation waits for, directly or through others (the other way from `_behind`)."""
    waited: set[str] = set()
    todo = [job_id]
    while todo:
        res = current.get(todo.pop())
        for w in res.waits_for if res is not None else ():
            if w.job in current and w.job not in waited and w.job != job_id:
                waited.add(w.job)
                todo.append(w.job)
    return waited


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
