"""Who may be preempted for a pending job, and the minimal set that makes it fit.

Follows Kueue's `preemption.go` and spec/scenario.md (Preemption):
- no job running on a host that holds room for a reservation the preemptor
  may not use is a candidate (that room is promised to another gang);
- candidates come from the preemptor's own queue (`within_queue`) and from
  borrowing queues of its cohort tree (`reclaim_within_cohort`,
  `borrow_within_cohort` with its priority threshold); a non-preemptible job
  is never a candidate;
- candidates are ordered: other queues first, lower priority, least work lost
  (GPU-seconds since the last checkpoint), most recently admitted
  (`candidates`: listing them in that order);
- victims are removed in that order until the preemptor fits, then each victim
  whose room is not needed is kept (tried in reverse), so the set is minimal;
- with fair sharing, a queue is preempted from only while the preemptor's
  share with the job stays at or under that queue's share without the victim
  (or, failing that, below its current share) (`victim_walk`: the walk).

This module decides which search a job gets: answered off its candidates'
sums (`holdings`) when those settle it, else listed and walked. Everything is
tentative on the cycle's view and undone before returning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from muster.events.types import PreemptionReason
from muster.projections.candidates import UNREACHABLE, list_candidates
from muster.projections.candidates import overlaps as overlaps
from muster.projections.eviction import Mode, Preemptor, eviction_chain, may_evict, reach
from muster.projections.flavors import placement_request, unassigned
from muster.projections.held import SummedRoom
from muster.projections.holdings import Held, Holding
from muster.projections.jobfacts import preemptible, priority_of
from muster.projections.resources import gpus_of
from muster.projections.state import JobState
from muster.projections.victim_walk import Probe, Roomy, fits_given

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
"""Switch for walking victims with a `Freeing` (`Probe.minimal`); off, every candidate taken is evicted on the
cycle's view and the gang placed (tests prove both agree)."""

_NONE = Result([], False, 0, {})


def preemptor_rule(cycle: Cycle, job: JobState, reclaimed: bool = False) -> Preemptor:
    """What the eviction rule knows of `job` as a preemptor on the cycle's view (`reclaimed`: as it will
    be once reclaimed for idleness now, else as the log left it)."""
    state = cycle.state
    queue = state.queues[job.queue]
    quota = cycle.idx.quota
    within = quota.within_nominal(job.queue, job.requests)
    # a job that never borrows (`preemptible`: a non-preemptible one) is admitted only within nominal quota,
    # so it takes room from other queues by the reclaim rule whatever its queue holds now (spec: Preemption)
    reclaims = within or not preemptible(state, job)
    mode: Mode = "fair" if state.fair_sharing else "reclaim" if reclaims else "borrow"
    prio, chain = priority_of(state, job), eviction_chain(state.jobs, job)
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
    candidates = list_candidates(cycle, job, rule)
    if not candidates:
        return _NONE
    held: dict[str, int] = {}
    for c in candidates:
        for r, v in c.requests.items():
            held[r] = held.get(r, 0) + v
    gpus = gpus_of(held)  # a flavored job's candidates hold `gpu@FLAVOR`
    roomy = Roomy(candidates, hopeless.roomy) if hopeless.roomy is not None else None
    probe = Probe(cycle, job, rule, roomy, FREEING)
    same = [c for c in candidates if c.queue == job.queue]
    if len(same) == len(candidates):
        victims = probe.minimal(candidates, allow_borrow, None)
    elif state.fair_sharing:
        victims = probe.fair(candidates, allow_borrow)
    elif policy.borrow_within_cohort.policy == "LowerPriority":
        # borrowing, `list_candidates` kept only the jobs the preemptor may take while it borrows
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
    return Result(_with_reasons(rule, victims), True, gpus, held)


class Unanswered(NamedTuple):
    """`_hopeless`: the sums do not answer the search (its candidates are listed and walked)."""

    roomy: bool | None
    """Whether the nodes could hold the job were every candidate evicted, as the sums showed (None: not
    asked): `Probe._room_possible`'s answer for the same candidates listed, which is then not asked again."""


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
    fails with no victim set tried (`Probe.minimal`, `_room_possible`); what it learns on the way is
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
            classes = holdings.classes(other)
            if other == job.queue or not classes or classes[0][0] > upto:
                continue  # none of its classes is in reach (the lowest priority comes first)
            borrowing = idx.quota.is_borrowing(other, job.requests)
            taken = [h for cp, h in classes if cp <= upto and may_evict(p, other, cp, 0, borrowing)]
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
    if requests.get("gpu", 0) <= 0:
        return False
    return len(requests) == 1 or all(v <= 0 for k, v in requests.items() if k != "gpu")


def _quota_fits(cycle: Cycle, job: JobState, freed: Mapping[str, int], allow_borrow: bool) -> bool:
    """Whether the quota holds `job` with `freed` GPUs given back per queue (a GPU-only job's fit reads
    only GPU usage)."""
    return fits_given(cycle, job, {queue: {"gpu": gpus} for queue, gpus in freed.items() if gpus}, allow_borrow)


def _with_reasons(rule: Preemptor, victims: list[JobState]) -> list[Victim]:
    """The victims with why each is taken: the rule that let the preemptor take it (`rule.mode`, its quota
    position when the search began), so a victim taken while it would borrow says so even when the jobs
    taken from its own queue bring it back within nominal quota."""
    out: list[Victim] = []
    for v in victims:
        reason: PreemptionReason
        if v.queue == rule.queue:
            reason = "WithinQueue"
        elif rule.mode == "fair":
            reason = "FairSharing"
        elif rule.mode == "reclaim":
            reason = "ReclaimWithinCohort"
        else:
            reason = "BorrowWithinCohort"
        out.append(Victim(v, reason))
    return out
