"""Node loss under load against a real kube-apiserver (not a test; prints numbers).

Starts `../shared/k8s/start` and an embedded nats-server, creates N Ready nodes and G gangs
(half labelled pod groups of bare pods, half Jobs with pods as their controller creates
them), runs the daemon until every pod is bound, then deletes D nodes and at once creates
a few new gangs. It reports how many evictions and admissions the loss caused (issue 11:
4,874 preemptions and 5,641 admissions for ~4,300 gangs, apply lagging minutes) and how
long the new gangs took to bind.

Usage: python bench/bench_node_loss.py [--nodes 500] [--gangs 200] [--pods 8] [--delete 100]
"""

from __future__ import annotations

import argparse
import collections
import os
import select
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from kubernetes_asyncio.client import ApiClient, BatchV1Api, Configuration, CoreV1Api
from kubernetes_asyncio.config import load_kube_config

from muster.daemon.cluster import KubeCluster
from muster.daemon.k8s import manifests as m
from muster.daemon.loop import LoopOptions, SchedulerLoop, SoleElector
from muster.events.embedded import EmbeddedNats
from muster.events.store import EventStore
from muster.events.types import JobAdmitted, JobFailed, JobPreempted, JobSubmitted, QueueConfigured, QueueName

ROOT = Path(__file__).resolve().parents[1]
START = ROOT.parent / "shared" / "k8s" / "start"
MERGE = "application/merge-patch+json"
NS = "bench"


def start_server(folder: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, APISERVER_EXTRA="--max-requests-inflight=2000 --max-mutating-requests-inflight=1000")
    proc = subprocess.Popen(["bash", str(START), str(folder)], stdout=subprocess.PIPE, env=env, start_new_session=True)
    assert proc.stdout is not None
    out = b""
    deadline = time.monotonic() + 90
    while b"ready" not in out.splitlines():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"the API server did not start: {out!r}")
        if select.select([proc.stdout], [], [], 1.0)[0]:
            out += os.read(proc.stdout.fileno(), 4096)
    return proc


async def gather(limit: int, calls: list[Any]) -> None:
    sem = anyio.Semaphore(limit)

    async def one(call: Any) -> None:
        async with sem:
            await call()

    async with anyio.create_task_group() as tg:
        for call in calls:
            tg.start_soon(one, call)


async def make_node(core: CoreV1Api, name: str, gpus: int) -> None:
    obj = m.node(name, gpus=gpus)
    status = obj.pop("status")
    await core.create_node(obj)
    await core.patch_node_status(name, {"status": status}, _content_type=MERGE)
    await core.patch_node(name, {"spec": {"taints": None}}, _content_type=MERGE)


async def make_gang(api: ApiClient, name: str, pods: int, bare: bool) -> list[str]:
    core, batch = CoreV1Api(api), BatchV1Api(api)
    if bare:
        labels = {"muster.dev/gang": name, "muster.dev/gang-size": str(pods), "muster.dev/queue": "q"}
        objs = [m.pod(f"{name}-{i}", NS, gpus=1, labels=labels, grace_seconds=0) for i in range(pods)]
    else:
        manifest = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "parallelism": pods,
                "completions": pods,
                "completionMode": "Indexed",
                "template": {
                    "spec": {
                        "schedulerName": "muster",
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "busybox"}],
                    }
                },
            },
        }
        job = api.sanitize_for_serialization(await batch.create_namespaced_job(NS, manifest))
        objs = m.job_pods(job, gpus=1, grace_seconds=0, labels={"muster.dev/queue": "q"})
    for obj in objs:
        await core.create_namespaced_pod(NS, obj)
    return [o["metadata"]["name"] for o in objs]


async def bound(core: CoreV1Api, selector: str = "") -> dict[str, str]:
    """Pod name -> node (the bench shares the daemon's process: it lists only what it must)."""
    pods = await core.list_namespaced_pod(NS, label_selector=selector)
    return {p.metadata.name: p.spec.node_name or "" for p in pods.items}


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp) / "kube")
        nats = EmbeddedNats(Path(tmp) / "nats", stop_timeout=5)
        nats.start()
        try:
            config = Configuration()
            await load_kube_config(
                config_file=str(Path(tmp) / "kube" / "admin.kubeconfig"), client_configuration=config
            )
            config.connection_pool_maxsize = 64
            async with ApiClient(config) as api:
                await run(api, nats.url, args)
        finally:
            nats.stop()
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)


async def run(api: ApiClient, url: str, args: argparse.Namespace) -> None:
    core = CoreV1Api(api)
    await core.create_namespace({"metadata": {"name": NS}})
    await core.create_namespaced_service_account(NS, {"metadata": {"name": "default"}})
    t = time.perf_counter()
    names = [f"node-{i:04d}" for i in range(args.nodes)]
    await gather(32, [lambda n=n: make_node(core, n, args.gpus) for n in names])
    gangs: dict[str, list[str]] = {}

    async def gang(name: str, bare: bool) -> None:
        gangs[name] = await make_gang(api, name, args.pods, bare)

    await gather(16, [lambda g=g: gang(f"g{g:04d}", g % 2 == 0) for g in range(args.gangs)])
    print(f"setup: {args.nodes} nodes, {args.gangs} gangs x {args.pods} pods in {time.perf_counter() - t:.1f} s")

    store = await EventStore.connect(url, stream="BENCH", prefix="bench", duplicate_window=60)
    try:
        await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 10**6})])
        loop = SchedulerLoop(
            store,
            elector=SoleElector("bench"),
            cluster=KubeCluster.factory(api, report=args.report),
            options=LoopOptions(),
        )
        async with anyio.create_task_group() as tg:
            t = time.perf_counter()
            await tg.start(loop.run)
            total = args.gangs * args.pods
            while sum(1 for n in (await bound(core)).values() if n) < total:  # noqa: ASYNC110 - polling the server
                await anyio.sleep(1.0)
            print(f"all {total} pods bound {time.perf_counter() - t:.1f} s after the daemon started")

            where = await bound(core)
            used = collections.Counter(where.values())
            doomed = [n for n, _ in used.most_common(args.delete)]
            affected = {g for g, pods in gangs.items() if any(where.get(p) in doomed for p in pods)}
            seq_before = await store.last_seq()
            t = time.perf_counter()
            await gather(32, [lambda n=n: core.delete_node(n) for n in doomed])
            deleted = time.perf_counter() - t
            new = [f"new{i}" for i in range(args.new)]
            created_at = time.perf_counter()
            await gather(8, [lambda g=g: gang(g, True) for g in new])
            created = time.perf_counter() - created_at
            new_pods = [p for g in new for p in gangs[g]]
            selector = f"muster.dev/gang in ({','.join(new)})"
            while True:
                now = await bound(core, selector)
                if all(now.get(p) for p in new_pods):
                    break
                await anyio.sleep(0.05)
            new_bound = time.perf_counter() - created_at
            # wait until every affected gang is settled: bare ones failed, Job ones evicted (pods gone)
            with anyio.move_on_after(60):
                while loop.metrics.registry.get_sample_value("muster_apply_backlog") or 0:  # noqa: ASYNC110 - a gauge
                    await anyio.sleep(0.1)
            after = [s.event for s in await store.read(seq_before + 1)]
            tg.cancel_scope.cancel()
    finally:
        await store.delete_stream()
        await store.close()

    kinds = collections.Counter(type(e).__name__ for e in after)
    preempted = collections.Counter(e.job for e in after if isinstance(e, JobPreempted))
    admitted_old = [e.job for e in after if isinstance(e, JobAdmitted) and "/new" not in e.job]
    failed = [e for e in after if isinstance(e, JobFailed)]
    subs = {e.job for e in after if isinstance(e, JobSubmitted)}
    print(f"deleted {len(doomed)} nodes in {deleted:.2f} s, hosting pods of {len(affected)} gangs")
    print(
        f"after: {kinds['JobPreempted']} preemptions ({len(preempted)} jobs, max {max(preempted.values(), default=0)}"
        f" per job), {len(admitted_old)} re-admissions of old gangs, {len(failed)} JobFailed, {len(subs)} new gangs"
    )
    print(
        f"{args.new} new gangs of {args.pods} created right after the deletion (taking {created:.2f} s): "
        f"all bound {new_bound:.2f} s after their creation began"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--gangs", type=int, default=200)
    parser.add_argument("--pods", type=int, default=8)
    parser.add_argument("--delete", type=int, default=100)
    parser.add_argument("--new", type=int, default=4)
    parser.add_argument("--no-report", dest="report", action="store_false", help="write no Kubernetes Events")
    anyio.run(main, parser.parse_args())
