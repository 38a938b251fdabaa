"""The gang kinds teams already run, in the adapter's pure part (pod_info, Translator, owner_sizing).

MPIJob (v2beta1), Volcano and coscheduling PodGroups, Kueue's queue label: each is
recognised from the pods as their controllers create them, sized from its owner
object as the adapter would fetch it, and bad owners are left alone with a reason.
The same kinds on a real API server: tests/k8s/test_gang_kinds_real.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from muster.daemon.k8s import manifests as m
from muster.daemon.k8s.owners import Sizing, api_of, namespace_queue, owner_sizing
from muster.daemon.k8s.pods import pod_info
from muster.daemon.k8s.translating import Translator
from muster.daemon.k8s.watching import WatchEvent
from muster.events.types import JobFailed, JobSubmitted, PodSet


def feed(t: Translator, pods: list[dict[str, Any]]) -> list[JobSubmitted]:
    """Give the pods to the translator (with uids, as the server sets them) and return what it submitted."""
    for p in pods:
        p["metadata"].setdefault("uid", p["metadata"]["name"] + "-uid")
        t.on_pod(WatchEvent("pods", "ADDED", p), 1)
    return [e for e in t.flush(1) if isinstance(e, JobSubmitted)]


def answer_lookups(t: Translator, objects: dict[str, dict[str, Any]]) -> list[JobSubmitted]:
    """Answer every owner lookup the translator asked for from `objects` (by owner name), as the adapter would."""
    for owner in t.gangs.owners_to_fetch():
        sizing = owner_sizing(owner, objects[owner.name])
        t.on_owner_size(owner, Sizing(sizing.size, uid=sizing.uid, queue=sizing.queue), 2)
    return [e for e in t.flush(2) if isinstance(e, JobSubmitted)]


def test_mpijob_launcher_and_workers_are_one_gang_sized_from_the_mpijob() -> None:
    """The launcher pod (owned by the launcher Job) and the workers (owned by the MPIJob) form one MPIJob gang."""
    mpi = m.mpijob("allreduce", "team", workers=3)
    pods = m.mpijob_pods(mpi, requests={"worker": {"gpus": 8}}, cpu="1", labels={"muster.dev/queue": "q"})
    t = Translator()
    assert feed(t, pods) == []
    [sub] = answer_lookups(t, {"allreduce": mpi})
    assert sub.source == "MPIJob/team/allreduce"
    assert sub.job == f"team/mpijob/allreduce-{mpi['metadata']['uid'][:8]}"
    assert sub.podsets == [
        PodSet(name="launcher", count=1, requests={"cpu": 1000}),
        PodSet(name="worker", count=3, requests={"cpu": 1000, "gpu": 8}),
    ]
    assert [sub.pods[f"worker-{i}"] for i in range(3)] == [f"team/allreduce-worker-{i}" for i in range(3)]
    assert api_of(t.gangs.owner_of(sub.job)).api_version == "kubeflow.org/v2beta1"  # type: ignore[arg-type]


def test_mpijob_waiting_for_workers_before_its_launcher_is_left_alone_with_a_reason() -> None:
    """launcherCreationPolicy WaitForWorkersReady can never be one gang: no submission, a problem says why."""
    mpi = m.mpijob("late", "team", workers=2, policy="WaitForWorkersReady")
    sizing = owner_sizing(pod_info(m.mpijob_pods(mpi)[1]).owner, mpi)
    assert sizing.size == 0
    assert "WaitForWorkersReady" in sizing.problem


@pytest.mark.parametrize("volcano", [True, False], ids=["volcano", "coscheduling"])
def test_pod_group_pods_are_one_gang_of_min_member(volcano: bool) -> None:
    """Pods naming a PodGroup (Volcano annotation or coscheduling label) are one gang of its minMember."""
    group = m.pod_group("sweep", "team", min_member=2, queue="research", volcano=volcano)
    job = m.job("sweep-job", "team", parallelism=2)  # their own controller owns them, not the PodGroup
    pods = m.pod_group_pods(group, 2, owner=job, gpus=1)
    t = Translator()
    assert feed(t, pods) == []
    [sub] = answer_lookups(t, {"sweep": group})
    kind = "VolcanoPodGroup" if volcano else "CoschedulingPodGroup"
    assert sub.source == f"{kind}/team/sweep"
    assert sub.job == f"team/{kind.lower()}/sweep-{group['metadata']['uid'][:8]}"
    assert sub.podsets == [PodSet(name="pod", count=2, requests={"gpu": 1})]
    # Volcano's spec.queue is the muster queue when the pods name none; coscheduling has no queue
    assert sub.queue == ("research" if volcano else "")


def test_a_pods_own_queue_label_wins_over_the_pod_groups_queue() -> None:
    """muster.dev/queue on the pods beats a Volcano PodGroup's spec.queue."""
    group = m.pod_group("g", "team", min_member=1, queue="volcano-q")
    t = Translator()
    feed(t, m.pod_group_pods(group, 1, labels={"muster.dev/queue": "mine"}))
    [sub] = answer_lookups(t, {"g": group})
    assert sub.queue == "mine"


@pytest.mark.parametrize("min_member", [0, -1, None, "three"], ids=["zero", "negative", "missing", "not-a-number"])
def test_a_pod_group_without_a_positive_min_member_is_ignored_with_a_reason(min_member: Any) -> None:
    """minMember 0, negative, missing or not a number: no submission, nothing raised, a problem names the PodGroup."""
    group = m.pod_group("bad", "team", min_member=min_member)
    if min_member is None:
        del group["spec"]["minMember"]
    t = Translator()
    feed(t, m.pod_group_pods(group, 2, gpus=1))
    [owner] = t.gangs.owners_to_fetch()
    sizing = owner_sizing(owner, group)
    assert sizing.size == 0
    assert sizing.problem.startswith("VolcanoPodGroup/team/bad: spec.minMember")
    t.on_owner_size(owner, Sizing(sizing.size, uid=sizing.uid), 2)
    assert [e for e in t.flush(2) if isinstance(e, JobSubmitted)] == []
    # a later pod of the same group does not bring it back to life
    assert feed(t, m.pod_group_pods(group, 3)[2:]) == []


def test_kueue_queue_label_is_the_muster_queue_unless_musters_own_is_set() -> None:
    """kueue.x-k8s.io/queue-name maps to the queue when muster.dev/queue is absent, and loses to it when present."""
    kueue = {"kueue.x-k8s.io/queue-name": "team-queue"}
    assert pod_info(m.pod("a", "ns", labels=kueue)).queue == "team-queue"
    assert pod_info(m.pod("b", "ns", labels={**kueue, "muster.dev/queue": "mine"})).queue == "mine"
    t = Translator()
    [sub] = feed(t, [m.pod("lone", "ns", gpus=1, labels=kueue)])
    assert sub.queue == "team-queue"


@pytest.mark.parametrize(
    ("owner_labels", "pod_labels", "queue"),
    [
        pytest.param({"kueue.x-k8s.io/queue-name": "kq"}, {}, "kq", id="kueue-on-the-job"),
        pytest.param({"muster.dev/queue": "mq", "kueue.x-k8s.io/queue-name": "kq"}, {}, "mq", id="muster-on-the-job"),
        pytest.param({"kueue.x-k8s.io/queue-name": "kq"}, {"muster.dev/queue": "pq"}, "pq", id="the-pods-win"),
    ],
)
def test_a_jobs_own_queue_label_is_the_queue_of_pods_that_name_none(
    owner_labels: dict[str, str], pod_labels: dict[str, str], queue: str
) -> None:
    """Kueue users label the Job, not its pods: the owner's queue label (read with its size) applies."""
    job = m.job("train", "team", parallelism=2)
    job["metadata"]["labels"] = owner_labels
    t = Translator()
    feed(t, m.job_pods(job, gpus=1, labels=pod_labels))
    [sub] = answer_lookups(t, {"train": job})
    assert sub.queue == queue


def test_any_kubeflow_jobs_pods_are_sized_from_its_owner() -> None:
    """A TFJob (not only a PyTorchJob) is looked up in kubeflow.org/v1 and sized from its replica specs."""
    tf = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "tf", "namespace": "team", "uid": "tf-uid-0123"},
        "spec": {"tfReplicaSpecs": {"PS": {"replicas": 1}, "Worker": {"replicas": 2}}},
    }
    pods = [
        m.pod(
            f"tf-{t}-{i}",
            "team",
            labels={"training.kubeflow.org/job-name": "tf", "training.kubeflow.org/replica-type": t},
            owner={
                "apiVersion": "kubeflow.org/v1",
                "kind": "TFJob",
                "name": "tf",
                "uid": "tf-uid-0123",
                "controller": True,
            },
        )
        for t, n in (("ps", 1), ("worker", 2))
        for i in range(n)
    ]
    t = Translator()
    feed(t, pods)
    [owner] = t.gangs.owners_to_fetch()
    assert api_of(owner).plural == "tfjobs"
    t.on_owner_size(owner, Sizing(owner_sizing(owner, tf).size), 2)
    [sub] = [e for e in t.flush(2) if isinstance(e, JobSubmitted)]
    assert (sub.source, sorted((p.name, p.count) for p in sub.podsets)) == ("TFJob/team/tf", [("ps", 1), ("worker", 2)])


def test_malformed_owner_objects_give_no_size_and_never_raise() -> None:
    """An owner whose spec or metadata is not an object is sized 0 with a problem, not an exception."""
    owner = pod_info(m.pod_group_pods(m.pod_group("g", "ns"), 1)[0]).owner
    assert owner_sizing(owner, {"spec": "nonsense"}).size == 0
    assert owner_sizing(owner, {"metadata": ["x"], "spec": {"minMember": 2}}).size == 0


def test_a_gang_naming_no_queue_waits_for_its_namespaces_default_queue() -> None:
    """With namespace queues on, a queue-less gang is submitted once its namespace is read, in the default it names."""
    t = Translator(namespace_queues=True)
    group = {"muster.dev/gang": "g", "muster.dev/gang-size": "2"}
    assert feed(t, [m.pod(f"g-{i}", "team", gpus=1, labels=group) for i in range(2)]) == []
    assert t.gangs.namespaces_to_fetch() == ["team"]
    assert t.gangs.namespaces_to_fetch() == []  # asked once
    namespace = {"metadata": {"name": "team", "annotations": {"muster.dev/default-queue": "team-q"}}}
    t.on_namespace_queue("team", namespace_queue(namespace), 2)
    [sub] = [e for e in t.flush(2) if isinstance(e, JobSubmitted)]
    assert sub.queue == "team-q"
    # the namespace is known now: the next queue-less gang there is submitted at once
    [lone] = feed(t, [m.pod("lone", "team", gpus=1)])
    assert lone.queue == "team-q"


def test_a_gangs_own_queue_needs_no_namespace_lookup() -> None:
    """Pods naming a queue (muster's or Kueue's label) are submitted at once, whatever their namespace says."""
    t = Translator(namespace_queues=True)
    [a, b] = feed(
        t,
        [
            m.pod("a", "team", labels={"muster.dev/queue": "mine"}),
            m.pod("b", "team", labels={"kueue.x-k8s.io/queue-name": "kq"}),
        ],
    )
    assert (a.queue, b.queue) == ("mine", "kq")
    assert t.gangs.namespaces_to_fetch() == []


@pytest.mark.parametrize(
    ("namespace", "queue"),
    [
        pytest.param({"metadata": {"labels": {"muster.dev/default-queue": "l"}}}, "l", id="label"),
        pytest.param({"metadata": {"annotations": {"muster.dev/default-queue": "a"}}}, "a", id="annotation"),
        pytest.param({"metadata": {"labels": {"other": "x"}}}, "", id="none"),
        pytest.param({"metadata": ["not", "an", "object"]}, "", id="malformed"),
        pytest.param({}, "", id="empty"),
    ],
)
def test_a_namespaces_default_queue_is_its_label_or_annotation(namespace: dict[str, Any], queue: str) -> None:
    """muster.dev/default-queue as a label or an annotation names the default; anything else names none."""
    assert namespace_queue(namespace) == queue


def test_a_namespace_naming_no_default_lets_the_gang_go_with_no_queue() -> None:
    """A namespace without a default (or unreadable: "") submits the gang with queue "", which the core rejects."""
    t = Translator(namespace_queues=True)
    feed(t, [m.pod("p", "bare", gpus=1)])
    [ns] = t.gangs.namespaces_to_fetch()
    t.on_namespace_queue(ns, "", 2)
    [sub] = [e for e in t.flush(2) if isinstance(e, JobSubmitted)]
    assert sub.queue == ""


def running_group(volcano: bool, *, owner: dict[str, Any] | None) -> tuple[Translator, JobSubmitted, list[str]]:
    """A PodGroup of 2 pods (bare, or made by `owner`) submitted and running on n1; the pods' keys."""
    group = m.pod_group("sweep", "team", min_member=2, volcano=volcano)
    pods = m.pod_group_pods(group, 2, owner=owner, gpus=1, labels={"muster.dev/queue": "q"}, node_name="n1")
    for p in pods:
        p["status"] = {"phase": "Running"}
    t = Translator()
    t.on_node(WatchEvent("nodes", "ADDED", m.node("n1")))
    feed(t, pods)
    [sub] = answer_lookups(t, {"sweep": group})
    return t, sub, [f"team/{p['metadata']['name']}" for p in pods]


@pytest.mark.parametrize("volcano", [True, False], ids=["volcano", "coscheduling"])
def test_a_bare_pod_groups_lost_pod_or_node_fails_its_job_naming_them(volcano: bool) -> None:
    """Bare pods of a PodGroup come back from nothing: a running pod deleted, or the node of its pods deleted,
    fails the job naming them (before: the gang waited for ever for a replacement, holding its quota)."""
    t, sub, keys = running_group(volcano, owner=None)
    assert not t.gangs.recreates(sub.job)
    t.on_pod(WatchEvent("pods", "DELETED", {"metadata": {"name": "sweep-1", "namespace": "team"}}), 2)
    [failed] = [e for e in t.flush(2) if isinstance(e, JobFailed)]
    assert (failed.job, failed.reason) == (sub.job, f"pod {keys[1]} was deleted while running on n1")

    t, sub, keys = running_group(volcano, owner=None)
    t.on_node(WatchEvent("nodes", "DELETED", m.node("n1")))
    [failed] = [e for e in t.flush(2) if isinstance(e, JobFailed)]
    assert failed.reason == f"node n1 was deleted with pods {', '.join(keys)}; nothing recreates them"


@pytest.mark.parametrize("volcano", [True, False], ids=["volcano", "coscheduling"])
def test_a_pod_groups_pods_made_by_a_controller_are_waited_for_when_lost(volcano: bool) -> None:
    """PodGroup pods naming their controller (a Volcano Job) come back: a deleted one asks for a read of the
    PodGroup (not of the controller, which the chart may not let it read), a lost node ends nothing."""
    vcjob = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "sweep", "uid": "vc-uid"}}
    t, sub, _ = running_group(volcano, owner=vcjob)
    assert t.gangs.recreates(sub.job)
    assert sub.controller is not None and sub.controller.uid == "vc-uid"  # on the log, for a later leader's verdict
    t.on_pod(WatchEvent("pods", "DELETED", {"metadata": {"name": "sweep-1", "namespace": "team"}}), 2)
    t.on_node(WatchEvent("nodes", "DELETED", m.node("n1")))
    assert [e for e in t.flush(2) if isinstance(e, JobFailed)] == []
    [check] = t.gangs.deletions
    assert (check.job, check.owner.workload) == (sub.job, sub.source)
