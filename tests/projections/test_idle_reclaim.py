"""Idle GPU reclamation as scenarios (spec/scenario.md, Idle reclamation).

Shape of most cases: qa and qb have 8 GPUs each on a 16-GPU cluster; qa runs
`own` (within nominal) and `lent` (borrowed); qb's `b` arrives later and,
with no reclaim policy, can only get room when an idle job is reclaimed.
"""

from __future__ import annotations

from simkit import flat_nodes, nodes_8gpu, queue, run, scenario, submit

TWO_NODES = nodes_8gpu(per_rack=2)  # 16 GPUs


def _idle(
    samples: list[tuple[int, str, float]],
    *,
    threshold: float = 0.05,
    after: int = 1800,
    only_borrowing: bool | None = None,
    pending_b: bool = True,
    own_prio: str = "training",
    more: tuple[str, ...] = (),
    own_runtime: int = 100_000,
) -> str:
    timeline = [
        submit("own", "qa", 8, runtime=own_runtime, prio=own_prio),
        submit("lent", "qa", 8, runtime=100_000),
    ]
    timeline += [f"  - {{at: {t}, utilization: {{job: {j}, gpu: {u}}}}}\n" for t, j, u in samples]
    if pending_b:
        timeline.append(submit("b", "qb", 8, at=200, runtime=100))
    timeline += more
    policy = f"idle_reclaim:\n  threshold: {threshold}\n  after: {after}\n"
    if only_borrowing is not None:
        policy += f"  only_borrowing: {'true' if only_borrowing else 'false'}\n"
    return scenario(
        TWO_NODES,
        [queue("qa", 8, "org"), queue("qb", 8, "org")],
        timeline,
        cohorts=["org"],
        extra=policy + "until: 20000\n",
    )


def test_idle_borrowing_job_reclaimed_after_the_delay() -> None:
    """A borrowing job idle for `after` seconds is evicted (IdleReclaim, no preemptor) for a pending job."""
    out = run(_idle([(100, "lent", 0.01)]))
    assert out.admitted("lent").borrowed == {"gpu": 8}
    (ev,) = out.preemptions()
    assert (ev.at, ev.job, ev.preemptor, ev.reason) == (1900, "lent", None, "IdleReclaim")
    assert ev.lost_gpu_seconds == 1900 * 8  # no checkpoints: all its work since admission at 0
    assert out.decisions(at=1900) == [("preempt", "lent", None, "IdleReclaim"), ("admit", "b"), ("pending", "lent")]


def test_sample_at_the_threshold_counts_as_idle() -> None:
    """Utilization exactly at the threshold is idle."""
    out = run(_idle([(100, "lent", 0.05)]))
    assert [e.at for e in out.preemptions()] == [1900]


def test_sample_above_the_threshold_is_busy() -> None:
    """Utilization above the threshold never makes a job idle."""
    out = run(_idle([(100, "lent", 0.06)]))
    assert out.preemptions() == []


def test_busy_sample_restarts_the_idle_clock() -> None:
    """A sample above the threshold ends the idle spell; the clock starts again at the next idle sample."""
    out = run(_idle([(100, "lent", 0.01), (1000, "lent", 0.9), (1200, "lent", 0.0)]))
    assert [e.at for e in out.preemptions()] == [3000]


def test_repeated_idle_samples_do_not_restart_the_clock() -> None:
    """An idle job stays idle from its first idle sample, whatever later idle samples say."""
    out = run(_idle([(100, "lent", 0.01), (1000, "lent", 0.02), (1500, "lent", 0.0)]))
    assert [e.at for e in out.preemptions()] == [1900]


def test_custom_threshold_and_after() -> None:
    """`threshold` and `after` come from the scenario."""
    out = run(_idle([(100, "lent", 0.3)], threshold=0.5, after=60))
    assert [e.at for e in out.preemptions()] == [200]


def test_only_borrowing_spares_jobs_within_nominal() -> None:
    """With only_borrowing (the default) an idle job that did not borrow is never reclaimed."""
    out = run(_idle([(100, "own", 0.0)]))
    assert out.preemptions() == []


def test_only_borrowing_spares_a_borrower_once_its_queue_stops_borrowing() -> None:
    """A job admitted on borrowed quota is spared once its queue is back within its nominal quota."""
    # `own` finishes at 500: qa then runs only `lent`, within its nominal; `b` (16) would need qa's quota
    out = run(_idle([(100, "lent", 0.0)], pending_b=False, own_runtime=500, more=(submit("b", "qb", 16, at=200),)))
    assert out.admitted("lent").borrowed == {"gpu": 8}
    assert out.preemptions() == []
    assert out.admissions("b") == []


def test_without_only_borrowing_any_idle_job_is_reclaimed() -> None:
    """With only_borrowing false an idle job within its nominal is reclaimed too."""
    out = run(_idle([(100, "own", 0.0)], only_borrowing=False))
    assert [(e.at, e.job, e.reason) for e in out.preemptions()] == [(1900, "own", "IdleReclaim")]


def test_idle_job_kept_when_no_pending_job_could_use_the_room() -> None:
    """An idle job is not evicted while nothing pending could use what it frees."""
    out = run(_idle([(100, "lent", 0.0)], pending_b=False))
    assert out.preemptions() == []


def test_idle_job_reclaimed_once_a_job_arrives_that_can_use_it() -> None:
    """An idle job long past its deadline is reclaimed at the instant a job that fits arrives."""
    out = run(_idle([(100, "lent", 0.0)], pending_b=False, more=(submit("late", "qb", 8, at=5000, runtime=10),)))
    assert [(e.at, e.job) for e in out.preemptions()] == [(5000, "lent")]
    assert out.admitted("late").at == 5000


def test_idle_job_kept_when_the_pending_job_would_still_not_fit() -> None:
    """Reclaiming an idle job that frees too little for any pending job is pointless, so it stays."""
    out = run(_idle([(100, "lent", 0.0)], pending_b=False, more=(submit("huge", "qb", 24, at=200),)))
    assert out.preemptions() == []


def test_non_preemptible_job_never_reclaimed_for_idleness() -> None:
    """A non-preemptible job is never reclaimed for idleness, even with only_borrowing false."""
    out = run(_idle([(100, "own", 0.0)], only_borrowing=False, own_prio="inference"))
    assert out.preemptions() == []


def test_idle_clock_resets_when_the_job_is_readmitted() -> None:
    """A reclaimed job starts with a clean utilization record when it runs again."""
    out = run(_idle([(100, "lent", 0.0)]))
    # `b` finishes at 2000; `lent` is readmitted and, with no new idle sample, runs on
    assert out.admissions("lent")[1].at == 2000
    assert len(out.preemptions()) == 1


# A job reclaimed for idleness loses its place (spec, Idle reclamation): one 8-GPU node, one queue,
# `idle` (submitted first) idle from t=100, the others waiting for its room.

ONE_NODE = flat_nodes(8)


def _one_queue(timeline: list[str]) -> str:
    policy = "idle_reclaim:\n  threshold: 0.05\n  after: 1800\n  only_borrowing: false\n"
    return scenario(ONE_NODE, [queue("q", 8)], timeline, extra=policy + "until: 20000\n")


def _idle_one(*more: str) -> list[str]:
    idle = submit("idle", "q", 8, runtime=100_000, prio="training")
    return [idle, "  - {at: 100, utilization: {job: idle, gpu: 0.0}}\n", *more]


def test_reclaimed_job_is_not_readmitted_ahead_of_the_job_it_was_reclaimed_for() -> None:
    """An idle job reclaimed for an equal job of its queue waits behind it: the waiting job gets the room."""
    out = run(_one_queue(_idle_one(submit("w", "q", 8, prio="training", at=200, runtime=100))))
    assert out.decisions(at=1900) == [("preempt", "idle", None, "IdleReclaim"), ("admit", "w"), ("pending", "idle")]
    assert [a.at for a in out.admissions("idle")] == [0, 2000]  # back when `w` ends


def test_reclaimed_job_goes_ahead_of_jobs_submitted_after_its_reclaim() -> None:
    """A reclaimed job's new place is the reclaim's: behind those then waiting, ahead of later submissions."""
    later = submit("later", "q", 8, prio="training", at=1950, runtime=100)
    out = run(_one_queue(_idle_one(submit("w", "q", 8, prio="training", at=200, runtime=100), later)))
    assert out.decisions(at=2000, pending=False) == [("admit", "idle")]
    assert out.admissions("later") == []  # `idle` runs on; `later` waits behind it


def test_job_idle_again_after_readmission_is_reclaimed_only_when_someone_waits() -> None:
    """Readmitted and idle again, a job is kept while no one waits and reclaimed when a job arrives."""
    timeline = _idle_one(
        submit("w", "q", 8, prio="training", at=200, runtime=100),
        "  - {at: 2100, utilization: {job: idle, gpu: 0.0}}\n",
        submit("w2", "q", 8, prio="training", at=5000, runtime=100),
    )
    out = run(_one_queue(timeline))
    assert [(e.at, e.job) for e in out.preemptions()] == [(1900, "idle"), (5000, "idle")]
    assert [a.at for a in out.admissions("w2")] == [5000]
    assert [a.at for a in out.admissions("idle")] == [0, 2000, 5100]


def test_idle_job_kept_when_only_lower_priority_jobs_wait() -> None:
    """An idle job is not reclaimed for a lower-priority job: that job would still come after it."""
    out = run(_one_queue(_idle_one(submit("w", "q", 8, at=200, runtime=100, prio="low"))))
    assert out.preemptions() == []
    assert out.admissions("w") == []


def test_one_waiting_job_reclaims_one_idle_job() -> None:
    """Two idle jobs and one waiting job that either's room holds: only the job idle longest is reclaimed."""
    timeline = [
        submit("idle1", "q", 8, runtime=100_000, prio="training"),
        submit("idle2", "q", 8, runtime=100_000, prio="training"),
        "  - {at: 100, utilization: {job: idle2, gpu: 0.0}}\n",
        "  - {at: 150, utilization: {job: idle1, gpu: 0.0}}\n",
        submit("w", "q", 8, prio="training", at=200, runtime=100),
    ]
    policy = "idle_reclaim:\n  threshold: 0.05\n  after: 1800\n  only_borrowing: false\n"
    out = run(scenario(flat_nodes(8, 8), [queue("q", 16)], timeline, extra=policy + "until: 20000\n"))
    assert out.decisions(at=1900) == [("preempt", "idle2", None, "IdleReclaim"), ("admit", "w"), ("pending", "idle2")]


def test_reclaimed_job_does_not_evict_the_equal_job_it_made_room_for() -> None:
    """Under LowerOrNewerEqualPriority the reclaimed job is the newer one: it may not evict the job now in its room."""
    policy = "idle_reclaim:\n  threshold: 0.05\n  after: 1800\n  only_borrowing: false\n"
    timeline = _idle_one(submit("w", "q", 8, prio="training", at=200, runtime=100))
    queues = [queue("q", 8, within="LowerOrNewerEqualPriority")]
    out = run(scenario(ONE_NODE, queues, timeline, extra=policy + "until: 20000\n"))
    assert [(e.at, e.job, e.reason) for e in out.preemptions()] == [(1900, "idle", "IdleReclaim")]
    assert [a.at for a in out.admissions("w")] == [1900]
    assert [a.at for a in out.admissions("idle")] == [0, 2000]


# A job reclaimed for idleness evicts no one while it borrows, until it runs again (spec, Idle
# reclamation): 32 GPUs, four queues of 8 in one cohort; qa runs `own` and the borrowing `lent` (idle
# from t=100), qc runs the busy scavengers `s1` and `s2` (which borrows); qb's `w` waits for room.


def _reclaimed_borrower(*more: str) -> str:
    timeline = [
        submit("own", "qa", 8, runtime=100_000, prio="training"),
        submit("lent", "qa", 8, runtime=100_000, prio="training"),
        submit("s1", "qc", 8, runtime=100_000, prio="scavenger"),
        submit("s2", "qc", 8, runtime=5000, prio="scavenger"),
        "  - {at: 100, utilization: {job: lent, gpu: 0.0}}\n",
        submit("w", "qb", 8, at=200, runtime=100_000, prio="training"),
        *more,
    ]
    queues = [
        queue("qa", 8, "org", reclaim="Any", borrow="LowerPriority"),
        queue("qb", 8, "org"),
        queue("qc", 8, "org"),
        queue("qd", 8, "org"),
    ]
    policy = "idle_reclaim:\n  threshold: 0.05\n  after: 1800\n"
    return scenario(nodes_8gpu(per_rack=4), queues, timeline, cohorts=["org"], extra=policy + "until: 20000\n")


def test_reclaimed_borrower_waits_for_free_room_instead_of_evicting_a_busy_scavenger() -> None:
    """Requeued while it borrows, a job reclaimed for idleness evicts no busy job: it runs once room is free."""
    out = run(_reclaimed_borrower())
    assert out.admitted("s2").borrowed == {"gpu": 8}
    assert [(e.at, e.job, e.reason) for e in out.preemptions()] == [(1900, "lent", "IdleReclaim")]
    assert [a.at for a in out.admissions("w")] == [1900]
    assert [a.at for a in out.admissions("lent")] == [0, 5000]  # when `s2` ends


def test_reclaimed_job_back_within_nominal_quota_reclaims_from_a_borrower() -> None:
    """Within its queue's nominal quota a job reclaimed for idleness still takes back what a borrower holds."""
    out = run(_reclaimed_borrower("  - {at: 2500, queue_update: {name: qa, nominal: {gpu: 16}}}\n"))
    assert [(e.at, e.job, e.preemptor, e.reason) for e in out.preemptions()] == [
        (1900, "lent", None, "IdleReclaim"),
        (2500, "s2", "lent", "ReclaimWithinCohort"),
    ]
    assert [a.at for a in out.admissions("lent")] == [0, 2500]


def test_the_mark_ends_when_the_job_runs_again() -> None:
    """Readmitted, a job once reclaimed for idleness evicts as any job: its mark is gone from the state."""
    out = run(_reclaimed_borrower())
    assert out.state.jobs["lent"].idle_reclaimed_at is None
    assert out.state.jobs["lent"].status == "admitted"
