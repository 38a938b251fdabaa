"""A victim search answered from its candidates' sums (`holdings`) says what listing and walking them says:
the same victims, the same bounds for the wake, and the same room short per domain."""

from __future__ import annotations

import random
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st
from logkit import settled

from muster.events.types import (
    BorrowWithinCohort,
    CohortConfigured,
    Event,
    JobFinished,
    JobSubmitted,
    NodeAdded,
    PodSet,
    PreemptionPolicy,
    PriorityClassConfigured,
    QueueConfigured,
    SchedulerConfigured,
    Topology,
)
from muster.projections import preemption
from muster.projections.cluster import evolve
from muster.projections.cycle import Cycle
from muster.projections.held import _MOVES_KEPT, SummedRoom
from muster.projections.holdings import Holding, Part
from muster.projections.index import index_of
from muster.projections.preemption import Result, find_victims
from muster.projections.scheduler import decide
from muster.projections.state import ClusterState
from muster.projections.topology import Domain

LEVELS = ["block", "rack"]
QUEUES = ["qa", "qb", "qc"]
CLASSES = {"low": 0, "mid": 50, "high": 100}
POLICIES = [
    PreemptionPolicy(within_queue="LowerPriority", reclaim_within_cohort="Any"),
    PreemptionPolicy(within_queue="LowerPriority", reclaim_within_cohort="LowerPriority"),
    PreemptionPolicy(within_queue="Never", reclaim_within_cohort="Any"),
    PreemptionPolicy(
        within_queue="LowerPriority",
        reclaim_within_cohort="LowerPriority",
        borrow_within_cohort=BorrowWithinCohort(policy="LowerPriority", max_priority_threshold=50),
    ),
    PreemptionPolicy(within_queue="LowerOrNewerEqualPriority", reclaim_within_cohort="Any"),
]

Gang = tuple[str, str, int, int, str | None]
"""(queue, priority class, pods, GPUs per pod, required level)."""

gang = st.tuples(
    st.sampled_from(QUEUES),
    st.sampled_from(sorted(CLASSES)),
    st.integers(1, 4),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([None, "rack", "block"]),
)
"""Gangs to run first."""

preemptors = st.tuples(
    st.sampled_from(QUEUES),
    st.sampled_from(["mid", "high"]),
    st.integers(1, 8),
    st.sampled_from([4, 8]),
    st.sampled_from([None, "rack", "block"]),
)
"""A gang that may evict some of them, often bigger than a rack or block (then the sums answer)."""


def _podset(pods: int, gpus: int, level: str | None) -> PodSet:
    return PodSet(name="w", count=pods, requests={"gpu": gpus}, topology=Topology(required=level) if level else None)


def _running(jobs: list[Gang], policy: int, lending: int | None = None) -> ClusterState:
    """2 blocks x 2 racks x 2 nodes of 8 GPUs, three queues of 20 GPUs nominal in one cohort (each lending at
    most `lending`), `jobs` admitted where they fit (the queues borrow what the others leave)."""
    events: list[Event] = [SchedulerConfigured(at=0, levels=LEVELS), CohortConfigured(at=0, name="org")]
    events += [PriorityClassConfigured(at=0, name=name, value=value) for name, value in CLASSES.items()]
    limit = {"gpu": lending} if lending is not None else None
    events += [
        QueueConfigured(
            at=0, name=q, cohort="org", nominal={"gpu": 20}, lending_limit=limit, preemption=POLICIES[policy]
        )
        for q in QUEUES
    ]
    for i in range(8):
        labels = {"block": f"b{i // 4}", "rack": f"r{i // 2}"}
        events.append(NodeAdded(at=0, node=f"n{i}", labels=labels, capacity={"gpu": 8}))
    for i, (queue, cls, pods, gpus, level) in enumerate(jobs):
        events.append(
            JobSubmitted(at=0, job=f"j{i}", queue=queue, priority_class=cls, podsets=[_podset(pods, gpus, level)])
        )
    return settled(events, len(jobs) + 1)


def searches(test: Callable[..., None]) -> Callable[..., None]:
    """Run `test` over searches among running gangs in three queues (`jobs`, `policy`, `preemptor`, `lending`)."""
    return settings(max_examples=400, deadline=None, derandomize=True)(
        given(
            jobs=st.lists(gang, min_size=1, max_size=12),
            policy=st.integers(0, len(POLICIES) - 1),
            preemptor=preemptors,
            lending=st.sampled_from([None, 4, 12]),
        )(test)
    )


def _waiting(jobs: list[Gang], policy: int, preemptor: Gang, lending: int | None) -> tuple[ClusterState, list[str]]:
    """`jobs` running, the `preemptor` ("p") submitted at the next instant, and every job that waits (some were
    evicted, and never evict the job that evicted them)."""
    state = _running(jobs, policy, lending)
    queue, cls, pods, gpus, level = preemptor
    evolve(state, JobSubmitted(at=1, job="p", queue=queue, priority_class=cls, podsets=[_podset(pods, gpus, level)]))
    return state, sorted(j.id for j in state.jobs.values() if j.status == "pending")


def _search(state: ClusterState, job: str, sums: bool) -> tuple[tuple[object, ...], object]:
    """The search's answer for `job` at the next instant, and the room its wake finds short per domain."""
    preemption.SUMS = sums
    try:
        cycle = Cycle(state, index_of(state), 1)
        pending = state.jobs[job]
        result: Result = find_victims(cycle, pending, True)
        ps = pending.podsets[0]
        level = ps.topology.required if ps.topology is not None else "rack"
        short = cycle.idx.topology.room_short(ps.count, ps.requests, level or "rack", result.candidates, 2)
        cycle.finish()
    finally:
        preemption.SUMS = True
    victims = tuple((v.job.id, v.reason) for v in result.victims)
    held = {k: v for k, v in result.candidate_requests.items() if v}
    answer = (victims, result.quota_possible, result.candidate_gpus, held, result.order_matters)
    return answer, (short, isinstance(result.candidates, SummedRoom))


@searches
def test_a_search_read_off_the_sums_answers_as_one_that_lists_its_candidates(
    jobs: list[Gang],
    policy: int,
    preemptor: Gang,
    lending: int | None,
) -> None:
    """Victims, whether quota fits on the way, what the candidates hold and the room short per domain agree,
    for a new gang and for every job that waits."""
    state, waiting = _waiting(jobs, policy, preemptor, lending)
    for job in waiting:
        listed, (listed_short, _) = _search(state, job, sums=False)
        read, (read_short, _) = _search(state, job, sums=True)
        assert read == listed, job
        assert read_short == listed_short, job


def test_a_gang_no_rack_can_hold_waits_without_its_candidates_listed() -> None:
    """A queue borrows for its low gangs; a gang within nominal quota but bigger than any rack finds no
    victims among them, from the sums alone, and learns that evicting them would make quota fit."""
    jobs: list[Gang] = [("qa", "low", 2, 8, "rack"), ("qb", "low", 2, 8, "rack")] * 2
    state = _running(jobs, 0)
    evolve(state, JobSubmitted(at=1, job="p", queue="qc", priority_class="high", podsets=[_podset(5, 4, "rack")]))
    read, (_, from_sums) = _search(state, "p", sums=True)
    listed, _ = _search(state, "p", sums=False)
    assert from_sums and read == listed
    victims, quota_possible, gpus, _, _ = read
    assert victims == () and quota_possible and gpus == 32  # qa's two low gangs: qb's second waits on quota


def _walked(state: ClusterState, job: str, freeing: bool, sums: bool) -> tuple[object, ...]:
    """The search's answer for `job` at the next instant, walked with a `Freeing` or by evicting on the view."""
    preemption.FREEING, preemption.SUMS = freeing, sums
    try:
        cycle = Cycle(state, index_of(state), 1)
        result: Result = find_victims(cycle, state.jobs[job], True)
        view = (cycle.idx.topology.free_total(), {q: dict(n.usage) for q, n in cycle.idx.quota.queues.items()})
        cycle.finish()
    finally:
        preemption.FREEING, preemption.SUMS = True, True
    victims = tuple((v.job.id, v.reason) for v in result.victims)
    listed = None if isinstance(result.candidates, SummedRoom) else [c.id for c in result.candidates]
    return victims, result.quota_possible, result.order_matters, listed, view


@searches
def test_a_walk_that_frees_room_in_sums_evicts_whom_a_walk_that_evicts_and_places_evicts(
    jobs: list[Gang], policy: int, preemptor: Gang, lending: int | None
) -> None:
    """The same victims in the same order with the same reasons, the same bounds for the wake, and the view left
    as found, whether the walk asks a `Freeing` or evicts each candidate and places the gang (sums on or off)."""
    state, waiting = _waiting(jobs, policy, preemptor, lending)
    for job in waiting:
        evicting = _walked(state, job, freeing=False, sums=False)
        assert _walked(state, job, freeing=True, sums=False) == evicting, job
        assert _walked(state, job, freeing=True, sums=True)[:3] == evicting[:3], job


def _sums(state: ClusterState) -> list[tuple[list[Holding], SummedRoom]]:
    """The kept sums a search would read for each queue's classes and for every queue's, each depth worked out."""
    holdings = index_of(state).holdings
    sets = [[h for _, h in holdings.classes(q)] for q in QUEUES]
    sets.append([h for hs in sets for h in hs])
    out = [(hs, holdings.room(hs)) for hs in sets if hs]
    for _, room in out:
        for depth in range(holdings.depths):
            room.by_domain(depth)
    return out


@settings(max_examples=300, deadline=None, derandomize=True)
@given(jobs=st.lists(gang, min_size=1, max_size=16), ended=st.integers(0, (1 << 16) - 1))
def test_sums_kept_while_jobs_end_and_start_are_the_sums_added_up_afresh(jobs: list[Gang], ended: int) -> None:
    """What a search reads per domain off the kept sums of some classes, after jobs of theirs ended and waiting
    ones started in their room (a class emptied, new ones made), is what adding up those classes now gives."""
    state = _running(jobs, 0)
    _sums(state)
    for i, job in enumerate(sorted(state.jobs)):
        if ended >> i & 1 and state.jobs[job].status == "admitted":
            evolve(state, JobFinished(at=1, job=job))
    for _ in range(len(jobs)):
        decided = decide(state, 1)
        if not decided:
            break
        for ev in decided:
            evolve(state, ev)
    depths = index_of(state).holdings.depths
    for hs, room in _sums(state):
        afresh = SummedRoom([h.rooms for h in hs])
        assert [room.by_domain(d) for d in range(depths)] == [afresh.by_domain(d) for d in range(depths)]


@settings(max_examples=30, deadline=None, derandomize=True)
@given(seed=st.integers(0, 1 << 16), count=st.sampled_from([3, 40, _MOVES_KEPT - 1, 2 * _MOVES_KEPT + 7]))
def test_a_kept_sum_asked_after_any_number_of_moves_reads_its_classes_added_up_now(seed: int, count: int) -> None:
    """A kept sum of two classes, asked once, then asked again after jobs came and went in them (more than
    a class's log keeps, too), reads what adding the classes up afresh gives at every depth."""
    rng = random.Random(seed)
    racks = [Domain(f"r{i}", 1, None, False) for i in range(3)]
    classes = [Holding(2), Holding(2)]
    room = SummedRoom([h.rooms for h in classes], [h.log for h in classes])
    room.by_domain(seed % 2)
    running: list[tuple[Holding, Part]] = []
    for _ in range(count):
        if running and rng.random() < 0.4:
            holding, part = running.pop(rng.randrange(len(running)))
            holding.move(part, -1)
            continue
        gpus = rng.randint(1, 8)
        part = Part(("qa", 0), {"gpu": gpus}, ({racks[0]: gpus}, {rng.choice(racks): gpus}))
        holding = rng.choice(classes)
        holding.move(part, 1)
        running.append((holding, part))
    afresh = SummedRoom([h.rooms for h in classes])
    assert [room.by_domain(d) for d in range(2)] == [afresh.by_domain(d) for d in range(2)]
