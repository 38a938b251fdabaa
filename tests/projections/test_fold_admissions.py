"""The fold checks an admission against the submitted gang, cheaply, whatever the event claims.

A `JobAdmitted` whose placement is not exactly the job's pods (`PODSET-INDEX`,
every index below the podset's count, nothing else) is counted as skipped and
changes nothing; the check never allocates per pod the spec or the event
claims, so a hostile gang of 2**40 pods cannot exhaust memory.
"""

from __future__ import annotations

import pytest

from muster.events.types import JobAdmitted, JobPreempted, JobSubmitted, NodeAdded, PodSet, QueueConfigured
from muster.projections.cluster import evolve
from muster.projections.state import ClusterState


def _state(podsets: list[PodSet]) -> ClusterState:
    state = ClusterState()
    evolve(state, QueueConfigured(at=0, name="q", nominal={"gpu": 64}))
    for n in ("n0", "n1"):
        evolve(state, NodeAdded(at=0, node=n, labels={}, capacity={"gpu": 8, "cpu": 64000}))
    evolve(state, JobSubmitted(at=0, job="j", queue="q", priority_class=None, podsets=podsets, runtime=10))
    return state


def _admit(state: ClusterState, placement: dict[str, str]) -> ClusterState:
    return evolve(state, JobAdmitted(at=1, job="j", queue="q", placement=placement, borrowed={}, cycle=1))


GANG = [PodSet(name="w", count=2, requests={"gpu": 2}), PodSet(name="ps-main", count=1, requests={"cpu": 1000})]


def test_a_matching_admission_takes_each_nodes_share() -> None:
    """An admission naming exactly the gang's pods is applied: node usage and pod counts per node."""
    state = _admit(_state(GANG), {"w-0": "n0", "w-1": "n0", "ps-main-0": "n1"})
    assert state.skipped == 0
    assert state.jobs["j"].status == "admitted"
    assert (state.nodes["n0"].used, state.nodes["n0"].jobs) == ({"gpu": 4}, {"j": 2})
    assert (state.nodes["n1"].used, state.nodes["n1"].jobs) == ({"cpu": 1000}, {"j": 1})
    evolve(state, JobPreempted(at=2, job="j", preemptor=None, reason="NodeFailure", cycle=2))
    assert (state.nodes["n0"].used, state.nodes["n0"].jobs) == ({"gpu": 0}, {})
    assert state.queues["q"].usage == {"gpu": 0, "cpu": 0}


@pytest.mark.parametrize(
    "placement",
    [
        pytest.param({"w-0": "n0", "w-1": "n0"}, id="a-pod-missing"),
        pytest.param({"w-0": "n0", "w-1": "n0", "ps-main-0": "n1", "w-2": "n1"}, id="a-pod-too-many"),
        pytest.param({"w-0": "n0", "w-2": "n0", "ps-main-0": "n1"}, id="index-past-the-count"),
        pytest.param({"w-0": "n0", "w-01": "n0", "ps-main-0": "n1"}, id="index-not-canonical"),
        pytest.param({"w-0": "n0", "w-1": "n0", "ps-main-x": "n1"}, id="index-not-a-number"),
        pytest.param({"w-0": "n0", "w-1": "n0", "other-0": "n1"}, id="unknown-podset"),
        pytest.param({"w-0": "n0", "w-1": "n9", "ps-main-0": "n1"}, id="unknown-node"),
        pytest.param({f"w-{i}": "n0" for i in range(5000)}, id="placement-far-larger-than-the-gang"),
    ],
)
def test_an_admission_that_is_not_the_gang_is_skipped(placement: dict[str, str]) -> None:
    """An admission whose placement is not exactly the submitted gang is counted and changes nothing."""
    state = _admit(_state(GANG), placement)
    assert state.skipped == 1
    assert state.jobs["j"].status == "pending"
    assert state.nodes["n0"].used == {} and state.nodes["n1"].used == {}


def test_an_admission_of_a_gang_of_2_pow_40_pods_is_skipped_without_allocating() -> None:
    """A gang submitted with 2**40 pods and admitted with a small placement is skipped at once."""
    state = _admit(_state([PodSet(name="w", count=2**40, requests={"gpu": 1})]), {"w-0": "n0", "w-1": "n1"})
    assert state.skipped == 1
    assert state.jobs["j"].status == "pending"
