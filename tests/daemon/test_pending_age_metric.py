"""Prometheus: the age of each queue's oldest pending job, and the reservations each queue holds, read from
the folded log at scrape time."""

from __future__ import annotations

import pytest

from muster.daemon.metrics import DaemonMetrics
from muster.events.types import (
    Event,
    JobAdmitted,
    JobHeld,
    JobPreempted,
    JobSubmitted,
    NodeAdded,
    NodeName,
    PodSet,
    QueueConfigured,
    ReservationMade,
    ReservationReleased,
)
from muster.projections.cluster import fold

AGE = "muster_queue_oldest_pending_age_seconds"
CONFIG: list[Event] = [
    QueueConfigured(at=0, name="qa", nominal={"gpu": 8}),
    QueueConfigured(at=0, name="qb", nominal={"gpu": 8}),
    NodeAdded(at=0, node=NodeName("n0"), capacity={"gpu": 8}),
]


def _job(job: str, at: int, queue: str = "qa") -> JobSubmitted:
    return JobSubmitted(at=at, job=job, queue=queue, podsets=[PodSet(name="w", count=1, requests={"gpu": 8})])


def _admit(job: str, at: int, queue: str = "qa") -> JobAdmitted:
    return JobAdmitted(at=at, job=job, queue=queue, placement={"w-0": NodeName("n0")})


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        pytest.param([], {"qa": 0.0, "qb": 0.0}, id="no-pending-job"),
        pytest.param([_job("a", 100), _job("b", 400)], {"qa": 900.0, "qb": 0.0}, id="oldest-of-two"),
        pytest.param([_job("a", 100), _admit("a", 200), _job("b", 700)], {"qa": 300.0, "qb": 0.0}, id="admitted-left"),
        pytest.param(
            [_job("a", 100), _admit("a", 200), JobPreempted(at=600, job="a", preemptor=None, reason="NodeFailure")],
            {"qa": 400.0, "qb": 0.0},
            id="preempted-counts-from-its-eviction",
        ),
    ],
)
def test_oldest_pending_age_per_queue(events: list[Event], expected: dict[str, float]) -> None:
    """Each queue reports how long its longest-waiting pending job has waited at the scrape (0 with none)."""
    state = fold([*CONFIG, *events])
    metrics = DaemonMetrics(clock=lambda: 1000.0)
    metrics.watch(lambda: state)
    got = {q: metrics.registry.get_sample_value(AGE, {"queue": q}) for q in expected}
    assert got == expected


def test_reservations_held_per_queue() -> None:
    """A queue reports the reservations its pending jobs hold: 1 once made, 0 again once released."""
    made = ReservationMade(at=50, job="a", queue="qa", nodes=[NodeName("n0")], expected_start=900, cycle=1)
    held = fold([*CONFIG, _job("a", 10), made])
    released = fold([*CONFIG, _job("a", 10), made, ReservationReleased(at=60, job="a", reason="cancelled", cycle=2)])
    got = []
    for state in (held, released):
        metrics = DaemonMetrics(clock=lambda: 1000.0)
        metrics.watch(lambda state=state: state)
        got.append(
            {q: metrics.registry.get_sample_value("muster_queue_reservations", {"queue": q}) for q in ("qa", "qb")}
        )
    assert got == [{"qa": 1.0, "qb": 0.0}, {"qa": 0.0, "qb": 0.0}]


def test_a_held_job_is_counted_apart_and_does_not_age_its_queue() -> None:
    """A job its user holds since t=100 is neither pending nor the queue's oldest wait: the job waiting since
    t=400 is (600 s at the scrape), and `muster_held_jobs` counts the held one."""
    state = fold([*CONFIG, _job("held", 100), JobHeld(at=150, job="held"), _job("waits", 400)])
    metrics = DaemonMetrics(clock=lambda: 1000.0)
    metrics.watch(lambda: state)
    sample = metrics.registry.get_sample_value
    assert sample(AGE, {"queue": "qa"}) == 600.0
    assert (sample("muster_pending_jobs", {"queue": "qa"}), sample("muster_held_jobs", {"queue": "qa"})) == (1, 1)
