"""What muster tells users about a decision (pure part): which objects get which Event, and which pods a condition.

Writing them to a real API server (aggregation, the condition, RBAC): tests/k8s/test_feedback_real.py.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from adapterkit import eventually
from anyio import wait_all_tasks_blocked

from muster.daemon.k8s import manifests as m
from muster.daemon.k8s.applying import InFlight
from muster.daemon.k8s.pods import Owner, pod_info
from muster.daemon.k8s.reporting import Report, Reporter, Target, binding_failed, event_name, reports_for
from muster.events.types import Event, JobAdmitted, JobFinished, JobId, JobInadmissible, JobPreempted, NodeName

JOB = JobId("ns/job/train-1")
OWNER = Owner("Job", "ns", "train", "uid-1")
PODS = {
    "w-0": pod_info(m.pod("train-0", "ns", gpus=1)),
    "w-1": pod_info({**m.pod("train-1", "ns", gpus=1), "status": {"phase": "Pending"}}),
}


Row = tuple[str, str, str, str, str, str, bool]


def summary(reports: list[Report]) -> list[Row]:
    return [(r.target.kind, r.target.name, r.type, r.reason, r.scheduled, r.status, r.quiet) for r in reports]


ADMITTED = JobAdmitted(at=1, job=JOB, queue="q", placement={"w-0": NodeName("a"), "w-1": NodeName("b")})


@pytest.mark.parametrize(
    ("event", "owner", "expected"),
    [
        pytest.param(
            ADMITTED,
            OWNER,
            [
                ("Pod", "train-0", "Normal", "Admitted", "", "", True),
                ("Pod", "train-1", "Normal", "Admitted", "", "", True),
                ("Job", "train", "Normal", "Admitted", "", "Admitted", False),
            ],
            id="admitted-once-on-the-job-which-holds-the-status",
        ),
        pytest.param(
            ADMITTED,
            Owner("Gang", "ns", "g"),
            [
                ("Pod", "train-0", "Normal", "Admitted", "", "Admitted", False),
                ("Pod", "train-1", "Normal", "Admitted", "", "Admitted", True),
            ],
            id="admitted-pod-group-told-on-its-first-pod",
        ),
        pytest.param(
            JobPreempted(at=1, job=JOB, preemptor=JobId("ns/job/boss"), reason="WithinQueue"),
            Owner("Gang", "ns", "g"),
            [
                ("Pod", "train-0", "Warning", "Preempted", "", "Preempted", False),
                ("Pod", "train-1", "Warning", "Preempted", "", "Preempted", False),
            ],
            id="preempted-pod-group-has-its-status-on-its-pods",
        ),
        pytest.param(
            JobInadmissible(at=1, job=JOB, reason="needs 2 gpu, 0 free"),
            OWNER,
            [
                ("Pod", "train-0", "Normal", "Waiting", "Unschedulable", "", False),
                ("Pod", "train-1", "Normal", "Waiting", "Unschedulable", "", False),
                ("Job", "train", "Normal", "Waiting", "", "Pending", False),
            ],
            id="waiting-unbound-pods-get-the-condition-the-job-the-status",
        ),
        pytest.param(JobFinished(at=1, job=JOB), OWNER, [], id="facts-say-nothing"),
    ],
)
def test_reports_for(event: Event, owner: Owner, expected: list[Row]) -> None:
    """A decision is told once per gang, its status where the gang's kind keeps it; waiting pods get the condition."""
    assert summary(reports_for(event, PODS, owner)) == expected


def test_a_refused_binding_is_a_scheduler_error_on_the_pods_it_left_unbound() -> None:
    """Pods whose binding failed get FailedScheduling and PodScheduled=False SchedulerError; the Job one Event."""
    outcomes = {"ns/train-0": "bound", "ns/train-1": "conflict: pod has non-empty .spec.schedulingGates"}
    assert summary(binding_failed(PODS, OWNER, outcomes)) == [
        ("Pod", "train-1", "Warning", "FailedScheduling", "SchedulerError", "", False),
        ("Job", "train", "Warning", "FailedScheduling", "", "", False),
    ]
    assert binding_failed(PODS, OWNER, {k: "bound" for k in outcomes}) == []


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


class RecordingClient:
    """Writes nothing anywhere: records the reasons of the Events it is asked to create."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        self.reasons.append(body["reason"])


TARGET = Target("v1", "Pod", "ns", "p", "uid-p")


async def test_reports_give_way_to_bindings_in_flight() -> None:
    """A report waits while a binding is in flight and is written as soon as none is."""
    bindings, client = InFlight(), RecordingClient()
    reporter = Reporter(client, give_way=bindings.lull, give_way_seconds=60)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        await tg.start(reporter.run)
        with bindings.running():
            reporter.report([Report(TARGET, "Normal", "Waiting", "muster: quota")])
            await wait_all_tasks_blocked()
            assert client.reasons == []
        await eventually(lambda: client.reasons == ["Waiting"], seconds=5)
        tg.cancel_scope.cancel()


async def test_unwritten_counts_the_reports_queued_until_they_are_written() -> None:
    """Reports held back by a binding count as unwritten, and the count is 0 once they are written."""
    bindings, client = InFlight(), RecordingClient()
    reporter = Reporter(client, give_way=bindings.lull, give_way_seconds=60)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        await tg.start(reporter.run)
        with bindings.running():
            reporter.report([Report(TARGET, "Normal", "Waiting", f"muster: reason {i}") for i in range(3)])
            await wait_all_tasks_blocked()
            assert (reporter.unwritten, client.reasons) == (3, [])
        await eventually(lambda: reporter.unwritten == 0, seconds=5)
        assert len(client.reasons) == 3
        tg.cancel_scope.cancel()


async def test_no_report_waits_for_bindings_longer_than_give_way_seconds_since_it_was_queued() -> None:
    """Bindings that never end hold each report back at most its own give-way time, not the sum over the queue."""
    bindings, client = InFlight(), RecordingClient()
    reporter = Reporter(client, give_way=bindings.lull, give_way_seconds=0.1)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        await tg.start(reporter.run)
        with bindings.running():
            reporter.report([Report(TARGET, "Normal", "Waiting", f"muster: reason {i}") for i in range(40)])
            # one after the other they would take 4 s; queued together they are all due after 0.1 s
            await eventually(lambda: len(client.reasons) == 40, seconds=2)
        tg.cancel_scope.cancel()


async def test_with_no_binding_lately_reports_are_written_at_once() -> None:
    """The lull reports wait for is over already when no binding ran for that long: none waits for it."""
    bindings, client = InFlight(lull_seconds=1.0), RecordingClient()
    reporter = Reporter(client, give_way=bindings.lull, give_way_seconds=60)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        await tg.start(reporter.run)
        reporter.report([Report(TARGET, "Normal", "Waiting", f"muster: reason {i}") for i in range(20)])
        # a lull of 1 s before each would take 20 s
        await eventually(lambda: len(client.reasons) == 20, seconds=5)
        tg.cancel_scope.cancel()
