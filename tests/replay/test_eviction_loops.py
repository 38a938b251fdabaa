"""Evictions never go round in a loop: a job never evicts a job its own eviction descends from."""

from __future__ import annotations

import pytest
from replaykit import mixed, sim

from muster.events.types import JobPreempted
from muster.projections.cluster import evolve
from muster.projections.eviction import eviction_chain
from muster.projections.state import ClusterState

SHAPES = [
    pytest.param(seed, fair, id=f"mixed-{seed}{'-fair-idle' if fair else ''}")
    for seed in range(4)
    for fair in (False, True)
]


@pytest.mark.parametrize(("seed", "fair"), SHAPES)
def test_no_preemptor_evicts_a_job_of_its_eviction_chain(seed: int, fair: bool) -> None:
    """Folding each log, no JobPreempted names a victim that the preemptor's own eviction descends from."""
    result = sim(mixed(seed, jobs=60, fair=fair, idle=fair))
    state = ClusterState()
    closing = []
    for ev in result.events:
        preemptor = state.jobs.get(ev.preemptor or "") if isinstance(ev, JobPreempted) else None
        if preemptor is not None and ev.job in eviction_chain(state.jobs, preemptor):
            closing.append((ev.at, preemptor.id, ev.job))
        evolve(state, ev)
    assert closing == []


def test_the_three_way_loop_of_fair_sharing_and_priorities_ends() -> None:
    """mixed(3) with fair sharing and idle reclaim (j48 evicted j3, j3 evicted j56, j56 evicted j48, once a second
    for ever) now runs to its end: every job finished, cancelled or waiting for room it may never get."""
    result = sim(mixed(3, jobs=60, fair=True, idle=True))
    assert all(j.status != "admitted" for j in result.state.jobs.values())
    preemptions = sum(isinstance(ev, JobPreempted) for ev in result.events)
    assert preemptions < 60


def test_a_job_does_not_take_the_verdict_of_one_of_its_class_that_spares_a_candidate() -> None:
    """In mixed(0) with fair sharing, j21 (evicted by j35) may not evict j35 and waits; j24, of the same class and
    tried after it at t=1325, is judged on its own and takes j35's room."""
    result = sim(mixed(0, jobs=60, fair=True, idle=True))
    taken = [(ev.job, ev.at) for ev in result.events if isinstance(ev, JobPreempted) and ev.preemptor == "j24"]
    assert ("j35", 1325) in taken
