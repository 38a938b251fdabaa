"""Where and when a waiting gang fits soonest: the plan a reservation holds (`reservations`).

A plan replays the cluster forward: each domain's free room (with what the
cycle's fence holds back counted as free, since the plan is for the one the
room is held for), less what the reservations *ahead* of it will take there,
then the room of the running jobs and of those reservations' holders coming
back at their declared ends, known ends first (then the unknown ones, the running
jobs' before the holders': `comes_back`). The job's start is the latest
end it had to wait for on the hosts it would take; a job without a limit in
its way makes it unknown (None). A reservation ahead stands like a running job
whose holder takes its `needs` from now until its own expected start plus its
limit: that is what lets a second gang be reserved for behind the first on the
same nodes (stacking), and the room it will take there is never promised to two.

Pure and deterministic: plans are a function of the topology, the running
jobs and the reservations, all folded from the log.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from muster.events.types import ExpectedEnd, JobId
from muster.projections.state import JobState, Reservation
from muster.projections.topology import Domain, TopologyIndex


class Plan(NamedTuple):
    """Where a job fits soonest: the hosts to hold, their domain, when, and the jobs in the way."""

    nodes: list[str]
    domain: str
    expected_start: int | None
    waits_for: list[ExpectedEnd]
    needs: dict[str, dict[str, int]]


class Running(NamedTuple):
    """Room per host that comes back at `end` (None: unknown): a running job's, or a reservation's ahead
    (its holder's, once it has run to its limit)."""

    end: int | None
    seq: int
    job: str
    room: dict[str, dict[str, int]]
    ahead: bool = False
    """A reservation's holder, not started yet: with an unknown end, after every running job's (`comes_back`)."""


class Replanned(NamedTuple):
    """A held reservation as it was last planned again, and the fold's `gpus_freed` then (`reservations`)."""

    res: Reservation
    freed: int


def comes_back(r: Running) -> tuple[bool, int, bool, int]:
    """The order room comes back in: known ends first, by end, then by submission; then the unknown ends,
    the running jobs' first (a holder that has not started cannot end before a job that runs), each by
    submission."""
    if r.end is not None:
        return False, r.end, False, r.seq
    return True, 0, r.ahead, r.seq


def plan_for(
    job: JobState,
    topo: TopologyIndex,
    running: list[Running],
    ahead: list[Running],
    excluded: set[str],
    now: int,
    held: Mapping[str, Mapping[str, int]],
) -> Plan | None:
    """The domain where `job` fits soonest, and the fewest of its hosts that hold it then (None: nowhere).

    `running`: in `comes_back` order; `ahead`: the reservations it queues behind (any order); `excluded`:
    hosts it may not be planned on; `held`: room the cycle's fence holds back (free, for the plan).
    """
    level = next((ps.topology.required for ps in job.podsets if ps.topology and ps.topology.required), None)
    depth = topo.level_depth(level) if level is not None else None
    domains = topo.by_level[depth - 1] if depth is not None else [topo.root]
    queue = sorted(ahead, key=comes_back)
    best: tuple[tuple[object, ...], Plan] | None = None
    for dom in domains:
        plan = _plan_in(job, dom, running, queue, excluded, now, held)
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
    ahead: list[Running],
    excluded: set[str],
    now: int,
    held: Mapping[str, Mapping[str, int]],
) -> Plan | None:
    """When and on which of the domain's hosts the job fits soonest, room coming back in `comes_back` order."""
    hosts = [dom] if dom.is_host else dom.hosts
    room = {h.name: dict(h.host_free) for h in hosts if h.schedulable and h.name not in excluded}
    if not room:
        return None
    _add(room, ((n, r) for n, r in held.items() if n in room), 1)
    # what the reservations ahead will take is not this job's, until their holders end (it may go below 0)
    _add(room, ((n, req) for a in ahead for n, req in a.room.items() if n in room), -1)
    need = job.gpus
    gpus = sum(r.get("gpu", 0) for r in room.values())
    chosen = _fit(job, room) if gpus >= need else None
    freed: list[Running] = []
    for r in heapq.merge(running, ahead, key=comes_back) if ahead else running:
        if chosen is not None:
            break
        mine = {n: req for n, req in r.room.items() if n in room}
        if mine:
            _add(room, mine.items(), 1)
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


def _add(room: dict[str, dict[str, int]], rooms: Iterable[tuple[str, Mapping[str, int]]], sign: int) -> None:
    for n, req in rooms:
        host = room[n]
        for k, v in req.items():
            host[k] = host.get(k, 0) + sign * v


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
