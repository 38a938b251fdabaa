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
  not nodes, holds it back: held nodes would not help). No node is held by
  two.
- Where: among the domains of the level its podsets require (every host
  when none is required), the one where it fits soonest, counting the
  running jobs' declared ends (admission + `max_runtime`); a job without a
  limit has an unknown end and is counted after every known one, in
  submission order. The reservation holds the fewest hosts of that domain
  that hold the job then (on each, what its pods take there), and names the
  running jobs there it waits for. At the end of every cycle a held
  reservation moves (`replaced`) where the job would start sooner: an
  earlier known start, a known start where its own is unknown, or, both
  unknown, fewer running jobs to wait for; older holders move first.
- What it holds back: on each reserved host, the free room up to what the
  holder's pods will take there; every job but the holder sees it as taken,
  unless its own declared limit ends by the expected start (backfill).
  With an unknown start (some job in the way declared no limit) nothing
  backfills; a job without a limit never does.
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
Within a cycle the held room only shrinks, as admissions shrink it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from muster.events.types import (
    Event,
    ExpectedEnd,
    JobId,
    NodeName,
    QueueName,
    ReservationMade,
    ReservationReleased,
)
from muster.projections.cluster import node_pods
from muster.projections.index import SchedulerIndex, order_key
from muster.projections.state import ClusterState, JobState, Reservation
from muster.projections.topology import Domain, TopologyIndex, Transaction


class Fence:
    """One cycle's reservations in force and the room they hold back on the cycle's view."""

    def __init__(self, state: ClusterState, topo: Transaction, now: int) -> None:
        self.now = now
        self.topo = topo
        self.held: dict[str, Reservation] = {
            job_id: res for job_id, res in sorted(state.reservations.items()) if in_force(state, job_id)
        }
        self.taken: dict[str, dict[str, int]] = {}
        """Host -> what the fence holds back there now."""
        self.needs: dict[str, dict[str, int] | None] = {}
        """Host -> the most it holds back there (None: all that is free)."""
        for res in self.held.values():
            for node in res.nodes:
                self.needs[node] = res.needs.get(node) if res.needs else None
            self._close(res.nodes)

    def _close(self, nodes: Iterable[str]) -> None:
        """Hold back the free room of `nodes` the holder needs (what it holds there already counts)."""
        hosts = self.topo.index.hosts
        for node in nodes:
            host = hosts.get(node)
            if host is None:
                continue
            need = self.needs.get(node)
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

    def usable_by(self, job: JobState) -> list[Reservation]:
        """The reservations whose room `job` may use: its own, and those it backfills."""
        out = []
        for res in self.held.values():
            if res.job == job.id or backfills(job, res, self.now):
                out.append(res)
        return out

    def open(self, job: JobState) -> list[str]:
        """Give `job` the room of the reservations it may use; returns the hosts opened (for `close`)."""
        opened: list[str] = []
        for res in self.usable_by(job):
            for node in res.nodes:
                held = self.taken.pop(node, None)
                if held:
                    self.topo.give(node, held)
                    opened.append(node)
        return opened

    def close(self, opened: list[str]) -> None:
        """Hold back again what is left of the hosts `open` gave."""
        self._close(opened)

    def held_gpus(self, job: JobState) -> int:
        """GPUs held back now on the reservations `job` may use (room it sees that others do not)."""
        if not self.held:
            return 0
        return sum(self.taken.get(n, {}).get("gpu", 0) for res in self.usable_by(job) for n in res.nodes)

    def own_verdict(self, job: JobState) -> bool:
        """Whether `job` sees room its class does not (so its verdict is its own, not its class's)."""
        if not self.held:
            return False
        if job.id in self.held:
            return True
        return job.max_runtime is not None and any(r.expected_start is not None for r in self.held.values())


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


class Plan(NamedTuple):
    """Where a job fits soonest: the hosts to hold, their domain, when, and the running jobs in the way."""

    nodes: list[str]
    domain: str
    expected_start: int | None
    waits_for: list[ExpectedEnd]
    needs: dict[str, dict[str, int]]


class Running(NamedTuple):
    """A running job's room per host, and when it ends by its declared limit (None: no limit)."""

    end: int | None
    seq: int
    job: str
    room: dict[str, dict[str, int]]


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
    queues = reserving_queues(state, idx)
    if not queues and not kept:
        return events
    holders = {res.job for res in kept}
    due = _due_jobs(state, idx, queues, holders, placed, now)
    if not kept and not due:
        return events
    running = _running(state, idx, now, placed)
    topo = idx.topology
    taken = {n for res in kept for n in res.nodes}
    slots = len(queues)
    for res in kept:
        job = state.jobs[res.job]
        gone = not all(_usable(state, n) for n in res.nodes)
        others = taken.difference(res.nodes)
        plan = plan_for(job, topo, running, others, now, fence.taken)
        if gone or (plan is not None and _sooner(state, plan, res, now)):
            # its hosts left, or room comes back sooner elsewhere: the same holder is reserved for there
            events.append(ReservationReleased(at=now, job=JobId(res.job), reason="replaced", cycle=cycle, epoch=epoch))
            taken = others
            if plan is None:
                continue
            events.append(_made(job, plan, res.reason, now, cycle, epoch))
            taken |= set(plan.nodes)
        if not _nominal(res):
            slots -= 1
    # as many reservations as queues make them (the guarantee's aside), to the longest waiting jobs
    for job, reason in due:
        if slots <= 0 and not reason.nominal:
            break
        plan = plan_for(job, topo, running, taken, now, fence.taken)
        if plan is None or not plan.waits_for:
            continue  # nowhere, or it fits now: what holds it back is not room that nodes could hold
        taken.update(plan.nodes)
        if not reason.nominal:
            slots -= 1
        events.append(_made(job, plan, reason.text, now, cycle, epoch))
    return events


def _sooner(state: ClusterState, plan: Plan, res: Reservation, now: int) -> bool:
    """Whether `plan` starts the holder sooner than its reservation will: an earlier known start, a known
    start where it has none, or, both unknown, fewer running jobs to wait for."""
    left = [w for w in res.waits_for if _still_running(state, w.job, res.since)]
    unknown = any(w.end is None for w in left)
    if plan.expected_start is None:
        return unknown and len(plan.waits_for) < len(left)
    if unknown:
        return True
    return plan.expected_start < max((w.end or now for w in left), default=now)


def _still_running(state: ClusterState, job_id: str, since: int) -> bool:
    """Whether a job a reservation made at `since` waits for is still in its way (the same run of it)."""
    job = state.jobs.get(job_id)
    return job is not None and job.status == "admitted" and (job.admitted_at or 0) <= since


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
            if after is None or now - since < after or not _own_room(idx, job, state.preemptible(job)):
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
    best: dict[str, tuple[tuple[int, int, int, int], JobState]] = {}
    for job_id in idx.group_of:  # the validated pending jobs, to try or parked
        job = state.jobs.get(job_id)
        if job is None or job.queue not in queues or job_id in placed or job.status != "pending":
            continue
        key = order_key(idx.priority(job), job.seq)
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
    """The running jobs (with those just admitted) in the order their room comes back: known ends first."""
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
    # known ends first, in order; then the jobs without a limit, in submission order
    out.sort(key=lambda r: (r.end is None, r.end or 0, r.seq))
    return out


def plan_for(
    job: JobState,
    topo: TopologyIndex,
    running: list[Running],
    taken: set[str],
    now: int,
    held: Mapping[str, Mapping[str, int]],
) -> Plan | None:
    """The domain where `job` fits soonest, and the fewest of its hosts that hold it then (None: nowhere).

    `taken`: hosts other reservations hold; `held`: room the cycle's fence holds back (free, for the plan).
    """
    level = next((ps.topology.required for ps in job.podsets if ps.topology and ps.topology.required), None)
    depth = topo.level_depth(level) if level is not None else None
    domains = topo.by_level[depth - 1] if depth is not None else [topo.root]
    best: tuple[tuple[object, ...], Plan] | None = None
    for dom in domains:
        plan = _plan_in(job, dom, running, taken, now, held)
        if plan is None:
            continue
        score = (plan.expected_start is None, plan.expected_start or 0, len(plan.waits_for), dom.path)
        if best is None or score < best[0]:
            best = (score, plan)
    return best[1] if best is not None else None


def _plan_in(
    job: JobState,
    dom: Domain,
    running: list[Running],
    taken: set[str],
    now: int,
    held: Mapping[str, Mapping[str, int]],
) -> Plan | None:
    """When and on which of the domain's hosts the job fits soonest, the running jobs' room coming back
    in `running`'s order."""
    hosts = [dom] if dom.is_host else dom.hosts
    room = {h.name: dict(h.host_free) for h in hosts if h.schedulable and h.name not in taken}
    if not room:
        return None
    _give(room, {n: r for n, r in held.items() if n in room})
    need = job.gpus
    gpus = sum(r.get("gpu", 0) for r in room.values())
    chosen = _fit(job, room) if gpus >= need else None
    freed: list[Running] = []
    for r in running:
        if chosen is not None:
            break
        mine = {n: req for n, req in r.room.items() if n in room}
        if mine:
            _give(room, mine)
            freed.append(r)
            gpus += sum(req.get("gpu", 0) for req in mine.values())
            if gpus >= need:  # fewer free GPUs than it asks for cannot hold it: no need to try
                chosen = _fit(job, room)
    if chosen is None:
        return None
    waits = [r for r in freed if any(n in chosen for n in r.room)]
    unknown = any(r.end is None for r in waits)
    start = None if unknown else max((r.end or now for r in waits), default=now)
    return Plan(
        nodes=sorted(chosen),
        domain="/".join(dom.path),
        expected_start=start,
        waits_for=[ExpectedEnd(job=JobId(r.job), end=r.end) for r in waits],
        needs=chosen,
    )


def _give(room: dict[str, dict[str, int]], rooms: Mapping[str, Mapping[str, int]]) -> None:
    for n, req in rooms.items():
        host = room[n]
        for k, v in req.items():
            host[k] = host.get(k, 0) + v


def _fit(job: JobState, room: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]] | None:
    """What a greedy fill, roomiest host first, puts on each host (None: the job does not fit)."""
    left = {n: dict(r) for n, r in room.items()}
    used: dict[str, dict[str, int]] = {}
    for ps in job.podsets:
        need = ps.count
        wanted = [(k, v) for k, v in ps.requests.items() if v > 0]
        if not wanted:
            continue  # pods that ask for nothing fit anywhere
        slots = {n: min(free.get(k, 0) // v for k, v in wanted) for n, free in left.items()}
        for name in sorted(left, key=lambda n: (-slots[n], n)):
            n = min(slots[name], need)
            if n <= 0:
                break
            on = used.setdefault(name, {})
            for k, v in wanted:
                left[name][k] -= v * n
                on[k] = on.get(k, 0) + v * n
            need -= n
        if need > 0:
            return None
    return used
