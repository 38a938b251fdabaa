"""A rack-bound gang waits for room in a rack: a release elsewhere does not wake it, one that covers its lack does."""

from __future__ import annotations

from muster.events.codec import encode
from muster.events.types import (
    Event,
    JobFinished,
    JobSubmitted,
    NodeAdded,
    PodSet,
    QueueConfigured,
    SchedulerConfigured,
    Topology,
)
from muster.projections import parking
from muster.projections.cluster import fold
from muster.projections.index import index_of
from muster.projections.scheduler import decide
from muster.projections.state import ClusterState


def _one(name: str, at: int) -> JobSubmitted:
    return JobSubmitted(at=at, job=name, queue="q", podsets=[PodSet(name="w", count=1, requests={"gpu": 8})])


def _log() -> list[Event]:
    """Racks r0 and r1 of two 8-GPU nodes; b0 and b1 fill r0 (a1, submitted next, runs in r1)."""
    events: list[Event] = [
        SchedulerConfigured(at=0, levels=["rack"]),
        QueueConfigured(at=0, name="q", nominal={"gpu": 64}),
    ]
    for rack in ("r0", "r1"):
        for i in range(2):
            events.append(NodeAdded(at=0, node=f"{rack}-n{i}", labels={"rack": rack}, capacity={"gpu": 8}))
    events += [_one("b0", 0), _one("b1", 0)]
    return events


def _gang() -> JobSubmitted:
    two = PodSet(name="w", count=2, requests={"gpu": 8}, topology=Topology(required="rack"))
    return JobSubmitted(at=2, job="g", queue="q", podsets=[two])


def _run(steps: list[tuple[int, list[Event]]]) -> tuple[ClusterState, list[bytes]]:
    """Fold each step's inputs, then decide at its time and fold the decisions; the decisions' bytes."""
    state = fold(_log())  # type: ignore[arg-type]
    out: list[bytes] = []
    fold(decide(state, 0), state)
    for at, inputs in steps:
        fold(inputs, state)
        decided = decide(state, at)
        out += [encode(e) for e in decided]
        fold(decided, state)
    return state, out


STEPS: list[tuple[int, list[Event]]] = [
    (1, [_one("a1", 1)]),
    (2, [_gang()]),
    (3, [JobFinished(at=3, job="b0")]),  # 8 GPUs freed in r0, which lacked 16
    (4, [JobFinished(at=4, job="a1")]),  # 8 GPUs freed in r1, which lacked 8
]


def test_release_in_another_rack_does_not_wake_a_rack_bound_gang() -> None:
    """A gang parked for want of room in one rack stays parked when a release leaves every rack short of it."""
    state, _ = _run(STEPS[:3])
    assert set(state.jobs["a1"].placement.values()) == {"r1-n0"} and state.jobs["g"].status == "pending"
    assert "g" in index_of(state).parking.parked


def test_release_that_covers_a_racks_lack_admits_the_gang() -> None:
    """The release that gives one rack the room the gang lacked there wakes it, and it is admitted into that rack."""
    state, _ = _run(STEPS)
    g = state.jobs["g"]
    assert g.status == "admitted"
    assert set(g.placement.values()) == {"r1-n0", "r1-n1"}


def test_domain_wakes_decide_as_without_the_memo() -> None:
    """With the memo off every job is tried every cycle: the decisions are the same bytes."""
    _, with_memo = _run(STEPS)
    parking.PARKING = False
    try:
        _, without = _run(STEPS)
    finally:
        parking.PARKING = True
    assert with_memo == without
    assert any(b'"JobAdmitted"' in b and b'"g"' in b for b in with_memo)
