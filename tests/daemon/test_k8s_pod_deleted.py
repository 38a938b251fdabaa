"""A pod someone deletes from a gang's run, judged by `Gangs` alone (pure, no API server).

The adapter asks for a read of the gang's owner (`Gangs.deletions`) and answers with `workload_read`:
gone cancels the job (`WorkloadDeleted`), unreadable fails it, there waits for the owner's replacement,
which takes the deleted pod's slot (bound: on its node, through `rebind`). A pod group nothing
recreates is judged without a read. The real-server and emulator tiers run the same stories whole
(`tests/k8s/test_user_deletes_real.py`, `tests/k8s/test_job_runs_real.py`, `test_k8s_lifecycle.py`).
"""

from __future__ import annotations

from typing import Any

import pytest

from muster.daemon.k8s import manifests as m
from muster.daemon.k8s.gangs import Gangs
from muster.daemon.k8s.owners import makes_no_pods
from muster.daemon.k8s.pods import pod_info
from muster.daemon.k8s.reconciling import OwnerRead
from muster.events.types import Event, JobCancelled, JobFailed, JobId, JobStarted, JobSubmitted

Obj = dict[str, Any]
JOB = m.job("train", "ns", parallelism=2)
SIZE = {"muster.dev/gang-size": "2", "muster.dev/queue": "q"}


def job_pod(index: int, uid: str, node: str = "", phase: str = "Pending") -> Obj:
    """The Job controller's pod of `index` (a fresh name each call, as it makes them), as the watch shows it."""
    [pod] = m.job_pods(JOB, [index], gpus=1, labels=SIZE, node_name=node or None, phase=phase)
    pod["metadata"]["uid"] = uid
    return pod


def group_pod(index: int, node: str) -> Obj:
    """A pod of a labelled pod group with no controller (nothing makes its pods again), running on `node`."""
    labels = {**SIZE, "muster.dev/gang": "g"}
    pod = m.pod(f"g-{index}", "ns", gpus=1, labels=labels, node_name=node, phase="Running")
    pod["metadata"]["uid"] = f"g{index}"
    return pod


def key(pod: Obj) -> str:
    return f"ns/{pod['metadata']['name']}"


def submitted(gangs: Gangs, pods: list[Obj]) -> JobId:
    """Feed `pods` in; return the job they were submitted as."""
    events: list[Event] = []
    for pod in pods:
        events += gangs.pod_changed(pod_info(pod), at=1)
    [sub] = [e for e in events if isinstance(e, JobSubmitted)]
    return sub.job


@pytest.mark.parametrize(
    ("bound", "alive", "ends"),
    [
        pytest.param(False, True, None, id="waiting-owner-there-waits-for-the-replacement"),
        pytest.param(True, True, None, id="running-owner-there-binds-the-replacement-in-place"),
        pytest.param(False, False, JobCancelled, id="waiting-owner-gone-cancelled"),
        pytest.param(True, False, JobCancelled, id="running-owner-gone-cancelled"),
        pytest.param(True, None, JobFailed, id="running-owner-unreadable-failed"),
    ],
)
def test_a_pod_deleted_from_a_jobs_run_is_judged_by_a_read_of_the_job(
    bound: bool, alive: bool | None, ends: type | None
) -> None:
    """The owner read decides: there, the replacement takes the deleted slot; gone, cancelled; unreadable, failed."""
    gangs = Gangs()
    nodes = ("n1", "n2") if bound else ("", "")
    phase = "Running" if bound else "Pending"
    first = [job_pod(i, f"u{i}", nodes[i], phase) for i in range(2)]
    job = submitted(gangs, first)
    assert gangs.pod_deleted(key(first[1]), at=2) == []
    assert [c.job for c in gangs.deletions] == [job]  # the adapter reads the Job before anything ends

    replacement = job_pod(1, "u2")
    assert gangs.pod_changed(pod_info(replacement), at=3) == []
    assert not gangs.rebind and not gangs.complete(job)  # nothing taken before the read says the Job is there

    out = gangs.workload_read(job, OwnerRead(alive), at=4)
    if ends is None:
        assert out == []
        assert gangs.complete(job)
        assert sorted(gangs.tracked(job).pods.values()) == sorted([key(first[0]), key(replacement)])  # type: ignore[union-attr]
        assert gangs.rebind == ({job} if bound else set())  # bound: the adapter binds it on the slot's node
    else:
        assert [type(e) for e in out] == [ends] and gangs.ended(job)
        reason = getattr(out[0], "reason", "")
        assert reason.startswith("WorkloadDeleted" if ends is JobCancelled else f"pod {key(first[1])} was deleted")


def test_a_running_pod_deleted_from_a_pod_group_nothing_recreates_fails_it_at_once() -> None:
    """A bound pod group with no controller that loses a pod ends JobFailed at once, with no owner to read."""
    gangs = Gangs()
    pods = [group_pod(i, f"n{i}") for i in range(2)]
    job = submitted(gangs, pods)
    out = gangs.pod_deleted(key(pods[0]), at=2)
    assert [(type(e), getattr(e, "reason", "")) for e in out] == [
        (JobFailed, f"pod {key(pods[0])} was deleted while running on n0")
    ]
    assert gangs.deletions == [] and gangs.ended(job)


def test_a_replacement_bound_in_place_runs_on_in_the_same_job() -> None:
    """The replacement of a running Job's pod, once bound on the slot's node and running, starts nothing new."""
    gangs = Gangs()
    first = [job_pod(i, f"u{i}", f"n{i}", "Running") for i in range(2)]
    job = submitted(gangs, first)
    gangs.pod_deleted(key(first[1]), at=2)
    gangs.workload_read(job, OwnerRead(True), at=3)
    replacement = job_pod(1, "u2")
    assert gangs.pod_changed(pod_info(replacement), at=4) == []
    replacement["spec"]["nodeName"], replacement["status"] = "n1", {"phase": "Running"}
    out = gangs.pod_changed(pod_info(replacement), at=5)
    assert not any(isinstance(e, (JobStarted, JobFailed, JobSubmitted)) for e in out)
    assert gangs.tracked(job) is not None


@pytest.mark.parametrize("bound", [False, True], ids=["waiting", "running"])
def test_a_pod_deleted_by_a_job_that_ended_fails_the_job_instead_of_waiting_for_a_replacement(bound: bool) -> None:
    """A Job past its activeDeadlineSeconds deletes its pods and makes none again: the job fails, naming why."""
    gangs = Gangs()
    nodes = ("n1", "n2") if bound else ("", "")
    first = [job_pod(i, f"u{i}", nodes[i], "Running" if bound else "Pending") for i in range(2)]
    job = submitted(gangs, first)
    gangs.pod_deleted(key(first[1]), at=2)
    out = gangs.workload_read(job, OwnerRead(True, "Failed (DeadlineExceeded)"), at=3)
    assert [type(e) for e in out] == [JobFailed] and gangs.ended(job)
    assert "Job/ns/train is Failed (DeadlineExceeded), so it makes no pod again" in getattr(out[0], "reason", "")


@pytest.mark.parametrize(
    ("obj", "why"),
    [
        pytest.param({"status": {}}, "", id="running"),
        pytest.param(
            {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}},
            "Failed (DeadlineExceeded)",
            id="job-past-its-deadline",
        ),
        pytest.param({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}, "Complete", id="complete"),
        pytest.param({"status": {"conditions": [{"type": "Failed", "status": "False"}]}}, "", id="condition-false"),
        pytest.param({"status": {"conditions": [{"type": "Succeeded", "status": "True"}]}}, "Succeeded", id="kubeflow"),
        pytest.param({"spec": {"suspend": True}}, "suspended", id="suspended"),
    ],
)
def test_an_owner_that_ended_or_is_suspended_makes_no_pods(obj: Obj, why: str) -> None:
    """Which owner objects will not make a deleted pod again, and the words that say why."""
    assert makes_no_pods(obj) == why
