"""What a cycle's reservations hold back, and who may use it: the `Fence` (rules: docs/spec/scenario.md).

- What it holds back: on each reserved host, the free room up to what the
  holders' pods will take there; every job sees it as taken but the holder
  and, on their own reserved hosts, the holders whose plans counted it
  ahead (`Fence.behind`, the order plans were made in), unless its own
  declared limit ends by the expected start (backfill). With an unknown start (some
  job in the way declared no limit) nothing backfills; a job without a
  limit never does. A preemptor evicts nothing on a host whose held room
  it may not use (`Fence.spared`).

A reservation holds room from the cycle after it is made for as long as its
holder is a pending job, not held (`in_force`). Within a cycle the held room
only shrinks, as admissions shrink it: a holder admitted in the cycle holds
nothing more (`Fence.release`). Which reservations are made, moved and
released, and where, is `reservations`'; the fence is built at the start of
every cycle from `state.reservations` (folded from those events) and `now`,
so what a cycle holds back is a function of the log.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from muster.events.types import PreemptionPolicy
from muster.projections.state import ClusterState, JobState, NodeState, Reservation
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
        reservation held when it is made but those waiting for its holder (`reservations`), so this is the order the
        plans assumed, and no two holders each keep the other out."""
        known = self._behind.get(job_id)
        if known is not None:
            return known
        waiting = waiting_on(self.held, job_id)
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


def waiting_on(current: Mapping[str, Reservation], job_id: str) -> set[str]:
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
    """The holders `job_id`'s reservation waits for, directly or through others (the other way from `waiting_on`)."""
    waited: set[str] = set()
    todo = [job_id]
    while todo:
        res = current.get(todo.pop())
        for w in res.waits_for if res is not None else ():
            if w.job in current and w.job not in waited and w.job != job_id:
                waited.add(w.job)
                todo.append(w.job)
    return waited
