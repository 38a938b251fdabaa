"""Reservations and backfill (spec/scenario.md, Reservations and backfill): a waiting gang's room is held
back from every job that would delay it, a job whose declared limit ends in time may use it, and a
queue's nominal quota is reached within the longest running limit in its way."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from simkit import Outcome, flat_nodes, queue, run, scenario, submit

from muster.events.types import ReservationMade, ReservationReleased
from muster.replay.scenario import loads
from muster.replay.specreader import ScenarioError

TWO_NODES = flat_nodes(8, 8)  # 16 GPUs


def reservations(out: Outcome) -> list[ReservationMade]:
    return [e for e in out.events if isinstance(e, ReservationMade)]


def releases(out: Outcome) -> list[tuple[str, str, int]]:
    return [(e.job, e.reason, e.at) for e in out.events if isinstance(e, ReservationReleased)]


def backfill_case(limit: int | None, runtime: int, reserve_after: int | None = 0) -> Outcome:
    """qb runs r1 (ends by 1000) and r2 (ends by 2000) on the two nodes; qa's 16-GPU gang arrives at 10 and
    gets a reservation (expected start 2000); qb's job `c` (8 GPUs, `limit`) arrives at 20."""
    queues = [queue("qa", 8, "org", reserve_after=reserve_after), queue("qb", 8, "org")]
    timeline = [submit(f"r{i}", "qb", 8, runtime=t, limit=t) for i, t in ((1, 1000), (2, 2000))]
    timeline += [submit("big", "qa", 16, at=10, runtime=100), submit("c", "qb", 8, at=20, runtime=runtime, limit=limit)]
    return run(scenario(TWO_NODES, queues, timeline, cohorts=["org"]))


@pytest.mark.parametrize(
    ("limit", "runtime", "c_at", "big_at"),
    [
        pytest.param(900, 300, 1000, 2000, id="limit-ends-before-the-start-backfills"),
        pytest.param(1000, 300, 1000, 2000, id="limit-ends-exactly-at-the-start-backfills"),
        pytest.param(1001, 300, 2100, 2000, id="limit-ends-after-the-start-is-held-back"),
        pytest.param(None, 300, 2100, 2000, id="no-limit-never-backfills"),
        pytest.param(None, 1500, 2100, 2000, id="a-long-job-without-limit-does-not-delay-the-gang"),
    ],
)
def test_a_reservation_lets_through_only_a_job_whose_limit_ends_in_time(
    limit: int | None, runtime: int, c_at: int, big_at: int
) -> None:
    """Room freed on reserved nodes goes to a job only when its limit ends by the expected start."""
    out = backfill_case(limit, runtime)
    [made] = reservations(out)
    assert (made.job, made.at, made.nodes, made.expected_start) == ("big", 10, ["n0", "n1"], 2000)
    assert [(w.job, w.end) for w in made.waits_for] == [("r1", 1000), ("r2", 2000)]
    assert out.admitted("c").at == c_at
    assert out.admitted("big").at == big_at
    assert releases(out) == [("big", "admitted", big_at)]


def test_without_reserve_after_the_job_that_fits_delays_the_gang() -> None:
    """The same arrivals with reservations off: `c` takes the first freed node and the gang waits for it to end."""
    out = backfill_case(None, 1500, reserve_after=None)
    assert reservations(out) == []
    assert out.admitted("c").at == 1000 and out.admitted("big").at == 2500


def test_a_reservation_waits_for_reserve_after_when_the_gang_borrows() -> None:
    """A gang beyond its nominal quota is reserved for only once it has waited reserve_after seconds."""
    out = backfill_case(None, 300, reserve_after=500)
    [made] = reservations(out)
    assert made.at == 1000 and made.reason == "waited 990 s (reserve_after 500 s)"
    # at 1000, r1's node went to c in the cycle that found the gang due: the reservation holds from the next one
    assert out.admitted("c").at == 1000 and out.admitted("big").at == 2000


def reserved_behind(nodes: str, borrowers: list[int], qb_nominal: int, *more: str) -> Outcome:
    """qb's jobs r1, r2, ... (8 GPUs each, ending by the given limits) fill `nodes`; qa's 16-GPU gang `big`
    arrives at 10 and gets a reservation; then the `more` timeline entries."""
    queues = [queue("qa", 8, "org", reserve_after=0), queue("qb", qb_nominal, "org")]
    timeline = [submit(f"r{i}", "qb", 8, runtime=t, limit=t) for i, t in enumerate(borrowers, start=1)]
    timeline += [submit("big", "qa", 16, at=10, runtime=100), *more]
    return run(scenario(nodes, queues, timeline, cohorts=["org"]))


def test_a_cancelled_holder_releases_its_room() -> None:
    """The holder is cancelled: its reservation is released (`cancelled`) and the held-back job runs."""
    out = reserved_behind(
        TWO_NODES, [1000, 2000], 8, submit("c", "qb", 8, at=20, runtime=300), "  - {at: 1500, cancel: big}\n"
    )
    assert releases(out) == [("big", "cancelled", 1500)]
    assert out.admitted("c").at == 1500


def test_a_reserved_node_that_fails_is_replaced() -> None:
    """A reserved node goes down: the reservation is released (`replaced`) and made again on nodes that can serve."""
    out = reserved_behind(flat_nodes(8, 8, 8), [1000, 2000, 3000], 16, "  - {at: 500, node_down: n0}\n")
    made = reservations(out)
    assert [(m.at, m.nodes, m.expected_start) for m in made] == [(10, ["n0", "n1"], 2000), (500, ["n1", "n2"], 3000)]
    assert releases(out)[0] == ("big", "replaced", 500)
    # r1, evicted from n0 and requeued, backfills n1 at 2000: its limit ends by 3000
    assert out.admissions("r1")[1].at == 2000
    assert out.admitted("big").at == 3000


def test_a_required_domain_is_reserved_where_it_frees_soonest() -> None:
    """A gang that needs one rack reserves the rack whose jobs' limits end first, naming the jobs it waits for."""
    nodes = (
        "topology:\n  levels: [rack]\nnodes:\n"
        '  - generate: {count: 2, name: "{rack}-n{i}", labels: {rack: [r0, r1]}, capacity: {gpu: 8}}\n'
    )
    queues = [queue("qa", 16, "org", reserve_after=0), queue("qb", 16, "org")]
    timeline = [
        submit("a", "qb", 16, runtime=900, limit=900, required="rack"),  # one whole rack until 900
        submit("b", "qb", 8, runtime=300, limit=400),
        submit("d", "qb", 8, runtime=300, limit=500),
        submit("big", "qa", 16, at=10, runtime=100, required="rack"),
    ]
    out = run(scenario(nodes, queues, timeline, cohorts=["org"]))
    [made] = reservations(out)
    assert made.domain == "r1" and made.expected_start == 500
    assert sorted((w.job, w.end) for w in made.waits_for) == [("b", 400), ("d", 500)]
    assert out.admitted("big").at == 300  # b and d ran 300 s, less than their limits


@pytest.mark.parametrize("seed", range(6))
def test_a_nominal_quota_gang_starts_within_the_longest_running_limit_in_its_way(seed: int) -> None:
    """A gang within its queue's nominal quota is reserved for at once and admitted by the latest end of the
    limited jobs running when it arrived, whatever its own small jobs and the borrowers submit after it."""
    rng = random.Random(seed)
    queues = [queue("team", 16, "org", reserve_after=86_400), queue("others", 16, "org")]
    timeline = []
    limits: list[int] = []
    for i in range(4):  # the borrowers fill the cluster with limited jobs
        limit = rng.randint(200, 3000)
        limits.append(limit)
        timeline.append(submit(f"o{i}", "others", 8, runtime=rng.randint(100, limit), limit=limit))
    timeline.append(submit("gang", "team", 16, at=50, runtime=100))
    for i in range(20):  # then small jobs of both queues keep coming, half of them without a limit
        q = rng.choice(["team", "others"])
        limit = rng.choice([None, rng.randint(60, 600)])
        at = 60 + 30 * i
        timeline.append(submit(f"s{i}", q, rng.choice([1, 2, 4]), per_pod=1, at=at, runtime=60, limit=limit))
    out = run(scenario(flat_nodes(8, 8, 8, 8), queues, timeline, cohorts=["org"]))
    made = [m for m in reservations(out) if m.job == "gang"]
    assert made and made[0].at == 50 and made[0].reason == "within its queue's nominal quota"
    assert out.admitted("gang").at <= max(limits)


def test_reserve_after_must_be_a_whole_number_of_seconds() -> None:
    """`reserve_after` takes a whole number of seconds, 0 or more; anything else is a scenario error with its line."""
    text = scenario(TWO_NODES, [queue("qa", 16)], [submit("a", "qa")]).replace(
        "name: qa,", "name: qa, reserve_after: -5,"
    )
    with pytest.raises(ScenarioError) as err:
        loads(text, "s.yaml")
    assert "reserve_after must be at least 0" in str(err.value)
    assert err.value.line is not None


def test_the_longest_waiting_gangs_are_reserved_for_whatever_their_queue() -> None:
    """Two queues make reservations, so two are held at once: both go to qa's gangs, which have waited longest,
    and qb's younger gang is reserved for only once one of them is admitted."""
    queues = [queue("qa", 8, "org", reserve_after=100), queue("qb", 8, "org", reserve_after=100)]
    queues.append(queue("qc", 16, "org"))
    timeline = [submit(f"r{i}", "qc", 8, runtime=t, limit=t) for i, t in enumerate((1000, 2000, 3000, 4000))]
    timeline += [submit("g1", "qa", 16, at=10, runtime=100), submit("g2", "qa", 16, at=20, runtime=100)]
    timeline += [submit("h", "qb", 16, at=30, runtime=100), submit("tick", "qc", 1, per_pod=1, at=200, runtime=10)]
    out = run(scenario(flat_nodes(8, 8, 8, 8), queues, timeline, cohorts=["org"]))
    first = {}
    for m in reservations(out):
        first.setdefault(m.job, (m.at, m.nodes, m.expected_start))
    assert first["g1"] == (200, ["n0", "n1"], 2000)
    assert first["g2"] == (200, ["n2", "n3"], 4000)
    assert first["h"][0] >= out.admitted("g1").at
    assert out.admitted("g1").at == 2000 and out.admitted("g2").at < 4000  # g2 moved where room came back sooner


def test_a_reservation_moves_where_room_comes_back_sooner() -> None:
    """r2 ends long before its limit: the gang's reservation moves to its node (`replaced`), so the job without
    a limit that arrives next cannot take it, and the gang starts at r0's end instead of r1's (2000)."""
    queues = [queue("qa", 8, "org", reserve_after=0), queue("qb", 16, "org")]
    timeline = [submit(f"r{i}", "qb", 8, runtime=rt, limit=lim) for i, (rt, lim) in enumerate(RUNS)]
    timeline += [submit("big", "qa", 16, at=10, runtime=100), submit("c", "qb", 8, at=400, runtime=100)]
    out = run(scenario(flat_nodes(8, 8, 8), queues, timeline, cohorts=["org"]))
    made = [(m.at, m.nodes, m.expected_start) for m in reservations(out)]
    assert made == [(10, ["n0", "n1"], 2000), (300, ["n0", "n2"], 1000)]
    assert releases(out) == [("big", "replaced", 300), ("big", "admitted", 1000)]
    assert out.admitted("big").at == 1000 and out.admitted("c").at == 1100  # c runs after the gang


RUNS = ((1000, 1000), (2000, 2000), (300, 3000))
"""(runtime, limit) of r0, r1, r2 on n0, n1, n2."""


def test_a_gang_blocked_only_by_quota_reserves_no_nodes() -> None:
    """The cohort's quota is full while half the nodes are free: holding nodes would not help the gang, so none
    are held and it starts when quota comes back."""
    queues = [queue("qa", 8, "org", reserve_after=0), queue("qb", 8, "org")]
    timeline = [submit("a1", "qa", 8, runtime=1000, limit=1000), submit("r1", "qb", 8, runtime=500, limit=1000)]
    timeline += [submit("big", "qa", 8, at=10, runtime=100)]
    out = run(scenario(flat_nodes(8, 8, 8, 8), queues, timeline, cohorts=["org"]))
    assert reservations(out) == []
    assert out.admitted("big").at == 500


@pytest.mark.parametrize(
    ("limit", "victim", "big_at"),
    [
        pytest.param(None, "r3", 2005, id="no-limit-evicts-off-the-reserved-nodes"),
        pytest.param(2000, "r3", 2005, id="a-limit-past-the-start-evicts-off-the-reserved-nodes"),
        pytest.param(900, "r2", 1005, id="a-limit-that-ends-in-time-may-evict-there"),
    ],
)
def test_a_preemptor_evicts_on_reserved_nodes_only_when_it_may_backfill(
    limit: int | None, victim: str, big_at: int
) -> None:
    """qc's job reclaims from qb's borrowers: it spares those on the gang's reserved nodes (n1, n2), whose room
    is promised to the gang, unless its own limit ends by the gang's expected start (then it may use that room)."""
    queues = [queue("qa", 8, "org", reserve_after=0), queue("qb", 8, "org"), queue("qc", 8, "org", reclaim="Any")]
    timeline = [submit("r3", "qb", 8, runtime=3000, limit=3000)]  # n0; admitted first, so it has lost the most
    timeline += [submit(f"r{i}", "qb", 8, at=5, runtime=t, limit=t) for i, t in ((1, 1000), (2, 2000))]
    timeline += [submit("big", "qa", 16, at=10, runtime=100), submit("p", "qc", 8, at=20, runtime=300, limit=limit)]
    out = run(scenario(flat_nodes(8, 8, 8), queues, timeline, cohorts=["org"]))
    [made] = reservations(out)
    assert (made.nodes, made.expected_start) == (["n1", "n2"], 2005)
    assert [(e.job, e.preemptor) for e in out.preemptions()] == [(victim, "p")]
    assert out.admitted("big").at == big_at


def test_a_second_gang_is_reserved_for_behind_the_first_on_the_same_nodes() -> None:
    """Both nodes are reserved for big1 (start 2000, limit 500): qc's big2 is reserved for behind it on the same
    nodes (start 2500, waiting for big1 too), so the job without a limit that arrives at 2100 runs after big2."""
    queues = [queue("qa", 8, "org", reserve_after=0), queue("qb", 8, "org"), queue("qc", 8, "org", reserve_after=0)]
    timeline = [submit("r1", "qb", 8, runtime=1000, limit=1000), submit("r2", "qb", 8, runtime=2000, limit=2000)]
    timeline += [submit("big1", "qa", 16, at=10, runtime=500, limit=500), submit("big2", "qc", 16, at=20, runtime=100)]
    timeline += [submit("d", "qb", 8, at=2100, runtime=5000)]
    out = run(scenario(TWO_NODES, queues, timeline, cohorts=["org"]))
    made = {m.job: m for m in reservations(out)}
    assert (made["big2"].at, made["big2"].nodes, made["big2"].expected_start) == (20, ["n0", "n1"], 2500)
    assert [(w.job, w.end) for w in made["big2"].waits_for] == [("r1", 1000), ("r2", 2000), ("big1", 2500)]
    assert [out.admitted(j).at for j in ("big1", "big2", "d")] == [2000, 2500, 2600]


@pytest.mark.parametrize(
    ("young_nominal", "old_at", "young_replaced"),
    [
        pytest.param(8, 200, True, id="an-older-holder-passes-a-younger-borrowing-gang"),
        pytest.param(24, 3000, False, id="a-nominal-quota-gang-is-never-passed"),
    ],
)
def test_an_older_holder_takes_a_younger_ones_place_unless_it_is_a_nominal_quota_gang(
    young_nominal: int, old_at: int, young_replaced: bool
) -> None:
    """`old` (16 GPUs, no limit) holds n0, n1 (start 3000), `young` (24 GPUs) n2-n4 (start 4000); at 200 n2 and n3
    free: `old` moves there and starts at once, `young` is planned again behind it, unless `young` is within
    its queue's nominal quota, whose expected start no other reservation may push back."""
    queues = [queue("qa", 8, "org", reserve_after=0), queue("qb", 32, "org")]
    queues.append(queue("qc", young_nominal, "org", reserve_after=0))
    runs = [(3000, 3000), (3000, 3000), (200, 4000), (200, 4000), (4000, 4000), (5000, 5000)]
    timeline = [submit(f"r{i}", "qb", 8, runtime=rt, limit=lim) for i, (rt, lim) in enumerate(runs)]
    timeline += [submit("old", "qa", 16, at=10, runtime=100), submit("young", "qc", 24, at=20, runtime=100)]
    out = run(scenario(flat_nodes(8, 8, 8, 8, 8, 8), queues, timeline, cohorts=["org"]))
    first = {m.job: (m.at, m.nodes, m.expected_start) for m in reversed(reservations(out))}
    assert first == {"old": (10, ["n0", "n1"], 3000), "young": (20, ["n2", "n3", "n4"], 4000)}
    assert out.admitted("old").at == old_at
    assert (("young", "replaced", 200) in releases(out)) == young_replaced
    assert out.admitted("young").at <= 4000


def test_a_holder_admitted_in_a_cycle_holds_nothing_back_from_the_next_holder() -> None:
    """`a` and `b` (1 GPU each, within nominal) hold n0, full until 100; at 100 two GPUs come back: `b` starts
    with `a`, not at 600 with its GPU idle meanwhile (qc's older `c` is reserved at 100 behind `b`)."""
    queues = [queue("qa", 8, "org", reserve_after=0), queue("qb", 8, "org", reserve_after=0)]
    queues += [queue("qc", 0, "org", reserve_after=95), queue("qd", 8, "org")]
    timeline = [
        submit("ra", "qa", 1, runtime=100, limit=100),
        submit("rb", "qb", 1, runtime=100, limit=100),
        submit("rd", "qd", 6, runtime=1000, limit=1000),
        submit("c", "qc", 1, at=5, runtime=500, limit=500),
        submit("a", "qa", 1, at=10, runtime=500, limit=500),
        submit("b", "qb", 1, at=11, runtime=500, limit=600),
    ]
    out = run(scenario(flat_nodes(8), queues, timeline, cohorts=["org"]))
    assert {(m.job, m.expected_start) for m in reservations(out) if m.at < 100} == {("a", 100), ("b", 100)}
    assert (out.admitted("a").at, out.admitted("b").at) == (100, 100)


def test_two_holders_on_one_host_do_not_hold_each_others_room() -> None:
    """`a` (older) and `b` hold 4 GPUs each of n0 (full until 1000; `b`'s plan counts `a` ahead but does not wait
    for it): r1 ends at 100 and its 4 GPUs go to `a` (before the fix each kept the other out until 1000), then
    `a`'s go to `b` when it ends."""
    queues = [queue("qa", 0, "org", reserve_after=0), queue("qb", 0, "org", reserve_after=0), queue("qr", 8, "org")]
    timeline = [
        submit("r1", "qr", 4, per_pod=4, runtime=100, limit=1000),
        submit("r2", "qr", 4, per_pod=4, runtime=1000, limit=1000),
        submit("a", "qa", 4, per_pod=4, at=10, runtime=500),
        submit("b", "qb", 4, per_pod=4, at=20, runtime=500),
    ]
    out = run(scenario(flat_nodes(8), queues, timeline, cohorts=["org"]))
    first = {m.job: (m.at, m.nodes) for m in reversed(reservations(out))}
    assert first == {"a": (10, ["n0"]), "b": (20, ["n0"])}
    assert (out.admitted("a").at, out.admitted("b").at) == (100, 600)


def test_a_running_job_without_a_limit_frees_its_room_before_a_holder_that_has_not_started() -> None:
    """`a` (16 GPUs) holds n0, n1 behind r0 and r1; `b` (8 GPUs), planned behind `a`, waits for r2 on n2 (running,
    no limit), not for `a` on n0 (not started: it cannot end first, though it was submitted before r2), so when r2
    ends at 320 `b` starts there and qr's `c`, within its nominal quota, does not take that node first."""
    queues = [queue("qa", 0, "org", reserve_after=50), queue("qb", 0, "org", reserve_after=0), queue("qr", 24, "org")]
    timeline = [
        submit("r0", "qr", 8, runtime=5000),
        submit("r1", "qr", 8, runtime=5000),
        submit("a", "qa", 16, at=10, runtime=100),
        submit("r2", "qr", 8, at=20, runtime=300),
        submit("b", "qb", 8, at=70, runtime=100),
        submit("c", "qr", 8, at=100, runtime=100),
    ]
    out = run(scenario(flat_nodes(8, 8, 8), queues, timeline, cohorts=["org"]))
    first = {m.job: (m.nodes, [w.job for w in m.waits_for]) for m in reversed(reservations(out))}
    assert first == {"a": (["n0", "n1"], ["r0", "r1"]), "b": (["n2"], ["r2"])}
    assert (out.admitted("b").at, out.admitted("c").at) == (320, 420)


def test_a_holder_behind_a_class_mate_that_cannot_use_its_room_is_still_tried() -> None:
    """`b`, evicted by a node failure, comes before the holder `a` in their class's order but may not use the room
    held for `a`: when `r` ends at 1000, `a` is tried on its own verdict and starts there (it was parked untried
    with `b`'s verdict, and both waited for ever), and `b` follows when `a` ends."""
    queues = [queue("q", 0, "org", reserve_after=0), queue("qr", 24, "org")]
    timeline = [
        submit("b", "q", 8, runtime=5000),
        submit("r", "qr", 8, runtime=1000, limit=1000),
        submit("a", "q", 8, at=10, runtime=100),
        "  - {at: 20, node_down: n1}\n",
    ]
    out = run(scenario(TWO_NODES, queues, timeline, cohorts=["org"]))
    assert [e.job for e in out.preemptions()] == ["b"]
    assert [(m.job, m.nodes) for m in reservations(out)][:1] == [("a", ["n0"])]
    assert (out.admitted("a").at, out.admissions("b")[1].at) == (1000, 1100)


FINDINGS = Path(__file__).parents[1] / "replay" / "findings"


def test_a_job_due_a_reservation_passes_a_younger_holder_in_the_cycle_it_becomes_due() -> None:
    """An older job due a reservation gets the room a younger holder would get sooner, in that cycle."""
    out = run((FINDINGS / "reservation_due_passes_a_younger_holder.yaml").read_text())
    made = [(e.job, e.at, e.nodes, e.expected_start) for e in reservations(out)]
    assert made == [("young", 10, ["n1"], 500), ("old", 60, ["n1"], 500), ("young", 60, ["n0"], 1000)]
    assert ("young", "replaced", 60) in releases(out)
    assert out.admitted("old").at == 500


def test_a_job_that_no_longer_fits_once_a_younger_job_is_reserved_for_is_reserved_for_at_the_same_instant() -> None:
    """A job held back by quota alone gets a reservation the instant a younger job's takes the room it fitted."""
    out = run((FINDINGS / "reservation_made_over_an_older_job_that_fitted.yaml").read_text())
    made = [(e.job, e.at, e.nodes, e.expected_start) for e in reservations(out)]
    assert made[:3] == [("j1", 1, ["n0", "n1"], None), ("flood1", 1, ["n1"], 1), ("j1", 1, ["n0", "n1"], None)]
    assert ("j1", "replaced", 1) in releases(out)
    assert out.admitted("flood1").at == 100
