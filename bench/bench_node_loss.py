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
import time

import anyio
from kubereal import bound, gather, make_gang, make_node, namespace, servers
from kubernetes_asyncio.client import ApiClient, CoreV1Api

from muster.daemon.cluster import KubeCluster
from muster.daemon.loop import LoopOptions, SchedulerLoop, SoleElector
from muster.events.store import EventStore
from muster.events.types import JobAdmitted, JobFailed, JobPreempted, JobSubmitted, QueueConfigured, QueueName

NS = "bench"


async def main(args: argparse.Namespace) -> None:
    async with servers(pool=64) as (api, url, _):
        await run(api, url, args)


async def run(api: ApiClient, url: str, args: argparse.Namespace) -> None:
    core = CoreV1Api(api)
    await namespace(core, NS)
    t = time.perf_counter()
    names = [f"node-{i:04d}" for i in range(args.nodes)]
    await gather(32, [lambda n=n: make_node(core, n, args.gpus) for n in names])
    gangs: dict[str, list[str]] = {}

    async def gang(name: str, bare: bool) -> None:
        gangs[name] = await make_gang(api, NS, name, args.pods, bare)

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
            while sum(1 for n in (await bound(core, NS)).values() if n) < total:  # noqa: ASYNC110 - polling the server
                await anyio.sleep(1.0)
            print(f"all {total} pods bound {time.perf_counter() - t:.1f} s after the daemon started")

            where = await bound(core, NS)
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
                now = await bound(core, NS, selector)
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
