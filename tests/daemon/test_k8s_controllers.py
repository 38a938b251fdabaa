"""What a pod group's controller's pods new to the log are, from the controller's jobs on the log (`controllers`).

The rule as a table over the latest job of the controller; the index that finds that job as the log grows.
The adapter acting on it: test_k8s_cancel.py, test_k8s_reconcile.py, and on a real API server
tests/k8s/test_cancel_real.py and test_reconcile_real.py.
"""

from __future__ import annotations

import pytest

from muster.daemon.k8s.controllers import Adopt, ControllerJobs, Stopped, claim
from muster.events.types import (
    ControllerRef,
    Event,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobId,
    JobSubmitted,
    NodeAdded,
    NodeName,
    PodSet,
    QueueConfigured,
    QueueName,
)
from muster.projections.cluster import fold

TRAINER = ControllerRef(api_version="example.com/v1", kind="Trainer", namespace="ns", name="t", uid="u-t")
PODSETS = [PodSet(name="w", count=2, requests={"gpu": 1})]
JOB = JobId("ns/gang/g-1")


def submission(
    job: JobId = JOB, controller: ControllerRef | None = TRAINER, podsets: list[PodSet] = PODSETS, queue: str = "q"
) -> Event:
    """A submission of pod group ns/g naming `controller` (None: naming none, as every other job)."""
    extra = {"controller": controller} if controller is not None else {}
    return JobSubmitted(at=1, job=job, queue=QueueName(queue), podsets=podsets, source="Gang/ns/g", **extra)


QUEUE = QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})
NODE = NodeAdded(at=0, node=NodeName("n1"), capacity={"gpu": 8})


def admitted() -> Event:
    """The admission of pod group ns/g onto node n1."""
    return JobAdmitted(at=2, job=JOB, queue=QueueName("q"), placement={"w-0": NodeName("n1"), "w-1": NodeName("n1")})


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        pytest.param([], None, id="no-job-of-it"),
        pytest.param([submission()], Adopt(JOB), id="its-job-waits"),
        pytest.param([submission(), admitted()], Adopt(JOB), id="its-job-runs"),
        pytest.param(
            [submission(podsets=[PodSet(name="w", count=3, requests={"gpu": 1})])], None, id="its-job-has-another-shape"
        ),
        pytest.param([submission(controller=None)], None, id="a-job-naming-no-controller"),
        pytest.param([submission(queue="a")], None, id="a-job-of-another-queue"),
        pytest.param(
            [
                submission(),
                submission(JobId("ns/gang/g-a"), queue="a"),
                JobCancelled(at=2, job=JobId("ns/gang/g-a"), reason="Cancelled: x"),
            ],
            Adopt(JOB),
            id="another-queues-job-hides-nothing",
        ),
        pytest.param(
            [submission(), JobCancelled(at=2, job=JOB, reason="Cancelled: stop")],
            Stopped(JOB, TRAINER),
            id="user-cancel",
        ),
        pytest.param(
            [submission(), JobCancelled(at=2, job=JOB, reason="WorkloadDeleted: gone")], None, id="workload-deleted"
        ),
        pytest.param([submission(), JobFailed(at=2, job=JOB, reason="pod failed")], None, id="failed-runs-again"),
        pytest.param(
            [
                submission(),
                JobCancelled(at=2, job=JOB, reason="Cancelled: stop"),
                submission(JobId("ns/gang/g-2")),
            ],
            Adopt(JobId("ns/gang/g-2")),
            id="the-latest-job-counts",
        ),
    ],
)
def test_claim(log: list[Event], expected: Adopt | Stopped | None) -> None:
    """Pods are the replacements of their controller's waiting job, left alone after its user's cancel, else new."""
    state = fold([QUEUE, NODE, *log])
    assert ControllerJobs(lambda: state).claim("Gang/ns/g", TRAINER, "q", PODSETS) == expected


def test_the_index_finds_jobs_submitted_after_it_was_asked() -> None:
    """The index follows the log as it is folded on: a job submitted after a question is found by the next one."""
    state = fold([QUEUE])
    index = ControllerJobs(lambda: state)
    assert index.latest("Gang/ns/g", TRAINER, "q") is None
    fold([submission()], state)  # the daemon folds on into the same state
    assert claim(index.latest("Gang/ns/g", TRAINER, "q"), PODSETS) == Adopt(JOB)
    fold([JobCancelled(at=2, job=JOB, reason="Cancelled: stop")], state)
    assert claim(index.latest("Gang/ns/g", TRAINER, "q"), PODSETS) == Stopped(JOB, TRAINER)
    other = ControllerRef(api_version="example.com/v1", kind="Trainer", namespace="ns", name="t", uid="u-other")
    assert index.latest("Gang/ns/g", other, "q") is None and index.latest("Gang/ns/h", TRAINER, "q") is None
