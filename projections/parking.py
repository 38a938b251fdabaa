"""The parking memo: pending jobs found inadmissible, set aside until something could change their verdict.

A parked job is not tried by `decide`; trying it would only find it
inadmissible again, for the same reason, and write nothing. The memo is
exact (a run without it, `PARKING = False`, decides the same bytes; the tests
check that on every scenario and bench shape) and it is a function of the log:

- A verdict counts only once the decisions of the cycle that reached it are
  folded. `decide` *proposes* its parks; the next sync keeps them if the
  state shows that cycle's decisions folded as decided, and drops them
  otherwise (a cycle refused by the fence, one that failed, one that decided
  nothing, an audit's settling cycle). So every caller that decides at the
  log's recorded cycles (the daemon, `muster audit`, `muster sim`) holds the
  same parked set at each of them, whatever idle cycles it ran in between.
- Every wake is a threshold on a counter the fold keeps and that only grows
  (usage given back or taken per queue, GPUs freed anywhere, borrowing starts
  per queue) or on time: looking at the state once or many times between two
  cycles wakes the same jobs.

A job is woken (tried again) when:
- quota blocked it: usage in its cohort tree went down by at least its
  deficit (a release of d raises any queue's available quota by at most d),
  or its own queue gave back what it holds over nominal quota (it may then
  reclaim what the cohort borrowed);
- placement blocked it: GPUs freed anywhere reach what it lacks beyond the
  free GPUs and what preemption could free when it was judged, or usage in
  its tree went up by more than its quota slack (then quota would block it,
  and its reason would read differently);
- a queue of its tree started borrowing (new victims), fair sharing is on and
  usage in its tree moved, or any configuration changed (the index is rebuilt);
- time moved on, for a job evicted at this instant (it may preempt later) and
  for one whose failed victim search depended on the candidates' order (lost
  work, which orders them, grows with time);
- its tree admitted, in the same cycle, a job that could be its victim (the
  scheduler asks for that one through `due_on_consumption`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

PARKING = True
"""Switch for the memo; off, every pending job is tried every cycle (tests prove both agree)."""


@dataclass
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


@dataclass(frozen=True)
class Proposal:
    """The parks of one cycle, kept once its decisions are folded (`cycle`, `decisions` in the state)."""

    cycle: int
    decisions: int
    jobs: tuple[str, ...]


class _Entry:
    __slots__ = ("root", "stamp")

    def __init__(self, root: str, stamp: int) -> None:
        self.root = root
        self.stamp = stamp


class HeapEntry(NamedTuple):
    """A parked job's wake, due once its counter reaches `level`; stale once the job is unparked or parked again."""

    level: int
    seq: int
    """The job's submission order: due jobs wake in it."""
    job: str
    stamp: int
    """The park it belongs to (`_Entry.stamp`)."""


class Parking:
    """The parked jobs and the counters their wakes wait on."""

    def __init__(self, on_wake: Callable[[str], None]) -> None:
        self._on_wake = on_wake
        """Called with each job woken outside `unpark(reactivate=False)`: the index makes it a job to try."""
        self.parked: dict[str, _Entry] = {}
        self.by_root: dict[str, set[str]] = {}
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
        self._time_heap: list[HeapEntry] = []
        self.proposal: Proposal | None = None
        self._proposed: list[str] = []
        """Jobs parked by the running cycle (they become `proposal` at its end)."""

    # ------------------------------------------------------------ parking (by decide)

    def park(self, job_id: str, seq: int, queue: str, root: str, wake: Wake, gpu_free: int) -> None:
        """Set a job aside until `wake`; provisional until the cycle's decisions are folded.

        `gpu_free` is the free GPUs of the view the job was judged on.
        """
        self.stamp += 1
        stamp = self.stamp
        self.parked[job_id] = _Entry(root, stamp)
        self.by_root.setdefault(root, set()).add(job_id)
        self._proposed.append(job_id)
        if wake.freed_short is not None:
            lacking = max(1, wake.freed_short - gpu_free)
            heapq.heappush(self._freed_heap, HeapEntry(self.freed_seen + lacking, seq, job_id, stamp))
        for r, amount in wake.released.items():
            key = (root, r)
            target = self.released_total.get(key, 0) + amount
            heapq.heappush(self._release_heaps.setdefault(key, []), HeapEntry(target, seq, job_id, stamp))
        for r, amount in wake.own_released.items():
            key = (f"own:{queue}", r)
            target = self.released_total.get(key, 0) + amount
            heapq.heappush(self._release_heaps.setdefault(key, []), HeapEntry(target, seq, job_id, stamp))
        for r, amount in wake.consumed.items():
            key = (root, r)
            target = self.consumed_total.get(key, 0) + amount
            heapq.heappush(self._consume_heaps.setdefault(key, []), HeapEntry(target, seq, job_id, stamp))
        if wake.at_time is not None:
            heapq.heappush(self._time_heap, HeapEntry(wake.at_time, seq, job_id, stamp))

    def end_cycle(self, cycle: int, decisions: int) -> None:
        """The running cycle is over: its parks wait for its decisions to be folded."""
        jobs, self._proposed = tuple(self._proposed), []
        self.proposal = Proposal(cycle, decisions, jobs) if jobs else None

    def settle(self, folded_cycle: int, folded_decisions: int) -> None:
        """Keep the last cycle's parks if the state shows its decisions folded, else judge those jobs again."""
        p, self.proposal = self.proposal, None
        if p is None:
            return
        if p.decisions > 0 and p.cycle == folded_cycle and p.decisions == folded_decisions:
            return
        for job_id in p.jobs:
            self.wake(job_id)

    # ------------------------------------------------------------ waking (by the sync and the cycle)

    def unpark(self, job_id: str) -> bool:
        """Forget a job's park (it was woken, it left, or it is tried now); whether it was parked."""
        e = self.parked.pop(job_id, None)
        if e is None:
            return False
        s = self.by_root.get(e.root)
        if s is not None:
            s.discard(job_id)
        return True

    def wake(self, job_id: str) -> None:
        """Unpark a job and hand it back to the index as a job to try."""
        if self.unpark(job_id):
            self._on_wake(job_id)

    def _pop_due(self, heap: list[HeapEntry], level: int) -> None:
        parked = self.parked
        while heap and heap[0].level <= level:
            _, _, job_id, stamp = heapq.heappop(heap)
            e = parked.get(job_id)
            if e is not None and e.stamp == stamp:
                self.wake(job_id)

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

    def wake_tree(self, root: str) -> None:
        for job_id in sorted(self.by_root.get(root, ())):
            self.wake(job_id)

    def wake_at(self, now: int) -> None:
        """Try again the jobs whose wake time has come."""
        self._pop_due(self._time_heap, now)

    def wake_all(self) -> None:
        for job_id in sorted(self.parked):
            self.wake(job_id)

    def due_on_consumption(self, key: tuple[str, str], level: int) -> list[str]:
        """Parked jobs whose consumption wake is due at `level`; the entries stay for the next sync."""
        heap = self._consume_heaps.get(key)
        out: list[str] = []
        if not heap:
            return out
        popped = []
        while heap and heap[0].level <= level:
            entry = heapq.heappop(heap)
            popped.append(entry)
            e = self.parked.get(entry.job)
            if e is not None and e.stamp == entry.stamp:
                out.append(entry.job)
        for entry in popped:
            heapq.heappush(heap, entry)
        return out
