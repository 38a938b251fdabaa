"""The one rule of who may evict whom (spec/scenario.md, Preemption; Kueue's `preemption.go`).

`may_evict` is the only place that reads a queue's preemption policy to say
whether a preemptor may take a running job's room. The victim search
(`preemption`), the cycle's check for jobs admitted earlier in the same cycle
(`verdicts.may_evict_new`) and `explain` all ask it; they differ only in what
they know about the preemptor (`Preemptor.seq` and `Preemptor.mode` may be left
open, which asks whether *some* submission order or quota position allows it).

- A non-preemptible job (priority None here) is never a victim.
- In the preemptor's own queue, `within_queue`: LowerPriority takes lower
  priorities; LowerOrNewerEqualPriority also equal priorities submitted later;
  never a higher priority.
- From another queue of its cohort tree, and only while that queue borrows:
  reclaiming (the preemptor within its nominal quota) follows
  `reclaim_within_cohort` (Any, or LowerPriority); borrowing follows
  `borrow_within_cohort` (LowerPriority, at or under the threshold if one is
  set); with fair sharing either may apply (shares decide among them).
- Nothing at all while the preemptor was reclaimed for idleness and borrows
  (`Preemptor.idle_borrowing`, until it runs again): its room went to waiting
  work, and evicting busy jobs to give it room back would trade them for a
  job that sat idle. Within its nominal quota the rule is the usual one (the
  queue's guarantee holds); borrowing, it waits for free room.
- Never a job the preemptor's own eviction descends from (`eviction_chain`):
  who evicted it, who evicted that one while it still waits, and so on. So
  evictions never go round in a loop (A evicts B, B evicts C, C evicts A),
  at one instant or across instants, while the jobs of the loop wait.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Literal, NamedTuple

from muster.events.types import PreemptionPolicy
from muster.projections.state import JobState

Mode = Literal["reclaim", "borrow", "fair"]
"""How the preemptor takes from other queues: within its nominal quota, borrowing, or by fair share."""

LOWEST = -(1 << 62)
"""Below every priority."""


class Preemptor:
    """What the rule needs to know of a preemptor."""

    __slots__ = ("idle_borrowing", "in_cohort", "mode", "policy", "priority", "queue", "seq", "spared")

    def __init__(
        self,
        queue: str,
        priority: int,
        policy: PreemptionPolicy,
        in_cohort: bool,
        mode: Mode | None,
        seq: int | None,
        spared: frozenset[str] = frozenset(),
        idle_borrowing: bool = False,
    ) -> None:
        self.queue = queue
        self.priority = priority
        self.policy = policy
        self.in_cohort = in_cohort
        """Whether its queue belongs to a cohort (else only its own queue can give room)."""
        self.mode = mode
        """None: any mode (the answer is whether some quota position allows the eviction)."""
        self.seq = seq
        """Its place in the admission order (`JobState.order_seq`: "newer" is a later place, as Kueue's
        queue order timestamp); None: any (the answer is whether some order allows it)."""
        self.spared = spared
        """Jobs it never evicts: those its own eviction descends from (`eviction_chain`)."""
        self.idle_borrowing = idle_borrowing
        """Reclaimed for idleness (`JobState.idle_reclaimed_at`) and borrowing now: it evicts no one (False:
        not such a job, or a question about any quota position, of which within nominal allows evicting)."""

    def placed_at(self, seq: int) -> Preemptor:
        """The same preemptor at another place in the admission order."""
        return Preemptor(
            self.queue, self.priority, self.policy, self.in_cohort, self.mode, seq, self.spared, self.idle_borrowing
        )


def may_evict(
    p: Preemptor, queue: str, priority: int | None, seq: int, lender_borrowing: bool = True, job: str | None = None
) -> bool:
    """Whether `p` may evict a running job of `queue` at `priority` (None: not preemptible) placed at `seq`.

    `lender_borrowing`: whether `queue` borrows from the cohort now (a job of
    another queue is a candidate only then). `job`: its id (None: a job `p`
    does not spare).
    """
    if priority is None or p.idle_borrowing or (job is not None and job in p.spared):
        return False
    if queue == p.queue:
        within = p.policy.within_queue
        if within == "Never" or priority > p.priority:
            return False
        if priority < p.priority:
            return True
        return within == "LowerOrNewerEqualPriority" and (p.seq is None or seq > p.seq)
    if not p.in_cohort or not lender_borrowing:
        return False
    if p.mode != "borrow":
        reclaim = p.policy.reclaim_within_cohort
        if reclaim == "Any" or (reclaim == "LowerPriority" and priority < p.priority):
            return True
    if p.mode != "reclaim":
        borrow = p.policy.borrow_within_cohort
        threshold = borrow.max_priority_threshold
        if borrow.policy == "LowerPriority" and priority < p.priority and (threshold is None or priority <= threshold):
            return True
    return False


class Reach(NamedTuple):
    """How far the rule reaches for a policy in a mode, whatever the preemptor's priority (derived from `may_evict`)."""

    equal_in_queue: bool
    """Some job of the preemptor's own queue at its own priority may be evicted (for some order)."""
    others: bool
    """Some job of another queue may be evicted."""
    above_in_others: bool
    """Jobs of other queues at or above the preemptor's priority may be evicted."""


@cache
def reach(policy: PreemptionPolicy, mode: Mode | None) -> Reach:
    """The rule's reach for `policy` in `mode` (cached: policies are few and frozen)."""
    p = Preemptor("q", 0, policy, True, mode, None)
    return Reach(may_evict(p, "q", 0, 0), may_evict(p, "other", LOWEST, 0), may_evict(p, "other", 0, 0))


def evicts_from_others(policy: PreemptionPolicy, mode: Mode | None) -> bool:
    """Whether, in `mode`, the rule may let a preemptor evict any job of another queue."""
    return reach(policy, mode).others


def evicts_more_within_nominal(policy: PreemptionPolicy, in_cohort: bool, job: JobState) -> bool:
    """Whether `job` may evict jobs it may not evict now once its queue is back within nominal quota: it
    then reclaims what its cohort borrowed, or, reclaimed for idleness, evicts at all again (its wake
    waits for its queue to give back what it holds over nominal)."""
    return (in_cohort and evicts_from_others(policy, None)) or job.idle_reclaimed_at is not None


def evicts_nothing(policy: PreemptionPolicy) -> bool:
    """Whether the rule lets a preemptor under `policy` evict no job at all, whatever its position."""
    return evicts_no_one(policy, 0, LOWEST)


def evicts_no_one(policy: PreemptionPolicy, priority: int, lowest: int) -> bool:
    """Whether a preemptor at `priority` under `policy` may evict no job at all, whatever its queue,
    position or order, when no job runs below priority `lowest` (the rule only narrows as the
    victim's priority rises, so asking at `lowest` asks for every job)."""
    p = Preemptor("q", priority, policy, True, None, None)
    return not may_evict(p, "q", lowest, 0) and not may_evict(p, "other", lowest, 0)


def eviction_chain(jobs: Mapping[str, JobState], job: JobState) -> frozenset[str]:
    """The jobs a pending job's eviction descends from: who evicted it, who evicted that one while
    it still waits, and so on (a job's `evicted_by` holds until it runs again)."""
    chain: set[str] = set()
    cur = job
    while cur.evicted_by is not None and cur.evicted_by not in chain:
        chain.add(cur.evicted_by)
        nxt = jobs.get(cur.evicted_by)
        if nxt is None or nxt.status != "pending":
            break
        cur = nxt
    return frozenset(chain)


def chain_may_shrink(jobs: Mapping[str, JobState], job: JobState) -> bool:
    """Whether the job's eviction chain runs through a job that still waits: once that one runs
    again the chain is shorter, and a verdict that spared its jobs may change."""
    by = job.evicted_by
    if by is None:
        return False
    evictor = jobs.get(by)
    return evictor is not None and evictor.status == "pending"
