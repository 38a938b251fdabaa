"""Topology-aware gang placement: the walk over a `topology.TopologyIndex` that picks a podset's nodes.

Rules (spec/scenario.md, Topology):
- `required: L` keeps a podset inside one domain of level L; `preferred: L`
  uses one such domain when one fits, else the fewest. No topology means
  preferred at the outermost level.
- Below that level, at each lower level in turn, use the fewest domains.
- Among domains that fit take the tightest (least free capacity of the primary
  resource: GPUs if requested), ties to the tightest enclosing domain, then name.

Read-only: it asks the index what each domain holds (`TopologyIndex.slots`,
its free sums) and never changes it; the caller takes the capacity inside a
`topology.Transaction`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from muster.projections.flavors import plain
from muster.projections.resources import fmt

if TYPE_CHECKING:
    from muster.projections.topology import Domain, TopologyIndex


def place(
    topo: TopologyIndex, count: int, req: Mapping[str, int], required: str | None, preferred: str | None
) -> tuple[list[str] | None, str]:
    """Nodes for `count` pods of `req` (one node name per pod), or None and why not.

    Read-only: the caller takes the capacity (inside a transaction).
    """
    plan = _plan(topo, count, req, required, preferred)
    if isinstance(plan, str):
        return None, plan
    out: list[str] = []
    if plan.one is not None:
        _assign(topo, plan.one, count, req, plan.primary, out)
    elif plan.spread is not None:
        parent = plan.spread[0].parent
        siblings = all(d.parent is parent for d in plan.spread)  # the outermost level's, or of one domain
        _spread(topo, plan.spread, plan.slots, count, req, plan.primary, out, siblings)
    elif plan.hosts is not None:
        out = [plan.hosts[i % len(plan.hosts)].name for i in range(count)]
    return out, ""


def can_place(
    topo: TopologyIndex, count: int, req: Mapping[str, int], required: str | None, preferred: str | None
) -> bool:
    """Whether `place` would find nodes (the same rule, without choosing them)."""
    return not isinstance(_plan(topo, count, req, required, preferred), str)


def _plan(
    topo: TopologyIndex, count: int, req: Mapping[str, int], required: str | None, preferred: str | None
) -> _Plan | str:
    """Where `place` puts the pods (one domain, a spread over domains, any hosts), or why not."""
    asked = sorted(k for k, v in req.items() if v > 0)
    primary = "gpu" if req.get("gpu", 0) > 0 or not asked else asked[0]
    if count <= 0:
        return _Plan(primary)
    if not any(v > 0 for v in req.values()):
        # requests nothing: any schedulable host will do
        hosts = [h for h in topo.by_level[-1] if h.schedulable]
        if not hosts:
            return "no schedulable node"
        return _Plan(primary, hosts=hosts)
    level = required or preferred
    if level is not None:
        depth = topo.level_depth(level)
        if depth is None:
            return f"topology level {level!r} does not exist"
    else:
        depth = 1
    domains = topo.by_level[depth - 1]
    # a domain's summed free capacity bounds what it can hold: skip the hopeless
    roomy = roomy_domains(topo, depth, [(k, v * count) for k, v in req.items() if v > 0])
    fitting = [d for d in roomy if topo.slots(d, req, count) >= count]
    if fitting:
        if len(fitting) == 1:
            return _Plan(primary, one=fitting[0])
        if depth == 1:
            # the outermost domains are siblings: their enclosing keys are equal (see `_tightest`)
            return _Plan(primary, one=_tightest(fitting, primary))
        return _Plan(primary, one=min(fitting, key=lambda d: _tight_key(d, primary)))
    what = f"{count} pod{'s' if count != 1 else ''} of {fmt(plain(req) if topo.markers else req)}"
    if required is not None:
        return f"no {required} has room for {what}"
    slots = {id(d): topo.slots(d, req, count) for d in domains}
    if sum(slots.values()) < count:
        return f"{what} do not fit on the schedulable nodes"
    return _Plan(primary, spread=domains, slots=slots)


def roomy_domains(topo: TopologyIndex, depth: int, need: list[tuple[str, int]]) -> list[Domain]:
    """The domains at `depth` whose free capacity covers `need`, in path order (as `by_level`).

    A domain's free capacity is the sum of its parts', so one short of `need` rules out every
    domain inside it: the walk down visits only the insides of roomy domains (on a full
    cluster, a few of its racks rather than all of them).
    """
    frontier = _covering([topo.root], need)
    for _ in range(depth):
        if len(frontier) == 1:
            frontier = _covering(frontier[0].children, need)
        else:
            frontier = _covering([c for d in frontier for c in d.children], need)
    return frontier


def _assign(topo: TopologyIndex, dom: Domain, count: int, req: Mapping[str, int], primary: str, out: list[str]) -> None:
    """Put `count` pods into `dom`: down its levels into the tightest child that holds them all,
    or spread over its children where none does."""
    need = [(k, v * count) for k, v in req.items() if v > 0]
    while not dom.is_host:
        children = dom.children
        if children and children[0].is_host:  # a domain's children are all hosts or none
            _onto_hosts(topo, children, count, req, primary, out)
            return
        # only a child whose free room covers the pods can hold them all (its slots are counted
        # only then); the others' slots are needed only to spread over them
        fitting = [c for c in _covering(children, need) if topo.slots(c, req, count) >= count]
        if not fitting:
            slots = {id(c): topo.slots(c, req, count) for c in children}
            _spread(topo, children, slots, count, req, primary, out, siblings=True)
            return
        dom = _tightest(fitting, primary)
    out.extend([dom.name] * count)


def _onto_hosts(
    topo: TopologyIndex, hosts: list[Domain], count: int, req: Mapping[str, int], primary: str, out: list[str]
) -> None:
    """`_assign` into the hosts of one domain, in one pass over them: the tightest host that holds every pod,
    else the fewest hosts as `_spread` takes them. Siblings share their enclosing domains, so a host's tight
    key is its own free room, then its place in path order (`hosts` are in path order): most placements end
    here, and the pass reads each host's room once instead of its slots, its key and its covering apart."""
    host_slots = topo.host_slots
    asked = [(k, v) for k, v in req.items() if v > 0]
    one = asked[0] if len(asked) == 1 and asked[0][0] == primary else None  # a GPU pod's: `host_slots` inline
    best: Domain | None = None
    least = 0
    room: list[_HostRoom] = []
    for place, h in enumerate(hosts):
        if one is not None:
            if not h.schedulable:
                continue
            free = h.host_free.get(primary, 0)
            n = free // one[1]
            if n > count:
                n = count
        else:
            n = host_slots(h, req, count)
            free = h.host_free.get(primary, 0)
        if n <= 0:
            continue
        if n >= count and (best is None or free < least):
            best, least = h, free
        room.append(_HostRoom(-n, free, place))
    if best is not None:
        out.extend([best.name] * count)
        return
    room.sort()  # the most slots first, then the tightest
    remaining = count
    i = 0
    while remaining > 0 and i < len(room):
        # the hosts that hold the rest are the first ones: the tightest of them takes it
        pick: _HostRoom | None = None
        for r in itertools.islice(room, i, None):
            if -r.neg_slots < remaining:
                break
            if pick is None or (r.free, r.place) < (pick.free, pick.place):
                pick = r
        if pick is not None:
            out.extend([hosts[pick.place].name] * remaining)
            return
        r = room[i]
        out.extend([hosts[r.place].name] * -r.neg_slots)
        remaining += r.neg_slots
        i += 1
    if remaining > 0:  # pragma: no cover - callers check total slots first
        raise AssertionError("spread ran out of room")


class _HostRoom:
    """A host with room for some pods, as `_onto_hosts` orders them (smallest first)."""

    __slots__ = ("free", "neg_slots", "place")

    def __init__(self, neg_slots: int, free: int, place: int) -> None:
        self.neg_slots = neg_slots
        self.free = free
        """Its free room of the primary resource."""
        self.place = place
        """Its place among its siblings (path order)."""

    def __lt__(self, other: _HostRoom) -> bool:
        """The most slots first, then the tightest, then path order."""
        if self.neg_slots != other.neg_slots:
            return self.neg_slots < other.neg_slots
        if self.free != other.free:
            return self.free < other.free
        return self.place < other.place


def _spread(
    topo: TopologyIndex,
    domains: Iterable[Domain],
    slots: dict[int, int],
    count: int,
    req: Mapping[str, int],
    primary: str,
    out: list[str],
    siblings: bool = False,
) -> None:
    """Fewest domains: take the roomiest until the rest fits in one, then the tightest that holds it.

    `siblings`: `domains` are one domain's children, in path order (they share their enclosing domains, so
    their tight keys differ only in their own free room, then path order: their place)."""
    # nothing changes while a plan is made: each domain's key is computed once
    tight: dict[int, tuple[object, ...]]
    if siblings:
        tight = {id(d): (_own_free(d, primary), i) for i, d in enumerate(domains) if slots[id(d)] > 0}
    else:
        tight = {id(d): _tight_key(d, primary) for d in domains if slots[id(d)] > 0}
    rest = sorted((d for d in domains if id(d) in tight), key=lambda d: (-slots[id(d)], tight[id(d)]))
    remaining = count
    i = 0
    while remaining > 0 and i < len(rest):
        # by room, the most first: the domains that hold the rest are the first ones
        best: Domain | None = None
        for d in itertools.islice(rest, i, None):
            if slots[id(d)] < remaining:
                break
            if best is None or tight[id(d)] < tight[id(best)]:
                best = d
        if best is not None:
            _assign(topo, best, remaining, req, primary, out)
            return
        d = rest[i]
        n = slots[id(d)]
        _assign(topo, d, n, req, primary, out)
        remaining -= n
        i += 1
    if remaining > 0:  # pragma: no cover - callers check total slots first
        raise AssertionError("spread ran out of room")


def _tight_key(dom: Domain, primary: str) -> tuple[object, ...]:
    """Least free capacity first, then the tightest enclosing domains, then the name path."""
    frees: list[int] = []
    d: Domain | None = dom
    while d is not None and d.parent is not None:
        frees.append(_own_free(d, primary))
        d = d.parent
    return (*frees, dom.path)


def _own_free(dom: Domain, primary: str) -> int:
    """A domain's free capacity of the primary resource (a host's own, schedulable or not)."""
    return dom.host_free.get(primary, 0) if dom.is_host else dom.free.get(primary, 0)


class _Plan(NamedTuple):
    """Where a podset goes: into one domain, spread over domains, or round-robin over any hosts."""

    primary: str
    one: Domain | None = None
    spread: list[Domain] | None = None
    slots: dict[int, int] = {}
    hosts: list[Domain] | None = None


def _tightest(siblings: list[Domain], primary: str) -> Domain:
    """`min` by `_tight_key` over domains of one parent, which share every enclosing
    domain: only their own free capacity differs, and ties go to the first in path order (`children`)."""
    best = siblings[0]
    if len(siblings) == 1:
        return best
    is_host = best.is_host
    least = best.host_free.get(primary, 0) if is_host else best.free.get(primary, 0)
    for d in siblings:
        free = d.host_free.get(primary, 0) if is_host else d.free.get(primary, 0)
        if free < least:
            best, least = d, free
    return best


def _covering(domains: Iterable[Domain], need: list[tuple[str, int]]) -> list[Domain]:
    """The domains whose free capacity covers `need`, in the order given (one resource, the usual case,
    without the generator)."""
    if len(need) == 1:
        (k0, n0), *_ = need
        return [d for d in domains if d.free.get(k0, 0) >= n0]
    return [d for d in domains if all(d.free.get(k, 0) >= n for k, n in need)]
