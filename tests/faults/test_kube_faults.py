"""The Kubernetes API misbehaving under the adapter: bindings and evictions still happen, once each.

The API double (kmock-based `KubeEmulator`) answers 500s, times out (the
request is applied but its answer comes too late, so the retry meets a 409
"already assigned"), refuses evictions with 429 (a PodDisruptionBudget),
closes every watch every quarter second and compacts its history (410 Gone)
every second, while gangs are submitted, admitted and preempted. A test-only
subclass records every binding and eviction the API *applied* (not just
requested), so "exactly once" is observed where it matters.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from faultkit import RecordingEmulator
from kubernetes_asyncio.client import ApiClient, CoreV1Api

from muster.daemon.k8s import Backoff, KubernetesAdapter
from muster.daemon.k8s import manifests as m
from muster.demo.emulator import KubeEmulator, running
from muster.demo.kubelet_sim import SimulatedKubelet
from muster.events.types import Event, JobAdmitted, JobId, JobPreempted, JobSubmitted, NodeName, QueueConfigured
from muster.replay.invariants import Binding, check_log

pytestmark = pytest.mark.faults

FAST = Backoff(initial=0.01, maximum=0.1, jitter=0.0)
SUBS = ("binding", "eviction")
REQUEST_SECONDS = 0.3
"""The adapter's per-request timeout; injected delays are longer, so they are timeouts."""


@dataclass
class Log:
    """The events the adapter pushed and the decisions the test took, in order: the log a daemon would write."""

    events: list[Event]

    async def sink(self, events: list[Event]) -> None:
        self.events.extend(events)

    def submitted(self) -> list[JobSubmitted]:
        return [e for e in self.events if isinstance(e, JobSubmitted)]


@contextlib.asynccontextmanager
async def chaos(emulator: KubeEmulator, period: float = 0.15) -> AsyncIterator[dict[str, int]]:
    """Close every watch each `period`, compact history (410) every 4th time, fail a list or a watch now and then."""
    counts = {"watch-closed": 0, "410": 0, "watch-500": 0, "list-500": 0}

    async def run() -> None:
        i = 0
        while True:
            await anyio.sleep(period)
            i += 1
            if i % 4 == 0:
                emulator.expire()
                counts["410"] += 1
            else:
                emulator.close_watches()
                counts["watch-closed"] += 1
            if i % 3 == 0:
                emulator.fail("GET", "pods", watch=True, status=500)
                counts["watch-500"] += 1
            if i % 5 == 0:
                emulator.fail("GET", "pods", watch=False, status=500)
                counts["list-500"] += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        yield counts
        tg.cancel_scope.cancel()


async def submit_gangs(emulator: KubeEmulator, api: ApiClient, count: int) -> None:
    """`count` Jobs of two 2-GPU pods each (owners first: the adapter looks their size up)."""
    core = CoreV1Api(api)
    for g in range(count):
        job = m.job(f"train-{g}", "ns", parallelism=2)
        emulator.put_object("batch/v1/jobs", job)
        for pod in m.job_pods(job, gpus=2, labels={"muster.dev/queue": "q"}, grace_seconds=1):
            await core.create_namespaced_pod("ns", pod)


async def wait_for(predicate: Any, seconds: float = 20.0) -> None:
    with anyio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110 - polls the API double's objects; nothing to wait on
            await anyio.sleep(0.02)


async def test_bindings_and_evictions_apply_once_through_api_faults() -> None:
    """Under 500s, timeouts, 429s, closing watches and 410s, every gang is bound whole once and evicted once."""
    gangs, nodes = 8, 4
    emulator = RecordingEmulator()
    log = Log([QueueConfigured(at=0, name="q", nominal={"gpu": 64})])
    async with running(emulator) as (emu, api):
        for i in range(nodes):
            emu.put_object("v1/nodes", m.node(f"n{i}"))
        adapter = KubernetesAdapter(api, backoff=FAST, request_seconds=REQUEST_SECONDS, pod_wait_seconds=5)
        kubelet = SimulatedKubelet(api, speed=10.0, backoff=FAST)
        async with anyio.create_task_group() as tg, chaos(emu) as injected:
            with anyio.fail_after(10):
                await tg.start(adapter.run, log.sink)
                await tg.start(kubelet.run)
            await submit_gangs(emu, api, gangs)
            await wait_for(lambda: len(log.submitted()) == gangs)

            # admissions: every binding meets a 500 or a lost answer (the request applied, the reply timed out)
            emu.fail("POST", "pods", "binding", status=500, times=gangs)
            emu.fail("POST", "pods", "binding", status=None, delay=REQUEST_SECONDS * 2, times=gangs)
            admissions: dict[str, JobAdmitted] = {}
            for i, sub in enumerate(sorted(log.submitted(), key=lambda s: s.job)):
                node = NodeName(f"n{i % nodes}")
                admissions[sub.job] = JobAdmitted(
                    at=1, job=sub.job, queue=sub.queue, placement={p: node for p in sub.pods}, epoch=1, cycle=1
                )
            results = {}

            async def apply(event: Event) -> None:
                log.events.append(event)  # on the log first, then applied (as the daemon does)
                results[getattr(event, "job", "")] = await adapter.apply(event)

            async with anyio.create_task_group() as appliers:
                for event in admissions.values():
                    appliers.start_soon(apply, event)
            assert all(r.ok and r.outcome in ("applied", "noop") for r in results.values()), results

            # preemptions: evictions meet 500s, 429s and lost answers
            emu.fail("POST", "pods", "eviction", status=500, times=3)
            emu.fail("POST", "pods", "eviction", status=429, times=3)
            emu.fail("POST", "pods", "eviction", status=None, delay=REQUEST_SECONDS * 2, times=3)
            victims = sorted(admissions)[::2]
            results.clear()
            async with anyio.create_task_group() as appliers:
                for job in victims:
                    victim = JobPreempted(at=2, job=JobId(job), preemptor=None, reason="WithinQueue", epoch=1, cycle=2)
                    appliers.start_soon(apply, victim)
            assert all(r.ok for r in results.values()), results
            # the kubelet finishes the evictions; pods of the survivors keep running
            victim_pods = {key for job in victims for key in admissions_pods(log, job)}
            await wait_for(lambda: not any(emu.get_object("v1/pods", *k.split("/")) for k in victim_pods))
            await anyio.sleep(0.5)  # let late duplicates (if any) show up
            tg.cancel_scope.cancel()

    assert injected["410"] >= 1 and injected["watch-closed"] >= 3
    sent = {sub: len([r for r in emulator if r.subresource == sub and str(r.method.value) == "POST"]) for sub in SUBS}
    assert sent["binding"] >= 2 * gangs * 2, f"the faults were not retried through: {sent}"
    assert sent["eviction"] > len(victims) * 2
    pod_of = {key: (sub.job, name) for sub in log.submitted() for name, key in sub.pods.items()}
    bindings = [Binding(uid, node, *pod_of[key]) for uid, key, node in emulator.bound]
    assert len(bindings) == gangs * 2
    report = check_log(log.events, submitted=[s.job for s in log.submitted()], bindings=bindings, settled=True)
    assert report.ok, report.summary()
    assert sorted(emulator.evicted) == sorted(victim_pods), "an eviction missed its pod or hit another"
    assert len(set(emulator.evicted)) == len(emulator.evicted)
    survivors = {key for job in admissions if job not in victims for key in admissions_pods(log, job)}
    for key in survivors:
        pod = emulator.get_object("v1/pods", *key.split("/"))
        assert pod is not None and pod["spec"]["nodeName"] == admissions_node(log, key)


def admissions_pods(log: Log, job: str) -> list[str]:
    sub = next(s for s in log.submitted() if s.job == job)
    return list(sub.pods.values())


def admissions_node(log: Log, key: str) -> str:
    for e in log.events:
        if isinstance(e, JobAdmitted):
            sub = next(s for s in log.submitted() if s.job == e.job)
            for name, k in sub.pods.items():
                if k == key:
                    return e.placement[name]
    raise KeyError(key)
