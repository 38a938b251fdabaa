"""What running jobs hold per topology domain: the room a victim search's bounds count as freed.

Kept per job for as long as its placement stands (a running job's placement is
replaced, not changed, when it runs again, so the placement object is the
key's check), and per set of jobs summed (`freed_room`); `SummedRoom` is the
same answer added up by whole (queue, priority) classes (`holdings`). Each
cache is bounded (then starts afresh): a long-running daemon's index outlives
many jobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from muster.projections.cluster import node_pods
from muster.projections.state import JobState

if TYPE_CHECKING:
    from muster.projections.topology import Domain

_FREED_KEPT = 4096
"""How many answers `freed_room` keeps (then it starts afresh)."""
_PER_JOB_KEPT = 1 << 16
"""How many answers each per-job cache (`room_by_domain`, `gpus_on_hosts`, `pods_freed`) keeps, then it
starts afresh: they are keyed by job, and a long-running daemon's index outlives many jobs."""


class HeldRoom:
    """What running jobs hold per domain and per host, kept per job and per set of jobs (see the module
    docstring)."""

    def __init__(self, hosts: Mapping[str, Domain]) -> None:
        self.hosts = hosts
        self._rooms: dict[tuple[str, int], _Room] = {}
        """(job, depth) -> what it holds per domain (`room_by_domain`)."""
        self._freed: dict[tuple[int, frozenset[int]], _FreedRoom] = {}
        """(depth, ids of the placements summed) -> `freed_room`'s answer (see there)."""
        self._on_hosts: dict[str, _OnHosts] = {}
        """job -> its GPUs per host (`gpus_on_hosts`)."""
        self._pods: dict[tuple[str, int, int], _Pods] = {}
        """(job, depth, GPUs per pod) -> `pods_freed`'s answer."""

    def freed_room(self, freed: Iterable[JobState], depth: int) -> dict[Domain, dict[str, int]]:
        """What the running jobs `freed` hold per domain at `depth`, added up.

        Answers are kept by the set of placements summed (a few thousand, then forgotten): every
        victim search of a preemptor bounds the room of its candidates (`could_hold`), then its wake
        asks what they leave each domain short of (`room_short`), and the preemptors of a queue find
        the same candidates, in an order that moves with time, until a job of theirs comes or goes.
        A kept answer holds its placements, so their ids stay theirs (a running job's placement is
        replaced, not changed, when it runs again).
        """
        placements = [job.placement for job in freed]
        key = (depth, frozenset(map(id, placements)))
        known = self._freed.get(key)
        if known is not None:
            return known.by_domain
        extra: dict[Domain, dict[str, int]] = {}
        for job in freed:
            for dom_id, amounts in self.room_by_domain(job, depth).items():
                more = extra.setdefault(dom_id, {})
                for k, v in amounts.items():
                    more[k] = more.get(k, 0) + v
        if len(self._freed) >= _FREED_KEPT:
            self._freed.clear()
        self._freed[key] = _FreedRoom(placements, extra)
        return extra

    def room_by_domain(self, job: JobState, depth: int) -> dict[Domain, dict[str, int]]:
        """What a running job holds per domain at `depth`, for as long as its placement stands.

        Hosts out of service count too: more room than evicting gives only weakens `could_hold`'s bound.
        """
        key = (job.id, depth)
        known = self._rooms.get(key)
        if known is not None and known.placement is job.placement:
            return known.by_domain
        by_domain: dict[Domain, dict[str, int]] = {}
        for name, pods, pod_req in node_pods(job.podsets, job.placement):
            host = self.hosts.get(name)
            if host is None:
                continue
            amounts = by_domain.setdefault(host.chain[-(depth + 1)], {})
            for k, v in pod_req.items():
                if v > 0:
                    amounts[k] = amounts.get(k, 0) + v * pods
        if len(self._rooms) >= _PER_JOB_KEPT:
            self._rooms.clear()
        self._rooms[key] = _Room(job.placement, by_domain)
        return by_domain

    def gpus_on_hosts(self, job: JobState) -> list[tuple[Domain, int]]:
        """The GPUs a running job holds on each host it runs on (in or out of service), for as long as its
        placement stands (a victim walk takes and gives back the same candidates again and again)."""
        known = self._on_hosts.get(job.id)
        if known is not None and known.placement is job.placement:
            return known.hosts
        held: dict[str, int] = {}
        for name, pods, pod_req in node_pods(job.podsets, job.placement):
            gpus = pod_req.get("gpu", 0) * pods
            if gpus > 0 and name in self.hosts:
                held[name] = held.get(name, 0) + gpus
        hosts = [(self.hosts[name], gpus) for name, gpus in held.items()]
        if len(self._on_hosts) >= _PER_JOB_KEPT:
            self._on_hosts.clear()
        self._on_hosts[job.id] = _OnHosts(job.placement, hosts)
        return hosts

    def pods_freed(self, job: JobState, depth: int, gpu: int) -> dict[Domain, int]:
        """At most how many more pods of `gpu` GPUs each domain at `depth` (0: the cluster) holds once a running
        job is evicted: per host it runs on, its GPUs there over `gpu`, rounded up (what it gives back to a host
        adds at most that many, whatever the host had free), added up per domain (`Freeing.may_place_with`)."""
        key = (job.id, depth, gpu)
        known = self._pods.get(key)
        if known is not None and known.placement is job.placement:
            return known.by_domain
        if len(self._pods) >= _PER_JOB_KEPT:
            self._pods.clear()
        by_domain: dict[Domain, int] = {}
        for host, g in self.gpus_on_hosts(job):
            dom = host.chain[-(depth + 1)]
            by_domain[dom] = by_domain.get(dom, 0) - (-g // gpu)
        self._pods[key] = _Pods(job.placement, by_domain)
        return by_domain


_MOVES_KEPT = 1024
"""How many moves a `MoveLog` keeps: a sum further behind is added up afresh when next asked."""


class Moved(NamedTuple):
    """One running job counted into a class (`sign` 1) or taken out of it (-1), by its GPUs per domain."""

    rooms: tuple[dict[Domain, int], ...]
    """Per depth (0 = the cluster), its GPUs per domain: `holdings.Part.rooms`."""
    sign: int


class MoveLog:
    """A class's moves in order (`holdings.Holding.move`), so that its kept sums catch up only when asked: of
    the sums a class is part of, most are not asked again before its next job comes or goes (in bench (c),
    one move in seven is ever read)."""

    __slots__ = ("end", "moves", "start")

    def __init__(self) -> None:
        self.moves: list[Moved] = []
        self.start = 0
        """How many moves were dropped before `moves[0]` (the log is bounded: `_MOVES_KEPT`)."""
        self.end = 0
        """How many moves were logged (a sum asks it of each of its classes at every ask)."""

    def append(self, moved: Moved) -> None:
        if len(self.moves) >= _MOVES_KEPT:
            self.start += len(self.moves)
            self.moves = []
        self.moves.append(moved)
        self.end += 1


class SummedRoom:
    """GPUs running jobs hold per domain, added up by whole classes of them (`holdings`): what a victim
    search's bounds read instead of a list of its candidates.

    Worked out per depth when first asked, then moved by its classes' moves (`MoveLog`) when asked again,
    not at every move: a sum nobody asks for costs nothing."""

    __slots__ = ("added", "logs", "parts", "seen")

    def __init__(self, parts: list[list[dict[Domain, int]]], logs: list[MoveLog] | None = None) -> None:
        self.parts = parts
        """Per class, per depth (0 = the cluster): GPUs per domain, the classes' own (always current)."""
        self.logs = logs or []
        """Per class, its moves (none: a sum read at once, never moved)."""
        self.seen = [log.end for log in self.logs]
        """Per class, how many of its moves `added` counts."""
        self.added: dict[int, dict[Domain, dict[str, int]]] = {}
        """Per depth, `by_domain`'s answer once asked (moved with the classes' jobs: `_catch_up`)."""

    def _catch_up(self) -> None:
        """Move what `by_domain` worked out by the classes' moves since (afresh when a log dropped some)."""
        added, seen = self.added, self.seen
        for i, log in enumerate(self.logs):
            at, end = seen[i], log.end
            if at == end:
                continue
            seen[i] = end
            if at < log.start:
                added.clear()  # moves it missed were dropped: `by_domain` adds the classes up again
                continue
            if added:
                for moved in log.moves[at - log.start :]:
                    self._move(moved)

    def _move(self, moved: Moved) -> None:
        """Move the sums by one job's GPUs per domain at every depth worked out."""
        rooms, sign = moved
        for depth, out in self.added.items():
            for dom, gpus in rooms[depth].items():
                more = out.get(dom)
                if more is None:
                    out[dom] = {"gpu": sign * gpus}
                    continue
                more["gpu"] += sign * gpus
                if not more["gpu"]:
                    del out[dom]  # as `by_domain` leaves out a domain where none is held

    def by_domain(self, depth: int) -> dict[Domain, dict[str, int]]:
        """GPUs per domain at `depth`, shaped as `HeldRoom.freed_room`'s answer (not to
        be changed: it is kept, and moved when asked again)."""
        if self.logs:
            self._catch_up()
        known = self.added.get(depth)
        if known is not None:
            return known
        out: dict[Domain, dict[str, int]] = {}
        self.added[depth] = out
        for rooms in self.parts:
            for dom, gpus in rooms[depth].items():
                more = out.get(dom)
                if more is None:
                    out[dom] = {"gpu": gpus}
                else:
                    more["gpu"] += gpus
        return out


class _FreedRoom(NamedTuple):
    """`freed_room`'s answer for a set of running jobs, with their placements (held, so that their ids
    stay their own while the answer is kept)."""

    placements: list[dict[str, str]]
    by_domain: dict[Domain, dict[str, int]]


class _Pods(NamedTuple):
    """`pods_freed`'s answer for a running job, as placed by `placement` (the job's own dict)."""

    placement: Mapping[str, str]
    by_domain: dict[Domain, int]


class _OnHosts(NamedTuple):
    """A running job's GPUs per host, as placed by `placement` (the job's own dict)."""

    placement: Mapping[str, str]
    hosts: list[tuple[Domain, int]]


class _Room(NamedTuple):
    """A running job's room per domain of one level, as placed by `placement` (the job's own dict)."""

    placement: Mapping[str, str]
    by_domain: dict[Domain, dict[str, int]]
