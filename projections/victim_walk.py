"""The victim walk: the minimal set of candidates whose eviction makes a preemptor fit (`Probe`).

Candidates (`candidates.list_candidates`, in victim order) are removed in turn
until the preemptor fits, then each victim whose room is not needed is kept
(tried in reverse), so the set is minimal; with fair sharing a queue is
preempted from only while the preemptor's share stays at or under that queue's.
Everything is tentative on the cycle's view and undone before returning.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, NamedTuple

from muster.projections.eviction import Preemptor, may_evict
from muster.projections.flavors import placement_request, unassigned
from muster.projections.freeing import Freeing
from muster.projections.jobfacts import gpus, priority_of
from muster.projections.state import JobState

if TYPE_CHECKING:
    from muster.projections.cycle import Cycle


def fits_given(cycle: Cycle, job: JobState, given: Mapping[str, Mapping[str, int]], allow_borrow: bool) -> bool:
    """Whether the quota holds `job` with `given` usage given back per queue: in sums (a queue's usage moves
    its tree the same, one job at a time or summed)."""
    quota = cycle.idx.quota
    mark = quota.mark()
    for queue, requests in given.items():
        quota.add(queue, requests, -1)
    fits = quota.fits(job.queue, job.requests, allow_borrow)
    quota.rollback(mark)
    return fits


WALK_BEFORE_ASKING = 32
"""Candidates a victim walk removes one by one before asking whether it can end in a fit at all."""


class Turn:
    """A candidate `Probe.minimal` removes in its turn, with whether the preemptor may borrow once it is."""

    __slots__ = ("job", "may_borrow")

    def __init__(self, job: JobState, may_borrow: bool) -> None:
        self.job = job
        self.may_borrow = may_borrow


class Turns(NamedTuple):
    """`Probe._turns`: the candidates removed in turn, and whether the quota fits after some run of them."""

    turns: list[Turn]
    quota_fits: bool


class Roomy(NamedTuple):
    """`Probe._room_possible`'s answer for a list of candidates, known before the probe (`Unanswered`)."""

    candidates: list[JobState]
    answer: bool


class Probe:
    """Tries victim sets on the cycle's view, leaving it unchanged."""

    def __init__(
        self, cycle: Cycle, job: JobState, rule: Preemptor, roomy: Roomy | None = None, freeing: bool = True
    ) -> None:
        self.cycle = cycle
        self.use_freeing = freeing
        """Whether `minimal` walks with a `Freeing` where one answers (`preemption.FREEING`)."""
        self.job = job
        self.rule = rule
        self.roomy = roomy
        """`_room_possible`'s answer for one list of candidates, if known (`Unanswered.roomy`)."""
        self.quota_possible = False
        self.walked = False
        """Whether a `minimal` walked its candidates (False: the nodes could not hold the job with every
        candidate evicted, so no victim set places it, whatever their order)."""
        self.freeing: Freeing | None = None
        """While `minimal` walks a podset a `Freeing` answers for: the candidates it has taken, evicted only
        from the quota (from `mark` on its undo log) and from the `Freeing`, not from the nodes."""
        self.mark = 0
        self.given: dict[str, dict[str, int]] | None = None
        """Per queue, usage of turns `_turns` took without giving it back to the quota (`_in_turn` reads it)."""

    def _take(self, c: JobState) -> None:
        """Evict a candidate tentatively, for the walk."""
        if self.freeing is None:
            self.cycle.remove(c)
            return
        self.cycle.idx.quota.add(c.queue, c.requests, -1)
        self.freeing.move(c, 1)

    def _give_back(self, c: JobState) -> None:
        """Undo `_take`."""
        if self.freeing is None:
            self.cycle.restore(c)
            return
        self.cycle.idx.quota.add(c.queue, c.requests, 1)
        self.freeing.move(c, -1)

    def _fits(self, allow_borrow: bool) -> bool:
        cycle, job = self.cycle, self.job
        if not cycle.idx.quota.fits(job.queue, job.requests, allow_borrow):
            return False
        self.quota_possible = True
        freeing = self.freeing
        if freeing is not None:
            # what `cycle.fits` would say (quota, then `could_place`, then `can_place`) on the view as evicted
            return freeing.could_place(gpus(job)) and freeing.places()
        return bool(cycle.fits(job, allow_borrow))

    def _fill_back(self, targets: list[JobState], allow_borrow: bool) -> list[JobState]:
        """Keep every victim whose room is not needed, trying the last-but-one first."""
        kept = list(targets)
        for i in range(len(targets) - 2, -1, -1):
            t = targets[i]
            self._give_back(t)
            if self._fits(allow_borrow):
                kept.remove(t)
            else:
                self._take(t)
        return kept

    def _still(self, c: JobState) -> bool:
        """Whether the rule still lets the preemptor take `c` on the view as it stands (its queue borrows)."""
        cycle = self.cycle
        borrowing = cycle.idx.quota.is_borrowing(c.queue, self.job.requests)
        return may_evict(self.rule, c.queue, priority_of(cycle.state, c), c.order_seq, borrowing)

    def _undo(self, removed: list[JobState]) -> None:
        """Give back every job of `removed` still taken (the cycle's view is again as found)."""
        if self.freeing is not None:
            self.cycle.idx.quota.rollback(self.mark)
            self.freeing = None
            return
        for t in reversed(removed):
            if t.id in self.cycle.removed:
                self.cycle.restore(t)

    def _in_turn(
        self, candidates: list[JobState], allow_borrow: bool, threshold: int | None
    ) -> Iterator[tuple[JobState, bool]]:
        """The candidates `minimal` removes, in turn, with whether the preemptor may borrow once it is
        removed; judged lazily, on the quota as the caller's removals leave it (and what `given` notes)."""
        job, state, quota = self.job, self.cycle.state, self.cycle.idx.quota
        for c in candidates:
            if c.queue != job.queue:
                cp = priority_of(state, c)
                given = self.given.get(c.queue) if self.given is not None else None
                if not may_evict(self.rule, c.queue, cp, c.order_seq, quota.is_borrowing(c.queue, job.requests, given)):
                    continue  # its queue no longer borrows
                if threshold is not None and cp > threshold:
                    allow_borrow = False  # borrow_within_cohort: borrowing only past victims under the threshold
            yield c, allow_borrow

    def minimal(self, candidates: list[JobState], allow_borrow: bool, threshold: int | None) -> list[JobState] | None:
        """Remove candidates in turn until the job fits, then keep those not needed (`_fill_back`).

        One GPU-only podset on its nodes is walked without evicting anyone from the nodes: the quota moves,
        and a `Freeing` says after each candidate whether the nodes would hold the job, at the cost of that
        candidate's hosts (not of giving its room back and placing the gang); any other job is evicted and
        placed on the cycle's view. For one podset on its nodes, a walk that has not found a fit after
        `WALK_BEFORE_ASKING` removals asks whether the rest of it can end in one at all (`_may_fit`)."""
        if not self._room_possible(candidates):
            self._quota_only(candidates, allow_borrow, threshold)
            return None
        self.walked = True
        cycle, job = self.cycle, self.job
        self.freeing = self._freeing() if self.use_freeing else None
        self.mark = cycle.idx.quota.mark()
        ask = len(job.podsets) == 1 and not unassigned(cycle.state, job)
        targets: list[JobState] = []
        turns = self._in_turn(candidates, allow_borrow, threshold)
        kept = self._walk(turns, targets, ask, self._own_queue_only(candidates))
        self._undo(targets)
        return kept

    def _walk(
        self, turns: Iterator[tuple[JobState, bool]], targets: list[JobState], ask: bool, own: bool
    ) -> list[JobState] | None:
        """`minimal`'s walk over `turns`, taking each into `targets` (left taken: the caller undoes them);
        `own`: whether every candidate runs in the preemptor's queue (`_turns`)."""
        while True:
            for c, may_borrow in turns:
                self._take(c)
                targets.append(c)
                if self._fits(may_borrow):
                    return self._fill_back(targets, may_borrow)
                if ask and len(targets) == WALK_BEFORE_ASKING:
                    break
            else:
                return None
            rest = self._turns(turns, own, may_borrow)
            if not self._may_fit(rest) or not self._may_place(rest):
                return None
            turns = ((t.job, t.may_borrow) for t in rest.turns)

    def _freeing(self) -> Freeing | None:
        """A `Freeing` for the job's pods, when it has one podset on its nodes that one answers for."""
        cycle, job = self.cycle, self.job
        if len(job.podsets) != 1 or unassigned(cycle.state, job):
            return None  # `Cycle.fits` places several podsets, or chooses flavors, in turn
        ps = job.podsets[0]
        topology = cycle.idx.topology
        t = ps.topology
        request = placement_request(job, ps.name, ps.requests, topology.tainted)
        return topology.freeing(ps.count, request, t.required if t else None, t.preferred if t else None)

    def _turns(self, rest: Iterator[tuple[JobState, bool]], own: bool, after: bool) -> Turns:
        """The turns left in `rest` (`_in_turn` reads only the quota, so the quota alone is moved), and
        whether the quota fits after the last of some run of them with one leave to borrow (the walk
        tried the prefix before them; `after` is the leave of its last turn)."""
        cycle, job = self.cycle, self.job
        if own:
            left = [Turn(c, may_borrow) for c, may_borrow in rest]
            return Turns(left, bool(left) and self._fits_without([t.job for t in left], after))
        # the turns' usage is noted, not given back one by one: `_in_turn` reads it from `given`, and the
        # quota is asked with it given back in sums (the tree moves the same)
        given: dict[str, dict[str, int]] = {}
        self.given = given
        turns: list[Turn] = []
        fits = False
        for c, may_borrow in rest:
            if turns and turns[-1].may_borrow != may_borrow and not fits:
                fits = fits_given(cycle, job, given, turns[-1].may_borrow)
            turns.append(Turn(c, may_borrow))
            back = given.setdefault(c.queue, {})
            for r, v in c.requests.items():
                back[r] = back.get(r, 0) + v
        self.given = None
        if turns and not fits:
            fits = fits_given(cycle, job, given, turns[-1].may_borrow)
        return Turns(turns, fits)

    def _own_queue_only(self, candidates: list[JobState]) -> bool:
        """Whether every candidate runs in the preemptor's queue (`_in_turn` then yields each, with the
        same leave to borrow)."""
        queue = self.job.queue
        return all(c.queue == queue for c in candidates)

    def _fits_without(self, jobs: list[JobState], allow_borrow: bool) -> bool:
        """Whether the quota holds the preemptor with all of `jobs`, of its own queue, removed: their
        usage given back at once (a queue's usage moves its tree the same, one job at a time or summed)."""
        total: dict[str, int] = {}
        for c in jobs:
            for r, v in c.requests.items():
                total[r] = total.get(r, 0) + v
        return fits_given(self.cycle, self.job, {self.job.queue: total}, allow_borrow)

    def _may_fit(self, turns: Turns) -> bool:
        """Whether the rest of a walk, `turns`, may find the job a fit (False: it would not, and
        `quota_possible` is what it would have learnt), asked without evicting anyone more.

        Fitting only grows as jobs are removed (their quota and room come back) while the preemptor's
        leave to borrow holds: some turn's quota fits only if the last of its run of turns with one leave
        fits, so the quota is asked at the end of each run (`_turns`), and the nodes once, with every turn
        taken (`_may_place`). A failing search then costs O(turns) sums, not a turn per candidate.
        """
        if not turns.quota_fits:
            return False
        self.quota_possible = True
        return True

    def _may_place(self, turns: Turns) -> bool:
        """Whether the nodes would hold the job with every turn of the rest of a walk taken too (False: no turn
        of it finds a fit: room only grows as jobs are removed), for a walk a `Freeing` answers for (others
        are placed turn by turn). On False the turns are left taken: the walk ends there, and `_undo` drops
        the `Freeing`."""
        freeing = self.freeing
        if freeing is None:
            return True
        if not freeing.may_place_with([t.job for t in turns.turns]):
            return False  # no domain could gain the room: not asked host by host
        mark = freeing.mark()
        for t in turns.turns:
            freeing.move(t.job, 1)
        if not (freeing.could_place(gpus(self.job)) and freeing.places()):
            return False
        freeing.rollback(mark)  # the walk goes on, turn by turn
        return True

    def _room_possible(self, candidates: list[JobState]) -> bool:
        """Whether the nodes could hold the job were every candidate evicted (False: no victim set
        places it). A bound on domains' free room: a failing search then costs O(domains), not a
        placement per candidate (big gangs that need one rack wait through many releases)."""
        cycle, job, known = self.cycle, self.job, self.roomy
        if known is not None and known.candidates is candidates:
            return known.answer
        if len(job.podsets) != 1 or unassigned(cycle.state, job):
            return True  # `Cycle.fits` places several podsets, or chooses flavors, in turn
        ps = job.podsets[0]
        topology = cycle.idx.topology
        level = ps.topology.required if ps.topology is not None else None
        request = placement_request(job, ps.name, ps.requests, topology.tainted)
        return topology.could_hold(ps.count, request, level, candidates)

    def _quota_only(self, candidates: list[JobState], allow_borrow: bool, threshold: int | None) -> None:
        """`minimal`'s walk when no victim set can place the job: only whether quota would fit on the
        way is left to learn (`quota_possible`, which the job's wake reads), from the quota alone."""
        job, quota = self.job, self.cycle.idx.quota
        if self._own_queue_only(candidates):
            # fitting only grows as they are removed: it fits on the way iff with all of them removed
            self.quota_possible = self.quota_possible or self._fits_without(candidates, allow_borrow)
            return
        mark = quota.mark()
        for c, may_borrow in self._in_turn(candidates, allow_borrow, threshold):
            quota.add(c.queue, c.requests, -1)
            if quota.fits(job.queue, job.requests, may_borrow):
                self.quota_possible = True
                break
        quota.rollback(mark)

    def fair(self, candidates: list[JobState], allow_borrow: bool) -> list[JobState] | None:
        cycle, job = self.cycle, self.job
        quota = cycle.idx.quota
        by_queue: dict[str, list[JobState]] = {}
        for c in candidates:
            by_queue.setdefault(c.queue, []).append(c)
        targets: list[JobState] = []
        retry: dict[str, list[JobState]] = {}

        def pick(pool: dict[str, list[JobState]]) -> str | None:
            live = [q for q, cs in pool.items() if cs]
            if not live:
                return None
            # other queues before the preemptor's own (spec), the largest share first
            return max(live, key=lambda q: (q != job.queue, quota.share(q), q))

        fits = False
        # strategy 1: preemptor's share with the job <= target's share without the victim
        pool = {q: list(cs) for q, cs in by_queue.items()}
        while not fits:
            q = pick(pool)
            if q is None:
                break
            if q == job.queue:
                c = pool[q].pop(0)
                cycle.remove(c)
                targets.append(c)
                fits = self._fits(allow_borrow)
                continue
            mine = quota.share(job.queue, job.requests)
            while pool[q]:
                c = pool[q].pop(0)
                if not self._still(c):
                    continue
                theirs_after = quota.share(q, {r: -v for r, v in c.requests.items()})
                if mine <= theirs_after:
                    cycle.remove(c)
                    targets.append(c)
                    fits = self._fits(allow_borrow)
                    break
                retry.setdefault(q, []).append(c)
        # strategy 2: preemptor's share with the job < target's current share
        while not fits:
            q = pick(retry)
            if q is None:
                break
            mine = quota.share(job.queue, job.requests)
            theirs = quota.share(q)
            c = retry[q].pop(0)
            if mine < theirs and self._still(c):
                cycle.remove(c)
                targets.append(c)
                fits = self._fits(allow_borrow)
            else:
                retry[q] = []
        if not fits:
            self._undo(targets)
            return None
        kept = self._fill_back(targets, allow_borrow)
        self._undo(targets)
        return kept
