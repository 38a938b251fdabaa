"""Preemption policies as given/when/then scenarios (spec/scenario.md, Preemption).

Every case: given a cluster, queues and running jobs; when a job arrives;
then exactly these decisions at that instant (victims with their preemptor
and reason, admissions, pending explanations).
"""

from __future__ import annotations

from typing import Any

import pytest
from simkit import flat_nodes, nodes_8gpu, queue, run, scenario, submit

FOUR_NODES = nodes_8gpu(per_rack=4)  # 32 GPUs
TWO_RACKS = nodes_8gpu(racks=2, per_rack=4)  # 64 GPUs in racks r0 and r1


def _two_racks(keep0: int, keep1: int) -> str:
    """Racks r0 and r1 (32 GPUs each) with high-priority jobs of `keep0` and `keep1` GPUs and two 8-GPU
    scavengers filling the rest; at 10 a 16-GPU gang that needs one rack."""
    return scenario(
        TWO_RACKS,
        [queue("q", 64, within="LowerPriority")],
        [
            submit("keep0", "q", keep0, prio="high", required="rack"),
            submit("keep1", "q", keep1, prio="high", required="rack"),
            submit("s0", "q", 8, prio="scavenger", required="rack"),
            submit("s1", "q", 8, prio="scavenger", required="rack"),
            submit("gang", "q", 16, at=10, prio="training", required="rack"),
        ],
    )


# ---------------------------------------------------------------- within a queue

WITHIN_QUEUE_CASES = [
    pytest.param(
        scenario(
            FOUR_NODES,
            [queue("q", 32, within="LowerPriority")],
            [
                submit("scav", "q", 8, prio="scavenger"),
                submit("low", "q", 16, prio="low"),
                submit("keep", "q", 8, prio="high"),
                submit("hi", "q", 16, at=10, prio="training"),
            ],
        ),
        [("preempt", "low", "hi", "WithinQueue"), ("admit", "hi"), ("pending", "low")],
        id="minimal-victim-set-keeps-lower-priority-job-not-needed",
    ),
    pytest.param(
        scenario(
            FOUR_NODES,
            [queue("q", 32, within="LowerPriority")],
            [
                submit("a", "q", 8, prio="scavenger"),
                submit("b", "q", 8, prio="low"),
                submit("c", "q", 16, prio="high"),
                submit("hi", "q", 16, at=10, prio="training"),
            ],
        ),
        [
            ("preempt", "a", "hi", "WithinQueue"),
            ("preempt", "b", "hi", "WithinQueue"),
            ("admit", "hi"),
            ("pending", "b"),
            ("pending", "a"),
        ],
        id="lowest-priority-victims-first",
    ),
    pytest.param(
        scenario(
            FOUR_NODES,
            [queue("q", 32, within="Never")],
            [submit("a", "q", 32, prio="scavenger"), submit("hi", "q", 8, at=10, prio="high")],
        ),
        [("pending", "hi")],
        id="within-queue-never-preempts-nothing",
    ),
    pytest.param(
        scenario(
            FOUR_NODES,
            [queue("q", 32, within="LowerPriority")],
            [submit("a", "q", 32, prio="training"), submit("b", "q", 8, at=10, prio="training")],
        ),
        [("pending", "b")],
        id="equal-priority-not-preempted-under-lower-priority",
    ),
    pytest.param(
        scenario(
            FOUR_NODES,
            [queue("q", 32, within="LowerPriority")],
            [submit("a", "q", 32, prio="high"), submit("b", "q", 8, at=10, prio="training")],
        ),
        [("pending", "b")],
        id="higher-priority-never-preempted",
    ),
    pytest.param(
        scenario(
            FOUR_NODES,
            [queue("q", 32, within="LowerPriority")],
            [submit("inf", "q", 32, prio="inference"), submit("u", "q", 8, at=10, prio="urgent")],
        ),
        [("pending", "u")],
        id="non-preemptible-never-a-victim",
    ),
    pytest.param(_two_racks(24, 24), [("pending", "gang")], id="victims-in-two-racks-do-not-make-one-rack-room"),
    pytest.param(
        _two_racks(16, 32),
        [
            ("preempt", "s1", "gang", "WithinQueue"),
            ("preempt", "s0", "gang", "WithinQueue"),
            ("admit", "gang"),
            ("pending", "s0"),
            ("pending", "s1"),
        ],
        id="victims-in-one-rack-make-room-there",
    ),
]


@pytest.mark.parametrize(("text", "expected"), WITHIN_QUEUE_CASES)
def test_within_queue_preemption(text: str, expected: list[tuple[Any, ...]]) -> None:
    """A preemptor evicts only what its queue's within_queue policy allows, and no more than it needs."""
    out = run(text)
    assert out.decisions(at=10) == expected


def _newer_equal(policy: str) -> str:
    # `big` waits (older, 24 GPUs) while `small` (newer, equal priority) takes the room; when `a` leaves,
    # only `small` stands between `big` and the room it needs
    return scenario(
        FOUR_NODES,
        [queue("q", 32, within=policy)],
        [
            submit("a", "q", 16, prio="training", runtime=3),
            submit("big", "q", 24, at=1, prio="training"),
            submit("small", "q", 16, at=2, prio="training"),
        ],
    )


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        pytest.param(
            "LowerOrNewerEqualPriority",
            [("preempt", "small", "big", "WithinQueue"), ("admit", "big")],
            id="newer-equal-priority-preempted",
        ),
        pytest.param("LowerPriority", [], id="newer-equal-priority-kept-under-lower-priority"),
    ],
)
def test_newer_equal_priority(policy: str, expected: list[tuple[Any, ...]]) -> None:
    """LowerOrNewerEqualPriority lets an older job evict a newer one of equal priority; LowerPriority does not."""
    out = run(_newer_equal(policy))
    assert out.decisions(at=2, pending=False) == [("admit", "small")]
    assert out.decisions(at=3, pending=False) == expected


def test_older_equal_priority_never_preempted() -> None:
    """Under LowerOrNewerEqualPriority a newer job may not evict an older one of equal priority."""
    out = run(
        scenario(
            FOUR_NODES,
            [queue("q", 32, within="LowerOrNewerEqualPriority")],
            [submit("a", "q", 32, prio="training"), submit("b", "q", 8, at=10, prio="training")],
        )
    )
    assert out.decisions(at=10) == [("pending", "b")]


# ---------------------------------------------------------------- reclaim within the cohort


def _reclaim(policy: str, borrower_prio: str, borrow: str | None = None) -> str:
    """qa and qb (16 GPUs each) share 32 GPUs; qb runs 32 (16 borrowed) until qa wants its 16 back at t=10."""
    return scenario(
        FOUR_NODES,
        [queue("qa", 16, "org", reclaim=policy, borrow=borrow), queue("qb", 16, "org")],
        [
            submit("b1", "qb", 16, prio=borrower_prio),
            submit("b2", "qb", 16, prio=borrower_prio),
            submit("a1", "qa", 16, at=10, prio="training"),
        ],
        cohorts=["org"],
    )


RECLAIM_CASES = [
    pytest.param(
        _reclaim("Any", "training"),
        [("preempt", "b2", "a1", "ReclaimWithinCohort"), ("admit", "a1"), ("pending", "b2")],
        id="reclaim-from-borrower",
    ),
    pytest.param(
        _reclaim("Any", "high"),
        [("preempt", "b2", "a1", "ReclaimWithinCohort"), ("admit", "a1"), ("pending", "b2")],
        id="reclaim-any-takes-higher-priority-borrower",
    ),
    pytest.param(
        _reclaim("LowerPriority", "low"),
        [("preempt", "b2", "a1", "ReclaimWithinCohort"), ("admit", "a1"), ("pending", "b2")],
        id="reclaim-lower-priority-borrower",
    ),
    pytest.param(
        _reclaim("LowerPriority", "training"),
        [("pending", "a1")],
        id="equal-priority-not-reclaimable-under-lower-priority",
    ),
    pytest.param(_reclaim("Never", "scavenger"), [("pending", "a1")], id="reclaim-never"),
    pytest.param(
        _reclaim("Never", "scavenger", borrow="LowerPriority"),
        [("pending", "a1")],
        id="reclaim-never-is-not-lifted-by-a-borrow-policy",
    ),
]


@pytest.mark.parametrize(("text", "expected"), RECLAIM_CASES)
def test_reclaim_within_cohort(text: str, expected: list[tuple[Any, ...]]) -> None:
    """A queue under its nominal quota takes it back from a borrowing queue as its reclaim policy allows."""
    out = run(text)
    assert out.admitted("b2").borrowed == {"gpu": 16}
    assert out.decisions(at=10) == expected


def test_reclaim_never_evicts_a_queue_within_its_nominal() -> None:
    """Reclaim takes only from borrowing queues: a queue at its nominal quota keeps its jobs."""
    out = run(
        scenario(
            FOUR_NODES,
            [queue("qa", 16, "org", reclaim="Any"), queue("qb", 16, "org")],
            [
                submit("b1", "qb", 16, prio="scavenger"),
                submit("x", "qa", 16, prio="training"),
                submit("a1", "qa", 16, at=10, prio="training"),
            ],
            cohorts=["org"],
        )
    )
    assert out.decisions(at=10) == [("pending", "a1")]
    (reason,) = out.reasons("a1")
    assert "queue qa" in reason and "cohort" in reason


def test_reclaim_takes_other_queues_before_own() -> None:
    """With both allowed, victims come from other (borrowing) queues before the preemptor's own queue."""
    out = run(
        scenario(
            FOUR_NODES,
            [queue("qa", 24, "org", within="LowerPriority", reclaim="Any"), queue("qb", 8, "org")],
            [
                submit("mine", "qa", 8, prio="scavenger"),
                submit("b1", "qb", 8, prio="high"),
                submit("b2", "qb", 16, prio="high"),
                submit("a1", "qa", 16, at=10, prio="training"),
            ],
            cohorts=["org"],
        )
    )
    assert out.admitted("b2").borrowed == {"gpu": 16}
    assert out.decisions(at=10) == [("preempt", "b2", "a1", "ReclaimWithinCohort"), ("admit", "a1"), ("pending", "b2")]


# ---------------------------------------------------------------- borrow within the cohort


def _borrow(policy: str | None, threshold: int | None, victim_prio: str) -> str:
    """qa (8) wants 16, i.e. to borrow; qb (16) borrows 16 of which `b2` (victim_prio) holds 16; qc (8) lends."""
    return scenario(
        FOUR_NODES,
        [
            queue("qa", 8, "org", borrow=policy, threshold=threshold),
            queue("qb", 16, "org"),
            queue("qc", 8, "org"),
        ],
        [
            submit("b1", "qb", 16, prio="training"),
            submit("b2", "qb", 16, prio=victim_prio),
            submit("a1", "qa", 16, at=10, prio="training"),
        ],
        cohorts=["org"],
    )


BORROW_CASES = [
    pytest.param(
        _borrow("LowerPriority", 50, "low"),
        [("preempt", "b2", "a1", "BorrowWithinCohort"), ("admit", "a1"), ("pending", "b2")],
        id="borrow-within-cohort-at-threshold",
    ),
    pytest.param(
        _borrow("LowerPriority", 50, "scavenger"),
        [("preempt", "b2", "a1", "BorrowWithinCohort"), ("admit", "a1"), ("pending", "b2")],
        id="borrow-within-cohort-below-threshold",
    ),
    pytest.param(_borrow("LowerPriority", 0, "low"), [("pending", "a1")], id="borrow-within-cohort-above-threshold"),
    pytest.param(
        _borrow("LowerPriority", None, "low"),
        [("preempt", "b2", "a1", "BorrowWithinCohort"), ("admit", "a1"), ("pending", "b2")],
        id="borrow-within-cohort-no-threshold",
    ),
    pytest.param(
        _borrow("LowerPriority", 500, "training"),
        [("pending", "a1")],
        id="borrow-within-cohort-never-equal-priority",
    ),
    pytest.param(_borrow(None, None, "scavenger"), [("pending", "a1")], id="borrow-without-policy-evicts-nothing"),
]


@pytest.mark.parametrize(("text", "expected"), BORROW_CASES)
def test_borrow_within_cohort(text: str, expected: list[tuple[Any, ...]]) -> None:
    """A preemptor that must borrow evicts other borrowers only of lower priority at or under the threshold."""
    out = run(text)
    assert out.decisions(at=10) == expected
    if ("admit", "a1") in expected:
        assert out.admitted("a1").borrowed == {"gpu": 8}


def test_reclaim_any_does_not_apply_when_preemptor_would_borrow() -> None:
    """reclaim_within_cohort applies only when the preemptor stays within nominal; a borrowing preemptor waits."""
    out = run(
        scenario(
            FOUR_NODES,
            [queue("qa", 8, "org", reclaim="Any"), queue("qb", 16, "org"), queue("qc", 8, "org")],
            [
                submit("b1", "qb", 16, prio="training"),
                submit("b2", "qb", 16, prio="scavenger"),
                submit("a1", "qa", 16, at=10, prio="training"),
            ],
            cohorts=["org"],
        )
    )
    assert out.decisions(at=10) == [("pending", "a1")]


def _inference_beside_borrowers(reclaim: str) -> str:
    """qi runs a 1-GPU notebook on n0; qb runs b1 (4 GPUs, n1) and borrows for b2 (3 GPUs, n0); at 10 qi's
    non-preemptible `serve` needs a whole node and, with the notebook, more than qi's nominal 4 GPUs."""
    return scenario(
        flat_nodes(4, 4),
        [
            queue("qi", 4, "org", within="LowerPriority", reclaim=reclaim, borrow="LowerPriority"),
            queue("qb", 4, "org"),
        ],
        [
            submit("notebook", "qi", 1, per_pod=1, prio="scavenger"),
            submit("b1", "qb", 4, per_pod=4, prio="scavenger"),
            submit("b2", "qb", 3, per_pod=3, prio="scavenger"),
            submit("serve", "qi", 4, at=10, per_pod=4, prio="inference", runtime=100),
        ],
        cohorts=["org"],
    )


def test_a_non_preemptible_preemptor_takes_from_other_queues_only_by_reclaim() -> None:
    """A job that never borrows evicts other queues' borrowers only as its queue's reclaim rule allows."""
    never = run(_inference_beside_borrowers("Never"))
    assert never.decisions(at=10) == [("pending", "serve")]
    assert never.preemptions() == []
    allowed = run(_inference_beside_borrowers("LowerPriority"))
    taken = {(e.job, e.preemptor, e.reason) for e in allowed.preemptions() if e.at == 10}
    assert taken == {("b2", "serve", "ReclaimWithinCohort"), ("notebook", "serve", "WithinQueue")}
    assert allowed.admitted("serve").at == 10 and allowed.admitted("serve").borrowed == {}


def test_a_borrowing_preemptor_names_the_borrow_rule_even_when_its_own_victims_bring_it_within_nominal() -> None:
    """The reason is the rule that let the victim go: under borrow_within_cohort, not reclaim (which is Never)."""
    out = run(
        scenario(
            flat_nodes(4, 4),
            [
                queue("qa", 4, "org", within="LowerPriority", reclaim="Never", borrow="LowerPriority"),
                queue("qb", 4, "org"),
            ],
            [
                submit("small", "qa", 1, per_pod=1, prio="scavenger"),
                submit("keep", "qb", 4, per_pod=4, prio="inference"),
                submit("b2", "qb", 3, per_pod=3, prio="scavenger"),
                submit("big", "qa", 4, at=10, per_pod=4, prio="training"),
            ],
            cohorts=["org"],
        )
    )
    taken = {(e.job, e.preemptor, e.reason) for e in out.preemptions() if e.at == 10}
    assert taken == {("b2", "big", "BorrowWithinCohort"), ("small", "big", "WithinQueue")}
    assert out.admitted("big").at == 10 and out.admitted("big").borrowed == {}


# ---------------------------------------------------------------- lost work and victim order


def test_inference_preempts_training_with_least_lost_work() -> None:
    """Among equal-priority training victims, the one losing the fewest GPU-seconds since its checkpoint goes."""
    out = run(
        scenario(
            FOUR_NODES,
            [queue("q", 32, within="LowerPriority")],
            [
                submit("no-ckpt", "q", 8, prio="training", runtime=5000),
                submit("ckpt-300", "q", 8, prio="training", runtime=5000, checkpoint=300),
                submit("ckpt-500", "q", 8, prio="training", runtime=5000, checkpoint=500),
                submit("ckpt-1000", "q", 8, prio="training", runtime=5000, checkpoint=1000),
                submit("serve", "q", 8, at=1100, prio="inference", runtime=100),
            ],
        )
    )
    # at t=1100: no-ckpt loses 1100 s, ckpt-300 200 s, ckpt-500 100 s, ckpt-1000 100 s (of 8 GPUs);
    # ckpt-500 and ckpt-1000 tie on lost work and admission time: the later submission goes first
    assert out.decisions(at=1100) == [
        ("preempt", "ckpt-1000", "serve", "WithinQueue"),
        ("admit", "serve"),
        ("pending", "ckpt-1000"),
    ]
    (ev,) = out.preemptions()
    assert ev.lost_gpu_seconds == 100 * 8
    # requeued with the work saved at its checkpoint (1000 s): 4000 s left once readmitted at 1200
    assert out.admissions("ckpt-1000")[1].at == 1200
    assert out.finished_at("ckpt-1000") == 1200 + 4000


def test_non_preemptible_job_never_borrows() -> None:
    """A non-preemptible job runs only within its queue's nominal quota, even when the cohort has room to lend."""
    out = run(
        scenario(
            FOUR_NODES,
            [queue("qa", 8, "org"), queue("qb", 24, "org")],
            [submit("inf1", "qa", 8, prio="inference", runtime=100), submit("inf2", "qa", 8, prio="inference")],
            cohorts=["org"],
        )
    )
    assert out.decisions(at=0) == [("admit", "inf1"), ("pending", "inf2")]
    (reason,) = out.reasons("inf2")
    assert "queue qa" in reason and "never borrows" in reason
    assert out.admitted("inf2").at == 100 and out.admitted("inf2").borrowed == {}


def test_lost_work_without_checkpoint_is_everything() -> None:
    """A job without checkpoints loses all its work on preemption and is requeued with its whole runtime."""
    out = run(
        scenario(
            flat_nodes(8),
            [queue("q", 8, within="LowerPriority")],
            [
                submit("t", "q", 8, prio="training", runtime=1000),
                submit("serve", "q", 8, at=250, prio="inference", runtime=50),
            ],
        )
    )
    (ev,) = out.preemptions("t")
    assert (ev.preemptor, ev.reason, ev.lost_gpu_seconds) == ("serve", "WithinQueue", 250 * 8)
    assert out.finished_at("t") == 300 + 1000
    assert out.summary()["jobs"]["t"]["preemptions"] == 1


def test_lost_work_right_at_a_checkpoint_is_zero() -> None:
    """Preempted exactly at a checkpoint, a job loses nothing."""
    out = run(
        scenario(
            flat_nodes(8),
            [queue("q", 8, within="LowerPriority")],
            [
                submit("t", "q", 8, prio="training", runtime=1000, checkpoint=200),
                submit("serve", "q", 8, at=400, prio="inference", runtime=50),
            ],
        )
    )
    (ev,) = out.preemptions("t")
    assert ev.lost_gpu_seconds == 0
    assert out.finished_at("t") == 450 + 600


def test_recently_admitted_victim_first_among_equals() -> None:
    """Among victims of equal priority and equal lost work, the most recently admitted goes first."""
    out = run(
        scenario(
            FOUR_NODES,
            [queue("q", 32, within="LowerPriority")],
            [
                submit("old", "q", 16, prio="training", runtime=5000, checkpoint=50),
                submit("new", "q", 16, at=50, prio="training", runtime=5000, checkpoint=50),
                submit("hi", "q", 16, at=200, prio="high"),
            ],
        )
    )
    assert out.decisions(at=200) == [("preempt", "new", "hi", "WithinQueue"), ("admit", "hi"), ("pending", "new")]


def test_preemptor_admitted_at_the_instant_of_eviction() -> None:
    """The preemptor is admitted at the same instant its victims are evicted, on the room they freed."""
    out = run(
        scenario(
            FOUR_NODES,
            [queue("q", 32, within="LowerPriority")],
            [submit("a", "q", 32, prio="low"), submit("hi", "q", 8, at=10, prio="high")],
        )
    )
    (ev,) = out.preemptions("a")
    assert ev.at == out.admitted("hi").at == 10
    assert out.nodes_of("hi") <= out.nodes_of("a")


def test_preemption_loop_never_happens_between_equal_priorities() -> None:
    """Two equal-priority jobs under LowerOrNewerEqualPriority do not evict each other back and forth."""
    out = run(
        scenario(
            FOUR_NODES,
            [queue("q", 32, within="LowerOrNewerEqualPriority")],
            [
                submit("a", "q", 32, prio="training", runtime=100),
                submit("b", "q", 32, at=1, prio="training", runtime=100),
            ],
        )
    )
    assert out.preemptions() == []
    assert (out.finished_at("a"), out.finished_at("b")) == (100, 200)


def test_fair_sharing_and_within_queue_evictions_do_not_chase_each_other() -> None:
    """Evictions settle: j1 -> j12, flood3 -> j1, j12 -> flood3 must not go round and round."""
    # q0 (weight 2) runs flood2 and waits with flood3; q1 (weight 0.5) runs j12; j1 (q0, 2 GPUs) arrives at 7.
    # j1 evicts j12 (FairSharing, 166 < 222), older flood3 evicts newer j1 (LowerOrNewerEqualPriority) and
    # borrows more, j12 evicts flood3 (FairSharing, 222 < 277). That went round again every second until
    # `until` while a cycle was due one second after an eviction; evicted jobs now wait for the next cycle.
    out = run(
        scenario(
            flat_nodes(4, 4, 4, 4),
            [
                queue("q0", 3, "c0", weight=2, within="LowerOrNewerEqualPriority", reclaim="Any"),
                queue("q1", 3, "c0", weight=0.5, reclaim="Any"),
                queue("q4", 3, "c0", lending_limit=3),
            ],
            [
                submit("j12", "q1", 4, per_pod=4, runtime=208),
                submit("flood2", "q0", 4, per_pod=4, runtime=837),
                submit("flood3", "q0", 4, per_pod=4, runtime=400),
                submit("j1", "q0", 2, at=7, per_pod=1, runtime=189),
            ],
            cohorts=["c0"],
            extra="fair_sharing: true\nuntil: 300\n",
            priorities="",
        )
    )
    # four jobs, no failures, no new arrivals after t=7: a handful of evictions at most, not one a second
    assert len(out.preemptions()) <= 6, [(e.at, e.job, e.preemptor) for e in out.preemptions()[:9]]


def test_a_node_failure_victim_preempts_at_once() -> None:
    """A high-priority job whose node fails evicts a lower one of its queue at that instant, not a cycle later."""
    out = run(
        scenario(
            flat_nodes(8, 8),
            [queue("q", 16, within="LowerPriority")],
            [
                submit("hi", "q", 8, prio="high"),
                submit("lo", "q", 8, prio="low"),
                "  - {at: 100, node_down: n0}\n",
            ],
        )
    )
    assert out.nodes_of("hi") == {"n0"}
    [failure, eviction] = out.preemptions()
    assert (failure.at, failure.job, failure.reason) == (100, "hi", "NodeFailure")
    assert (eviction.at, eviction.job, eviction.preemptor, eviction.reason) == (100, "lo", "hi", "WithinQueue")
    assert [a.at for a in out.admissions("hi")] == [0, 100] and out.nodes_of("hi", 1) == {"n1"}
