"""Lost nodes and held capacity in the adapter's pure part (the Translator): what a node's loss ends, what a pod holds.

The same on a real API server, with the whole daemon: tests/k8s/test_node_loss_real.py.
"""

from __future__ import annotations

from muster.daemon.k8s import manifests as m
from muster.daemon.k8s.translating import Translator
from muster.daemon.k8s.watching import WatchEvent
from muster.events.types import JobAdmitted, JobFailed, JobSubmitted, NodeName, NodeRemoved, QueueConfigured, QueueName
from muster.projections.cluster import fold


def running_on(pod: dict, node: str) -> dict:
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    pod["metadata"]["uid"] = pod["metadata"]["name"] + "-uid"
    return pod


def test_a_deleted_node_ends_the_pod_groups_on_it_and_leaves_jobs_to_the_core() -> None:
    """JobFailed for the pod group that ran there (written with NodeRemoved); nothing for a Job's gang or elsewhere."""
    t = Translator()
    for node in ("n1", "n2"):
        t.on_node(WatchEvent("nodes", "ADDED", m.node(node)))
    group = {"muster.dev/gang": "g", "muster.dev/gang-size": "2", "muster.dev/queue": "q"}
    for i in range(2):
        t.on_pod(WatchEvent("pods", "ADDED", running_on(m.pod(f"g-{i}", "ns", gpus=1, labels=group), "n1")), 1)
    other = {"muster.dev/gang": "h", "muster.dev/gang-size": "1", "muster.dev/queue": "q"}
    t.on_pod(WatchEvent("pods", "ADDED", running_on(m.pod("h-0", "ns", gpus=1, labels=other), "n2")), 1)
    job = m.job("train", "ns", parallelism=2)
    for pod in m.job_pods(job, gpus=1, labels={"muster.dev/gang-size": "2"}):
        t.on_pod(WatchEvent("pods", "ADDED", running_on(pod, "n1")), 1)
    subs = {s.source.split("/")[2]: s.job for s in t.flush(1) if isinstance(s, JobSubmitted)}
    assert set(subs) == {"g", "h", "train"}

    t.on_node(WatchEvent("nodes", "DELETED", m.node("n1")))
    events = t.flush(2)
    assert [type(e).__name__ for e in events] == ["NodeRemoved", "JobFailed"]
    [removed], [failed] = (
        [e for e in events if isinstance(e, NodeRemoved)],
        [e for e in events if isinstance(e, JobFailed)],
    )
    assert removed.node == "n1"
    assert failed.job == subs["g"]
    assert failed.reason == "node n1 was deleted with pods ns/g-0, ns/g-1; nothing recreates them"
    assert t.gangs.ended(subs["g"]) and not t.gangs.ended(subs["train"]) and not t.gangs.ended(subs["h"])


def test_a_pod_group_with_a_controller_is_left_to_the_core_when_its_node_goes() -> None:
    """Labelled pods that name a controller (a user's operator) come back: no JobFailed, the core requeues them."""
    t = Translator()
    t.on_node(WatchEvent("nodes", "ADDED", m.node("n1")))
    labels = {"muster.dev/gang": "g", "muster.dev/gang-size": "2", "muster.dev/queue": "q"}
    controller = {"apiVersion": "example.com/v1", "kind": "Trainer", "name": "g", "uid": "t-uid", "controller": True}
    for i in range(2):
        pod = running_on(m.pod(f"g-{i}", "ns", gpus=1, labels=labels), "n1")
        pod["metadata"]["ownerReferences"] = [controller]
        t.on_pod(WatchEvent("pods", "ADDED", pod), 1)
    [sub] = [e for e in t.flush(1) if isinstance(e, JobSubmitted)]
    assert t.gangs.recreates(sub.job)
    t.on_node(WatchEvent("nodes", "DELETED", m.node("n1")))
    assert [type(e).__name__ for e in t.flush(2)] == ["NodeRemoved"]
    assert not t.gangs.ended(sub.job)


def test_a_node_deleted_and_back_within_one_flush_ends_nothing() -> None:
    """A node that is there again by the flush (a kubelet re-registering) has lost no pods."""
    t = Translator()
    t.on_node(WatchEvent("nodes", "ADDED", m.node("n1")))
    labels = {"muster.dev/gang": "g", "muster.dev/gang-size": "1"}
    t.on_pod(WatchEvent("pods", "ADDED", running_on(m.pod("g-0", "ns", gpus=1, labels=labels), "n1")), 1)
    t.flush(1)
    t.on_node(WatchEvent("nodes", "DELETED", m.node("n1")))
    t.on_node(WatchEvent("nodes", "ADDED", m.node("n1")))
    assert not [e for e in t.flush(2) if isinstance(e, JobFailed)]


def test_a_relisted_gang_the_log_placed_holds_nothing_outside_its_job() -> None:
    """A new leader lists the bound pods of an admitted gang one by one: none counts as foreign usage (reserved)."""
    first = Translator()
    first.on_node(WatchEvent("nodes", "ADDED", m.node("n1")))
    labels = {"muster.dev/gang": "g", "muster.dev/gang-size": "2", "muster.dev/queue": "q"}
    pods = [m.pod(f"g-{i}", "ns", gpus=1, labels=labels) for i in range(2)]
    for pod in pods:
        pod["metadata"]["uid"] = pod["metadata"]["name"] + "-uid"
        first.on_pod(WatchEvent("pods", "ADDED", pod), 1)
    log = first.flush(1)
    [sub] = [e for e in log if isinstance(e, JobSubmitted)]
    admitted = JobAdmitted(at=2, job=sub.job, queue=QueueName("q"), placement={p: NodeName("n1") for p in sub.pods})
    state = fold([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8}), *log, admitted])

    second = Translator(state=lambda: state)
    second.on_node(WatchEvent("nodes", "ADDED", m.node("n1")))
    for pod in pods:
        second.on_pod(WatchEvent("pods", "ADDED", running_on(pod, "n1")), 3)
    events = second.flush(3)
    assert not [e for e in events if getattr(e, "reserved", None)], events
