"""A node removed and added back under the same name (a Node object deleted and re-created) while jobs run on it.

When no cycle ran between the two events, nothing evicted the node's jobs: they are still
admitted there, and the node must come back holding what they hold. It once came back
empty: another gang was placed over them (16 GPUs bound on an 8-GPU node), and their end
took their GPUs off it a second time (usage -8).
"""

from __future__ import annotations

import msgspec
from logkit import Log, job

from muster.events.types import JobAdmitted, JobFinished, JobPreempted, NodeAdded, NodeRemoved, QueueConfigured
from muster.projections.state import ClusterState


def _log() -> Log:
    """Nodes n0 and n1 of 8 GPUs, queue q of 16, job `a` (8 GPUs) admitted on n0 at t=1."""
    log = Log()
    log.add(QueueConfigured(at=0, name="q", nominal={"gpu": 16}), NodeAdded(at=0, node="n1", capacity={"gpu": 8}))
    log.add(job("a", 8, at=1))
    (admitted,) = log.cycle(1)
    assert isinstance(admitted, JobAdmitted) and admitted.placement == {"w-0": "n0"}
    return log


def _fill_n1(log: Log) -> None:
    log.add(job("fill", 8, at=1))
    (admitted,) = log.cycle(1)
    assert isinstance(admitted, JobAdmitted) and admitted.placement == {"w-0": "n1"}


def test_a_returned_node_keeps_its_running_job_and_takes_no_gang_over_it() -> None:
    """Removed and added back before any cycle, n0 still holds a's 8 GPUs: a new 8-GPU job waits instead."""
    log = _log()
    _fill_n1(log)
    log.add(NodeRemoved(at=2, node="n0"), NodeAdded(at=2, node="n0", capacity={"gpu": 8}), job("b", 8, at=2))
    assert not [e for e in log.cycle(2) if isinstance(e, JobAdmitted)]
    assert log.state.nodes["n0"].used == {"gpu": 8}
    assert log.state.nodes["n0"].jobs == {"a": 1}


def test_the_end_of_a_job_on_a_returned_node_leaves_it_empty_and_its_room_is_used() -> None:
    """a's end gives back the 8 GPUs it held on the returned n0 once (usage 0, not -8), and b runs there."""
    log = _log()
    _fill_n1(log)
    log.add(NodeRemoved(at=2, node="n0"), NodeAdded(at=2, node="n0", capacity={"gpu": 8}), job("b", 8, at=2))
    log.cycle(2)
    log.add(JobFinished(at=3, job="a"))
    assert log.state.nodes["n0"].used == {"gpu": 0}
    (admitted,) = log.cycle(3)
    assert isinstance(admitted, JobAdmitted) and (admitted.job, admitted.placement) == ("b", {"w-0": "n0"})


def test_a_node_that_returns_after_its_jobs_were_evicted_comes_back_empty() -> None:
    """A cycle between removal and return evicts a (NodeFailure): the returned n0 holds nothing of it."""
    log = _log()
    log.add(NodeRemoved(at=2, node="n0"))
    (evicted,) = log.cycle(2)
    assert isinstance(evicted, JobPreempted) and (evicted.job, evicted.reason) == ("a", "NodeFailure")
    (admitted,) = log.cycle(2)  # a cycle that evicts admits nothing: the next one places a again
    assert isinstance(admitted, JobAdmitted) and admitted.placement == {"w-0": "n1"}
    log.add(NodeAdded(at=3, node="n0", capacity={"gpu": 8}))
    assert log.state.nodes["n0"].used == {}
    assert log.state.nodes["n1"].used == {"gpu": 8}


def test_a_state_decoded_between_removal_and_return_counts_the_job_too() -> None:
    """A replica that starts from a snapshot taken while n0 was gone folds its return as a full fold does."""
    log = _log()
    log.add(NodeRemoved(at=2, node="n0"))
    log.state = msgspec.json.decode(msgspec.json.encode(log.state), type=ClusterState)
    log.add(NodeAdded(at=2, node="n0", capacity={"gpu": 8}))
    assert log.state.nodes["n0"].used == {"gpu": 8}
    assert log.state.nodes["n0"].jobs == {"a": 1}
