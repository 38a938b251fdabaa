"""Findings of the replay work about the scheduler core: preemption loops.

Both are fixed: a job evicted by another may not evict it in return until it
has run again (`JobState.evicted_by`), and a job evicted at an instant does not
evict others at that instant (`JobState.preempted_at`), so chains of evictions
end within the instant.

Found by auditing seeded `muster sim` scenarios (tests/replay/replaykit.mixed):
in both scenarios below, the cycles at one instant never settle; the
simulator gives up after 100,000 cycles (`SimulationError`), and a daemon
would evict and readmit the same jobs forever. Each test runs the scenario
up to just before that instant, applies the last submission and runs at most
50 cycles, as `muster sim` does, with the public `evolve` and `decide`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from muster.events.types import JobAdmitted, JobPreempted, JobSubmitted
from muster.projections.cluster import evolve
from muster.projections.scheduler import decide
from muster.replay.scenario import load
from muster.replay.simulator import simulate

FINDINGS = Path(__file__).parent / "findings"
RECLAIM_AFTER_BORROW = FINDINGS / "reclaim_after_borrow.yaml"
"""qb (high) borrows and evicts qa's scavenger jobs under borrow_within_cohort; qa, back within its
nominal quota, reclaims from the borrower qb (reclaim_within_cohort: Any); and round again at t=1040."""
FAIR_SHARING_NESTED = FINDINGS / "fair_sharing_nested_cohorts.yaml"
"""Fair sharing in nested cohorts (lab inside org, qb weight 2): FairSharing and WithinQueue evictions
chase each other at t=565."""


def _settles(path: Path) -> bool:
    """Whether the cycles at the instant of the last submission settle within 50 cycles."""
    scenario = load(path)
    last = scenario.inputs[-1]
    assert last.kind == "submit"
    state = simulate(dataclasses.replace(scenario, until=last.at - 1)).state
    d = last.data
    evolve(
        state,
        JobSubmitted(
            at=last.at,
            job=d["job"],
            queue=d["queue"],
            priority_class=d["priority_class"],
            podsets=d["podsets"],
            runtime=d["runtime"],
            checkpoint_every=d["checkpoint_every"],
        ),
    )
    for _ in range(50):
        events = decide(state, last.at)
        for ev in events:
            evolve(state, ev)
        if not any(isinstance(ev, (JobAdmitted, JobPreempted)) for ev in events):
            return True
    return False


def test_reclaim_after_borrow_within_cohort_settles() -> None:
    """A borrower's BorrowWithinCohort evictions are not undone by the victims' queue reclaiming at once."""
    assert _settles(RECLAIM_AFTER_BORROW)


def test_fair_sharing_in_nested_cohorts_settles() -> None:
    """Fair-sharing preemptions in a cohort tree settle within a few cycles."""
    assert _settles(FAIR_SHARING_NESTED)
