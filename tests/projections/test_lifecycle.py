"""Node and job lifecycle as scenarios: node failure, cordon, cancel, queue updates, explanations, rejections."""

from __future__ import annotations

import pytest
from simkit import flat_nodes, nodes_8gpu, queue, run, scenario, submit

FOUR_NODES = nodes_8gpu(per_rack=4)  # 32 GPUs, nodes b0-r0-n0..3
BIG_QUEUE = [queue("q", 10_000)]


def _at(t: int, what: str) -> str:
    return f"  - {{at: {t}, {what}}}\n"


# ---------------------------------------------------------------- nodes


def test_node_down_evicts_with_node_failure_and_requeues_remaining_work() -> None:
    """A failed node evicts its jobs (NodeFailure, no preemptor); they rerun elsewhere from their last checkpoint."""
    out = run(
        scenario(
            FOUR_NODES,
            BIG_QUEUE,
            [
                submit("j", "q", 16, runtime=3600, checkpoint=1000),
                submit("other", "q", 16, runtime=10_000),
                _at(1500, "node_down: b0-r0-n0"),
            ],
        )
    )
    assert out.admitted("j").placement == {"w-0": "b0-r0-n0", "w-1": "b0-r0-n1"}
    (ev,) = out.preemptions()
    assert (ev.job, ev.preemptor, ev.reason, ev.lost_gpu_seconds) == ("j", None, "NodeFailure", 500 * 16)
    assert out.decisions(at=1500, pending=False) == [("preempt", "j", None, "NodeFailure")]
    # of the 3 nodes left, `other` holds two: j waits until `other` finishes at 10000
    assert out.admissions("j")[1].at == 10_000
    assert "b0-r0-n0" not in out.nodes_of("j", 1)
    assert out.finished_at("j") == 10_000 + 2600


def test_node_down_reruns_at_once_when_room_is_left() -> None:
    """An evicted job is readmitted at the same instant when other nodes have room."""
    out = run(scenario(FOUR_NODES, BIG_QUEUE, [submit("j", "q", 8, runtime=1000), _at(100, "node_down: b0-r0-n0")]))
    assert out.decisions(at=100) == [("preempt", "j", None, "NodeFailure"), ("admit", "j")]
    assert out.finished_at("j") == 1100


def test_node_down_evicts_non_preemptible_jobs_too() -> None:
    """node_down evicts even a non-preemptible job."""
    out = run(
        scenario(
            flat_nodes(8),
            BIG_QUEUE,
            [
                submit("serve", "q", 8, prio="inference", runtime=1000),
                _at(100, "node_down: n0"),
                _at(200, "node_up: n0"),
            ],
        )
    )
    assert out.decisions(at=100) == [("preempt", "serve", None, "NodeFailure"), ("pending", "serve")]
    assert out.decisions(at=200, pending=False) == [("admit", "serve")]
    assert out.finished_at("serve") == 1200


def test_node_down_evicts_the_whole_gang() -> None:
    """A gang with one pod on a failed node loses all its pods, not only that one."""
    out = run(scenario(FOUR_NODES, BIG_QUEUE, [submit("gang", "q", 32), _at(10, "node_down: b0-r0-n3")]))
    assert out.decisions(at=10) == [("preempt", "gang", None, "NodeFailure"), ("pending", "gang")]
    assert out.state.jobs["gang"].status == "pending"
    assert all(not n.jobs for n in out.state.nodes.values())


def test_node_up_does_not_lift_a_cordon() -> None:
    """A cordoned node that goes down and comes back up still takes no new pods."""
    out = run(
        scenario(
            FOUR_NODES,
            BIG_QUEUE,
            [
                _at(10, "cordon: b0-r0-n0"),
                _at(20, "node_down: b0-r0-n0"),
                _at(30, "node_up: b0-r0-n0"),
                submit("all", "q", 32, at=40),
            ],
        )
    )
    assert out.decisions() == [("pending", "all")]


def test_node_up_makes_room_again() -> None:
    """A node that comes back up takes pods again."""
    out = run(
        scenario(
            FOUR_NODES,
            BIG_QUEUE,
            [_at(10, "node_down: b0-r0-n0"), submit("all", "q", 32, at=20), _at(30, "node_up: b0-r0-n0")],
        )
    )
    assert out.decisions(at=20) == [("pending", "all")]
    assert out.decisions(at=30) == [("admit", "all")]


def test_cordon_keeps_running_pods_and_takes_no_new_ones() -> None:
    """A cordon evicts nothing, and new pods avoid the node; uncordon lifts it."""
    out = run(
        scenario(
            FOUR_NODES,
            BIG_QUEUE,
            [
                submit("j", "q", 8, runtime=500),
                _at(10, "cordon: b0-r0-n0"),
                submit("k", "q", 32, at=20),
                _at(600, "uncordon: b0-r0-n0"),
            ],
        )
    )
    assert out.admitted("j").placement == {"w-0": "b0-r0-n0"}
    assert out.preemptions() == []
    assert out.finished_at("j") == 500
    # j's node is free at 500 but cordoned: k waits for the uncordon
    assert out.admitted("k").at == 600


# ---------------------------------------------------------------- jobs


def test_cancel_releases_resources_at_once() -> None:
    """Cancelling a running job frees its room for a pending job at the same instant."""
    out = run(
        scenario(
            FOUR_NODES,
            BIG_QUEUE,
            [submit("a", "q", 32, runtime=1000), submit("b", "q", 32, at=1), _at(100, "cancel: a")],
        )
    )
    assert out.decisions(at=100) == [("admit", "b")]
    assert out.finished_at("a") is None
    assert out.summary()["jobs"]["a"]["status"] == "cancelled"


def test_cancel_a_pending_job() -> None:
    """A cancelled pending job never runs."""
    out = run(
        scenario(
            FOUR_NODES,
            BIG_QUEUE,
            [submit("a", "q", 32, runtime=1000), submit("b", "q", 32, at=1), _at(100, "cancel: b")],
        )
    )
    assert out.admissions("b") == []
    assert out.summary()["jobs"]["b"]["status"] == "cancelled"


def test_queue_update_applies_at_once() -> None:
    """Raising a queue's nominal quota admits the jobs it was holding back at that instant."""
    out = run(
        scenario(
            FOUR_NODES,
            [queue("q", 8)],
            [
                submit("a", "q", 8),
                submit("b", "q", 8),
                _at(100, "queue_update: {name: q, nominal: {gpu: 16}}"),
            ],
        )
    )
    assert out.decisions(at=0) == [("admit", "a"), ("pending", "b")]
    assert out.decisions(at=100) == [("admit", "b")]


def test_queue_update_of_policy_enables_preemption() -> None:
    """Changing a queue's preemption policy takes effect for the jobs already pending."""
    out = run(
        scenario(
            FOUR_NODES,
            [queue("q", 32)],
            [
                submit("low", "q", 32, prio="low"),
                submit("hi", "q", 8, at=10, prio="high"),
                _at(100, "queue_update: {name: q, preemption: {within_queue: LowerPriority}}"),
            ],
        )
    )
    assert out.decisions(at=10) == [("pending", "hi")]
    assert out.decisions(at=100) == [("preempt", "low", "hi", "WithinQueue"), ("admit", "hi"), ("pending", "low")]


def test_queue_update_into_a_cohort_lets_it_borrow() -> None:
    """Moving a queue into a cohort by queue_update lets its waiting jobs borrow at once."""
    out = run(
        scenario(
            FOUR_NODES,
            [queue("qa", 8), queue("qb", 24, "org")],
            [submit("a1", "qa", 8), submit("a2", "qa", 8), _at(50, "queue_update: {name: qa, cohort: org}")],
            cohorts=["org"],
        )
    )
    assert out.decisions(at=0) == [("admit", "a1"), ("pending", "a2")]
    assert out.decisions(at=50) == [("admit", "a2")]
    assert out.admitted("a2").borrowed == {"gpu": 8}


def test_queue_update_lowering_nominal_evicts_nothing_but_makes_jobs_reclaimable() -> None:
    """A lower nominal quota evicts nothing by itself; the queue now borrows, so others may reclaim from it."""
    out = run(
        scenario(
            FOUR_NODES,
            [queue("qa", 16, "org"), queue("qb", 16, "org", reclaim="Any")],
            [
                submit("a1", "qa", 8),
                submit("a2", "qa", 8),
                submit("b1", "qb", 16),
                _at(50, "queue_update: {name: qa, nominal: {gpu: 8}}"),
                _at(50, "queue_update: {name: qb, nominal: {gpu: 24}}"),
                submit("b2", "qb", 8, at=60),
            ],
            cohorts=["org"],
        )
    )
    assert out.decisions(at=50) == []
    assert out.decisions(at=60) == [("preempt", "a2", "b2", "ReclaimWithinCohort"), ("admit", "b2"), ("pending", "a2")]


def test_finish_time_counts_work_left() -> None:
    """A job admitted at t with r seconds of work finishes at t + r."""
    out = run(scenario(FOUR_NODES, BIG_QUEUE, [submit("a", "q", 8, at=7, runtime=93)]))
    assert (out.admitted("a").at, out.finished_at("a")) == (7, 100)


# ---------------------------------------------------------------- explanations


def test_inadmissible_written_only_when_the_reason_changes() -> None:
    """A job that waits through many cycles gets one JobInadmissible per distinct reason, not one per cycle."""
    out = run(
        scenario(
            FOUR_NODES,
            [queue("q", 16), queue("other", 32)],
            [
                submit("a", "q", 16, runtime=1000),
                submit("b", "q", 16, runtime=100),
                *[submit(f"o{i}", "other", 8, at=10 * i, runtime=5) for i in range(1, 6)],
                _at(500, "queue_update: {name: q, nominal: {gpu: 64}}"),
                submit("fill", "other", 16, at=499, runtime=2000),
            ],
        )
    )
    quota, capacity = out.reasons("b")
    assert "queue q" in quota and "no cohort" in quota
    assert capacity == "2 pods of gpu=8 do not fit on the schedulable nodes"
    assert out.admitted("b").at == 1000


def test_rejected_job_does_not_stop_the_run() -> None:
    """Invalid jobs are rejected with a reason; valid jobs around them run."""
    out = run(
        scenario(
            FOUR_NODES,
            BIG_QUEUE,
            [submit("bad", "nope", 8), submit("good", "q", 8), submit("worse", "q", 8, prio="gold")],
        )
    )
    assert out.decisions(at=0) == [("reject", "bad"), ("reject", "worse"), ("admit", "good")]
    assert "queue 'nope' does not exist" in out.rejection("bad")
    assert "priority class 'gold' does not exist" in out.rejection("worse")


def test_a_job_naming_no_queue_is_told_where_a_queue_comes_from() -> None:
    """A job with an empty queue is rejected saying it names none and where a pod's queue comes from."""
    from muster.events.types import JobRejected, JobSubmitted, NodeAdded, PodSet, QueueConfigured
    from muster.projections.cluster import evolve
    from muster.projections.scheduler import decide
    from muster.projections.state import ClusterState

    state = ClusterState()  # the adapter's path: a scenario file cannot leave the queue out
    for ev in [
        QueueConfigured(at=0, name="q", nominal={"gpu": 8}),
        NodeAdded(at=0, node="n0", labels={}, capacity={"gpu": 8}),
        JobSubmitted(at=0, job="lost", queue="", podsets=[PodSet(name="w", count=1, requests={"gpu": 8})]),
    ]:
        evolve(state, ev)
    (rejected,) = [e for e in decide(state, 0) if isinstance(e, JobRejected)]
    assert rejected.job == "lost"
    assert rejected.reason.startswith("the job names no queue (a pod takes one from its label muster.dev/queue")


@pytest.mark.parametrize(
    ("podsets", "reason"),
    [
        pytest.param("[]", "the job has no pods", id="no-pods"),
        pytest.param("[{name: w, count: 0, requests: {gpu: 8}}]", "count 0 must be at least 1", id="zero-count"),
        pytest.param("[{name: w, count: -2, requests: {gpu: 8}}]", "count -2 must be at least 1", id="negative-count"),
        pytest.param("[{name: w, count: 1, requests: {gpu: -8}}]", "request gpu=-8 is negative", id="negative-gpus"),
        pytest.param(
            "[{name: w, count: 1, requests: {gpu: 8}, topology: {required: zone}}]",
            "topology level 'zone' does not exist",
            id="unknown-topology-level",
        ),
        pytest.param(
            "[{name: w, count: 1, requests: {gpu: 8}}, {name: w, count: 1, requests: {gpu: 8}}]",
            "podset 'w' appears twice",
            id="duplicate-podset",
        ),
        pytest.param(
            "[{name: w, count: 1, requests: {gpu: 99999999999999999999}}]",
            "request gpu=99999999999999999999 is more than muster accepts",
            id="gpus-past-the-bound",
        ),
        pytest.param(
            "[{name: w, count: 4096, requests: {memory: 1Pi}}]",
            "the gang's total memory=4611686018427387904 is more than muster accepts",
            id="gang-total-past-the-bound",
        ),
    ],
)
def test_invalid_spec_rejected_with_reason(podsets: str, reason: str) -> None:
    """A job whose spec is invalid is rejected (never pending) and the reason says what is wrong."""
    job = _at(0, f"submit: {{job: bad, queue: q, podsets: {podsets}}}")
    out = run(scenario(FOUR_NODES, BIG_QUEUE, [job, submit("good", "q", 8)]))
    assert reason in out.rejection("bad")
    assert out.decisions(at=0) == [("reject", "bad"), ("admit", "good")]
    assert out.summary()["jobs"]["bad"]["status"] == "rejected"
