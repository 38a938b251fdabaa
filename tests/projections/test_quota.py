"""Quotas as given/when/then scenarios: nominal, borrowing and lending limits, cohort trees, fair sharing.

Kueue's cohort semantics (spec/scenario.md, Quotas): a queue borrows while its
usage is above its nominal quota, never uses more than nominal + borrowing
limit, and never lends more than its lending limit.
"""

from __future__ import annotations

from typing import Any

import pytest
from simkit import flat_nodes, nodes_8gpu, queue, run, scenario, submit

FOUR_NODES = nodes_8gpu(per_rack=4)  # 32 GPUs
EIGHT_NODES = nodes_8gpu(racks=2, per_rack=4)  # 64 GPUs


def _gpus_admitted(out: Any, queue_name: str, at: int) -> int:
    """GPUs of the queue's jobs admitted at `at`."""
    state = out.state
    return sum(state.jobs[e.job].gpus for e in out.admissions_at(at) if e.queue == queue_name)


# ---------------------------------------------------------------- limits

LIMIT_CASES = [
    pytest.param(
        scenario(
            FOUR_NODES,
            [queue("qa", 16, "org"), queue("qb", 16, "org")],
            [submit("b1", "qb", 16), submit("b2", "qb", 8), submit("b3", "qb", 8)],
            cohorts=["org"],
        ),
        {"b1": {}, "b2": {"gpu": 8}, "b3": {"gpu": 8}},
        [],
        id="borrow-all-the-cohort-lends",
    ),
    pytest.param(
        scenario(
            FOUR_NODES,
            [queue("qa", 16, "org"), queue("qb", 16, "org", borrowing_limit=8)],
            [submit("b1", "qb", 16), submit("b2", "qb", 8), submit("b3", "qb", 8)],
            cohorts=["org"],
        ),
        {"b1": {}, "b2": {"gpu": 8}},
        [("b3", ["queue qb", "borrowing limit"])],
        id="borrowing-limit-caps-usage",
    ),
    pytest.param(
        scenario(
            FOUR_NODES,
            [queue("qa", 16, "org", lending_limit=8), queue("qb", 16, "org")],
            [submit("b1", "qb", 16), submit("b2", "qb", 8), submit("b3", "qb", 8)],
            cohorts=["org"],
        ),
        {"b1": {}, "b2": {"gpu": 8}},
        [("b3", ["queue qb", "cohort"])],
        id="lending-limit-caps-borrowing",
    ),
    pytest.param(
        scenario(
            FOUR_NODES,
            [queue("qa", 16, "org", lending_limit=0), queue("qb", 16, "org")],
            [submit("b1", "qb", 16), submit("b2", "qb", 8)],
            cohorts=["org"],
        ),
        {"b1": {}},
        [("b2", ["queue qb", "cohort"])],
        id="lending-limit-zero-lends-nothing",
    ),
    pytest.param(
        scenario(
            FOUR_NODES,
            [queue("qa", 16), queue("qb", 16)],
            [submit("b1", "qb", 16), submit("b2", "qb", 8)],
        ),
        {"b1": {}},
        [("b2", ["queue qb", "no cohort"])],
        id="no-cohort-no-borrowing",
    ),
    pytest.param(
        scenario(
            FOUR_NODES,
            [queue("qb", 16, "org", borrowing_limit=0), queue("qa", 16, "org")],
            [submit("b1", "qb", 16), submit("b2", "qb", 8)],
            cohorts=["org"],
        ),
        {"b1": {}},
        [("b2", ["queue qb", "borrowing limit"])],
        id="borrowing-limit-zero",
    ),
]


@pytest.mark.parametrize(("text", "borrowed", "pending"), LIMIT_CASES)
def test_quota_limits(text: str, borrowed: dict[str, dict[str, int]], pending: list[tuple[str, list[str]]]) -> None:
    """Jobs are admitted up to the limits with their borrowed part; the rest wait and say which limit holds them."""
    out = run(text)
    assert {e.job: e.borrowed for e in out.admissions_at(0)} == borrowed
    assert [e.job for e in out.inadmissible_at(0)] == [job for job, _ in pending]
    for ev, (_, words) in zip(out.inadmissible_at(0), pending, strict=True):
        assert all(w in ev.reason for w in words), ev.reason


def test_lending_limit_keeps_the_unlent_part_guaranteed() -> None:
    """What a queue does not lend is free for it at once; reclaim is needed only for what it lent."""
    out = run(
        scenario(
            FOUR_NODES,
            [queue("qa", 16, "org", lending_limit=8, reclaim="Any"), queue("qb", 16, "org")],
            [
                submit("b1", "qb", 16),
                submit("b2", "qb", 8),
                submit("a1", "qa", 8, at=10),
                submit("a2", "qa", 8, at=20),
            ],
            cohorts=["org"],
        )
    )
    assert out.admitted("b2").borrowed == {"gpu": 8}
    assert out.decisions(at=10) == [("admit", "a1")]
    assert out.decisions(at=20) == [("preempt", "b2", "a2", "ReclaimWithinCohort"), ("admit", "a2"), ("pending", "b2")]


def test_lending_limit_caps_what_reclaim_can_free() -> None:
    """A lender never reclaims more than it lent: the borrower's usage within its own nominal is safe."""
    out = run(
        scenario(
            EIGHT_NODES,
            [
                queue("qa", 32, "org", lending_limit=16, reclaim="Any"),
                queue("qb", 16, "org", reclaim="Any"),
                queue("qc", 16, "org"),
            ],
            [
                submit("b1", "qb", 16),
                submit("b2", "qb", 16),
                submit("b3", "qb", 16),
                submit("a1", "qa", 32, at=10),
                submit("a2", "qa", 8, at=20),
            ],
            cohorts=["org"],
        )
    )
    # qb borrows 32: 16 lent by qa, 16 by qc
    assert [out.admitted(j).borrowed for j in ("b1", "b2", "b3")] == [{}, {"gpu": 16}, {"gpu": 16}]
    # qa takes back its 16 lent GPUs (its 16 unlent ones were free): one borrowed job goes
    assert out.decisions(at=10) == [("preempt", "b3", "a1", "ReclaimWithinCohort"), ("admit", "a1"), ("pending", "b3")]
    # qa is at its nominal; a2 would borrow, and the cohort has nothing left to lend
    assert out.decisions(at=20) == [("pending", "a2")]


def test_borrowed_is_the_jobs_own_part_above_nominal() -> None:
    """A job that crosses the nominal line borrows only its part above it."""
    out = run(
        scenario(
            FOUR_NODES,
            [queue("qa", 12, "org"), queue("qb", 20, "org")],
            [submit("a1", "qa", 8), submit("a2", "qa", 8), submit("a3", "qa", 8)],
            cohorts=["org"],
        )
    )
    assert [out.admitted(j).borrowed for j in ("a1", "a2", "a3")] == [{}, {"gpu": 4}, {"gpu": 8}]


def test_resource_the_queue_does_not_name_is_unlimited() -> None:
    """A queue that names only GPUs puts no limit on CPU."""
    text = scenario(
        "nodes:\n  - {name: n0, capacity: {gpu: 8, cpu: 64}}\n",
        [queue("q", 8)],
        "  - {at: 0, submit: {job: j, queue: q, podsets: [{name: w, count: 1, requests: {gpu: 8, cpu: 64}}]}}\n",
    )
    out = run(text)
    assert out.decisions(at=0) == [("admit", "j")]


# ---------------------------------------------------------------- cohort trees


def test_hierarchical_cohorts_borrow_across_the_tree() -> None:
    """A queue borrows through parent cohorts from a sibling subtree, which reclaims it across the tree."""
    out = run(
        scenario(
            FOUR_NODES,
            [queue("research", 16, "lab"), queue("prod", 16, "serving", reclaim="Any")],
            [
                submit("r1", "research", 16),
                submit("r2", "research", 16),
                submit("p1", "prod", 16, at=10),
            ],
            cohorts=["org", "lab:org", "serving:org"],
        )
    )
    assert out.admitted("r2").borrowed == {"gpu": 16}
    assert out.decisions(at=10) == [("preempt", "r2", "p1", "ReclaimWithinCohort"), ("admit", "p1"), ("pending", "r2")]


def test_sibling_queues_in_a_subcohort_share_first() -> None:
    """Borrowing in a subcohort draws on siblings and on the rest of the tree alike, up to the whole tree."""
    out = run(
        scenario(
            EIGHT_NODES,
            [queue("a", 16, "lab"), queue("b", 16, "lab"), queue("c", 32, "serving")],
            [submit(f"a{i}", "a", 16) for i in range(5)],
            cohorts=["org", "lab:org", "serving:org"],
        )
    )
    assert [e.job for e in out.admissions_at(0)] == ["a0", "a1", "a2", "a3"]
    (reason,) = out.reasons("a4")
    assert "queue a" in reason and "cohort" in reason


def test_separate_cohort_trees_do_not_lend() -> None:
    """Queues in different (unrelated) cohorts never borrow from each other."""
    out = run(
        scenario(
            FOUR_NODES,
            [queue("a", 16, "one"), queue("b", 16, "two")],
            [submit("a1", "a", 16), submit("a2", "a", 16)],
            cohorts=["one", "two"],
        )
    )
    assert out.decisions(at=0) == [("admit", "a1"), ("pending", "a2")]


# ---------------------------------------------------------------- admission order


ORDER_CASES = [
    pytest.param(
        scenario(
            FOUR_NODES,
            [queue("q", 32)],
            [submit("first", "q", 32, prio="training"), submit("second", "q", 32, prio="training")],
        ),
        ["first"],
        id="fifo-among-equal-priority",
    ),
    pytest.param(
        scenario(
            FOUR_NODES,
            [queue("q", 32)],
            [submit("low", "q", 32, prio="low"), submit("high", "q", 32, prio="high")],
        ),
        ["high"],
        id="priority-before-fifo",
    ),
    pytest.param(
        scenario(
            nodes_8gpu(per_rack=2),
            [queue("qa", 8, "org"), queue("qb", 8, "org")],
            [submit("borrower", "qa", 16, prio="high"), submit("within", "qb", 8, prio="low")],
            cohorts=["org"],
        ),
        ["within"],
        id="within-nominal-before-priority",
    ),
    pytest.param(
        scenario(
            FOUR_NODES,
            [queue("q", 32)],
            [submit("big", "q", 40), submit("small", "q", 8)],
        ),
        ["small"],
        id="a-job-that-cannot-fit-does-not-block-the-queue",
    ),
]


@pytest.mark.parametrize(("text", "admitted"), ORDER_CASES)
def test_admission_order(text: str, admitted: list[str]) -> None:
    """Within nominal first, then higher priority, then submission order."""
    out = run(text)
    assert [e.job for e in out.admissions_at(0)] == admitted


def test_preempted_job_keeps_its_place_in_its_queue() -> None:
    """A preempted job goes back ahead of jobs submitted after it."""
    out = run(
        scenario(
            FOUR_NODES,
            [queue("q", 32, within="LowerPriority")],
            [
                submit("j1", "q", 32, prio="training", runtime=1000),
                submit("j2", "q", 32, at=5, prio="training"),
                submit("hi", "q", 8, at=10, prio="high", runtime=100),
            ],
        )
    )
    assert out.decisions(at=10, pending=False) == [("preempt", "j1", "hi", "WithinQueue"), ("admit", "hi")]
    assert out.decisions(at=110, pending=False) == [("admit", "j1")]
    assert out.finished_at("j1") == 1110
    assert out.admitted("j2").at == 1110


# ---------------------------------------------------------------- fair sharing


def _fair(weight_a: float, fair: bool) -> str:
    # qa and qb have no nominal quota: everything they run is borrowed from qc, which is idle
    jobs = [submit(f"a{i}", "qa", 8) for i in range(4)] + [submit(f"b{i}", "qb", 8) for i in range(4)]
    return scenario(
        FOUR_NODES,
        [queue("qa", 0, "org", weight=weight_a), queue("qb", 0, "org"), queue("qc", 32, "org")],
        jobs,
        cohorts=["org"],
        extra=f"fair_sharing: {'true' if fair else 'false'}\n",
    )


@pytest.mark.parametrize(
    ("text", "gpus_a", "gpus_b"),
    [
        pytest.param(_fair(1, False), 32, 0, id="without-fair-sharing-fifo-takes-all"),
        pytest.param(_fair(1, True), 16, 16, id="equal-weights-split-evenly"),
        pytest.param(_fair(2, True), 24, 8, id="weight-two-gets-more"),
        pytest.param(_fair(0.5, True), 8, 24, id="weight-half-gets-less"),
    ],
)
def test_fair_sharing_admission_order(text: str, gpus_a: int, gpus_b: int) -> None:
    """With fair sharing the queue with the lowest weighted share goes first; without, submission order."""
    out = run(text)
    assert (_gpus_admitted(out, "qa", 0), _gpus_admitted(out, "qb", 0)) == (gpus_a, gpus_b)


def _fair_preempt(weight_a: float, reclaim: str = "Any") -> str:
    jobs = [submit(f"b{i}", "qb", 8) for i in range(4)] + [submit(f"a{i}", "qa", 8, at=10) for i in range(4)]
    return scenario(
        FOUR_NODES,
        [queue("qa", 0, "org", weight=weight_a, reclaim=reclaim), queue("qb", 0, "org"), queue("qc", 32, "org")],
        jobs,
        cohorts=["org"],
        extra="fair_sharing: true\n",
    )


@pytest.mark.parametrize(
    ("text", "victims"),
    [
        pytest.param(_fair_preempt(1), ["b3", "b2"], id="equal-weights-preempt-to-even"),
        pytest.param(_fair_preempt(2), ["b3", "b2", "b1"], id="weight-two-preempts-more"),
        pytest.param(_fair_preempt(0.5), ["b3"], id="weight-half-preempts-less"),
        pytest.param(_fair_preempt(1, reclaim="Never"), [], id="fair-sharing-needs-a-reclaim-policy"),
    ],
)
def test_fair_sharing_preemption(text: str, victims: list[str]) -> None:
    """A borrowing queue with a lower share evicts from a higher-share queue until shares even out by weight."""
    out = run(text)
    preempted = out.preemptions()
    assert [e.job for e in preempted] == victims
    assert all(e.reason == "FairSharing" and e.preemptor is not None for e in preempted)
    assert all(e.preemptor.startswith("a") for e in preempted if e.preemptor)


def test_fair_sharing_reclaim_within_nominal() -> None:
    """Under fair sharing a queue below its nominal takes its quota back from a borrower (reason FairSharing)."""
    jobs = [submit(f"b{i}", "qb", 8) for i in range(4)] + [submit(f"a{i}", "qa", 8, at=10) for i in range(2)]
    out = run(
        scenario(
            FOUR_NODES,
            [queue("qa", 16, "org", reclaim="Any"), queue("qb", 16, "org")],
            jobs,
            cohorts=["org"],
            extra="fair_sharing: true\n",
        )
    )
    assert [(e.job, e.reason) for e in out.preemptions()] == [("b3", "FairSharing"), ("b2", "FairSharing")]
    assert [e.job for e in out.admissions_at(10)] == ["a0", "a1"]


# ---------------------------------------------------------------- four teams, 512 GPUs


def test_four_teams_share_512_gpus() -> None:
    """Four teams of 128 GPUs: one borrows the idle rest, the others reclaim their share when they need it."""
    teams = ["team-a", "team-b", "team-c", "team-d"]
    timeline = [submit(f"a{i}", "team-a", 64, runtime=10_000) for i in range(8)]
    timeline += [submit(f"b{i}", "team-b", 64, at=100, runtime=1000) for i in range(2)]
    timeline += [submit(f"c{i}", "team-c", 64, at=100, runtime=1000) for i in range(2)]
    timeline += [submit(f"d{i}", "team-d", 128, at=200, runtime=1000) for i in range(1)]
    out = run(
        scenario(
            nodes_8gpu(blocks=2, racks=4, per_rack=8),
            [queue(t, 128, "org", reclaim="Any") for t in teams],
            timeline,
            cohorts=["org"],
        )
    )
    # t=0: team-a runs all 512 GPUs, 384 of them borrowed
    assert [e.job for e in out.admissions_at(0)] == [f"a{i}" for i in range(8)]
    assert sum(e.borrowed.get("gpu", 0) for e in out.admissions_at(0)) == 384
    # t=100: team-b and team-c take back 128 each from team-a's most recently admitted borrowers
    at100 = out.decisions(at=100, pending=False)
    assert sorted(d[1] for d in at100 if d[0] == "preempt") == ["a4", "a5", "a6", "a7"]
    assert {d[3] for d in at100 if d[0] == "preempt"} == {"ReclaimWithinCohort"}
    assert sorted(d[1] for d in at100 if d[0] == "admit") == ["b0", "b1", "c0", "c1"]
    # t=200: team-d takes back its 128 GPUs from team-a, which keeps its own 128
    at200 = out.decisions(at=200, pending=False)
    assert sorted(d[1] for d in at200 if d[0] == "preempt") == ["a2", "a3"]
    assert sorted(d[1] for d in at200 if d[0] == "admit") == ["d0"]
    assert {e.preemptor for e in out.preemptions()} == {"b0", "b1", "c0", "c1", "d0"}
    # t=1100: team-b and team-c finish; team-a borrows their room again, its jobs in their submission order
    at1100 = out.decisions(at=1100, pending=False)
    assert [d[1] for d in at1100 if d[0] == "admit"] == ["a2", "a3", "a4", "a5"]
    assert all(e.borrowed == {"gpu": 64} for e in out.admissions_at(1100))
    # t=1200: team-d finishes; the last two follow
    assert [d[1] for d in out.decisions(at=1200, pending=False) if d[0] == "admit"] == ["a6", "a7"]
    summary = out.summary()
    assert summary["queues"]["team-b"] == {"gpu_seconds": 128 * 1000, "borrowed_gpu_seconds": 0}
    assert summary["queues"]["team-a"]["borrowed_gpu_seconds"] > 0
    assert summary["jobs"]["a7"]["preemptions"] == 1
    assert summary["jobs"]["a0"]["preemptions"] == 0


@pytest.mark.parametrize("fair", [False, True], ids=["without-fair-sharing", "with-fair-sharing"])
def test_other_queues_victims_go_before_the_preemptors_own(fair: bool) -> None:
    """A preemptor that could evict a borrower or its own lower-priority job evicts the borrower, once, either way."""
    jobs = [
        submit("a-lo", "qa", 4, per_pod=4, prio="low"),
        submit("b-big", "qb", 12, per_pod=4),
        submit("a-hi", "qa", 4, per_pod=4, prio="high", at=5),
    ]
    out = run(
        scenario(
            flat_nodes(8, 8),
            [queue("qa", 8, "org", within="LowerPriority", reclaim="Any"), queue("qb", 8, "org")],
            jobs,
            cohorts=["org"],
            extra=f"fair_sharing: {'true' if fair else 'false'}\n",
        )
    )
    preempted = out.preemptions()
    assert [(e.job, e.preemptor) for e in preempted] == [("b-big", "a-hi")]
    assert preempted[0].reason == ("FairSharing" if fair else "ReclaimWithinCohort")
    assert out.finished_at("a-lo") is not None  # never evicted: it ran to the end
