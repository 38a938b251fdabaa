"""The parking memo: pending jobs found inadmissible, set aside until something could change their verdict.

A parked job is not tried by `decide`; trying it would only find it
inadmissible again, for the same reason, and write nothing. The memo is
exact (a run without it, `PARKING = False`, decides the same bytes; the tests
check that on every scenario and bench shape) and it is a function of the log:

- A verdict counts only once the record of the cycle that reached it is
  folded. `decide` *proposes* its parks; the next sync keeps them if the
  state shows that cycle's decisions folded as decided, or, for a cycle that
  decided nothing but parked jobs, its `CycleSettled` (which `decide` writes
  for exactly such a cycle, `Cycle.finish`); it drops them otherwise (a cycle
  refused by the fence, one that failed, an audit's settling cycle). So every
  caller that decides at the log's recorded cycles (the daemon, `muster
  audit`, `muster sim`) holds the same parked set at each of them, whatever
  unrecorded cycles it ran in between (those parked no one). Every reader
  starts afresh (nothing parked) at a new leader's election, where the fold
  has the index rebuilt; a reader that starts elsewhere (an audit window, a
  snapshot) parks more at first, and writes or re-derives other
  `CycleSettled` records, but takes the same decisions. With the memo off
  nothing stands, and no `CycleSettled` is written.
- Every wake is a threshold on a counter the fold keeps and that only grows
  (usage given back or taken per queue, GPUs freed anywhere, borrowing starts
  per queue) or on time: looking at the state once or many times between two
  cycles wakes the same jobs.

A job is woken (tried again) when:
- quota blocked it: usage in its cohort tree went down by at least its
  deficit (a release of d raises any queue's available quota by at most d),
  or its own queue gave back what it holds over nominal quota (it may then
  reclaim what the cohort borrowed);
- placement blocked it: GPUs freed anywhere (for a flavor's placement, on that
  flavor's nodes; for a gang bound to one domain of a level, in one domain,
  `RoomWait`) reach what it lacks beyond the free GPUs and what preemption
  could free when it was judged, or usage in
  its tree went up by more than its quota slack (then quota would block it,
  and its reason would read differently);
- a queue of its tree started borrowing (new victims; not for a job that may
  evict no one, `eviction.evicts_no_one`), fair sharing is on and
  usage in its tree moved, or any configuration changed (the index is rebuilt);
- time moved on, for a job evicted at this instant (it may preempt later) and
  for one whose failed victim search depended on the candidates' order (lost
  work, which orders them, grows with time);
- its tree admitted, in the same cycle, a job that could be its victim (the
  scheduler asks for that one through `due_on_consumption`).

Jobs are parked in blocks: the jobs of one class (`index.Group`) that one
cycle found inadmissible for one verdict share every wake threshold, so they
are parked, woken and (in the cycle) judged as one `Block`; a release costs
one wake per block, not one per job, however deep the backlog. A block can
be split (some members woken, the rest kept) and loses members that leave.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

PARKING = True
"""Switch for the memo; off, every pending job is tried every cycle (tests prove both agree)."""


@dataclass(slots=True)
class Wake:
    """When a parked job must be tried again (see the module docstring)."""

    freed_short: int | None = None
    """Try again once this many GPUs have been freed anywhere (None: not on capacity)."""
    at_time: int | None = None
    """Try again in the first cycle at or after this time (the verdict may change with time)."""
    released: dict[str, int] = field(default_factory=dict)
    """Resource -> usage decrease in the tree after which to try again."""
    consumed: dict[str, int] = field(default_factory=dict)
    """Resource -> usage increase in the tree after which to try again."""
    own_released: dict[str, int] = field(default_factory=dict)
    """Resource -> usage decrease in the job's own queue after which to try again."""
    freed_on: dict[str, int] = field(default_factory=dict)
    """Flavor -> GPUs to be freed on its nodes before trying again (what the job lacks there)."""
    room: RoomWait | None = None
    """For a gang bound to one domain of a level: try again once a domain was freed of its lack."""
    new_victims: bool = True
    """Whether a queue of its tree that starts borrowing may change the verdict (False: the job may
    evict no one, so victims coming or going change nothing; only quota and room do)."""


ROOM_DOMAINS = 8
"""How many domains a `RoomWait` watches one by one (the closest to holding the gang)."""


class RoomWait(NamedTuple):
    """What a gang bound to one domain of a level lacks, per domain (`TopologyIndex.room_short`).

    Only the `ROOM_DOMAINS` domains that lack least are watched one by one: GPUs
    freed in any other domain reach its lack only once GPUs freed anywhere reach
    `elsewhere` (the least lack among them), so that wake covers them all.
    """

    domains: tuple[tuple[tuple[str, ...], int], ...]
    """(domain path, GPUs to be freed there) of the domains watched one by one."""
    elsewhere: int | None
    """GPUs to be freed anywhere before trying again (None: every domain is watched)."""


class Member:
    """A pending job in its class's lists, kept sorted: the first in queue order is last.

    Compared, equal and hashed as the pair (neg_seq, job). A class, not a NamedTuple: the compiled
    core builds and compares it in C (a deep backlog makes millions).
    """

    __slots__ = ("job", "neg_seq")

    def __init__(self, neg_seq: int, job: str) -> None:
        self.neg_seq = neg_seq
        self.job = job

    def __lt__(self, other: Member) -> bool:
        return self.neg_seq < other.neg_seq or (self.neg_seq == other.neg_seq and self.job < other.job)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Member) and self.neg_seq == other.neg_seq and self.job == other.job

    def __hash__(self) -> int:
        return hash((self.neg_seq, self.job))

    def __repr__(self) -> str:
        return f"Member({self.neg_seq}, {self.job!r})"


class Block:
    """Jobs of one class parked together under one verdict (they share every wake)."""

    __slots__ = ("group", "members", "new_victims", "reason", "root", "stamp")

    def __init__(
        self,
        stamp: int,
        group: Hashable,
        root: str,
        members: list[Member],
        reason: str | None,
        new_victims: bool = True,
    ):
        self.stamp = stamp
        """Unique and growing: the park the block belongs to (its wake entries carry it); a cycle's
        blocks have stamps above the memo's `stamp` when it began."""
        self.group = group
        self.root = root
        self.members = members
        """Sorted like the index's group lists; empty once woken."""
        self.reason = reason
        """The reason every member has once the parking cycle's decisions are folded (None: unknown)."""
        self.new_victims = new_victims
        """Whether new victims in its tree (a queue starts borrowing) may change its verdict (`Wake`)."""


class HeapEntry:
    """A block's wake, due once its counter reaches `level`; stale once the block is woken.

    Ordered by (level, stamp): a heap holds one entry per block, so stamps never tie. A class, not a
    NamedTuple: the compiled core builds and compares it in C (a deep backlog makes millions).
    """

    __slots__ = ("block", "level", "stamp")

    def __init__(self, level: int, stamp: int, block: Block) -> None:
        self.level = level
        self.stamp = stamp
        self.block = block

    def __lt__(self, other: HeapEntry) -> bool:
        return self.level < other.level or (self.level == other.level and self.stamp < other.stamp)


class Park:
    """A block the running cycle parked, and what its wakes wait for (set once the park stands)."""

    __slots__ = ("block", "domain_levels", "flavor_levels", "freed_level", "queue", "wake")

    def __init__(
        self,
        block: Block,
        queue: str,
        wake: Wake,
        freed_level: int | None,
        flavor_levels: dict[str, int],
        domain_levels: dict[tuple[str, ...], int],
    ) -> None:
        self.block = block
        self.queue = queue
        self.wake = wake
        self.freed_level = freed_level
        """The count of freed GPUs that wakes it (None: not on capacity)."""
        self.flavor_levels = flavor_levels
        """Per flavor, the count of GPUs freed on its nodes that wakes it."""
        self.domain_levels = domain_levels
        """Per topology domain (path), the count of GPUs freed in it that wakes it."""


class Proposal(NamedTuple):
    """The parks of one cycle, kept once the state shows its record folded (`Parking.settle`)."""

    cycle: int
    decisions: int
    serial: int
    """The `serial` of its `CycleSettled`, if it decided nothing (the state's `settles` once folded)."""
    parks: tuple[Park, ...]


class Folded(NamedTuple):
    """What the state shows of the cycles recorded so far (`ClusterState`'s fields of these names)."""

    cycle: int
    """The last cycle that decided something."""
    cycle_decisions: int
    """Its decisions folded."""
    settles: int
    """`CycleSettled` records folded."""


class Parking:
    """The parked blocks and the counters their wakes wait on."""

    def __init__(self, on_wake: Callable[[Block, list[Member]], None]) -> None:
        self._on_wake = on_wake
        """Called with a block and its members woken: the index makes them jobs to try."""
        self.blocks: dict[Hashable, dict[int, Block]] = {}
        """Group -> its parked blocks by stamp, oldest first (a job is parked iff it is a member of one)."""
        self.by_root: dict[str, dict[int, Block]] = {}
        """Tree root -> its parked blocks by stamp."""
        self.stamp = 0
        self.released_total: dict[tuple[str, str], int] = {}
        """(tree root or `own:QUEUE`, resource) -> usage given back there, as seen by the syncs."""
        self.consumed_total: dict[tuple[str, str], int] = {}
        """(tree root, resource) -> usage taken there, as seen by the syncs."""
        self.freed_seen = 0
        """The state's `gpus_freed` at the last sync."""
        self._release_heaps: dict[tuple[str, str], list[HeapEntry]] = {}
        self._consume_heaps: dict[tuple[str, str], list[HeapEntry]] = {}
        self._freed_heap: list[HeapEntry] = []
        self.flavor_freed_total: dict[str, int] = {}
        """Per flavor, GPUs freed on its nodes as seen by the syncs (from the fold's per-node counts)."""
        self._flavor_freed_heaps: dict[str, list[HeapEntry]] = {}
        self.domain_freed_total: dict[tuple[str, ...], int] = {}
        """Per topology domain (path), GPUs freed on its nodes as seen by the syncs."""
        self._domain_freed_heaps: dict[tuple[str, ...], list[HeapEntry]] = {}
        self._time_heap: list[HeapEntry] = []
        self.proposal: Proposal | None = None
        self._proposed: list[Park] = []
        """Blocks parked by the running cycle (they become `proposal` at its end)."""

    @property
    def parked(self) -> dict[str, Block]:
        """Every parked job with its block (built on demand: for tests and views, not the cycle)."""
        return {m.job: b for bs in self.blocks.values() for b in bs.values() for m in b.members}

    def block_of(self, group: Hashable, neg_seq: int, job: str) -> Block | None:
        """The block a job of `group` is parked in, if any."""
        target = Member(neg_seq, job)
        for b in self.blocks.get(group, {}).values():
            i = bisect.bisect_left(b.members, target)
            if i < len(b.members) and b.members[i] == target:
                return b
        return None

    # ------------------------------------------------------------ parking (by decide)

    def park(
        self,
        members: list[Member],
        group: Hashable,
        queue: str,
        root: str,
        wake: Wake,
        gpu_free: int,
        reason: str,
    ) -> Block:
        """Set jobs of one class aside until `wake`; provisional until the cycle's decisions are folded.

        `gpu_free` is the free GPUs of the view they were judged on; `reason` the
        reason they have once the cycle's decisions are folded.
        """
        self.stamp += 1
        stamp = self.stamp
        block = Block(stamp, group, root, members, reason, wake.new_victims)
        self.blocks.setdefault(group, {})[stamp] = block
        self.by_root.setdefault(root, {})[stamp] = block
        freed = None if wake.freed_short is None else self.freed_seen + max(1, wake.freed_short - gpu_free)
        levels: dict[str, int] = {}
        if wake.freed_on:
            totals = self.flavor_freed_total
            levels = {f: totals.get(f, 0) + max(1, n) for f, n in wake.freed_on.items()}
        domain_levels: dict[tuple[str, ...], int] = {}
        room = wake.room
        if room is not None:
            seen = self.domain_freed_total
            domain_levels = {path: seen.get(path, 0) + max(1, n) for path, n in room.domains}
            if room.elsewhere is not None:
                at = self.freed_seen + max(1, room.elsewhere)
                freed = at if freed is None else min(freed, at)
        self._proposed.append(Park(block, queue, wake, freed, levels, domain_levels))
        return block

    def _stand(self, park: Park) -> None:
        """A proposed park stands: its wakes wait on the counters.

        Set at the next sync, before it folds anything: the counters are still
        those the cycle saw (a cycle whose park is dropped sets no wake at all).
        """
        block, wake, root = park.block, park.wake, park.block.root
        if park.freed_level is not None:
            heapq.heappush(self._freed_heap, HeapEntry(park.freed_level, block.stamp, block))
        for flavor, level in park.flavor_levels.items():
            heapq.heappush(self._flavor_freed_heaps.setdefault(flavor, []), HeapEntry(level, block.stamp, block))
        for path, level in park.domain_levels.items():
            heapq.heappush(self._domain_freed_heaps.setdefault(path, []), HeapEntry(level, block.stamp, block))
        for r, amount in wake.released.items():
            self._push(self._release_heaps, (root, r), self.released_total, amount, block)
        for r, amount in wake.own_released.items():
            self._push(self._release_heaps, (f"own:{park.queue}", r), self.released_total, amount, block)
        for r, amount in wake.consumed.items():
            self._push(self._consume_heaps, (root, r), self.consumed_total, amount, block)
        if wake.at_time is not None:
            heapq.heappush(self._time_heap, HeapEntry(wake.at_time, block.stamp, block))

    @staticmethod
    def _push(
        heaps: dict[tuple[str, str], list[HeapEntry]],
        key: tuple[str, str],
        totals: dict[tuple[str, str], int],
        amount: int,
        block: Block,
    ) -> None:
        target = totals.get(key, 0) + amount
        heapq.heappush(heaps.setdefault(key, []), HeapEntry(target, block.stamp, block))

    def end_cycle(self, cycle: int, decisions: int, serial: int) -> int:
        """The running cycle is over: its parks wait for its record to be folded. Returns how many jobs
        they hold (with the memo off: 0, for nothing it parks stands)."""
        parks, self._proposed = tuple(self._proposed), []
        self.proposal = Proposal(cycle, decisions, serial, parks) if parks else None
        return sum(len(park.block.members) for park in parks) if PARKING else 0

    def settle(self, folded: Folded) -> None:
        """Keep the last cycle's parks if the state shows its record folded, else judge those jobs again.

        Its record is its decisions, or, if it decided nothing, its `CycleSettled`: then no cycle that
        decided may have been folded since (the next one would have taken its number)."""
        p, self.proposal = self.proposal, None
        if p is None:
            return
        if p.decisions > 0:
            stands = p.cycle == folded.cycle and p.decisions == folded.cycle_decisions
        else:
            stands = p.serial == folded.settles and p.cycle == folded.cycle + 1
        if stands:
            for park in p.parks:
                if park.block.members:
                    self._stand(park)
            return
        for park in p.parks:
            park.block.reason = None  # its verdicts were not folded: the members keep what they had
            self.wake(park.block)

    # ------------------------------------------------------------ waking (by the sync and the cycle)

    def unpark(self, group: Hashable, neg_seq: int, job: str) -> bool:
        """Forget a job's park (it left, or changed); whether it was parked."""
        block = self.block_of(group, neg_seq, job)
        if block is None:
            return False
        block.members.remove(Member(neg_seq, job))
        if not block.members:
            self._drop(block)
        return True

    def _drop(self, block: Block) -> None:
        blocks = self.blocks.get(block.group)
        if blocks is not None:
            del blocks[block.stamp]
            if not blocks:
                del self.blocks[block.group]
        roots = self.by_root.get(block.root)
        if roots is not None:
            roots.pop(block.stamp, None)

    def wake(self, block: Block, keep: int = 0) -> None:
        """Unpark a block's members but the first `keep` in queue order, and hand them to the index."""
        members = block.members
        if len(members) <= keep:
            return
        if keep == 0:
            woken, block.members = members, []
            self._drop(block)
        else:
            cut = len(members) - keep
            woken, block.members = members[:cut], members[cut:]
        self._on_wake(block, woken)

    def _pop_due(self, heap: list[HeapEntry], level: int) -> None:
        while heap and heap[0].level <= level:
            self.wake(heapq.heappop(heap).block)

    def usage_moved(self, queue: str, root: str, released: Mapping[str, int], consumed: Mapping[str, int]) -> None:
        """Count a queue's usage given back and taken since the last look, and wake whom it concerns."""
        for r, d in sorted(released.items()):
            for key in ((root, r), (f"own:{queue}", r)):
                total = self.released_total[key] = self.released_total.get(key, 0) + d
                self._pop_due(self._release_heaps.get(key, []), total)
        for r, d in sorted(consumed.items()):
            key = (root, r)
            total = self.consumed_total[key] = self.consumed_total.get(key, 0) + d
            self._pop_due(self._consume_heaps.get(key, []), total)

    def gpus_freed(self, total: int) -> None:
        """The fold's count of freed GPUs reached `total`."""
        self.freed_seen = total
        self._pop_due(self._freed_heap, total)

    def flavor_gpus_freed(self, flavor: str, gpus: int) -> None:
        """`gpus` more GPUs were freed on the nodes of `flavor`."""
        total = self.flavor_freed_total[flavor] = self.flavor_freed_total.get(flavor, 0) + gpus
        self._pop_due(self._flavor_freed_heaps.get(flavor, []), total)

    def domain_gpus_freed(self, path: tuple[str, ...], gpus: int) -> None:
        """`gpus` more GPUs were freed on the nodes of a topology domain."""
        total = self.domain_freed_total[path] = self.domain_freed_total.get(path, 0) + gpus
        self._pop_due(self._domain_freed_heaps.get(path, []), total)

    def tree(self, root: str) -> list[Block]:
        """The blocks parked in a cohort tree, oldest first."""
        blocks = self.by_root.get(root)
        return [blocks[s] for s in sorted(blocks)] if blocks else []

    def wake_tree(self, root: str, new_victims: bool = False) -> None:
        """Wake a tree's blocks; for `new_victims` (a queue started borrowing), only those it concerns."""
        for block in self.tree(root):
            if block.new_victims or not new_victims:
                self.wake(block)

    def wake_at(self, now: int) -> None:
        """Try again the jobs whose wake time has come."""
        self._pop_due(self._time_heap, now)

    def wake_all(self) -> None:
        for block in sorted((b for bs in self.blocks.values() for b in bs.values()), key=lambda b: b.stamp):
            self.wake(block)

    def due_on_consumption(self, key: tuple[str, str], level: int) -> Iterable[Block]:
        """Parked blocks whose consumption wake is due at `level`; the entries stay for the next sync."""
        heap = self._consume_heaps.get(key)
        if not heap:
            return []
        out: dict[int, Block] = {}
        popped = []
        while heap and heap[0].level <= level:
            entry = heapq.heappop(heap)
            popped.append(entry)
            if entry.block.members:
                out[entry.stamp] = entry.block
        for entry in popped:
            heapq.heappush(heap, entry)
        return out.values()
