"""The one eviction rule (`eviction.may_evict`) as a table: preemptor, candidate, answer."""

from __future__ import annotations

import pytest

from muster.events.types import BorrowWithinCohort, PodSet, PreemptionPolicy
from muster.projections.eviction import (
    Mode,
    Preemptor,
    chain_may_shrink,
    eviction_chain,
    evicts_from_others,
    evicts_nothing,
    may_evict,
)
from muster.projections.state import JobState


def policy(
    within: str = "Never", reclaim: str = "Never", borrow: str = "Never", threshold: int | None = None
) -> PreemptionPolicy:
    """A queue's preemption policy from its three settings."""
    return PreemptionPolicy(
        within_queue=within,  # type: ignore[arg-type]
        reclaim_within_cohort=reclaim,  # type: ignore[arg-type]
        borrow_within_cohort=BorrowWithinCohort(policy=borrow, max_priority_threshold=threshold),  # type: ignore[arg-type]
    )


def preemptor(p: PreemptionPolicy, mode: Mode | None = "reclaim", prio: int = 100, seq: int | None = 10) -> Preemptor:
    """A preemptor of queue `q` in a cohort."""
    return Preemptor("q", prio, p, True, mode, seq)


# (preemptor, candidate queue, candidate priority (None: not preemptible), candidate seq, lender borrowing, answer)
CASES = [
    # within_queue
    pytest.param(preemptor(policy("LowerPriority")), "q", 50, 1, True, True, id="within-lower-priority-takes-lower"),
    pytest.param(preemptor(policy("LowerPriority")), "q", 100, 20, True, False, id="within-lower-priority-not-equal"),
    pytest.param(preemptor(policy("LowerPriority")), "q", 200, 1, True, False, id="within-lower-priority-not-higher"),
    pytest.param(preemptor(policy("LowerOrNewerEqualPriority")), "q", 100, 20, True, True, id="within-newer-equal"),
    pytest.param(
        preemptor(policy("LowerOrNewerEqualPriority")), "q", 100, 5, True, False, id="within-older-equal-kept"
    ),
    pytest.param(
        preemptor(policy("LowerOrNewerEqualPriority"), seq=None), "q", 100, 5, True, True, id="within-equal-any-order"
    ),
    pytest.param(preemptor(policy("LowerOrNewerEqualPriority")), "q", 50, 5, True, True, id="within-newer-equal-lower"),
    pytest.param(preemptor(policy("Never", reclaim="Any")), "q", 0, 1, True, False, id="within-never"),
    # reclaim_within_cohort, the preemptor within its nominal quota
    pytest.param(preemptor(policy(reclaim="Any")), "r", 500, 1, True, True, id="reclaim-any-takes-higher"),
    pytest.param(preemptor(policy(reclaim="Any")), "r", 500, 1, False, False, id="reclaim-only-from-borrowers"),
    pytest.param(preemptor(policy(reclaim="LowerPriority")), "r", 50, 1, True, True, id="reclaim-lower-takes-lower"),
    pytest.param(preemptor(policy(reclaim="LowerPriority")), "r", 100, 1, True, False, id="reclaim-lower-not-equal"),
    pytest.param(preemptor(policy(reclaim="Never")), "r", 0, 1, True, False, id="reclaim-never"),
    pytest.param(
        preemptor(policy(reclaim="Never", borrow="LowerPriority")),
        "r",
        0,
        1,
        True,
        False,
        id="reclaiming-ignores-borrow",
    ),
    # borrow_within_cohort, the preemptor borrowing
    pytest.param(
        preemptor(policy(reclaim="Any"), mode="borrow"), "r", 0, 1, True, False, id="borrowing-ignores-reclaim"
    ),
    pytest.param(
        preemptor(policy(borrow="LowerPriority"), mode="borrow"), "r", 50, 1, True, True, id="borrow-lower-no-threshold"
    ),
    pytest.param(
        preemptor(policy(borrow="LowerPriority"), mode="borrow"), "r", 100, 1, True, False, id="borrow-not-equal"
    ),
    pytest.param(
        preemptor(policy(borrow="LowerPriority", threshold=40), mode="borrow"),
        "r",
        40,
        1,
        True,
        True,
        id="borrow-at-threshold",
    ),
    pytest.param(
        preemptor(policy(borrow="LowerPriority", threshold=40), mode="borrow"),
        "r",
        50,
        1,
        True,
        False,
        id="borrow-over-threshold",
    ),
    # fair sharing, and an open mode: either cohort rule
    pytest.param(
        preemptor(policy(reclaim="LowerPriority"), mode="fair"), "r", 50, 1, True, True, id="fair-reclaim-rule"
    ),
    pytest.param(preemptor(policy(borrow="LowerPriority"), mode="fair"), "r", 50, 1, True, True, id="fair-borrow-rule"),
    pytest.param(
        preemptor(policy(reclaim="LowerPriority"), mode="fair"), "r", 150, 1, True, False, id="fair-not-higher"
    ),
    pytest.param(preemptor(policy(reclaim="Any"), mode=None), "r", 150, 1, True, True, id="open-mode-either-rule"),
    # non-preemptible, and a queue outside any cohort
    pytest.param(preemptor(policy("LowerPriority", "Any")), "q", None, 1, True, False, id="non-preemptible-own-queue"),
    pytest.param(
        preemptor(policy("LowerPriority", "Any")), "r", None, 1, True, False, id="non-preemptible-other-queue"
    ),
    pytest.param(
        Preemptor("q", 100, policy(reclaim="Any"), False, "reclaim", 10),
        "r",
        0,
        1,
        True,
        False,
        id="no-cohort-no-others",
    ),
]


@pytest.mark.parametrize(("p", "queue", "prio", "seq", "borrowing", "answer"), CASES)
def test_may_evict(p: Preemptor, queue: str, prio: int | None, seq: int, borrowing: bool, answer: bool) -> None:
    """Each policy setting lets the preemptor evict exactly the candidates of its row."""
    assert may_evict(p, queue, prio, seq, borrowing) is answer


def test_policies_that_evict_nothing() -> None:
    """Only all three settings at Never evict nothing; a threshold below every priority still lets borrowing evict."""
    assert evicts_nothing(policy())
    assert not evicts_nothing(policy(within="LowerPriority"))
    assert not evicts_nothing(policy(borrow="LowerPriority", threshold=-(10**9)))
    assert evicts_from_others(policy(reclaim="Any"), "reclaim")
    assert not evicts_from_others(policy(reclaim="Any"), "borrow")
    assert evicts_from_others(policy(borrow="LowerPriority"), "fair")


def _job(name: str, status: str = "pending", evicted_by: str | None = None) -> JobState:
    """A one-pod job of queue `q` in `status`, evicted by `evicted_by`."""
    podsets = [PodSet(name="w", count=1, requests={"gpu": 8})]
    job = JobState(
        id=name,
        queue="q",
        priority_class=None,
        podsets=podsets,
        runtime=None,
        checkpoint_every=None,
        seq=1,
        submitted_at=0,
    )
    job.status = status  # type: ignore[assignment]
    job.evicted_by = evicted_by
    return job


def test_a_job_never_evicts_a_job_its_own_eviction_descends_from() -> None:
    """C waits, evicted by B, which waits, evicted by A (running): C spares A and B, whatever the policy allows."""
    jobs = {j.id: j for j in (_job("a", "admitted"), _job("b", evicted_by="a"), _job("c", evicted_by="b"))}
    chain = eviction_chain(jobs, jobs["c"])
    assert chain == {"a", "b"}
    assert chain_may_shrink(jobs, jobs["c"]) and not chain_may_shrink(jobs, jobs["b"])
    p = Preemptor("q", 100, policy(reclaim="Any"), True, "reclaim", 10, chain)
    assert not may_evict(p, "r", 0, 1, True, "a")
    assert may_evict(p, "r", 0, 1, True, "d")
    assert may_evict(p, "r", 0, 1, True)  # a job left unnamed is not spared


def test_the_chain_ends_at_a_job_that_runs_again() -> None:
    """Once the job that evicted it runs again (its own `evicted_by` cleared), the chain stops there."""
    jobs = {j.id: j for j in (_job("a", "admitted"), _job("b", "admitted"), _job("c", evicted_by="b"))}
    assert eviction_chain(jobs, jobs["c"]) == {"b"}
    assert not chain_may_shrink(jobs, jobs["c"])
