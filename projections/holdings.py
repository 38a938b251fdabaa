"""What the running jobs of each queue hold, by priority: the sums a victim search reads before listing anyone.

A victim search for a GPU-only gang takes its candidates from whole (queue,
priority) classes of running jobs (`candidates.list_candidates`: the rule,
`eviction.may_evict`, depends on a candidate's queue and priority, and on its
submission order only for equal priorities in the preemptor's own queue). When
the nodes could not hold the gang even with every candidate evicted, no victim
set places it, whatever their order; that is answered here from sums, in
O(classes x domains they run in), instead of listing, ordering and adding up
every candidate (about 450 near the end of bench (c)'s run, at every try).

Kept by the index (`SchedulerIndex._track`/`_untrack`) for the running set it
tracks, so it is a function of the state like the rest of the index: for each
(queue, priority) the preemptible running jobs that hold GPUs, their requests
added up, and their GPUs per topology domain at every depth (as
`HeldRoom.room_by_domain` counts them). A job's own part is kept with it,
so taking it out subtracts exactly what was added, whatever its state says by
then.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from muster.projections.cluster import node_pods
from muster.projections.held import Moved, MoveLog, SummedRoom
from muster.projections.state import JobState
from muster.projections.topology import Domain, TopologyIndex

_SUMS_KEPT = 256
"""How many sums `Holdings.room` keeps (then it starts afresh)."""

Class = tuple[str, int]
"""(queue, priority) of running jobs."""


class Part(NamedTuple):
    """One running job's part of its class's sums."""

    cls: Class
    requests: Mapping[str, int]
    rooms: tuple[dict[Domain, int], ...]
    """Per depth (0 = the cluster), its GPUs per domain."""


class Holding:
    """The sums of one (queue, priority) class of running jobs."""

    __slots__ = ("jobs", "log", "requests", "rooms")

    def __init__(self, depths: int) -> None:
        self.jobs = 0
        self.requests: dict[str, int] = {}
        self.rooms: list[dict[Domain, int]] = [{} for _ in range(depths)]
        """Per depth, GPUs per domain; domains at zero are dropped."""
        self.log = MoveLog()
        """Its moves, for the kept sums it is part of to catch up with (`SummedRoom`)."""

    def move(self, part: Part, sign: int) -> None:
        self.jobs += sign
        self.log.append(Moved(part.rooms, sign))
        for r, v in part.requests.items():
            self.requests[r] = self.requests.get(r, 0) + sign * v
        for room, own in zip(self.rooms, part.rooms, strict=True):
            for dom, gpus in own.items():
                left = room.get(dom, 0) + sign * gpus
                if left:
                    room[dom] = left
                else:
                    del room[dom]


class Holdings:
    """Per queue and priority, what its preemptible running GPU jobs hold (see the module docstring)."""

    def __init__(self, topology: TopologyIndex) -> None:
        self.topology = topology
        self.depths = len(topology.levels) + 1
        self.by_queue: dict[str, dict[int, Holding]] = {}
        self.parts: dict[str, Part] = {}
        self._classes: dict[str, list[tuple[int, Holding]]] = {}
        """Per queue, `classes`' answer (not to be changed), kept until a class of it is made or emptied."""
        self._rooms: dict[tuple[int, ...], SummedRoom] = {}
        """`room`'s sums by their classes (by the `id` of their logs, which a sum holds: a class made anew
        has a log, and sums, of its own)."""

    def add(self, job: JobState, priority: int) -> None:
        """Count a running preemptible job of `priority` (one that holds no GPU is no GPU gang's candidate)."""
        if job.requests.get("gpu", 0) <= 0 or job.id in self.parts:
            return
        # what `HeldRoom.room_by_domain` counts at each depth, in one pass over its nodes
        hosts = self.topology.hosts
        rooms: tuple[dict[Domain, int], ...] = tuple({} for _ in range(self.depths))
        for name, pods, pod_req in node_pods(job.podsets, job.placement):
            host = hosts.get(name)
            gpus = pod_req.get("gpu", 0) * pods
            if host is None or gpus <= 0:
                continue
            chain = host.chain
            for depth, room in enumerate(rooms):
                dom = chain[-(depth + 1)]
                room[dom] = room.get(dom, 0) + gpus
        part = Part((job.queue, priority), dict(job.requests), rooms)
        self.parts[job.id] = part
        holding = self.by_queue.setdefault(job.queue, {}).get(priority)
        if holding is None:
            holding = self.by_queue[job.queue][priority] = Holding(self.depths)
            self._classes.pop(job.queue, None)
        holding.move(part, 1)

    def discard(self, job_id: str) -> None:
        """Take a job out (it stopped running, or changed), by the part it was counted with."""
        part = self.parts.pop(job_id, None)
        if part is None:
            return
        queue, priority = part.cls
        by_prio = self.by_queue[queue]
        holding = by_prio[priority]
        holding.move(part, -1)
        if holding.jobs == 0:
            del by_prio[priority]  # its sums are not asked again (a class made anew has a log of its own)
            self._classes.pop(queue, None)

    def holds(self, job_id: str, holdings: list[Holding]) -> bool:
        """Whether a running job is counted in one of `holdings`."""
        part = self.parts.get(job_id)
        if part is None:
            return False
        queue, priority = part.cls
        mine = self.by_queue[queue][priority]
        return any(h is mine for h in holdings)

    def room(self, holdings: list[Holding]) -> SummedRoom:
        """The GPUs of `holdings` per domain, for `TopologyIndex.could_hold` and `room_short`: kept (the searches
        of a cycle, and of the cycles after it, ask for the same classes again and again), and moved by their
        jobs' moves when asked again (`SummedRoom`)."""
        key = tuple(id(h.log) for h in holdings)
        room = self._rooms.get(key)
        if room is None:
            if len(self._rooms) >= _SUMS_KEPT:
                self._rooms.clear()
            room = self._rooms[key] = SummedRoom([h.rooms for h in holdings], [h.log for h in holdings])
        return room

    def classes(self, queue: str) -> list[tuple[int, Holding]]:
        """A queue's classes with running jobs, lowest priority first (victim order's)."""
        known = self._classes.get(queue)
        if known is None:
            by_prio = self.by_queue.get(queue)
            known = self._classes[queue] = sorted(by_prio.items()) if by_prio else []
        return known


class Held:
    """What a set of (queue, priority) classes holds, added up: every candidate of a search, without listing them."""

    __slots__ = ("holdings",)

    def __init__(self, holdings: list[Holding]) -> None:
        self.holdings = holdings

    def requests(self) -> dict[str, int]:
        """Their requests added up (as a search adds up its candidates')."""
        out: dict[str, int] = {}
        for h in self.holdings:
            for r, v in h.requests.items():
                out[r] = out.get(r, 0) + v
        return out
