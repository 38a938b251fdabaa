"""The index of free room over the cluster's nodes in network domains (placement walks it: `placement`).

The index is a tree: root -> one domain per value of each topology level
(outermost first, e.g. block then rack) -> hosts. Every domain keeps the free
capacity of its schedulable hosts and a histogram of their free GPUs, so the
number of pods of a GPU-only request a domain can hold (`slots`) is computed
without visiting its hosts. It also answers what running jobs would leave
free were they evicted (`could_hold`, `room_short`), for the victim search
and the wake rule.

The index is mutated only inside a `Transaction`, whose undo log puts every
change back. A cycle's own log is put back lazily (`Transaction.defer`): at
the next sync (`settle`), only for the nodes whose state did not change since;
a node the fold changed (the cycle's admissions and evictions, once folded) is
set from its state instead, so an admission's nodes are not undone and then
redone. Invariant: after a sync, every host's free capacity equals
capacity - reserved - used of its node in the cluster state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from muster.projections import placement
from muster.projections.flavors import MARKER, node_markers
from muster.projections.freeing import Freeing
from muster.projections.held import HeldRoom, SummedRoom
from muster.projections.resources import undoing
from muster.projections.state import ClusterState, JobState, NodeState

HOST = "host"
_SHORT_KEPT = 4096
"""How many answers `room_short` keeps (then it starts afresh)."""
_MAX_GPU_BUCKET = 64


class Domain:
    """A topology domain (or a host, at the innermost level)."""

    __slots__ = (
        "chain",
        "children",
        "depth",
        "free",
        "hist",
        "host_free",
        "hosts",
        "is_host",
        "name",
        "parent",
        "path",
        "schedulable",
    )

    def __init__(self, name: str, depth: int, parent: Domain | None, is_host: bool) -> None:
        self.name = name
        self.depth = depth
        self.parent = parent
        self.is_host = is_host
        self.children: list[Domain] = []
        self.hosts: list[Domain] = []
        self.free: dict[str, int] = {}
        """Sum of the free capacity of schedulable hosts below."""
        self.hist: list[int] = [0] * (_MAX_GPU_BUCKET + 1)
        """Number of schedulable hosts below by free GPUs (capped at the last bucket)."""
        self.host_free: dict[str, int] = {}
        """For a host: its free capacity, schedulable or not."""
        self.schedulable = True
        self.path: tuple[str, ...] = (*parent.path, name) if parent is not None else ()
        self.chain: list[Domain] = [self, *parent.chain] if parent is not None else [self]
        """This domain and its ancestors, innermost first."""


def _bucket(gpus: int) -> int:
    if gpus <= 0:
        return 0
    return gpus if gpus < _MAX_GPU_BUCKET else _MAX_GPU_BUCKET


class TopologyIndex:
    """Domains and hosts of the cluster, derived from `ClusterState.nodes`."""

    def __init__(self, state: ClusterState) -> None:
        self.levels: list[str] = list(state.levels)
        self.version = 0
        """Grows whenever a domain's free room moves (`_roomiest` keeps its order for one)."""
        self.max_bucket = 0
        """No host has more free GPUs than this: the GPU histograms are read up to here."""
        self.root = Domain("", 0, None, False)
        self.hosts: dict[str, Domain] = {}
        self.by_level: list[list[Domain]] = [[] for _ in range(len(self.levels) + 1)]
        self.markers: dict[str, dict[str, int]] = (
            {name: node_markers(state, node.labels) for name, node in state.nodes.items()} if state.flavors else {}
        )
        """Per node, the marker resources of its flavors (see `flavors`); flavors and labels change the structure."""
        self.flavor_hosts: dict[str, list[Domain]] = {}
        """Per flavor, its nodes' hosts (filled below)."""
        self.tainted = any(f.taints for f in state.flavors.values())
        """Whether some flavor has taints: a pod on no flavor then stays off its nodes."""
        index: dict[tuple[str, ...], Domain] = {(): self.root}
        for name in sorted(state.nodes):
            node = state.nodes[name]
            parent = self.root
            path: tuple[str, ...] = ()
            for depth, level in enumerate(self.levels, start=1):
                value = node.labels.get(level, "")
                path = (*path, value)
                dom = index.get(path)
                if dom is None:
                    dom = Domain(value, depth, parent, False)
                    index[path] = dom
                    parent.children.append(dom)
                    self.by_level[depth - 1].append(dom)
                parent = dom
            host = Domain(name, len(self.levels) + 1, parent, True)
            parent.children.append(host)
            self.by_level[len(self.levels)].append(host)
            self.hosts[name] = host
            for marker in self.markers.get(name, {}):
                self.flavor_hosts.setdefault(marker.removeprefix(MARKER), []).append(host)
            anc: Domain | None = parent
            while anc is not None:
                anc.hosts.append(host)
                anc = anc.parent
            self._set_host(host, node)
        for doms in self.by_level:
            doms.sort(key=lambda d: d.path)
        for dom in index.values():
            dom.children.sort(key=lambda d: d.path)
        self.gpu_free_total: int = self.root.free.get("gpu", 0)
        self.deferred: list[tuple[str, dict[str, int], int]] = []
        """The last cycle's tentative changes, not undone yet (`settle`)."""
        self._positions: dict[int, dict[Domain, int]] = {}
        """Per depth, each domain's place in `by_level` (`room_short`)."""
        self.held = HeldRoom(self.hosts)
        """What running jobs hold per domain and host (`could_hold`, `room_short`, `Freeing`)."""
        self._ranked: dict[int, _Ranked] = {}
        """Per depth, `_roomiest`'s order."""
        self._short: dict[tuple[int, int, int, int], _Short] = {}
        """(id of the freed room, depth, GPUs needed, domains kept) -> `room_short`'s answer for a listed set."""

    # ------------------------------------------------------------ host updates

    def settle(self, changed: set[str]) -> None:
        """Undo the deferred changes of the hosts not in `changed` (those `sync_node` sets from the state)."""
        if not self.deferred:
            return
        changes, self.deferred = undoing(self.deferred, changed), []
        for host, delta in changes.items():
            self.adjust(host, delta, 1)

    def level_depth(self, level: str) -> int | None:
        """Depth of a level's domains (1 = outermost); `host` is the innermost."""
        if level == HOST:
            return len(self.levels) + 1
        if level in self.levels:
            return self.levels.index(level) + 1
        return None

    def _set_host(self, host: Domain, node: NodeState) -> None:
        gpus = node.capacity.get("gpu", 0)
        if gpus > self.max_bucket:  # then its bucket is above the highest too (buckets cap at the last)
            self.max_bucket = _bucket(gpus)
        used, reserved = node.used, node.reserved
        free = {k: v - used.get(k, 0) - reserved.get(k, 0) for k, v in node.capacity.items()}
        if self.markers:
            free.update(self.markers.get(node.name, {}))
        if host.schedulable and node.schedulable and host.host_free.keys() <= free.keys():
            # the common case (usage moved): one walk up with the difference
            old = host.host_free
            delta: dict[str, int] = {}
            for k, v in free.items():
                moved = v - old.get(k, 0)
                if moved:
                    delta[k] = moved
            if delta:
                self.adjust(host.name, delta, 1)
            return
        self._replace_host(host, free, node.schedulable)

    def _replace_host(self, host: Domain, free: dict[str, int], schedulable: bool) -> None:
        if host.schedulable:
            self._contribute(host, host.host_free, -1)
        host.host_free = free
        host.schedulable = schedulable
        if schedulable:
            self._contribute(host, free, 1)

    def _contribute(self, host: Domain, free: Mapping[str, int], sign: int) -> None:
        self.version += 1
        # an over-committed host (capacity shrunk under its pods) adds no room, never less than none:
        # a domain's sum must bound what its hosts hold, or a plan trusts room its parts deny
        bucket = _bucket(free.get("gpu", 0))
        dom: Domain | None = host
        while dom is not None:
            dfree = dom.free
            for k, v in free.items():
                if v > 0:
                    dfree[k] = dfree.get(k, 0) + sign * v
            dom.hist[bucket] += sign
            dom = dom.parent

    def sync_node(self, state: ClusterState, name: str) -> None:
        host = self.hosts.get(name)
        node = state.nodes.get(name)
        if host is None or node is None:
            return
        self._set_host(host, node)
        self.gpu_free_total = self.root.free.get("gpu", 0)

    def adjust(self, host_name: str, delta: Mapping[str, int], sign: int) -> None:
        """Add `sign * delta` to a host's free capacity (used by transactions).

        The hot path of every tentative placement: the host's chain of domains
        is walked as a list, and the GPU histogram moves only if the bucket does.
        """
        host = self.hosts.get(host_name)
        if host is None:
            return
        free = host.host_free
        old_gpu = free.get("gpu", 0)
        signed: list[tuple[str, int]] = []  # what the domains see: the change of the room above zero
        for k, v in delta.items():
            before = free.get(k, 0)
            after = before + sign * v
            free[k] = after
            seen = (after if after > 0 else 0) - (before if before > 0 else 0)
            if seen:
                signed.append((k, seen))
        if not host.schedulable:
            return
        self.version += 1
        new_gpu = free.get("gpu", 0)
        old_bucket = 0 if old_gpu <= 0 else (old_gpu if old_gpu < _MAX_GPU_BUCKET else _MAX_GPU_BUCKET)
        new_bucket = 0 if new_gpu <= 0 else (new_gpu if new_gpu < _MAX_GPU_BUCKET else _MAX_GPU_BUCKET)
        moved = old_bucket != new_bucket
        for dom in host.chain:
            dfree = dom.free
            for k, d in signed:
                dfree[k] = dfree.get(k, 0) + d
            if moved:
                hist = dom.hist
                hist[old_bucket] -= 1
                hist[new_bucket] += 1
        self.gpu_free_total = self.root.free.get("gpu", 0)

    # ------------------------------------------------------------ capacity queries

    def free_total(self) -> dict[str, int]:
        return dict(self.root.free)

    def gpu_free_on(self, flavor: str) -> int:
        """The free GPUs of a flavor's schedulable nodes."""
        return sum(max(0, h.host_free.get("gpu", 0)) for h in self.flavor_hosts.get(flavor, ()) if h.schedulable)

    @staticmethod
    def host_slots(host: Domain, req: Mapping[str, int], cap: int) -> int:
        if not host.schedulable:
            return 0
        free = host.host_free
        best = cap
        for k, v in req.items():
            if v <= 0:
                continue
            n = free.get(k, 0) // v
            if n < best:
                best = n
                if best <= 0:
                    return 0
        return best

    def slots(self, dom: Domain, req: Mapping[str, int], cap: int) -> int:
        """How many pods of `req` fit in `dom` (counting at most `cap`)."""
        if dom.is_host:
            return self.host_slots(dom, req, cap)
        dfree = dom.free
        upper = cap
        for k, v in req.items():
            if v > 0:
                n = dfree.get(k, 0) // v
                if n < upper:
                    upper = n
        if upper <= 0:
            return 0
        gpu = req.get("gpu", 0)
        if gpu > 0 and (len(req) == 1 or all(v <= 0 for k, v in req.items() if k != "gpu")):
            total = 0
            hist = dom.hist
            for g in range(gpu, self.max_bucket + 1):
                c = hist[g]
                if c:
                    total += c * (g // gpu)
                    if total >= upper:
                        return upper
            if hist[_MAX_GPU_BUCKET]:
                # hosts with more GPUs than the last bucket: count them exactly
                total = sum(self.host_slots(h, req, upper) for h in dom.hosts)
            return min(total, upper)
        total = 0
        for h in dom.hosts:
            total += self.host_slots(h, req, upper)
            if total >= upper:
                return upper
        return total

    def could_hold(
        self, count: int, req: Mapping[str, int], level: str | None, freed: Iterable[JobState] | SummedRoom
    ) -> bool:
        """Whether some domain of `level` (None: the cluster) has the free capacity for `count` pods of `req`
        were the running jobs `freed` (say every candidate victim, or their classes' sums for a GPU-only
        request: those count GPUs alone) evicted first.

        Free capacity only bounds what `place` finds, so False means that `place`
        fails on this view with any of `freed` evicted: a victim search can stop
        without trying a set (no host visited; each job's room per domain is kept).
        """
        need = {k: v * count for k, v in req.items() if v > 0}
        depth = 0 if level is None else self.level_depth(level)
        if not need or depth is None:
            return True
        extra = self._extra(freed, depth)
        if depth == 0:
            more = extra.get(self.root, {})
            return all(self.root.free.get(k, 0) + more.get(k, 0) >= n for k, n in need.items())
        # only the domains the freed jobs run in gain room; any other holds the pods only if it already
        # has the room for them, and then so has each domain around it (its room is the sum of its parts'):
        # looked for from the cluster down, not over every domain of the level
        if len(need) == 1:
            # one resource (a GPU gang's): the test of every domain the freed jobs run in, without a generator
            ((k, n),) = need.items()
            for dom, more in extra.items():
                if dom.free.get(k, 0) + more.get(k, 0) >= n:
                    return True
        else:
            for dom, more in extra.items():
                if all(dom.free.get(k, 0) + more.get(k, 0) >= n for k, n in need.items()):
                    return True
        return bool(placement.roomy_domains(self, depth, list(need.items())))

    def freeing(
        self, count: int, req: Mapping[str, int], required: str | None, preferred: str | None
    ) -> Freeing | None:
        """A `Freeing` for `count` pods of `req` placed as `place` places them (None: not a GPU-only request, or a
        level that does not exist; ask `can_place` on the view with the jobs evicted)."""
        gpu = req.get("gpu", 0)
        if gpu <= 0 or count <= 0 or any(v > 0 for k, v in req.items() if k != "gpu"):
            return None
        depth = 1 if required is None else self.level_depth(required)
        if depth is None or (preferred is not None and self.level_depth(preferred) is None):
            return None
        return Freeing(self, count, gpu, depth, required is not None)

    def room_short(
        self, count: int, req: Mapping[str, int], level: str, freed: Iterable[JobState] | SummedRoom, keep: int
    ) -> RoomShort | None:
        """The `keep` domains of `level` that lack the fewest GPUs for `count` pods of `req` were the
        running jobs `freed` evicted first (a lack is at least 1: a domain whose sum would do may be
        fragmented), smallest first, ties in path order; and the lack of the next one.

        Only GPUs are counted (as the memo counts GPUs freed), so this is for GPU-only requests:
        None for others. A domain can hold the pods only once at least its lack has been freed in it.
        """
        gpu = req.get("gpu", 0)
        depth = self.level_depth(level)
        if gpu <= 0 or depth is None or depth > len(self.levels) or any(v > 0 for k, v in req.items() if k != "gpu"):
            return None
        need = gpu * count
        extra = self._extra(freed, depth)
        # a listed set's room is kept unchanged (`HeldRoom.freed_room`), so its answer holds while no free room
        # moves: the wakes of a cycle's failed searches ask it again and again (a sum's room moves with its jobs)
        key = (id(extra), depth, need, keep)
        known = self._short.get(key) if not isinstance(freed, SummedRoom) else None
        if known is not None and known.extra is extra and known.version == self.version:
            return known.answer
        domains = self.by_level[depth - 1]
        position = self._position(depth)
        gained: dict[int, int] = {}
        for dom, amounts in extra.items():
            i = position[dom]
            gained[i] = gained.get(i, 0) + amounts.get("gpu", 0)
        # (lack, place) of the domains the freed jobs run in, and of the `keep` + 1 others with the most
        # free GPUs (the others' least lacks): the smallest of them are the smallest of all, ties in path order
        lacks = [(need - domains[i].free.get("gpu", 0) - g, i) for i, g in gained.items()]
        others = 0
        for i in self._roomiest(depth):
            if others > keep:
                break
            if i not in gained:
                lacks.append((need - domains[i].free.get("gpu", 0), i))
                others += 1
        lacks.sort()
        found = [DomainLack(max(1, lack), domains[i].path) for lack, i in lacks[: keep + 1]]
        answer = RoomShort(found[:keep], found[keep].gpus if len(found) > keep else None)
        if not isinstance(freed, SummedRoom):
            if len(self._short) >= _SHORT_KEPT:
                self._short.clear()
            self._short[key] = _Short(extra, self.version, answer)
        return answer

    def _roomiest(self, depth: int) -> list[int]:
        """The domains at `depth` (by place in `by_level`), the most free GPUs first, ties in path order.

        Kept while no free room moves (`version`): the tries of a cycle between two admissions read one."""
        known = self._ranked.get(depth)
        if known is not None and known.version == self.version:
            return known.order
        domains = self.by_level[depth - 1]
        order = sorted(range(len(domains)), key=lambda i: -domains[i].free.get("gpu", 0))
        self._ranked[depth] = _Ranked(self.version, order)
        return order

    def _position(self, depth: int) -> dict[Domain, int]:
        """Each domain's place in `by_level` at `depth` (1 and deeper)."""
        position = self._positions.get(depth)
        if position is None:
            position = self._positions[depth] = {dom: i for i, dom in enumerate(self.by_level[depth - 1])}
        return position

    def _extra(self, freed: Iterable[JobState] | SummedRoom, depth: int) -> dict[Domain, dict[str, int]]:
        """What `freed` holds per domain at `depth`: a list's room added up, or a sum's own."""
        return freed.by_domain(depth) if isinstance(freed, SummedRoom) else self.held.freed_room(freed, depth)

    @staticmethod
    def freed_in_domains(host: Domain) -> list[tuple[str, ...]]:
        """The domains (paths) a host's freed GPUs count in: each enclosing domain but the cluster."""
        return [d.path for d in host.chain[1:] if d.parent is not None]

    # ------------------------------------------------------------ placement (`placement`)

    def place(
        self, count: int, req: Mapping[str, int], required: str | None, preferred: str | None
    ) -> tuple[list[str] | None, str]:
        """Nodes for `count` pods of `req` (one node name per pod), or None and why not (`placement.place`)."""
        return placement.place(self, count, req, required, preferred)

    def can_place(self, count: int, req: Mapping[str, int], required: str | None, preferred: str | None) -> bool:
        """Whether `place` would find nodes (the same rule, without choosing them)."""
        return placement.can_place(self, count, req, required, preferred)


class DomainLack:
    """How many GPUs must be freed in a domain (by its path) before it may hold a shape."""

    __slots__ = ("gpus", "path")

    def __init__(self, gpus: int, path: tuple[str, ...]) -> None:
        self.gpus = gpus
        self.path = path

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DomainLack) and self.gpus == other.gpus and self.path == other.path

    __hash__ = None  # type: ignore[assignment]  # a value, compared but never a key

    def __repr__(self) -> str:
        return f"DomainLack({self.gpus}, {self.path})"


class RoomShort:
    """`TopologyIndex.room_short`: the domains of a level that lack least, and the lack of the rest."""

    __slots__ = ("lacks", "rest")

    def __init__(self, lacks: list[DomainLack], rest: int | None) -> None:
        self.lacks = lacks
        """The domains that lack least, with their lack, the smallest first."""
        self.rest = rest
        """The least lack of the other domains (None: there are none)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RoomShort) and self.lacks == other.lacks and self.rest == other.rest

    __hash__ = None  # type: ignore[assignment]  # a value, compared but never a key

    def __repr__(self) -> str:
        return f"RoomShort({self.lacks}, {self.rest})"


class _Short:
    """`room_short`'s answer for a listed set's room (held, so that its id stays its own), as of `version`."""

    __slots__ = ("answer", "extra", "version")

    def __init__(self, extra: dict[Domain, dict[str, int]], version: int, answer: RoomShort) -> None:
        self.extra = extra
        self.version = version
        self.answer = answer


class _Ranked(NamedTuple):
    """`TopologyIndex._roomiest`'s order of a level's domains, as of the index's `version`."""

    version: int
    order: list[int]


class Transaction:
    """Tentative changes to the topology index, undone by `rollback`."""

    def __init__(self, index: TopologyIndex) -> None:
        self.index = index
        self.log: list[tuple[str, dict[str, int], int]] = []

    def take(self, host: str, req: Mapping[str, int]) -> None:
        d = dict(req)
        self.index.adjust(host, d, -1)
        self.log.append((host, d, -1))

    def give(self, host: str, req: Mapping[str, int]) -> None:
        d = dict(req)
        self.index.adjust(host, d, 1)
        self.log.append((host, d, 1))

    def mark(self) -> int:
        return len(self.log)

    def defer(self) -> None:
        """Leave every change in place, to be undone at the index's next sync (`TopologyIndex.settle`)."""
        self.index.deferred.extend(self.log)
        self.log = []

    def rollback(self, to: int = 0) -> None:
        while len(self.log) > to:
            host, d, sign = self.log.pop()
            self.index.adjust(host, d, -sign)
