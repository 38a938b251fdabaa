"""Whether one GPU-only podset would fit were a set of running jobs evicted, without moving the index.

A victim walk (`preemption`) takes and gives back candidates one at a time and
asks after each whether the gang would now fit; `Freeing` answers at the cost
of the hosts that candidate runs on, reading the topology index's histograms
and per-job held room (`held`), never changing them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from muster.projections import placement
from muster.projections.state import JobState

if TYPE_CHECKING:
    from muster.projections.topology import Domain, TopologyIndex


class FreeingMark(NamedTuple):
    """What a `Freeing`'s evicted set frees, as `Freeing.mark` found it (`Freeing.rollback` puts it back)."""

    on_host: dict[str, int]
    free: int
    slots: int
    gained: dict[int, int]
    fitting: int


class Freeing:
    """Whether one GPU-only podset would fit were a set of running jobs evicted, kept as jobs join and leave
    the set without moving the index (`TopologyIndex.freeing`): a victim walk asks after every candidate it
    takes or gives back, at the cost of the hosts that one runs on, not of an eviction and a placement.

    Exact, what evicting the jobs and asking `Cycle.could_place` and `can_place` says: a domain holds the sum
    over its schedulable hosts of their free GPUs // the pod's GPUs (what `slots` reads off the histograms),
    so only the hosts the jobs run on move. With a required level one of its domains must hold every pod;
    without, the pods may spread (one domain that holds them all is a spread too), so the cluster's count
    decides (`placement._plan`). The index must not move while a `Freeing` is asked.
    """

    __slots__ = (
        "base",
        "count",
        "depth",
        "fitting",
        "free",
        "gained",
        "gpu",
        "held",
        "index",
        "on_host",
        "room",
        "slots",
    )

    def __init__(self, index: TopologyIndex, count: int, gpu: int, depth: int, required: bool) -> None:
        self.index = index
        self.count = count
        self.gpu = gpu
        self.depth = depth
        """Depth of the required level's domains (0: none required, the cluster counts)."""
        self.on_host: dict[str, int] = {}
        """GPUs the set frees per host (by name)."""
        self.free = 0
        """Free GPUs the cluster gains (as `gpu_free_total` would)."""
        self.slots = 0
        """Pods the cluster gains room for."""
        self.gained: dict[int, int] = {}
        """Pods each domain of the required level (by `id`) gains room for."""
        self.base: dict[int, int] = {}
        """Pods each of those domains holds before (counted up to `count`)."""
        self.fitting = 0
        """How many of those domains hold every pod with the set evicted."""
        req = {"gpu": gpu}
        if required:
            need = [("gpu", gpu * count)]
            self.held = any(index.slots(d, req, count) >= count for d in placement.roomy_domains(index, depth, need))
            """Whether some domain holds every pod already (then it still does, whatever is evicted)."""
        else:
            self.depth = 0
            self.held = False
        self.room = 0 if required else index.slots(index.root, req, count)
        """Without a required level: pods the cluster holds before (counted up to `count`)."""

    def move(self, job: JobState, sign: int) -> None:
        """Add a running job to the evicted set (`sign` 1), or take it back out of it (-1)."""
        gpu, count, depth, on_host = self.gpu, self.count, self.depth, self.on_host
        for host, g in self.index.held.gpus_on_hosts(job):
            if not host.schedulable:
                continue  # giving back to a host out of service adds no room (`TopologyIndex.adjust`)
            name = host.name
            freed = on_host.get(name, 0)
            on_host[name] = freed + sign * g
            # only room above zero counts: an over-committed host has none, however far below it is
            before = host.host_free.get("gpu", 0) + freed
            after = before + sign * g
            if before < 0:
                before = 0
            if after < 0:
                after = 0
            self.free += after - before
            more = after // gpu - before // gpu
            if not more:
                continue
            self.slots += more
            if depth:
                dom = host.chain[-(depth + 1)]
                key = id(dom)
                had = self.gained.get(key)
                if had is None:
                    had = 0
                    self.base[key] = self.index.slots(dom, {"gpu": gpu}, count)
                base = self.base[key]
                self.gained[key] = had + more
                self.fitting += (base + had + more >= count) - (base + had >= count)

    def mark(self) -> FreeingMark:
        """The evicted set as it stands, for `rollback`: copying what it frees costs the hosts it frees on,
        giving back a long run of jobs one by one costs every host each of them runs on."""
        return FreeingMark(dict(self.on_host), self.free, self.slots, dict(self.gained), self.fitting)

    def rollback(self, mark: FreeingMark) -> None:
        """Put the evicted set back as it was at `mark` (what `move(job, -1)` of each job taken since does).

        A host or domain no job freed on before `mark` is dropped, not left at 0: both read as 0. `base` is
        kept: a domain's count before the set is evicted holds while the index does not move. The mark's
        dicts become the set's own: a mark is rolled back to once."""
        self.on_host, self.gained = mark.on_host, mark.gained
        self.free, self.slots, self.fitting = mark.free, mark.slots, mark.fitting

    def may_place_with(self, jobs: list[JobState]) -> bool:
        """Whether the pods might fit were `jobs` taken too (False: they would not), from what each job gives
        back at most per domain (`HeldRoom.pods_freed`), not host by host: a bound, for a walk to ask
        before taking every job of its rest (True: take them and ask `places`)."""
        index, depth, gpu, count = self.index, self.depth, self.gpu, self.count
        if self.held or self.fitting > 0:
            return True
        if not depth:
            freed = sum(index.held.pods_freed(j, 0, gpu).get(index.root, 0) for j in jobs)
            return self.room + self.slots + freed >= count
        bound: dict[Domain, int] = {}
        for job in jobs:
            for dom, pods in index.held.pods_freed(job, depth, gpu).items():
                bound[dom] = bound.get(dom, 0) + pods
        for dom, pods in bound.items():
            key = id(dom)
            base = self.base.get(key)
            if base is None:
                base = self.base[key] = index.slots(dom, {"gpu": gpu}, count)
            if base + self.gained.get(key, 0) + pods >= count:
                return True
        return False

    def could_place(self, gpus: int) -> bool:
        """`Cycle.could_place` with the set evicted: the cluster's free GPUs cover a gang of `gpus`."""
        return gpus <= self.index.gpu_free_total + self.free

    def places(self) -> bool:
        """Whether `can_place` would find nodes for the pods with the set evicted."""
        if self.depth:
            return self.held or self.fitting > 0
        return self.room + self.slots >= self.count
