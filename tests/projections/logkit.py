"""A log built the way the daemon builds it: inputs folded, then a cycle decided and its decisions folded."""

from __future__ import annotations

from muster.events.types import Event, JobSubmitted, LeaderElected, NodeAdded, PodSet, QueueConfigured
from muster.projections.cluster import evolve
from muster.projections.scheduler import decide
from muster.projections.state import ClusterState


def job(name: str, gpus: int, at: int, queue: str = "q") -> JobSubmitted:
    """A one-pod job of `gpus` GPUs that runs 100 s."""
    return JobSubmitted(
        at=at, job=name, queue=queue, podsets=[PodSet(name="w", count=1, requests={"gpu": gpus})], runtime=100
    )


def settled(events: list[Event], rounds: int) -> ClusterState:
    """The state with `events` folded, then up to `rounds` cycles at their instant decided and folded
    (until one decides nothing): the jobs admitted where they fit."""
    state = ClusterState()
    for ev in events:
        evolve(state, ev)
    for _ in range(rounds):
        decided = decide(state, 0)
        if not decided:
            break
        for ev in decided:
            evolve(state, ev)
    return state


class Log:
    """One queue `q` of 8 GPUs on one 8-GPU node `n0`, leader epoch 1; `add` folds inputs, `cycle` decides."""

    def __init__(self) -> None:
        self.state = ClusterState()
        self.events: list[Event] = []
        self.add(
            LeaderElected(at=0, epoch=1, holder="a"),
            QueueConfigured(at=0, name="q", nominal={"gpu": 8}),
            NodeAdded(at=0, node="n0", capacity={"gpu": 8}),
        )

    def add(self, *events: Event) -> None:
        for ev in events:
            evolve(self.state, ev)
            self.events.append(ev)

    def cycle(self, now: int) -> list[Event]:
        decided = decide(self.state, now)
        self.add(*decided)
        return decided
