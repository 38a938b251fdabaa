"""Reconciliation's policy: which of the log's live jobs lost their workload, and how each ends.

The pure `judge` as a table; the adapter running it against the emulator (a job whose pods
were deleted while no adapter ran is ended before the adapter reports started). The same
against a real API server, with the whole daemon: tests/k8s/test_reconcile_real.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from muster.daemon.k8s import manifests as m
from muster.daemon.k8s import reconciling
from muster.daemon.k8s.gangruns import Tracked
from muster.daemon.k8s.owners import Sizing
from muster.daemon.k8s.pods import Owner
from muster.daemon.k8s.reconciling import OwnerRead, judge, owner_of
from muster.events.types import (
    ControllerRef,
    Event,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobId,
    JobPreempted,
    JobSubmitted,
    NodeAdded,
    NodeName,
    PodSet,
    QueueConfigured,
    QueueName,
)
from muster.projections.cluster import fold


@dataclass
class Job:
    id: str
    source: str
    pods: dict[str, str] = field(default_factory=dict)
    status: str = "admitted"
    controller: ControllerRef | None = None


GANG = Job("ns/gang/g-1234", "Gang/ns/g", {"w-0": "ns/g-0", "w-1": "ns/g-1"})
BATCH = Job("ns/job/train-abcdef12", "Job/ns/train", {"w-0": "ns/train-0-x", "w-1": "ns/train-1-y"})


@pytest.mark.parametrize(
    ("job", "present", "owner_alive", "expected"),
    [
        pytest.param(GANG, {"ns/g-0", "ns/g-1"}, None, None, id="all-pods-there"),
        pytest.param(GANG, set(), None, ("JobCancelled", "WorkloadDeleted: its pods are gone"), id="group-gone"),
        pytest.param(GANG, {"ns/g-1"}, None, ("JobFailed", "pods deleted while no scheduler"), id="group-half-gone"),
        pytest.param(BATCH, set(), True, None, id="job-alive-recreates-its-pods"),
        pytest.param(BATCH, set(), None, None, id="job-owner-unknown-no-verdict"),
        pytest.param(BATCH, set(), False, ("JobCancelled", "WorkloadDeleted: Job/ns/train is gone"), id="job-gone"),
        pytest.param(BATCH, {"ns/train-0-x"}, False, ("JobCancelled", "WorkloadDeleted: Job"), id="job-gone-pod-left"),
    ],
)
def test_judge(job: Job, present: set[str], owner_alive: bool | None, expected: tuple[str, str] | None) -> None:
    """A job is ended only when its pods are missing and nothing will bring them back, cancelled when all are gone."""
    verdict = judge(job, present.__contains__, OwnerRead(owner_alive), at=7)
    if expected is None:
        assert verdict is None
        return
    assert verdict is not None
    kind, reason = expected
    assert type(verdict.event).__name__ == kind
    assert verdict.event.reason.startswith(reason)  # type: ignore[attr-defined]
    assert verdict.remaining == tuple(sorted(present & set(job.pods.values())))


@pytest.mark.parametrize(
    ("status", "size", "resized"),
    [
        pytest.param("pending", 1, True, id="waiting-scaled-down"),
        pytest.param("pending", 2, False, id="waiting-same-size-waits-for-its-replacement"),
        pytest.param("admitted", 1, False, id="admitted-keeps-its-placement"),
    ],
)
def test_judge_a_waiting_job_whose_owner_was_scaled_down(status: str, size: int, resized: bool) -> None:
    """A pod of a waiting Job missing while the Job runs fewer pods at once now: cancelled `Resized`, with the new
    size for its pods' new job; the same size, or an admitted job, is left to the controller's replacement."""
    job = Job(BATCH.id, BATCH.source, BATCH.pods, status=status)
    read = OwnerRead(True, sizing=Sizing(size, completions=size))
    verdict = judge(job, {"ns/train-0-x"}.__contains__, read, at=7)
    if not resized:
        assert verdict is None
        return
    assert verdict is not None and isinstance(verdict.event, JobCancelled)
    assert verdict.event.reason.startswith("Resized: Job/ns/train runs 1 pods at once now, not 2")
    assert (verdict.remaining, verdict.resized) == (("ns/train-0-x",), read.sizing)


def test_judge_a_job_whose_owner_ended_while_no_scheduler_watched() -> None:
    """A Job that failed past its deadline while no scheduler watched deleted its pods and makes none again:
    its job fails naming why, instead of waiting for ever for replacements (a phantom holding its quota)."""
    verdict = judge(BATCH, set().__contains__, OwnerRead(True, "Failed (DeadlineExceeded)"), at=7)
    assert verdict is not None and isinstance(verdict.event, JobFailed)
    assert verdict.event.reason.startswith("Job/ns/train is Failed (DeadlineExceeded), so it makes no pod again")


@pytest.mark.parametrize(
    ("owner_alive", "expected"),
    [
        pytest.param(True, None, id="controller-there"),
        pytest.param(None, None, id="controller-unreadable"),
        pytest.param(False, "WorkloadDeleted: Trainer/ns/t (the controller of pod group g) is gone", id="gone"),
    ],
)
def test_judge_a_tracked_pod_group_by_its_controller(owner_alive: bool | None, expected: str | None) -> None:
    """A pod group whose pods name a controller waits while it is there or cannot be read, and is cancelled
    naming it once it is gone; judged by the log alone (no controller known) its gone pods cancel it."""
    controller = ControllerRef(api_version="example.com/v1", kind="Trainer", namespace="ns", name="t", uid="u-t")
    tracked = Tracked(pods=GANG.pods, owner=Owner("Gang", "ns", "g", controlled=True, controller=controller))
    verdict = judge(GANG, set().__contains__, OwnerRead(owner_alive), at=7, tracked=tracked)
    assert (verdict.event.reason if verdict is not None else None) == expected  # type: ignore[attr-defined]
    untracked = judge(GANG, set().__contains__, OwnerRead(None), at=7)
    assert untracked is not None and isinstance(untracked.event, JobCancelled)


def test_owner_of_reads_a_submission_source() -> None:
    """`Kind/namespace/name` names an owner; anything else (a CLI submission) names none."""
    owner = owner_of("JobSet/ns/big")
    assert owner is not None and (owner.kind, owner.namespace, owner.name) == ("JobSet", "ns", "big")
    assert owner_of("") is None and owner_of("cli") is None and owner_of("a/b") is None


def group_submission(**fields: Any) -> JobSubmitted:
    """The submission of pod group ns/g, pods g-0 and g-1 of one GPU each (`fields` added)."""
    return JobSubmitted(
        at=1,
        job=JobId("ns/gang/g-1"),
        queue=QueueName("q"),
        podsets=[PodSet(name="w", count=2, requests={"gpu": 1})],
        pods={"w-0": "ns/g-0", "w-1": "ns/g-1"},
        source="Gang/ns/g",
        **fields,
    )


async def test_a_gang_deleted_while_no_adapter_ran_is_cancelled_before_the_adapter_starts(kube, start_adapter):
    """The log holds a gang admitted whose pods are gone: the adapter's first push ends it, WorkloadDeleted."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1"))
    sub = group_submission()
    placement = {p: NodeName("n1") for p in sub.pods}
    admitted = JobAdmitted(at=2, job=sub.job, queue=QueueName("q"), placement=placement)
    state = fold([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8}), sub, admitted])
    async with start_adapter(api, state=lambda: state) as (adapter, events):
        cancelled = events.of(JobCancelled)  # pushed before `run` reported started
        assert [(c.job, c.reason) for c in cancelled] == [(sub.job, "WorkloadDeleted: its pods are gone")]
        assert adapter.translator.gangs.ended(sub.job)
        assert not events.of(JobFailed)


TRAINER = {"apiVersion": "example.com/v1", "kind": "Trainer", "name": "g", "uid": "u-g", "controller": True}
"""A pod group's controller (an operator of its own kind) that recreates its evicted pods under new names."""


async def test_a_pod_group_running_on_replacement_pods_is_not_taken_for_gone(kube, start_adapter):
    """A preempted pod group whose controller made new pods (new names) runs on them: a reconciliation pass
    leaves it alone, though the pods its submission named are gone (the demo lost 24 of 371 jobs so)."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1"))
    labels = {"muster.dev/gang": "g", "muster.dev/gang-size": "2", "muster.dev/queue": "q"}

    def pod(name: str) -> dict[str, Any]:
        return m.pod(name, "ns", gpus=1, labels=labels, owner=TRAINER, grace_seconds=0)

    for name in ("g-0", "g-1"):
        emulator.put_object("v1/pods", pod(name))
    log: list[Event] = [QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8})]
    async with start_adapter(api, state=lambda: fold(log)) as (adapter, events):
        await events.wait_for(lambda e: bool(e.of(JobSubmitted)))
        [sub] = events.of(JobSubmitted)
        placement = {p: NodeName("n1") for p in sub.pods}
        admitted = JobAdmitted(at=2, job=sub.job, queue=QueueName("q"), placement=placement)
        preempted = JobPreempted(at=3, job=sub.job, preemptor=None, reason="WithinQueue")
        log += [sub, admitted]
        assert (await adapter.apply(admitted)).ok
        log.append(preempted)
        assert (await adapter.apply(preempted)).ok
        for name in ("g-0-r1", "g-1-r1"):  # the controller's replacements
            emulator.put_object("v1/pods", pod(name))
        await adapter.caught_up("pods", emulator.resource_version)
        again = JobAdmitted(at=4, job=sub.job, queue=QueueName("q"), placement=placement)
        log.append(again)
        assert (await adapter.apply(again)).ok
        assert sorted(p.key for p in (adapter.translator.gangs.pods_of(sub.job) or {}).values()) == [
            "ns/g-0-r1",
            "ns/g-1-r1",
        ]
        assert await adapter.reconcile() == []
    assert not events.of(JobCancelled) and not events.of(JobFailed)


@pytest.mark.parametrize(
    ("job", "uid", "alive"),
    [
        pytest.param("ns/job/train-abcdef12", "abcdef12-0000", True, id="its-run"),
        pytest.param("ns/job/train-abcdef12-r1a2b3c", "abcdef12-0000", True, id="a-later-run-of-it"),
        pytest.param("ns/job/train-abcdef12-r1a2b3c", "99999999-0000", False, id="made-again-under-its-name"),
    ],
)
async def test_a_later_run_of_a_job_is_judged_by_the_job_it_belongs_to(
    monkeypatch: pytest.MonkeyPatch, job: str, uid: str, alive: bool
) -> None:
    """A Job whose later run (a salted job id) lost its pods still exists for reconciliation: the run is not
    cancelled as 'gone' while its Job is there; a Job made again under the name is another owner."""

    async def fetch(client: object, owner: Owner) -> dict[str, Any]:
        return {"metadata": {"name": owner.name, "uid": uid}}

    monkeypatch.setattr(reconciling, "fetch_owner", fetch)
    owner = Owner("Job", "ns", "train")
    found = (await reconciling.read_owner(None, owner, JobId(job), anyio.CapacityLimiter(1))).exists  # type: ignore[arg-type]
    assert found is alive


async def test_a_preempted_controlled_pod_group_found_without_pods_by_a_new_leader_keeps_its_job(kube, start_adapter):
    """A pod group of a controller, preempted, whose pods are all gone when a new leader starts, is judged by the
    controller the log names (not cancelled 'its pods are gone'), and its controller's replacements are that job's
    pods: no new job, and its next admission binds them."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1"))
    controller = ControllerRef(api_version="example.com/v1", kind="Trainer", namespace="ns", name="g", uid="u-g")
    sub = group_submission(controller=controller)
    placement = {p: NodeName("n1") for p in sub.pods}
    log: list[Event] = [
        QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8}),
        NodeAdded(at=0, node=NodeName("n1"), capacity={"gpu": 8}),
        sub,
        JobAdmitted(at=2, job=sub.job, queue=QueueName("q"), placement=placement),
        JobPreempted(at=3, job=sub.job, preemptor=None, reason="WithinQueue"),
    ]
    labels = {"muster.dev/gang": "g", "muster.dev/gang-size": "2", "muster.dev/queue": "q", "muster.dev/podset": "w"}
    assert fold(log).jobs[sub.job].preemptions == 1
    async with start_adapter(api, state=lambda: fold(log)) as (adapter, events):
        assert not events.of(JobCancelled)  # pushed before `run` reported started, had it judged the job gone
        for name in ("g-0-r1", "g-1-r1"):  # the controller's replacements
            emulator.put_object("v1/pods", m.pod(name, "ns", gpus=1, labels=labels, owner=TRAINER, grace_seconds=0))
        await adapter.caught_up("pods", emulator.resource_version)
        again = JobAdmitted(at=4, job=sub.job, queue=QueueName("q"), placement=placement)
        log.append(again)
        assert (await adapter.apply(again)).outcome == "applied"
        assert await adapter.reconcile() == []
    assert not events.of(JobSubmitted) and not events.of(JobCancelled)
    assert {emulator.get_object("v1/pods", "ns", n)["spec"].get("nodeName") for n in ("g-0-r1", "g-1-r1")} == {"n1"}


async def test_a_running_controlled_pod_group_that_lost_a_pod_while_no_adapter_ran_runs_on_its_replacement(
    kube, start_adapter
):
    """An admitted pod group of a controller lost a bound pod while no adapter ran, and the controller made a
    replacement: the new leader takes the replacement for the job's (no new job, no phantom of the old one) and
    its admission, re-applied as a new term does, binds it where the log placed the pod it replaces."""
    emulator, api = kube
    emulator.put_object("v1/nodes", m.node("n1"))
    controller = ControllerRef(api_version="example.com/v1", kind="Trainer", namespace="ns", name="g", uid="u-g")
    sub = group_submission(controller=controller)
    admitted = JobAdmitted(at=2, job=sub.job, queue=QueueName("q"), placement={p: NodeName("n1") for p in sub.pods})
    node = NodeAdded(at=0, node=NodeName("n1"), capacity={"gpu": 8})
    log: list[Event] = [QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8}), node, sub, admitted]
    labels = {"muster.dev/gang": "g", "muster.dev/gang-size": "2", "muster.dev/queue": "q", "muster.dev/podset": "w"}
    running = m.pod("g-0", "ns", gpus=1, labels=labels, owner=TRAINER, grace_seconds=0, node_name="n1")
    emulator.put_object("v1/pods", running | {"status": {"phase": "Running"}})
    emulator.put_object("v1/pods", m.pod("g-1-r1", "ns", gpus=1, labels=labels, owner=TRAINER, grace_seconds=0))
    assert fold(log).jobs[sub.job].status == "admitted"
    async with start_adapter(api, state=lambda: fold(log)) as (adapter, events):
        assert (await adapter.apply(admitted)).outcome == "applied"
        assert await adapter.reconcile() == []
    assert not events.of(JobSubmitted) and not events.of(JobCancelled) and not events.of(JobFailed)
    assert emulator.get_object("v1/pods", "ns", "g-1-r1")["spec"].get("nodeName") == "n1"
