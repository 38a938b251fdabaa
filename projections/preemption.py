"""Who may be preempted for a pending job, and the minimal set that makes it fit.

Follows Kueue's `preemption.go` and spec/scenario.md (Preemption):
- no job running on a host that holds room for a reservation the preemptor
  may not use is a candidate (that room is promised to another gang);
- candidates come from the preemptor's own queue (`within_queue`) and from
  borrowing queues of its cohort tree (`reclaim_within_cohort`,
  `borrow_within_cohort` with its priority threshold); a non-preemptible job
  is never a candidate;
- candidates are ordered: other queues first, lower priority, least work lost
  (GPU-seconds since the last checkpoint), most recently admitted;
- victims are removed in that order until the preemptor fits, then each victim
  whose room is not needed is kept (tried in reverse), so the set is minimal;
- with fair sharing, a queue is preempted from only while the preemptor's
  share with the job stays at or under that queue's share without the victim
  (or, failing that, below its current share).

Everything is tentative on the cycle's view and undone before returning.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from muster.events.types import PreemptionReason
from muster.projections.eviction import LOWEST, Mode, Preemptor, eviction_chain, may_evict, reach
from muster.projections.flavors import placement_request, unassigned
from muster.projections.holdings import Held, Holding
from muster.projections.index import VictimEntry, VictimList, VictimMemo
from muster.projections.resources import gpus_of
from muster.projections.state import JobState
from muster.projections.topology import Freeing, SummedRoom

if TYPE_CHECKING:
    from muster.projections.cycle import Cycle


class Victim(NamedTuple):
    job: JobState
    reason: PreemptionReason


class Result(NamedTuple):
    victims: list[Victim]
    quota_possible: bool
    """Whether removing candidates could make the quota fit (placement aside)."""
    candidate_gpus: int
    """GPUs held by every candidate: an upper bound on what preemption can free."""
    candidate_requests: dict[str, int]
    """Everything held by every candidate, per resource."""
    order_matters: bool = False
    """Whether the verdict may depend on the candidates' order, which moves with time (lost
    work grows between checkpoints): other queues' candidates are skipped once their queue
    stops borrowing, and fair sharing weighs shares victim by victim."""
    candidates: Sequence[JobState] | SummedRoom = ()
    """Every candidate, when no victim set was found (the room they hold bounds the job's wake); for a
    search decided from its candidates' sums (`_hopeless`), the room they hold, summed."""


SUMS = True
"""Switch for answering searches off their candidates' sums (`_hopeless`); off, every search lists its
candidates (tests prove both agree)."""

FREEING = True
"""Switch for walking victims with a `Freeing` (`_Probe.minimal`); off, every candidate taken is evicted on the
cycle's view and the gang placed (tests prove both agree)."""

_NONE = Result([], False, 0, {})
UNREACHABLE = 1 << 62
"""Above every priority: the whole victim order."""


def _candidates(cycle: Cycle, job: JobState, p: Preemptor) -> list[JobState]:
    """Every running job `eviction.may_evict` lets `p` take that holds something `job` asks for.

    Other queues' first (in victim order across them), then its own queue's.
    """
    idx = cycle.idx
    # the room reserved for another gang is not the preemptor's to free: no victim there (`reservations`)
    removed = cycle.removed | cycle.fence.spared(job, cycle.state.nodes) if cycle.fence.held else cycle.removed
    prio = p.priority
    own: list[JobState] = []
    rule = reach(p.policy, p.mode)
    if p.policy.within_queue != "Never":
        # in victim order, priorities rise: stop at the first the rule refuses whatever the order
        equal = rule.equal_in_queue
        # jobs the rule refuses whatever the order are left out of the order (their lost work
        # is not computed)
        for cp, _, _, _, c in victim_order(cycle, job.queue, prio if equal else prio - 1):
            if cp > prio or (cp == prio and not equal):
                break
            if c.id in removed or not overlaps(c, job):
                continue
            if may_evict(p, job.queue, cp, c.order_seq, job=c.id):
                own.append(c)
    others: list[VictimEntry] = []
    if p.in_cohort and rule.others:
        upto = UNREACHABLE if rule.above_in_others else prio - 1
        for other in idx.tree_queues.get(idx.roots.get(job.queue, job.queue), ()):
            if other == job.queue or not idx.running.get(other):
                continue
            borrowing = idx.quota.is_borrowing(other, job.requests)
            if not may_evict(p, other, LOWEST, 0, borrowing):
                continue  # not even its lowest priority: none of its jobs (the order is not needed)
            for entry in victim_order(cycle, other, upto):
                cp, c = entry.priority, entry.job
                if not may_evict(p, other, cp, c.order_seq, borrowing):
                    break  # for other queues the rule only narrows as priority rises
                if c.id in removed or not overlaps(c, job) or not may_evict(p, other, cp, c.order_seq, borrowing, c.id):
                    continue
                others.append(entry)
    others.sort()  # by (priority, lost, neg_admitted, neg_seq): seq is unique, so the job is never compared
    return [e.job for e in others] + own


def victim_order(cycle: Cycle, queue: str, upto: int) -> list[VictimEntry]:
    """A queue's preemptible running jobs of priority <= `upto` in victim order (priority,
    lost work, newest); kept for the instant. Callers walk it in order and stop at a priority
    they may not take, so a longer list serves them too."""
    idx, now = cycle.idx, cycle.now
    if upto < cycle.state.lowest_priority():
        # no job is below the lowest class (a scavenger's search): nothing to order, however many run
        return []
    version = idx.running_version.get(queue, 0)
    hit = idx.victim_cache.get(queue)
    if hit is not None and hit.at == now and hit.upto >= upto:
        if hit.version == version:
            return hit.entries
        # the running set changed since (admissions, ends, evictions folded at this instant):
        # the other jobs' entries hold for the instant, so only the jobs that came or went move
        changed = set(idx.running_changes.pop(queue, ()))
        running = idx.running.get(queue, set())
        keys = [e for e in hit.entries if e.job.id not in changed]
        for j in sorted(changed):
            if j in running:
                entry = _victim_entry(cycle, j, hit.upto)
                if entry is not None:
                    bisect.insort(keys, entry)
        idx.victim_cache[queue] = VictimList(now, version, hit.upto, keys)
        return keys
    idx.running_changes.pop(queue, None)
    keys = [e for j in idx.running.get(queue, ()) if (e := _victim_entry(cycle, j, upto)) is not None]
    keys.sort()
    idx.victim_cache[queue] = VictimList(now, version, upto, keys)
    return keys


def _victim_entry(cycle: Cycle, job_id: str, upto: int) -> VictimEntry | None:
    """A running job's place in victim order at the cycle's instant (None: not preemptible, or above `upto`).

    A job's entry holds for the instant (and its admission): several cycles at one
    instant reuse it (`index.victim_entries`).
    """
    idx, now, state = cycle.idx, cycle.now, cycle.state
    c = state.jobs[job_id]
    entries = idx.victim_entries
    memo = entries.get(job_id)
    if memo is not None and memo.admitted_at == c.admitted_at:
        prio = memo.priority
        if prio is None or prio > upto:
            return None  # not preemptible, or out of reach
        if memo.at == now and memo.entry is not None:
            return memo.entry
    else:
        prio = state.priority_of(c) if state.preemptible(c) else None
        if prio is None or prio > upto:
            entries[job_id] = VictimMemo(-1, c.admitted_at, prio, None)
            return None
    entry = VictimEntry(prio, c.lost_gpu_seconds(now), -(c.admitted_at or 0), -c.seq, c)
    entries[job_id] = VictimMemo(now, c.admitted_at, prio, entry)
    return entry


def overlaps(candidate: JobState, job: JobState) -> bool:
    """A candidate helps only if it holds something the preemptor asks for."""
    return any(v > 0 and candidate.requests.get(r, 0) > 0 for r, v in job.requests.items())


def preemptor_rule(cycle: Cycle, job: JobState, reclaimed: bool = False) -> Preemptor:
    """What the eviction rule knows of `job` as a preemptor on the cycle's view (`reclaimed`: as it will
    be once reclaimed for idleness now, else as the log left it)."""
    state = cycle.state
    queue = state.queues[job.queue]
    quota = cycle.idx.quota
    within = quota.within_nominal(job.queue, job.requests)
    mode: Mode = "fair" if state.fair_sharing else "reclaim" if within else "borrow"
    prio, chain = state.priority_of(job), eviction_chain(state.jobs, job)
    idle_borrowing = (reclaimed or job.idle_reclaimed_at is not None) and not within
    return Preemptor(
        job.queue, prio, queue.preemption, queue.cohort is not None, mode, job.order_seq, chain, idle_borrowing
    )


def find_victims(cycle: Cycle, job: JobState, allow_borrow: bool) -> Result:
    """The victims to evict so that `job` fits, or none."""
    state = cycle.state
    if job.chained_eviction(cycle.now):
        return _NONE
    policy = state.queues[job.queue].preemption
    rule = preemptor_rule(cycle, job)
    if rule.idle_borrowing:
        return _NONE  # the rule lets it evict no one (the sums in `_hopeless` do not ask it per class)
    hopeless = _hopeless(cycle, job, rule, allow_borrow)
    if isinstance(hopeless, Result):
        return hopeless
    candidates = _candidates(cycle, job, rule)
    if not candidates:
        return _NONE
    held: dict[str, int] = {}
    for c in candidates:
        for r, v in c.requests.items():
            held[r] = held.get(r, 0) + v
    gpus = gpus_of(held)  # a flavored job's candidates hold `gpu@FLAVOR`
    probe = _Probe(cycle, job, rule, Roomy(candidates, hopeless.roomy) if hopeless.roomy is not None else None)
    same = [c for c in candidates if c.queue == job.queue]
    if len(same) == len(candidates):
        victims = probe.minimal(candidates, allow_borrow, None)
    elif state.fair_sharing:
        victims = probe.fair(candidates, allow_borrow)
    elif policy.borrow_within_cohort.policy == "LowerPriority":
        # borrowing, `_candidates` kept only the jobs the preemptor may take while it borrows
        victims = probe.minimal(candidates, allow_borrow, policy.borrow_within_cohort.max_priority_threshold)
    else:
        # other queues' jobs are candidates only while reclaiming: first without borrowing
        victims = probe.minimal(candidates, False, None) or probe.minimal(same, allow_borrow, None)
    if not victims:
        # with only own-queue candidates a failure means that evicting all of them
        # does not help, whatever their order; nor does any order help when the nodes could
        # not hold the job with every candidate evicted (every victim set is a subset of them)
        order_matters = state.fair_sharing or (len(same) != len(candidates) and probe.walked)
        return Result([], probe.quota_possible, gpus, held, order_matters, candidates)
    return Result(_with_reasons(cycle, job, victims), True, gpus, held)


class Unanswered(NamedTuple):
    """`_hopeless`: the sums do not answer the search (its candidates are listed and walked)."""

    roomy: bool | None
    """Whether the nodes could hold the job were every candidate evicted, as the sums showed (None: not
    asked): `_Probe._room_possible`'s answer for the same candidates listed, which is then not asked again."""


_UNKNOWN = Unanswered(roomy=None)
_ROOMY = Unanswered(roomy=True)
_CRAMPED = Unanswered(roomy=False)


def _hopeless(cycle: Cycle, job: JobState, p: Preemptor, allow_borrow: bool) -> Result | Unanswered:
    """`find_victims`' answer read off its candidates' sums (`holdings`) when it has no candidate, or when
    the nodes could not hold the job were every candidate evicted; `Unanswered` when that is not so, or
    not for the sums to say (then the candidates are listed and walked).

    For a GPU-only gang of one podset, judged on the cycle's view as folded (no job tentatively
    evicted, no reserved room to spare, none of its eviction chain a candidate) outside fair sharing,
    the candidates are whole (queue, priority) classes: the preemptor's own queue's below its priority
    (a policy that takes equals orders them by submission: not for the sums), and each other queue's
    that the rule lets it take while that queue borrows (the rule only narrows as priority rises). Such a search
    fails with no victim set tried (`_Probe.minimal`, `_room_possible`); what it learns on the way is
    whether quota fits once candidates are removed: with only its own queue's, with all of them gone
    (`_fits_without`); with other queues', the walk (`_quota_only`) stops taking a queue's jobs once it
    no longer borrows, so it frees between what that queue borrows and all it holds there, and the sums
    answer unless quota fits in between (then the walk decides, in its order)."""
    state, idx = cycle.state, cycle.idx
    if not SUMS or state.fair_sharing or cycle.removed or cycle.fence.held or len(job.podsets) != 1:
        return _UNKNOWN
    ps = job.podsets[0]
    topology = idx.topology
    request = placement_request(job, ps.name, ps.requests, topology.tainted)
    if not (_gpu_only(job.requests) and _gpu_only(request)) or unassigned(state, job):
        return _UNKNOWN
    rule = reach(p.policy, p.mode)
    if rule.equal_in_queue:
        return _UNKNOWN
    holdings = idx.holdings
    same: list[Holding] = []
    if p.policy.within_queue != "Never":
        same = [h for prio, h in holdings.classes(job.queue) if prio < p.priority]
    others: list[tuple[str, list[Holding]]] = []
    if p.in_cohort and rule.others:
        upto = UNREACHABLE if rule.above_in_others else p.priority - 1
        for other in idx.tree_queues.get(idx.roots.get(job.queue, job.queue), ()):
            if other == job.queue:
                continue
            borrowing = idx.quota.is_borrowing(other, job.requests)
            taken = [h for cp, h in holdings.classes(other) if cp <= upto and may_evict(p, other, cp, 0, borrowing)]
            if taken:
                others.append((other, taken))
    held = Held(same + [h for _, hs in others for h in hs])
    if not held.holdings:
        return _NONE
    if any(holdings.holds(spared, held.holdings) for spared in sorted(p.spared)):
        return _UNKNOWN  # a job it never evicts is in a class it takes: the class's sums overcount
    t = ps.topology
    room = holdings.room(held.holdings)
    if topology.could_hold(ps.count, request, t.required if t is not None else None, room):
        return _ROOMY
    own_gpus = Held(same).requests().get("gpu", 0)
    if not others:
        possible = _quota_fits(cycle, job, {job.queue: own_gpus}, allow_borrow)
    elif p.policy.borrow_within_cohort.policy == "LowerPriority":
        return _CRAMPED  # past the threshold the walk stops borrowing, in its order
    else:
        # `find_victims`: every candidate without borrowing, then its own queue's with leave to borrow
        quota = idx.quota.queues
        least = {job.queue: own_gpus}
        most = {job.queue: own_gpus}
        for other, hs in others:
            holds = Held(hs).requests().get("gpu", 0)
            node = quota[other]
            borrowed = node.usage.get("gpu", 0) - node.nominal.get("gpu", 0)
            least[other], most[other] = min(holds, borrowed), holds
        if _quota_fits(cycle, job, least, False) or _quota_fits(cycle, job, {job.queue: own_gpus}, allow_borrow):
            possible = True
        elif not _quota_fits(cycle, job, most, False):
            possible = False
        else:
            return _CRAMPED
    requests = held.requests()
    return Result([], possible, gpus_of(requests), requests, False, room)


def _gpu_only(requests: Mapping[str, int]) -> bool:
    """Whether a request asks for GPUs and nothing else (what `holdings` sums per domain)."""
    return requests.get("gpu", 0) > 0 and all(v <= 0 for k, v in requests.items() if k != "gpu")


def _quota_fits(cycle: Cycle, job: JobState, freed: Mapping[str, int], allow_borrow: bool) -> bool:
    """Whether the quota holds `job` with `freed` GPUs given back per queue (a GPU-only job's fit reads
    only GPU usage)."""
    return _fits_given(cycle, job, {queue: {"gpu": gpus} for queue, gpus in freed.items() if gpus}, allow_borrow)


def _fits_given(cycle: Cycle, job: JobState, given: Mapping[str, Mapping[str, int]], allow_borrow: bool) -> bool:
    """Whether the quota holds `job` with `given` usage given back per queue: in sums (a queue's usage moves
    its tree the same, one job at a time or summed)."""
    quota = cycle.idx.quota
    mark = quota.mark()
    for queue, requests in given.items():
        quota.add(queue, requests, -1)
    fits = quota.fits(job.queue, job.requests, allow_borrow)
    quota.rollback(mark)
    return fits


def _with_reasons(cycle: Cycle, job: JobState, victims: list[JobState]) -> list[Victim]:
    """The victims with why each is taken: whether the preemptor is within its nominal quota once they are
    gone reads only the quota, so only their usage is given back (and taken again)."""
    state, quota = cycle.state, cycle.idx.quota
    mark = quota.mark()
    for v in victims:
        quota.add(v.queue, v.requests, -1)
    within_nominal = quota.within_nominal(job.queue, job.requests)
    quota.rollback(mark)
    out: list[Victim] = []
    for v in victims:
        reason: PreemptionReason
        if v.queue == job.queue:
            reason = "WithinQueue"
        elif state.fair_sharing:
            reason = "FairSharing"
        elif within_nominal:
            reason = "ReclaimWithinCohort"
        else:
            reason = "BorrowWithinCohort"
        out.append(Victim(v, reason))
    return out


WALK_BEFORE_ASKING = 32
"""Candidates a victim walk removes one by one before asking whether it can end in a fit at all."""


class Turn(NamedTuple):
    """A candidate `_Probe.minimal` removes in its turn, with whether the preemptor may borrow once it is."""

    job: JobState
    may_borrow: bool


class Turns(NamedTuple):
    """`_Probe._turns`: the candidates removed in turn, and whether the quota fits after some run of them."""

    turns: list[Turn]
    quota_fits: bool


class Roomy(NamedTuple):
    """`_Probe._room_possible`'s answer for a list of candidates, known before the probe (`Unanswered`)."""

    candidates: list[JobState]
    answer: bool


class _Probe:
    """Tries victim sets on the cycle's view, leaving it unchanged."""

    def __init__(self, cycle: Cycle, job: JobState, rule: Preemptor, roomy: Roomy | None = None) -> None:
        self.cycle = cycle
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
            return freeing.could_place(job.gpus) and freeing.places()
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
        return may_evict(self.rule, c.queue, cycle.state.priority_of(c), c.order_seq, borrowing)

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
                cp = state.priority_of(c)
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
        self.freeing = self._freeing() if FREEING else None
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
            turns = iter(rest.turns)

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
                fits = _fits_given(cycle, job, given, turns[-1].may_borrow)
            turns.append(Turn(c, may_borrow))
            back = given.setdefault(c.queue, {})
            for r, v in c.requests.items():
                back[r] = back.get(r, 0) + v
        self.given = None
        if turns and not fits:
            fits = _fits_given(cycle, job, given, turns[-1].may_borrow)
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
        return _fits_given(self.cycle, self.job, {self.job.queue: total}, allow_borrow)

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
        for t in turns.turns:
            freeing.move(t.job, 1)
        if not (freeing.could_place(self.job.gpus) and freeing.places()):
            return False
        for t in turns.turns:
            freeing.move(t.job, -1)  # the walk goes on, turn by turn
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
