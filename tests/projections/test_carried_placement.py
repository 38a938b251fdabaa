"""An admission takes the nodes the look before it found only while the cycle's view is still the one looked at:
a tentative change in between makes it place afresh."""

from __future__ import annotations

import pytest
from logkit import settled

from muster.events.types import Event, JobSubmitted, NodeAdded, PodSet, QueueConfigured
from muster.projections.cycle import Cycle
from muster.projections.flavors import podsets_key
from muster.projections.index import index_of
from muster.projections.state import ClusterState


def _two_nodes_one_gang(pods: int) -> ClusterState:
    """Two 8-GPU nodes, nothing running, and a pending gang `g` of `pods` pods of 4 GPUs."""
    events: list[Event] = [QueueConfigured(at=0, name="q", nominal={"gpu": 16})]
    events += [NodeAdded(at=0, node=f"n{i}", capacity={"gpu": 8}) for i in range(2)]
    events.append(JobSubmitted(at=0, job="g", queue="q", podsets=[PodSet(name="w", count=pods, requests={"gpu": 4})]))
    return settled(events, 0)


def _free(cycle: Cycle) -> dict[str, int]:
    return {name: host.host_free.get("gpu", 0) for name, host in sorted(cycle.idx.topology.hosts.items())}


@pytest.mark.parametrize("pods", [1, 2], ids=["one-pod", "two-pods"])
def test_a_look_s_nodes_are_taken_on_the_view_it_looked_at(pods: int) -> None:
    """With nothing changed since the look, the admission takes exactly the nodes a fresh placement would."""
    state = _two_nodes_one_gang(pods)
    fresh = Cycle(state, index_of(state), 1)
    expected, _ = fresh.place(state.jobs["g"])
    fresh.finish()
    cycle = Cycle(state, index_of(state), 1)
    job = state.jobs["g"]
    assert cycle.look(job, podsets_key(job, False)) == ""
    placement, _ = cycle.place(job)
    assert placement == expected
    assert sum(_free(cycle).values()) == 16 - 4 * pods
    cycle.finish()


def test_room_taken_after_the_look_is_not_handed_out_twice() -> None:
    """A node filled between the look and the admission is not given to the gang: it lands on the other node."""
    state = _two_nodes_one_gang(2)
    cycle = Cycle(state, index_of(state), 1)
    job = state.jobs["g"]
    assert cycle.look(job, podsets_key(job, False)) == ""
    (looked,) = set(cycle.found[podsets_key(job, False)][0])
    cycle.topo.take(looked, {"gpu": 8})  # another admission of the cycle fills that node
    placement, _ = cycle.place(job)
    assert placement is not None
    assert looked not in placement.values()
    assert min(_free(cycle).values()) == 0 and all(v >= 0 for v in _free(cycle).values())
    cycle.finish()
