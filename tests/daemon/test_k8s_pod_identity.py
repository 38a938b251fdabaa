"""A pod is its uid: a relisting leader tells the pods of an ended run from pods made again under their names.

The log names a run's pods (`namespace/name`), not their uids; the same on a real API server,
with the daemon restarted in between: tests/k8s/test_job_runs_real.py.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from muster.daemon.k8s import manifests as m
from muster.daemon.k8s.translating import Translator
from muster.daemon.k8s.watching import WatchEvent
from muster.events.types import Event, JobAdmitted, JobFailed, JobSubmitted, NodeName, QueueConfigured, QueueName
from muster.projections.cluster import fold

Obj = dict[str, Any]


def with_uid(pod: Obj, uid: str, node: str = "", phase: str = "Pending") -> Obj:
    pod = copy.deepcopy(pod)
    pod["metadata"]["uid"] = uid
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": phase}
    return pod


def relisted(log: list[Event], pods: list[Obj]) -> list[JobSubmitted]:
    """What a new leader submits after listing `pods` with `log` folded."""
    state = fold(log)
    t = Translator(state=lambda: state)
    t.on_node(WatchEvent("nodes", "ADDED", m.node("n1")))
    for pod in pods:
        t.on_pod(WatchEvent("pods", "ADDED", pod), 5)
    return [e for e in t.flush(5) if isinstance(e, JobSubmitted)]


@pytest.mark.parametrize(
    "made_again",
    [
        pytest.param(False, id="the-survivor-bound-where-the-run-left-it-is-that-run"),
        pytest.param(True, id="pods-waiting-under-its-names-with-new-uids-are-a-new-run"),
    ],
)
def test_a_relist_after_a_failed_run_submits_a_new_run_only_for_pods_made_again(made_again: bool) -> None:
    """Worker 0 failed the run; worker 1 runs on (that run's), or both come back unbound with new uids (a new job)."""
    job = m.job("train", "ns", parallelism=2)
    pods = m.job_pods(job, gpus=1, labels={"muster.dev/gang-size": "2", "muster.dev/queue": "q"})
    first = Translator()
    for i, pod in enumerate(pods):
        first.on_pod(WatchEvent("pods", "ADDED", with_uid(pod, f"old-{i}")), 1)
    [sub] = [e for e in first.flush(1) if isinstance(e, JobSubmitted)]
    placement = {name: NodeName("n1") for name in sub.pods}
    log: list[Event] = [
        QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8}),
        sub,
        JobAdmitted(at=2, job=sub.job, queue=QueueName("q"), placement=placement),
        JobFailed(at=3, job=sub.job, reason="pod failed"),
    ]
    if made_again:
        now = [with_uid(pod, f"new-{i}") for i, pod in enumerate(pods)]
    else:
        now = [with_uid(pods[0], "old-0", "n1", "Failed"), with_uid(pods[1], "old-1", "n1", "Running")]

    submitted = relisted(log, now)

    if made_again:
        [again] = submitted
        assert again.job.startswith(f"{sub.job}-r") and again.pods == sub.pods
    else:
        assert submitted == []
