"""What muster tells users about a decision (pure part): which objects get which Event, and which pods a condition.

Writing them to a real API server (aggregation, the condition, RBAC): tests/k8s/test_feedback_real.py.
"""

from __future__ import annotations

import pytest

from muster.daemon.k8s import manifests as m
from muster.daemon.k8s.gangs import Owner, pod_info
from muster.daemon.k8s.reporting import Report, event_name, reports_for
from muster.events.types import Event, JobAdmitted, JobFinished, JobId, JobInadmissible, JobPreempted, NodeName

JOB = JobId("ns/job/train-1")
OWNER = Owner("Job", "ns", "train", "uid-1")
PODS = {
    "w-0": pod_info(m.pod("train-0", "ns", gpus=1)),
    "w-1": pod_info({**m.pod("train-1", "ns", gpus=1), "status": {"phase": "Pending"}}),
}


def summary(reports: list[Report]) -> list[tuple[str, str, str, str, bool]]:
    return [(r.target.kind, r.target.name, r.type, r.reason, r.unschedulable) for r in reports]


@pytest.mark.parametrize(
    ("event", "owner", "expected"),
    [
        pytest.param(
            JobAdmitted(at=1, job=JOB, queue="q", placement={"w-0": NodeName("a"), "w-1": NodeName("b")}),
            OWNER,
            [
                ("Pod", "train-0", "Normal", "Admitted", False),
                ("Pod", "train-1", "Normal", "Admitted", False),
                ("Job", "train", "Normal", "Admitted", False),
            ],
            id="admitted-pods-and-job",
        ),
        pytest.param(
            JobPreempted(at=1, job=JOB, preemptor=JobId("ns/job/boss"), reason="WithinQueue"),
            Owner("Gang", "ns", "g"),
            [("Pod", "train-0", "Warning", "Preempted", False), ("Pod", "train-1", "Warning", "Preempted", False)],
            id="preempted-pod-group-has-no-workload-object",
        ),
        pytest.param(
            JobInadmissible(at=1, job=JOB, reason="needs 2 gpu, 0 free"),
            OWNER,
            [
                ("Pod", "train-0", "Normal", "Waiting", True),
                ("Pod", "train-1", "Normal", "Waiting", True),
                ("Job", "train", "Normal", "Waiting", False),
            ],
            id="waiting-unbound-pods-get-the-condition",
        ),
        pytest.param(JobFinished(at=1, job=JOB), OWNER, [], id="facts-say-nothing"),
    ],
)
def test_reports_for(event: Event, owner: Owner, expected: list[tuple[str, str, str, str, bool]]) -> None:
    """A decision is told on each pod and on the workload (if it has one); waiting pods get the condition."""
    assert summary(reports_for(event, PODS, owner)) == expected


def test_the_messages_say_where_why_and_by_whom() -> None:
    """Admitted names the nodes; Preempted the reason and preemptor; Waiting the core's reason."""
    admitted = reports_for(JobAdmitted(at=1, job=JOB, queue="q", placement={"w-0": "a", "w-1": "b"}), PODS, OWNER)
    assert admitted[0].message.startswith("assigned ns/train-0 to a; gang ns/job/train-1 (2 pods)")
    assert admitted[0].message.endswith("onto a, b")
    preempted = reports_for(JobPreempted(at=1, job=JOB, preemptor="x/y", reason="FairSharing"), PODS, OWNER)
    assert "(FairSharing) for x/y" in preempted[0].message
    waiting = reports_for(JobInadmissible(at=1, job=JOB, reason="quota"), PODS, OWNER)
    assert {r.message for r in waiting} == {"muster: quota"}


def test_an_event_is_named_by_its_object_reason_and_message() -> None:
    """The same report twice has one name (counted on one Event); another message, another Event."""
    [first, *_] = reports_for(JobInadmissible(at=1, job=JOB, reason="quota"), PODS, OWNER)
    [again, *_] = reports_for(JobInadmissible(at=9, job=JOB, reason="quota"), PODS, OWNER)
    [other, *_] = reports_for(JobInadmissible(at=9, job=JOB, reason="topology"), PODS, OWNER)
    assert event_name(first) == event_name(again) != event_name(other)
    assert event_name(first).startswith("train-0.muster.")
