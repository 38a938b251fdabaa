"""Pods with `schedulerName: muster` become gangs: one JobSubmitted per owner, once, when all pods exist."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
from kubernetes_asyncio.client import ApiClient, CoreV1Api

from muster.daemon.k8s import manifests as m
from muster.demo.emulator import KubeEmulator
from muster.events.types import JobSubmitted, PodSet

GiB = 2**30


async def create(api: ApiClient, pods: list[dict[str, Any]]) -> int:
    """Create the pods through the API; return the resourceVersion of the last one."""
    core = CoreV1Api(api)
    rv = 0
    for pod in pods:
        created = await core.create_namespaced_pod(pod["metadata"]["namespace"], pod)
        rv = int(created.metadata.resource_version)
    return rv


def watch_owner_lookups(emulator: KubeEmulator, plural: str) -> asyncio.Event:
    """An event set when the adapter asks the API server for an owner of kind `plural` (a kmock side effect)."""
    seen = asyncio.Event()
    emulator[lambda r: r.resource is not None and r.resource.plural == plural] >> seen
    return seen


async def owner_looked_up(seen: asyncio.Event) -> None:
    """Wait until the owner was fetched, and give its answer time to be translated."""
    with anyio.fail_after(30):
        await seen.wait()
    await anyio.sleep(0.1)


async def test_job_pods_become_one_gang_only_after_the_last_pod_exists(kube, start_adapter):
    """A batch Job's pods (parallelism 3) are submitted as one gang, with queue, class and hints, once all 3 exist."""
    emulator, api = kube
    job = m.job("train", "team-a", parallelism=3)
    emulator.put_object("batch/v1/jobs", job)
    pods = m.job_pods(
        job,
        gpus=8,
        memory="64Gi",
        labels={"muster.dev/queue": "team-a"},
        annotations={"muster.dev/runtime": "2h", "muster.dev/checkpoint-every": "600"},
        priority_class="high",
    )
    lookups = watch_owner_lookups(emulator, "jobs")
    async with start_adapter(api) as (adapter, events):
        await adapter.caught_up("pods", await create(api, pods[:2]))
        await owner_looked_up(lookups)
        assert events.of(JobSubmitted) == []

        await adapter.caught_up("pods", await create(api, pods[2:]))
        [sub] = events.of(JobSubmitted)
        assert sub.queue == "team-a"
        assert sub.priority_class == "high"
        assert sub.runtime == 7200
        assert sub.checkpoint_every == 600
        assert sub.source == "Job/team-a/train"
        assert sub.podsets == [PodSet(name="pod", count=3, requests={"gpu": 8, "memory": 64 * GiB})]
        assert sub.pods == {f"pod-{i}": f"team-a/{pods[i]['metadata']['name']}" for i in range(3)}
        assert sub.job.startswith("team-a/job/train-")

        # Later changes of the pods do not submit the gang again.
        emulator.patch_object("v1/pods", "team-a", pods[0]["metadata"]["name"], {"metadata": {"labels": {"x": "y"}}})
        await adapter.caught_up("pods", emulator.resource_version)
        assert len(events.of(JobSubmitted)) == 1


async def test_jobset_pods_become_one_gang_with_a_podset_per_replicated_job(kube, start_adapter):
    """A JobSet (1 leader job, 2 worker jobs of 2 pods) is one gang of 5 pods: podsets leader and workers."""
    emulator, api = kube
    js = m.jobset("llm", "team-b", replicated=[("leader", 1, 1), ("workers", 2, 2)])
    emulator.put_object("jobset.x-k8s.io/v1alpha2/jobsets", js)
    pods = m.jobset_pods(
        js,
        requests={"leader": {"cpu": "4"}, "workers": {"gpus": 4}},
        labels={"muster.dev/queue": "team-b"},
    )
    assert len(pods) == 5
    lookups = watch_owner_lookups(emulator, "jobsets")
    async with start_adapter(api) as (adapter, events):
        await adapter.caught_up("pods", await create(api, pods[::-1][:4]))
        await owner_looked_up(lookups)
        assert events.of(JobSubmitted) == []

        await adapter.caught_up("pods", await create(api, pods[::-1][4:]))
        [sub] = events.of(JobSubmitted)
        assert sub.source == "JobSet/team-b/llm"
        assert sub.podsets == [
            PodSet(name="leader", count=1, requests={"cpu": 4000}),
            PodSet(name="workers", count=4, requests={"gpu": 4}),
        ]
        # Worker pods are numbered by job index, then completion index.
        workers = [p["metadata"]["name"] for p in pods if "workers" in p["metadata"]["name"]]
        assert [sub.pods[f"workers-{i}"] for i in range(4)] == [f"team-b/{n}" for n in workers]


async def test_pytorchjob_pods_become_one_gang_of_master_and_workers(kube, start_adapter):
    """A PyTorchJob (1 master, 3 workers) is one gang sized from the PyTorchJob object, podsets master and worker."""
    emulator, api = kube
    pj = m.pytorchjob("bert", "team-c", masters=1, workers=3)
    emulator.put_object("kubeflow.org/v1/pytorchjobs", pj)
    pods = m.pytorchjob_pods(
        pj,
        requests={"master": {"gpus": 1, "cpu": "8"}, "worker": {"gpus": 8}},
        labels={"muster.dev/queue": "team-c"},
    )
    lookups = watch_owner_lookups(emulator, "pytorchjobs")
    async with start_adapter(api) as (adapter, events):
        await adapter.caught_up("pods", await create(api, pods[1:]))
        await owner_looked_up(lookups)
        assert events.of(JobSubmitted) == []

        await adapter.caught_up("pods", await create(api, pods[:1]))
        [sub] = events.of(JobSubmitted)
        assert sub.source == "PyTorchJob/team-c/bert"
        assert sub.podsets == [
            PodSet(name="master", count=1, requests={"cpu": 8000, "gpu": 1}),
            PodSet(name="worker", count=3, requests={"gpu": 8}),
        ]
        assert sub.pods["master-0"] == "team-c/bert-master-0"
        assert [sub.pods[f"worker-{i}"] for i in range(3)] == [f"team-c/bert-worker-{i}" for i in range(3)]


async def test_labelled_pod_group_is_one_gang_and_a_missing_queue_is_submitted_empty(kube, start_adapter):
    """Pods labelled muster.dev/gang + gang-size form one gang; with no queue anywhere it is submitted with queue ""."""
    _, api = kube
    group = {"muster.dev/gang": "sweep", "muster.dev/gang-size": "3"}
    pods = [m.pod(f"sweep-{i}", "lab", gpus=2, labels=group) for i in range(3)]
    async with start_adapter(api) as (adapter, events):
        await adapter.caught_up("pods", await create(api, pods[:2]))
        assert events.of(JobSubmitted) == []
        await adapter.caught_up("pods", await create(api, pods[2:]))
        # no queue label: submitted once its namespace was read (it names no default queue either)
        await events.wait_for(lambda e: bool(e.of(JobSubmitted)))
        [sub] = events.of(JobSubmitted)
        assert sub.queue == ""
        assert sub.source == "Gang/lab/sweep"
        assert sub.podsets == [PodSet(name="pod", count=3, requests={"gpu": 2})]
        assert sorted(sub.pods.values()) == ["lab/sweep-0", "lab/sweep-1", "lab/sweep-2"]


async def test_gangs_of_different_owners_and_lone_pods_are_submitted_separately(kube, start_adapter):
    """Two Jobs give two gangs; a muster pod with no owner is a gang of one; other schedulers' pods are no gang."""
    emulator, api = kube
    jobs = [m.job(f"j{i}", "ns", parallelism=2) for i in range(2)]
    for job in jobs:
        emulator.put_object("batch/v1/jobs", job)
    pods = [p for job in jobs for p in m.job_pods(job, gpus=1, labels={"muster.dev/queue": "q"})]
    pods.append(m.pod("solo", "ns", gpus=1, labels={"muster.dev/queue": "q"}))
    pods.append(m.pod("web", "ns", scheduler="default-scheduler", cpu="1"))
    async with start_adapter(api) as (adapter, events):
        await create(api, pods)
        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 3)
        await adapter.caught_up("pods", emulator.resource_version)
        subs = sorted(events.of(JobSubmitted), key=lambda s: s.source)
        assert [s.source for s in subs] == ["Job/ns/j0", "Job/ns/j1", "Pod/ns/solo"]
        assert [sum(ps.count for ps in s.podsets) for s in subs] == [2, 2, 1]
        assert len({s.job for s in subs}) == 3


async def test_gang_whose_owner_is_gone_is_never_submitted(kube, start_adapter):
    """Pods whose Job no longer exists (404) are left alone: nothing is submitted for them."""
    emulator, api = kube
    job = m.job("ghost", "ns", parallelism=1)  # never stored: the owner lookup answers 404
    lookups = watch_owner_lookups(emulator, "jobs")
    async with start_adapter(api) as (adapter, events):
        await adapter.caught_up("pods", await create(api, m.job_pods(job, gpus=1)))
        await owner_looked_up(lookups)
        await adapter.caught_up("pods", await create(api, [m.pod("marker", "ns", scheduler="other")]))
        assert events.of(JobSubmitted) == []


async def test_owner_lookup_is_retried_after_a_server_error(kube, start_adapter):
    """A 500 from the owner lookup is retried; the gang is submitted once the Job can be read."""
    emulator, api = kube
    job = m.job("flaky", "ns", parallelism=2)
    emulator.put_object("batch/v1/jobs", job)
    emulator.fail("GET", "jobs", status=500, times=2)
    async with start_adapter(api) as (_, events):
        await create(api, m.job_pods(job, gpus=1, labels={"muster.dev/queue": "q"}))
        await events.wait_for(lambda e: len(e.of(JobSubmitted)) == 1)
    job_gets = [r for r in emulator if r.resource is not None and r.resource.plural == "jobs"]
    assert len(job_gets) == 3
