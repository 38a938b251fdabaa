"""A gang preempted as its run ends: the eviction takes pods that succeeded, and their owner makes none again.

The demo showed it (`muster demo --duration 120`: 2 to 8 gangs a run ended `JobFailed` "pods gone before
binding"): the core preempts a gang whose last pods are finishing, the kubelet marks them Succeeded
before the eviction deletes them, and the controller, which counts them done, makes no replacement. The
gang waited for replacements, so its re-admission found no pods. The run is over: the job finishes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import anyio
from adapterkit import eventually
from emulatorkit import admission, pod_object, submit_gang
from kubernetes_asyncio.client import CoreV1Api

from muster.daemon.k8s import manifests as m
from muster.daemon.k8s.gangs import Gangs
from muster.daemon.k8s.owners import Sizing
from muster.daemon.k8s.pods import pod_info
from muster.events.types import JobFailed, JobFinished, JobPreempted, JobStarted, JobSubmitted, PodSet


async def one_of_two_pods_succeeded(emulator: Any, api: Any, adapter: Any, events: Any) -> tuple[Any, Any, str]:
    """A Job of two pods (grace 0) admitted on n1 and n2 and running, its first pod succeeded since: the gang,
    its admission and the name of the pod still running."""
    core = CoreV1Api(api)
    sub = await submit_gang(emulator, api, adapter, events, size=2, grace_seconds=0)
    admitted = admission(sub, ["n1", "n2"])
    assert (await adapter.apply(admitted)).outcome == "applied"
    first, last = (sub.pods[name].split("/")[1] for name in sorted(sub.pods))
    for name in (first, last):  # the kubelet starts both
        await core.patch_namespaced_pod_status(name, "ns", {"status": {"phase": "Running"}})
    await events.wait_for(lambda e: len(e.of(JobStarted)) == 1)
    await core.patch_namespaced_pod_status(first, "ns", {"status": {"phase": "Succeeded"}})
    await adapter.caught_up("pods", emulator.resource_version)
    return sub, admitted, last


async def test_a_gang_whose_pods_succeed_while_it_is_preempted_finishes_and_its_readmission_binds_nothing(
    kube, start_adapter
):
    """Pods that succeed before their eviction takes them end the job JobFinished; its re-admission is skipped."""
    emulator, api = kube
    core = CoreV1Api(api)
    async with start_adapter(api, pod_wait_seconds=2) as (adapter, events):
        sub, admitted, last = await one_of_two_pods_succeeded(emulator, api, adapter, events)

        # the eviction of the last pod reaches the server only after that pod succeeded
        held = emulator.fail("POST", "pods", "eviction", name=last, status=None, delay=1.0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(adapter.apply, JobPreempted(at=2, job=sub.job, preemptor=None, reason="WithinQueue"))
            await eventually(lambda: held.times == 0)
            await core.patch_namespaced_pod_status(last, "ns", {"status": {"phase": "Succeeded"}})
        await eventually(lambda: pod_object(emulator, f"ns/{last}") is None)
        # the Job is complete: its controller makes no replacement

        await events.wait_for(lambda e: len(e.of(JobFinished)) == 1)
        again = await adapter.apply(admitted)  # the core re-admitted it in the same second
        assert again.outcome == "skipped"
        assert events.of(JobFailed) == []


async def test_a_gang_preempted_with_some_pods_succeeded_binds_only_the_replacements_of_the_others(kube, start_adapter):
    """Slots whose pods succeeded before the preemption stay done: the re-admission binds the other slots'
    replacements, and the job finishes when they succeed (before: it waited for replacements of every pod)."""
    emulator, api = kube
    core = CoreV1Api(api)
    async with start_adapter(api, pod_wait_seconds=2) as (adapter, events):
        sub, admitted, last = await one_of_two_pods_succeeded(emulator, api, adapter, events)

        await adapter.apply(JobPreempted(at=2, job=sub.job, preemptor=None, reason="WithinQueue"))
        await eventually(lambda: pod_object(emulator, f"ns/{last}") is None)
        # the Job controller makes again the one pod that did not succeed
        job = emulator.get_object("batch/v1/jobs", "ns", "train")
        [made] = m.job_pods(job, [1], gpus=1, labels={"muster.dev/queue": "q"})
        await core.create_namespaced_pod("ns", made)
        await adapter.caught_up("pods", emulator.resource_version)

        again = await adapter.apply(admitted)
        assert (again.outcome, sorted(again.pods)) == ("applied", [f"ns/{made['metadata']['name']}"])
        replacement = made["metadata"]["name"]
        await core.patch_namespaced_pod_status(replacement, "ns", {"status": {"phase": "Running"}})
        await events.wait_for(lambda e: len(e.of(JobStarted)) == 2)
        await core.patch_namespaced_pod_status(replacement, "ns", {"status": {"phase": "Succeeded"}})
        await events.wait_for(lambda e: len(e.of(JobFinished)) == 1)
        assert events.of(JobFailed) == []


def test_a_slot_that_finished_stays_done_when_the_gang_is_preempted_again_before_it_runs() -> None:
    """A second preemption, before the replacements ran, still waits for no pod in the slot that finished."""
    labels = {"muster.dev/gang-size": "2", "muster.dev/queue": "q"}
    job = m.job("train", "ns", parallelism=2)

    def pod(index: int, uid: str, phase: str = "Pending") -> dict[str, Any]:
        [made] = m.job_pods(job, [index], gpus=1, labels=labels, node_name="n1" if phase != "Pending" else None)
        made["metadata"]["uid"], made["status"] = uid, {"phase": phase}
        return made

    gangs = Gangs()
    first = [pod(0, "u0", "Running"), pod(1, "u1", "Running")]
    events = [e for p in first for e in gangs.pod_changed(pod_info(p), at=1)]
    [sub] = [e for e in events if isinstance(e, JobSubmitted)]
    gangs.pod_changed(pod_info(pod(0, "u0", "Succeeded") | {"metadata": first[0]["metadata"]}), at=2)
    for preemption in range(2):
        victims = gangs.evicting(sub.job)
        for victim in victims:
            gangs.pod_deleted(victim.key, at=3)
        gangs.pod_changed(pod_info(pod(1, f"r{preemption}")), at=4)  # the Job makes index 1 again, only
        assert gangs.complete(sub.job), preemption
        assert len(gangs.finished(sub.job)) == 1 and len(gangs.pods_of(sub.job) or {}) == 1


def job_pod(job: dict[str, Any], index: int, uid: str, phase: str = "Pending") -> dict[str, Any]:
    """`job`'s pod of `index` as its controller makes it (a gang of 2 in queue q), named by `uid`; on n1 unless
    Pending."""
    labels = {"muster.dev/gang-size": "2", "muster.dev/queue": "q"}
    [made] = m.job_pods(job, [index], gpus=1, labels=labels, node_name="n1" if phase != "Pending" else None)
    made["metadata"]["uid"], made["metadata"]["name"], made["status"] = uid, f"train-{index}-{uid}", {"phase": phase}
    return made


def test_a_next_index_made_after_a_preemption_waits_for_a_slot_that_runs_not_one_that_finished() -> None:
    """A Job of completions 3 at parallelism 2, preempted after index 0 succeeded: its index 2, made with index 1's
    replacement, takes index 1's slot once that succeeds (and is bound there), not the finished slot nothing binds."""
    job = m.job("train", "ns", parallelism=2, completions=3)
    pod = functools.partial(job_pod, job)

    gangs = Gangs()
    events = [e for i in (0, 1) for e in gangs.pod_changed(pod_info(pod(i, f"u{i}", "Running")), at=1)]
    [sub] = [e for e in events if isinstance(e, JobSubmitted)]
    gangs.set_size(pod_info(pod(0, "u0")).owner, Sizing(2, completions=3), at=1)
    gangs.pod_changed(pod_info(pod(0, "u0", "Succeeded")), at=2)
    for victim in gangs.evicting(sub.job):
        gangs.pod_deleted(victim.key, at=3)
    gangs.pod_changed(pod_info(pod(1, "r1")), at=4)  # index 1 again, and the next index with it
    gangs.pod_changed(pod_info(pod(2, "r2")), at=4)
    assert sorted(p.name for p in (gangs.pods_of(sub.job) or {}).values()) == ["train-1-r1"]

    gangs.pod_changed(pod_info(pod(1, "r1", "Running")), at=5)  # the re-admission bound it
    gangs.pod_changed(pod_info(pod(1, "r1", "Succeeded")), at=6)
    assert sub.job in gangs.rebind
    assert sorted(p.name for p in (gangs.pods_of(sub.job) or {}).values()) == ["train-2-r2"]  # in index 1's slot


@dataclass
class OnLog:
    """A job as the log holds it (`gangruns.KnownJob`): preempted and waiting."""

    podsets: list[PodSet]
    pods: dict[str, str]
    status: str = "pending"
    started_at: int | None = None
    placement: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    preemptions: int = 1


def test_a_new_leader_takes_no_slot_as_finished_by_the_pods_of_a_jobs_earlier_indexes() -> None:
    """A Job of completions 4 at parallelism 2 preempted while its indexes 2 and 3 ran: a new leader finding the
    pods of indexes 0 and 1 succeeded and one replacement does not end it; the replacements take the slots."""
    job = m.job("train", "ns", parallelism=2, completions=4)
    pod = functools.partial(job_pod, job)

    old = Gangs()
    [sub] = [e for i in (0, 1) for e in old.pod_changed(pod_info(pod(i, f"u{i}")), at=1) if isinstance(e, JobSubmitted)]
    on_log = OnLog(podsets=sub.podsets, pods=sub.pods)
    gangs = Gangs(known=lambda j: on_log if j == sub.job else None)
    relisted = [pod(0, "u0", "Succeeded"), pod(1, "u1", "Succeeded"), pod(2, "r2")]  # index 3's replacement to come
    events = [e for p in relisted for e in gangs.pod_changed(pod_info(p), at=5)]
    assert not [e for e in events if isinstance(e, JobFinished)], events
    [owner] = gangs.owners_to_fetch()  # the Job is read: its completions say which slots are done
    events += gangs.set_size(owner, Sizing(2, completions=4, succeeded=2), at=5)
    assert not [e for e in events if isinstance(e, JobFinished)], events
    gangs.pod_changed(pod_info(pod(3, "r3")), at=6)
    assert gangs.complete(sub.job)
    assert sorted(p.name for p in (gangs.pods_of(sub.job) or {}).values()) == ["train-2-r2", "train-3-r3"]
