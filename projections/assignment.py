"""The flavored path of a scheduling cycle: Kueue's flavor assigner (pkg/scheduler/flavorassigner).

`attempt(cycle, job, allow_borrow)` is the whole interface the cycle uses for
a job of a queue with resource groups: it says what to do with the job
(`Admit` it on its flavors, `Evict` victims for it, or `Wait`, with the words
and the wake of its verdict); the cycle does it. `choose` alone answers
whether a job fits now (idle reclaim asks it).

- per podset, for each resource group its requests touch, the group's flavors
  are tried in order and every resource of the group comes from one flavor; a
  podset's own `flavors` list rules the others out; podsets are assigned in
  order, each judged with the podsets before it, and may get different flavors;
- a flavor fits when the quota holds the podset within nominal or by borrowing
  and the flavor's nodes hold its pods. Fungibility (Kueue's defaults):
  `when_can_borrow: Borrow` stops at the first flavor that fits by borrowing,
  `TryNextFlavor` looks on for one within nominal and falls back to the first
  that borrows; `when_can_preempt: TryNextFlavor` preempts only when no flavor
  fits, in the first flavor where victims make room, `Preempt` preempts in a
  flavor where victims make room before trying the flavors after it;
- the gang is admitted whole (every podset has a flavor) or not at all;
- a podset asking for a resource no resource group of its queue covers makes the
  gang inadmissible, as in Kueue, saying which (`flavors.uncovered`);
- a flavored job that waits is parked (`parking`) with a wake that covers every
  flavor it tried (`wake`); the memo-equivalence tests hold with flavors too;
- `victim_search` is the same search for `explain`: what the candidates on the
  job's flavors hold, or the victims it would evict.

A flavored job waits through many tries, each judging every flavor: what its
queue and podsets alone give is worked out once per class (`flavorplan.Plan`), and
the words of a flavor its quota stops are `quotawords`'.

The choice reads only the cycle's view (quota tree and topology), so replay,
audit and a new leader make the same one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, NamedTuple

from muster.projections import flavors
from muster.projections.configuration import flavored_requests
from muster.projections.eviction import evicts_more_within_nominal
from muster.projections.flavorplan import Slot, Trial, complete, on_trial, plan_of
from muster.projections.flavors import Flavors, PodsetsKey, podsets_key, view
from muster.projections.jobfacts import priority_of
from muster.projections.parking import Wake
from muster.projections.preemption import Result, Victim, find_victims
from muster.projections.quotawords import limit_reached, quota_asked, quota_words, words_of
from muster.projections.resources import gpus_of
from muster.projections.state import JobState, QueueState

if TYPE_CHECKING:
    from muster.projections.cycle import Cycle

Mode = Literal["fit", "borrow", "no"]


_NO_AMOUNTS: dict[str, int] = {}
"""The default of the fields below: shared, as no one writes them."""
_NO_REFUSALS: list[Refusal] = []


class Choice:
    """A flavored job's flavors on the cycle's view."""

    __slots__ = ("admit", "consumed", "preempt", "reason", "refusals", "short")

    def __init__(
        self,
        admit: JobState | None,
        preempt: list[JobState],
        reason: str,
        consumed: dict[str, int] = _NO_AMOUNTS,
        short: dict[str, int] = _NO_AMOUNTS,
        refusals: list[Refusal] = _NO_REFUSALS,
    ) -> None:
        self.admit = admit
        """The job on its flavors, when every podset has one that fits now."""
        self.preempt = preempt
        """Else the job on each flavor to look for victims in, in order."""
        self.reason = reason
        """Else why each flavor tried failed (`h100: quota (...); a100: no rack has room ...`)."""
        self.consumed = consumed
        """Else, per quota key, the use in the tree after which the words may change (see `wake`)."""
        self.short = short
        """Else, per quota key, what a flavor whose quota stopped it lacks (its largest shortfall)."""
        self.refusals = refusals
        """Else the flavors tried that their nodes stopped (GPUs freed there may change the choice)."""


class _Verdict:
    __slots__ = ("consumed", "mode", "refusal", "short", "why")

    def __init__(
        self,
        mode: Mode,
        why: str,
        consumed: dict[str, int] = _NO_AMOUNTS,
        short: dict[str, int] = _NO_AMOUNTS,
        refusal: Refusal | None = None,
    ) -> None:
        self.mode = mode
        self.why = why
        self.consumed = consumed
        self.short = short
        self.refusal = refusal


class Admit(NamedTuple):
    """Admit the job: `job` is it on its flavors, its nodes already taken by `Cycle.place`."""

    job: JobState
    placement: dict[str, str]
    borrowed: dict[str, int]


class Evict(NamedTuple):
    """Evict `victims` to make room for `job` (the job on the flavors to preempt in)."""

    job: JobState
    victims: list[Victim]


class Wait:
    """Park the job: why each flavor failed, and what must happen before that may change."""

    __slots__ = ("reason", "wake")

    def __init__(self, reason: str, wake: Wake) -> None:
        self.reason = reason
        self.wake = wake


def attempt(cycle: Cycle, job: JobState, allow_borrow: bool) -> Admit | Evict | Wait:
    """What to do with a pending job of a queue with flavors: admit it on the flavors `choose` finds,
    else preempt in the first flavor where victims make room, else wait saying why each flavor failed."""
    choice = choose(cycle, job, allow_borrow, lambda v: bool(find_victims(cycle, v, allow_borrow).victims))
    if choice.admit is not None:
        on = choice.admit
        borrowed = cycle.idx.quota.borrowed_by(on.queue, on.requests)
        placement, _ = cycle.place(on)
        if placement is not None:
            return Admit(on, placement, borrowed)
    searched = _search(cycle, choice.preempt, allow_borrow)
    if searched and searched[-1][1].victims:
        on, result = searched[-1]
        return Evict(on, result.victims)
    return Wait(choice.reason, wake(cycle, job, choice, [result for _, result in searched]))


def _search(cycle: Cycle, options: list[JobState], allow_borrow: bool) -> list[tuple[JobState, Result]]:
    """The victim searches for a job on each of `options` (the job on flavors to preempt in), in order,
    up to the first that finds victims (then last)."""
    out: list[tuple[JobState, Result]] = []
    for on in options:
        result = find_victims(cycle, on, allow_borrow)
        out.append((on, result))
        if result.victims:
            break
    return out


def victim_search(cycle: Cycle, job: JobState, allow_borrow: bool) -> Result:
    """The core's victim search for a pending job now (`explain` asks it): for a flavored job, the one
    `attempt` makes, flavor by flavor; the victims of the first flavor that has some, else what the
    candidates of every flavor tried hold. A flavored job that fits now needs no victims."""
    if not flavors.unassigned(cycle.state, job):
        return find_victims(cycle, job, allow_borrow)
    choice = choose(cycle, job, allow_borrow, lambda v: bool(find_victims(cycle, v, allow_borrow).victims))
    if choice.admit is not None:
        return Result([], True, 0, {})
    searched = _search(cycle, choice.preempt, allow_borrow)
    if searched and searched[-1][1].victims:
        return searched[-1][1]
    held: dict[str, int] = {}
    for _, result in searched:
        for k, v in result.candidate_requests.items():
            held[k] = max(held.get(k, 0), v)  # the same candidates may be found for several flavors
    possible = any(r.quota_possible for _, r in searched)
    return Result([], possible, gpus_of(held), held, any(r.order_matters for _, r in searched))


def choose(
    cycle: Cycle, job: JobState, allow_borrow: bool, victims_in: Callable[[JobState], bool] | None = None
) -> Choice:
    """The flavors of every podset of `job` (see the module docstring); leaves the view as found.

    `victims_in(job_on_flavors)` says whether preemption makes room there (for `Preempt`)."""
    queue = cycle.state.queues[job.queue]
    plan = plan_of(cycle, job, queue)
    if plan.uncovered:
        # as Kueue: what no resource group gives quota for cannot be admitted (a queue_update may cover it)
        return Choice(None, [], plan.uncovered)
    policy = queue.fungibility
    slots = plan.slots
    chosen: Flavors = {}
    reasons: list[str] = []
    consumed: dict[str, int] = {}
    short: dict[str, int] = {}
    full = False
    """Whether the last verdict judged the whole gang on `chosen` (then it needs no final look)."""
    stuck: list[Slot] = []
    """Podset-groups no flavor fits now."""
    refusals: list[Refusal] = []
    many = len(job.podsets) > 1
    for slot in slots:
        ps, covered, allowed = slot.podset, slot.covered, slot.allowed
        words: list[str] = []
        pick: str | None = None
        fallback: str | None = None
        for f in allowed:
            # the first podset-group is judged with nothing chosen before it: its trials are the plan's
            known = plan.first.get(f) if slot is slots[0] else None
            if known is not None:
                trial = known.chosen
            else:
                trial = {**chosen, ps.name: {**chosen.get(ps.name, {}), **dict.fromkeys(covered, f)}}
            verdict = _judge(cycle, job, slot.upto, trial, allow_borrow, queue, f, known)
            if verdict.mode == "fit" or (verdict.mode == "borrow" and policy.when_can_borrow == "Borrow"):
                pick = f
                break
            if verdict.mode == "borrow":
                fallback = fallback or f
                continue
            for k, v in verdict.consumed.items():
                consumed[k] = min(v, consumed.get(k, v))
            for k, v in verdict.short.items():
                short[k] = min(v, short.get(k, v))
            if verdict.refusal is not None:
                refusals.append(verdict.refusal)
            words.append(f"{f}: {verdict.why}")
            if policy.when_can_preempt == "Preempt" and victims_in is not None:
                whole = view(job, complete(trial, slots))
                if victims_in(whole):
                    return Choice(None, [whole], "; ".join([*reasons, *words]))
        if pick is None and fallback is not None:
            pick = fallback
            full = False  # judged last on a flavor after the one taken
        elif pick is not None:
            full = slot.upto == len(job.podsets)
        if pick is not None:
            chosen.setdefault(ps.name, {}).update(dict.fromkeys(covered, pick))
            continue
        if not allowed:
            words.append(f"none of its flavors ({', '.join(ps.flavors)}) is one of queue {job.queue}'s")
        reasons.append(f"{ps.name}: {'; '.join(words)}" if many else "; ".join(words))
        stuck.append(slot)
    if not stuck:
        whole = view(job, chosen)
        if full:
            return Choice(whole, [], "")
        final = _judge(cycle, job, None, chosen, allow_borrow, queue, None)
        if final.mode != "no":
            return Choice(whole, [], "")
        if final.refusal is not None:
            refusals.append(final.refusal)
        return Choice(None, [whole], final.why, final.consumed, final.short, refusals)
    options: list[JobState] = []
    if len(slots) == 1:
        # the one podset-group got no flavor: the job on each of its flavors is the plan's
        return Choice(
            None, [on_trial(job, plan.first[f]) for f in slots[0].allowed], reasons[0], consumed, short, refusals
        )
    for slot in stuck:
        name = slot.podset.name
        for f in slot.allowed:
            trial = {**chosen, name: {**chosen.get(name, {}), **dict.fromkeys(slot.covered, f)}}
            options.append(view(job, complete(trial, slots)))
    return Choice(None, options, "; ".join(reasons), consumed, short, refusals)


def _judge(
    cycle: Cycle,
    job: JobState,
    upto: int | None,
    chosen: Flavors,
    allow_borrow: bool,
    queue: QueueState,
    flavor: str | None,
    known: Trial | None = None,
) -> _Verdict:
    """Whether the job's first `upto` podsets on `chosen` fit quota (within nominal or borrowing) and nodes now.

    A failure says why, and the use of quota in the tree after which those words may change
    (quota words that name a borrowing limit; a placement failure turning into a quota one).
    `known`: `chosen` as the job's plan has it (its requests and quota words' keys worked out)."""
    if known is not None:
        requests = known.requests
    else:
        podsets = job.podsets if upto is None else job.podsets[:upto]
        requests = flavored_requests(podsets, chosen)
    quota = cycle.idx.quota
    # the quota holds the request exactly when no limited resource is left short (`QuotaTree.fits`)
    headroom = quota.headroom(job.queue, requests, allow_borrow)
    lacking = {k: -h for k, h in headroom.items() if h < 0}
    if lacking:
        if known is not None:
            reached = limit_reached(cycle, queue, known.asked, known.quota)
            said = known.words.get((allow_borrow, reached))
            if said is None:
                said = known.words[allow_borrow, reached] = words_of(
                    known.asked, known.quota, allow_borrow, queue.cohort is not None, reached
                )
            why, limited = said
        else:
            why, limited = quota_words(cycle, queue, *quota_asked(queue, requests, flavor), allow_borrow)
        most = max(sorted(lacking), key=lambda k: lacking[k])
        return _Verdict("no", why, dict.fromkeys(limited, 1), {most: lacking[most]})
    partial = view(job, chosen, upto)
    refused = _nodes_refuse(cycle, partial)
    if refused is not None:
        return _Verdict("no", refused.why, {k: h + 1 for k, h in headroom.items()}, {}, refused)
    return _Verdict("fit" if quota.within_nominal(job.queue, requests) else "borrow", "")


class Refusal(NamedTuple):
    """Why the nodes cannot hold a job on its flavors, and how many GPUs it lacks on the nodes it may take."""

    why: str
    lacking: int
    flavors: list[str] | None
    """The flavors of its GPU pods (None: a podset takes its GPUs on no flavor, from any node)."""


def _nodes_refuse(cycle: Cycle, on: JobState) -> Refusal | None:
    """Why the nodes cannot hold `on` now (None when they can), with `Cycle.place`'s words.

    Jobs of many queues ask the same flavors for the same pods in a cycle: the answer is kept
    until the view changes, that is until the cycle takes room for a job (`Cycle.placed` grows);
    a view with jobs tentatively removed (a victim search, idle reclaim) is judged afresh."""
    key: tuple[object, ...] | None = None
    podsets: PodsetsKey | None = None
    if not cycle.removed:
        podsets = podsets_key(on, cycle.idx.topology.tainted)
        key = (len(cycle.placed), *podsets)
        if key in cycle.nodes_judged:
            return cycle.nodes_judged[key]
    why = cycle.look(on, podsets)
    refusal = None
    if why:
        names = _gpu_flavors(on)
        refusal = Refusal(why, on.gpus - gpu_room(cycle, names), names)
    if key is not None:
        cycle.nodes_judged[key] = refusal
    return refusal


def _gpu_flavors(on: JobState) -> list[str] | None:
    """The flavors a job on its flavors takes GPUs on (None: a podset takes them on no flavor)."""
    names: set[str] = set()
    for ps in on.podsets:
        if ps.requests.get("gpu", 0) > 0:
            name = on.flavors.get(ps.name, {}).get("gpu") if on.flavors else None
            if name is None:
                return None
            names.add(name)
    return sorted(names)


def gpu_room(cycle: Cycle, names: list[str] | None) -> int:
    """The free GPUs of the nodes a job on its flavors may put its GPU pods on: its flavors' nodes
    (`_gpu_flavors`; counted once per flavor: an upper bound where flavors share nodes), or every node
    when a podset has no flavor for its GPUs (None)."""
    topology = cycle.idx.topology
    if names is None:
        return topology.gpu_free_total
    return sum(topology.gpu_free_on(name) for name in names)


def wake(cycle: Cycle, job: JobState, choice: Choice, found: list[Result]) -> Wake:
    """What must happen before a flavored job's verdict (or its words) can change (see `parking`).

    Any of its flavors may become possible: one its quota stopped, once its tree gives back what
    that flavor lacks (less what its candidates hold); one its nodes stopped (or whose quota
    evicting candidates would make fit), once GPUs freed reach what it lacked on its nodes beyond
    what the candidates hold; the words, once the quota used in its tree crosses `Choice.consumed`;
    a reclaim, once its queue gives back what it would hold over nominal quota on a flavor (the
    least over the flavors tried); and, when the victims' order moves with time (or it was just
    evicted), the next second. `found` are the victim searches made for it, one per flavor tried."""
    held: dict[str, int] = {}
    for result in found:
        for k, v in result.candidate_requests.items():
            held[k] = max(held.get(k, 0), v)

    # GPUs freed change nothing for flavors that only quota stopped, unless evicting candidates
    # would make their quota fit (then placement decides, as for a plain job); a flavor whose
    # nodes stopped it needs what it lacked on its nodes, less what the candidates hold
    # (the candidates' GPUs on those flavors: only they can be evicted to make room there)
    def freeable(names: list[str] | None) -> int:
        if names is None:
            return gpus_of(held)
        return sum(held.get(f"gpu@{name}", 0) for name in names)

    # one flavor's nodes: GPUs freed there (`parking` counts them per flavor); several, or any node:
    # GPUs freed anywhere, which `parking` counts against the whole cluster's free GPUs, while those
    # pods see only their flavors' nodes' (so the free GPUs of the other nodes are added back)
    shortfalls: list[int] = []
    freed_on: dict[str, int] = {}

    def lacks(names: list[str] | None, short: int) -> None:
        if names is not None and len(names) == 1:
            freed_on[names[0]] = min(short, freed_on.get(names[0], short))
        else:
            shortfalls.append(short)

    for r in choice.refusals:
        lacks(r.flavors, r.lacking - freeable(r.flavors))
    for on, result in zip(choice.preempt, found, strict=True):
        if result.quota_possible:
            names = _gpu_flavors(on)
            lacks(names, on.gpus - gpu_room(cycle, names) - freeable(names))
    freed_short = min(shortfalls) + cycle.idx.topology.gpu_free_total if shortfalls else None
    state = cycle.state
    queue = state.queues[job.queue]
    woken = Wake(
        freed_short=freed_short,
        freed_on=freed_on,
        released={k: max(1, v - held.get(k, 0)) for k, v in choice.short.items()},
        consumed=dict(choice.consumed),
        # as a plain job's (`verdicts.wake_rule`): new victims change nothing for one that may evict no one
        new_victims=not cycle.idx.evicts_no_one(job.queue, priority_of(state, job)),
    )
    if evicts_more_within_nominal(queue.preemption, queue.cohort is not None, job):
        for on in choice.preempt:
            over = cycle.idx.quota.over_nominal(job.queue, on.requests)
            if not over:
                continue
            k = max(sorted(over), key=lambda r: over[r])
            woken.own_released[k] = min(over[k], woken.own_released.get(k, over[k]))
    if any(r.order_matters for r in found) or job.chained_eviction(cycle.now):
        woken.at_time = cycle.now + 1
    return woken
