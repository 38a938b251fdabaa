"""The victim search's shortcut is exact: asking whether a gang fits with jobs evicted, without evicting them,
answers what evicting them and placing the gang answers, so a search it stops would have found no victim set."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from logkit import settled

from muster.events.types import (
    Event,
    JobSubmitted,
    NodeAdded,
    NodeCordoned,
    PodSet,
    QueueConfigured,
    SchedulerConfigured,
    Topology,
)
from muster.projections.cluster import evolve, node_pods
from muster.projections.index import index_of
from muster.projections.state import ClusterState
from muster.projections.topology import Transaction

LEVELS = ["block", "rack"]

running_jobs = st.lists(
    st.tuples(st.integers(1, 4), st.sampled_from([1, 2, 4, 8]), st.sampled_from([None, "rack", "block"])),
    min_size=1,
    max_size=14,
)
"""Jobs to run first: (pods, GPUs per pod, required level)."""


def _running(jobs: list[tuple[int, int, str | None]], cordon: int) -> ClusterState:
    """2 blocks x 2 racks x 2 nodes of 8 GPUs with `jobs` admitted where they fit, then node `cordon` cordoned
    (its jobs run on: evicting them gives no room a gang may take)."""
    events: list[Event] = [
        SchedulerConfigured(at=0, levels=LEVELS),
        QueueConfigured(at=0, name="q", nominal={"gpu": 1000}),
    ]
    for i in range(8):
        labels = {"block": f"b{i // 4}", "rack": f"r{i // 2}"}
        events.append(NodeAdded(at=0, node=f"n{i}", labels=labels, capacity={"gpu": 8}))
    for i, (pods, gpus, level) in enumerate(jobs):
        topology = Topology(required=level) if level else None
        podset = PodSet(name="w", count=pods, requests={"gpu": gpus}, topology=topology)
        events.append(JobSubmitted(at=0, job=f"j{i}", queue="q", podsets=[podset]))
    state = settled(events, len(jobs) + 1)
    if cordon < 8:
        evolve(state, NodeCordoned(at=1, node=f"n{cordon}", cordoned=True))
    return state


@settings(max_examples=600, deadline=None, derandomize=True)
@given(
    jobs=running_jobs,
    cordon=st.integers(0, 8),  # 8: none
    evicted=st.integers(0, (1 << 14) - 1),
    returned=st.integers(0, (1 << 14) - 1),
    pods=st.integers(1, 8),
    gpus=st.sampled_from([1, 2, 3, 4, 8]),
    required=st.sampled_from([None, "rack", "block"]),
)
def test_a_gang_fits_with_jobs_evicted_exactly_when_evicting_them_makes_it_fit(
    jobs: list[tuple[int, int, str | None]],
    cordon: int,
    evicted: int,
    returned: int,
    pods: int,
    gpus: int,
    required: str | None,
) -> None:
    """A `Freeing` says what evicting its jobs and then asking `could_place` and `can_place` says, also on a
    cordoned node, and also once some of the jobs it took are given back (as a victim walk's fill-back does);
    its bound says no only when evicting them all leaves no room."""
    state = _running(jobs, cordon)
    topology = index_of(state).topology
    running = sorted((j for j in state.jobs.values() if j.status == "admitted"), key=lambda j: j.seq)
    taken = [j for i, j in enumerate(running) if evicted >> i & 1]
    back = [j for i, j in enumerate(taken) if returned >> i & 1]
    freeing = topology.freeing(pods, {"gpu": gpus}, required, None)
    assert freeing is not None
    bound = freeing.may_place_with(taken)
    for job in taken:
        freeing.move(job, 1)
    for job in back:
        freeing.move(job, -1)
    asked = (freeing.places(), freeing.could_place(pods * gpus))
    tx = Transaction(topology)
    for job in taken:
        if job not in back:
            for node, n, req in node_pods(job.podsets, job.placement):
                tx.give(node, {k: v * n for k, v in req.items()})
    placed = (topology.can_place(pods, {"gpu": gpus}, required, None), pods * gpus <= topology.gpu_free_total)
    tx.rollback()
    assert asked == placed
    for job in taken:
        for node, n, req in node_pods(job.podsets, job.placement):
            tx.give(node, {k: v * n for k, v in req.items()})
    assert bound or not topology.can_place(pods, {"gpu": gpus}, required, None)  # a bound: False only when none fits
    tx.rollback()


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    jobs=running_jobs,
    evicted=st.integers(0, (1 << 14) - 1),
    pods=st.integers(1, 8),
    gpus=st.sampled_from([1, 2, 4, 8]),
    level=st.sampled_from(["rack", "block"]),
    keep=st.integers(1, 4),
)
def test_the_domains_that_lack_least_are_those_evicting_the_jobs_leaves_roomiest(
    jobs: list[tuple[int, int, str | None]], evicted: int, pods: int, gpus: int, level: str, keep: int
) -> None:
    """`room_short` ranks every domain of the level by what it lacks once the jobs are evicted, ties in path
    order; `could_hold` says whether one lacks nothing."""
    state = _running(jobs, 8)
    topology = index_of(state).topology
    running = sorted((j for j in state.jobs.values() if j.status == "admitted"), key=lambda j: j.seq)
    freed = [j for i, j in enumerate(running) if evicted >> i & 1]
    short = topology.room_short(pods, {"gpu": gpus}, level, freed, keep)
    held = topology.could_hold(pods, {"gpu": gpus}, level, freed)
    tx = Transaction(topology)
    for job in freed:
        for node, n, req in node_pods(job.podsets, job.placement):
            tx.give(node, {k: v * n for k, v in req.items()})
    domains = topology.by_level[topology.level_depth(level) - 1]  # type: ignore[operator]
    lacks = sorted((pods * gpus - dom.free.get("gpu", 0), i) for i, dom in enumerate(domains))
    tx.rollback()
    assert short is not None
    assert [(d.gpus, d.path) for d in short.lacks] == [(max(1, lack), domains[i].path) for lack, i in lacks[:keep]]
    assert short.rest == (max(1, lacks[keep][0]) if len(lacks) > keep else None)
    assert held == (lacks[0][0] <= 0)  # and `could_hold` says whether the roomiest would have the GPUs
