"""Kubernetes adapter throughput against the API double (not a test; prints numbers).

Serves `KubeEmulator` (kmock) on a local port and measures the adapter over HTTP:

  translate  the adapter's pure part alone: N node + G*P pod watch events -> events (no HTTP)
  sync       start-up: list + translate N nodes and their DaemonSet pods (reserved capacity)
  gangs      G Jobs of P pods created through the API -> G JobSubmitted (watch, owner lookup, gang)
  bind       apply G admissions (G*P pods/binding calls, 16 in flight per gang)
  evict      apply G preemptions (G*P pods/eviction calls)
  term       a new leader's adapter syncing with that cluster (the log knowing it): listing it, and
             from a standby's standing watch (`mirroring.Mirror`); wall, and CPU of this process (which
             serves the API double too: listing costs it some of that)

The emulator is Python on the same core as the adapter, so these are lower
bounds for the adapter against a real API server.

Usage: python bench/bench_k8s.py [--nodes 1000] [--gangs 200] [--pods 8]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import anyio
from kubernetes_asyncio.client import CoreV1Api

from muster.daemon.k8s import Backoff, KubernetesAdapter
from muster.daemon.k8s import manifests as m
from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.mirroring import Mirror
from muster.daemon.k8s.owners import Sizing
from muster.daemon.k8s.pods import Owner
from muster.daemon.k8s.translating import Translator
from muster.daemon.k8s.watching import WatchEvent
from muster.demo.emulator import KubeEmulator, running
from muster.events.types import (
    Event,
    JobAdmitted,
    JobPreempted,
    JobSubmitted,
    NodeAdded,
    NodeName,
    QueueConfigured,
    QueueName,
)
from muster.projections.cluster import fold
from muster.projections.state import ClusterState


def translate(nodes: int, gangs: int, pods: int) -> None:
    node_events = [WatchEvent("nodes", "ADDED", m.node(f"node-{i:04d}")) for i in range(nodes)]
    pod_events = []
    owners = []
    for g in range(gangs):
        job = m.job(f"job-{g:04d}", "bench", parallelism=pods)
        job["metadata"]["uid"] = f"{g:08d}-uid"
        owners.append(Owner("Job", "bench", job["metadata"]["name"], job["metadata"]["uid"]))
        for pod in m.job_pods(job, gpus=1, labels={"muster.dev/queue": "q"}):
            pod["metadata"]["uid"] = pod["metadata"]["name"]
            pod_events.append(WatchEvent("pods", "ADDED", pod))
    translator = Translator()
    t0 = time.perf_counter()
    for ev in node_events:
        translator.on_node(ev)
    out = translator.flush(1)
    for ev in pod_events:
        translator.on_pod(ev, 1)
    for owner in owners:  # sizes arrive after the pods, as when the owner lookups answer
        translator.on_owner_size(owner, Sizing(pods), 1)
    out += translator.flush(1)
    elapsed = time.perf_counter() - t0
    assert sum(isinstance(e, JobSubmitted) for e in out) == gangs
    n = len(node_events) + len(pod_events)
    print(f"translate {n} watch events -> {len(out)} events: {elapsed * 1000:8.1f} ms  ({n / elapsed:9.0f} events/s)")


async def main(nodes: int, gangs: int, pods: int) -> None:
    translate(nodes, gangs * 5, pods)
    emulator = KubeEmulator()
    for i in range(nodes):
        emulator.put_object("v1/nodes", m.node(f"node-{i:04d}"))
        ds = m.pod(f"dcgm-{i:04d}", "kube-system", scheduler="default-scheduler", cpu="100m", node_name=f"node-{i:04d}")
        emulator.put_object("v1/pods", ds)
    events: list[Event] = []
    changed = anyio.Event()

    async def sink(batch: list[Event]) -> None:
        nonlocal changed
        events.extend(batch)
        changed.set()
        changed = anyio.Event()

    async def until(count: int, cls: type) -> None:
        while sum(isinstance(e, cls) for e in events) < count:
            await changed.wait()

    async with running(emulator) as (_, api):
        adapter = KubernetesAdapter(api, backoff=Backoff(initial=0.01, maximum=0.1))
        async with anyio.create_task_group() as tg:
            t0 = time.perf_counter()
            await tg.start(adapter.run, sink)
            t_sync = time.perf_counter() - t0
            assert sum(isinstance(e, NodeAdded) for e in events) == nodes

            core = CoreV1Api(api)
            t0 = time.perf_counter()
            for g in range(gangs):
                job = m.job(f"job-{g:04d}", "bench", parallelism=pods)
                emulator.put_object("batch/v1/jobs", job)
                for pod in m.job_pods(job, gpus=1, labels={"muster.dev/queue": "q"}):
                    await core.create_namespaced_pod("bench", pod)
            await until(gangs, JobSubmitted)
            t_gangs = time.perf_counter() - t0

            subs = [e for e in events if isinstance(e, JobSubmitted)]
            known = [QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 1 << 30}), *events]
            takeover = await term_sync(api, fold(known))
            t0 = time.perf_counter()
            for i, sub in enumerate(subs):
                placement = {name: NodeName(f"node-{(i + j) % nodes:04d}") for j, name in enumerate(sorted(sub.pods))}
                result = await adapter.apply(JobAdmitted(at=1, job=sub.job, queue=QueueName("q"), placement=placement))
                assert result.outcome == "applied", result
            t_bind = time.perf_counter() - t0
            await adapter.caught_up("pods", emulator.resource_version)

            t0 = time.perf_counter()
            for sub in subs:
                preempt = JobPreempted(at=2, job=sub.job, preemptor=None, reason="WithinQueue")
                result = await adapter.apply(preempt)
                assert result.ok, result
            t_evict = time.perf_counter() - t0
            tg.cancel_scope.cancel()

    total = gangs * pods
    print(f"sync   {nodes} nodes + {nodes} daemonset pods: {t_sync * 1000:8.1f} ms")
    print(f"gangs  {gangs} x {pods} pods created -> submitted: {t_gangs:6.2f} s  ({total / t_gangs:7.0f} pods/s)")
    per_gang = t_bind / gangs * 1000
    print(f"bind   {total} bindings: {t_bind:6.2f} s  ({total / t_bind:7.0f} bindings/s, {per_gang:.1f} ms/gang)")
    print(f"evict  {total} evictions: {t_evict:6.2f} s  ({total / t_evict:7.0f} evictions/s)")
    for how, (wall, cpu) in takeover.items():
        print(f"term   a new term's sync, {how:<12} {wall * 1000:8.1f} ms wall, {cpu * 1000:8.1f} ms CPU")


async def term_sync(api: Any, state: ClusterState) -> dict[str, tuple[float, float]]:
    """A new leader's adapter syncing with the cluster the log knows: listing it, and from a standby's mirror."""
    out: dict[str, tuple[float, float]] = {}
    mirror = Mirror(KubeClient(api), backoff=Backoff(initial=0.01, maximum=0.1))

    async def sync(how: str, **options: Any) -> None:
        adapter = KubernetesAdapter(api, state=lambda: state, report=False, **options)
        async with anyio.create_task_group() as tg:
            wall, cpu = time.perf_counter(), time.process_time()
            await tg.start(adapter.run, _discard)
            out[how] = (time.perf_counter() - wall, time.process_time() - cpu)
            tg.cancel_scope.cancel()

    await sync("listing")
    async with anyio.create_task_group() as tg:
        await tg.start(mirror.run)  # the standby: listed and watching before the term starts
        await sync("from mirror", mirror=mirror)
        tg.cancel_scope.cancel()
    return out


async def _discard(events: list[Event]) -> None:
    """A term's sink that appends nothing (the log already holds what the cluster reports)."""


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gangs", type=int, default=200)
    parser.add_argument("--pods", type=int, default=8)
    args = parser.parse_args()
    anyio.run(main, args.nodes, args.gangs, args.pods)
