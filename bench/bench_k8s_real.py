"""Binding throughput of the whole daemon against a real kube-apiserver (not a test; prints numbers).

Starts `../shared/k8s/start` (with the load flags of kubereal.LOAD_FLAGS) and an
embedded nats-server, creates N Ready 8-GPU nodes, then for each gang size: P
one-GPU pods in gangs of that size (alternately Jobs with the pods their
controller would create, and labelled pod groups), all created before the
daemon starts; then it starts the daemon (a fresh log) and waits until every
pod is bound. First, once, "server alone": the bench binds P pods itself (no
daemon, no watch), the most any scheduler gets from this server on this machine.
It prints, per run:

  first->last   pods / (last binding answered - first binding sent): the binding rate
  start->all    pods / (all bound - daemon started): lists, log, decisions and bindings
  daemon CPU    the process's CPU from start to all bound, per pod, and how much of it the
                cyclic garbage collector took (`daemon/heap.py` tunes it as `muster daemon` does)
  server CPU    kube-apiserver's and etcd's CPU over the same time, per pod
  daemon busy   the share of that time the daemon's process ran or waited for a CPU while runnable
                (/proc schedstat); above half of it the run was decided by the daemon (its CPU per
                pod, or its share of a loaded machine), else by the API server it waited for
  requests      what the API server was asked over that time, per pod, by verb and resource
                (its apiserver_request_total metric; the bench's one list at the end counts too)
  afterwards    what the daemon asked after the last binding until its reports were all
                written (Events, status annotations: they give way to bindings), per pod

Binding times are taken at the daemon's `Cluster.apply` (a wrapper records when each
admission's apply began and ended), so the bench adds no watch of its own to the
daemon's process. Issue 11 measured 383-529 pods/s (gangs of 8) and 493-590 (gangs
of 32) first to last; kube-scheduler on the same server 348-647. Target: >= 700.
Exit status 1 when the best run of a size misses it.

Usage: python bench/bench_k8s_real.py [--nodes 500] [--pods 2000] [--sizes 1,8,32] [--trials 2]
       [--bind-connections N (0: bind through the library's session)]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskStatus
from kubereal import START, Server, bound, gather, make_gang, make_node, namespace, runqueue_seconds, servers
from kubernetes_asyncio.client import ApiClient, BatchV1Api, CoreV1Api

from muster.daemon import heap
from muster.daemon.cluster import Applied, Cluster, KubeCluster, Sink
from muster.daemon.k8s.client import KubeClient, skip_environment_lookups
from muster.daemon.logs import configure_logging
from muster.daemon.loop import LoopOptions, SchedulerLoop, SoleElector
from muster.events.store import EventStore
from muster.events.types import Event, JobAdmitted, QueueConfigured, QueueName
from muster.projections.state import ClusterState

TARGET = 700.0


@dataclass
class Timings:
    """When the daemon's admissions were applied (perf_counter seconds) and how many pods they bound."""

    total: int
    first: float = float("inf")
    last: float = 0.0
    pods: int = 0
    done: anyio.Event = field(default_factory=anyio.Event)


class TimedCluster:
    """The daemon's Kubernetes cluster, timing each admission it applies (a `Cluster` around a `Cluster`)."""

    def __init__(self, inner: Cluster, timings: Timings) -> None:
        self.inner = inner
        self.timings = timings

    async def run(self, sink: Sink, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        await self.inner.run(sink, task_status=task_status)

    async def ready(self, event: Event) -> None:
        await self.inner.ready(event)

    async def apply(self, event: Event) -> Applied:
        began = time.perf_counter()
        result = await self.inner.apply(event)
        if isinstance(event, JobAdmitted) and result.outcome == "applied":
            t = self.timings
            t.first = min(t.first, began)
            t.last = max(t.last, time.perf_counter())
            t.pods += len(event.placement)
            if t.pods >= t.total:
                t.done.set()
        return result

    def holds(self, job: str) -> bool:
        return self.inner.holds(job)


class CollectorTime:
    """CPU seconds spent in the cyclic garbage collector while `running` (`gc.callbacks`)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.passes = 0
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.process_time()
        else:
            self.seconds += time.process_time() - self._began
            self.passes += 1

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        gc.callbacks.append(self)
        try:
            yield
        finally:
            gc.callbacks.remove(self)


def _top(requests: Counter[str], pods: int) -> str:
    """The six most frequent requests, each per pod."""
    return ", ".join(f"{what} {n / pods:.2f}" for what, n in requests.most_common(6))


@dataclass(frozen=True)
class Run:
    size: int
    pods: int
    first_to_last: float
    start_to_all: float
    cpu: float
    """CPU seconds of the daemon's process (the bench's share is idle waiting) from start to all bound."""
    server_cpu: float
    """CPU seconds of kube-apiserver and etcd over the same time."""
    waited: float
    """Seconds the daemon's process waited for a CPU while runnable over the same time."""
    requests: Counter[str]
    """What the API server answered over the same time, by `VERB resource`."""
    afterwards: Counter[str]
    """What it answered after that until the daemon's reports were written."""
    load: str
    collector: CollectorTime

    def line(self) -> str:
        busy = (self.cpu + self.waited) / self.start_to_all
        decided = "daemon" if busy > 0.5 else "server"
        asked = sum(self.requests.values())
        top = _top(self.requests, self.pods)
        return (
            f"gangs of {self.size:>3}: {self.pods} pods  first->last {self.pods / self.first_to_last:6.0f} pods/s"
            f" ({self.first_to_last:5.2f} s)  start->all {self.pods / self.start_to_all:6.0f} pods/s"
            f" ({self.start_to_all:5.2f} s)  daemon CPU {self.cpu / self.start_to_all:4.0%}"
            f" ({1000 * self.cpu / self.pods:.2f} ms/pod, collector {1000 * self.collector.seconds / self.pods:.2f}"
            f" in {self.collector.passes} passes)  server CPU {1000 * self.server_cpu / self.pods:.2f} ms/pod"
            f"  daemon busy {busy:.0%} (waiting for a CPU {self.waited / self.start_to_all:.0%})"
            f"  decided by {decided}  load {self.load}\n"
            f"    requests {asked / self.pods:.2f}/pod: {top}\n"
            f"    afterwards {sum(self.afterwards.values()) / self.pods:.2f}/pod: {_top(self.afterwards, self.pods)}"
        )


async def one_run(api: ApiClient, url: str, server: Server, args: argparse.Namespace, size: int, trial: int) -> Run:
    core = CoreV1Api(api)
    ns = f"bench-{size}-{trial}"
    await namespace(core, ns)
    gangs = max(1, round(args.pods / size))
    await gather(16, [lambda g=g: make_gang(api, ns, f"g{g:04d}", size, g % 2 == 0) for g in range(gangs)])
    total = gangs * size
    timings = Timings(total)
    options = {"lookups": args.lookups} if args.lookups else {}
    if args.bind_connections is not None:
        options["bind_connections"] = args.bind_connections
    make = KubeCluster.factory(api, report=args.report, **options)

    clusters: list[TimedCluster] = []

    def factory(state: Callable[[], ClusterState]) -> Cluster:
        clusters.append(TimedCluster(make(state), timings))
        return clusters[-1]

    store = await EventStore.connect(url, stream=f"BENCH{size}X{trial}", prefix=f"b{size}x{trial}")
    try:
        await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 10**6})])
        loop = SchedulerLoop(store, elector=SoleElector("bench"), cluster=factory, options=LoopOptions())
        collector = CollectorTime()
        async with anyio.create_task_group() as tg:
            # CPU time, not wall time: on a shared machine a wall-clock profile mostly measures waiting
            profile = cProfile.Profile(time.process_time) if args.profile else None
            asked = await server.requests(api)
            started, cpu, server_cpu = time.perf_counter(), time.process_time(), server.cpu_seconds()
            waited = runqueue_seconds(os.getpid())
            if profile is not None:
                profile.enable()
            with collector.running():
                await tg.start(loop.run)
                with anyio.fail_after(args.timeout):
                    await timings.done.wait()
            all_bound, cpu = time.perf_counter(), time.process_time() - cpu
            server_cpu = server.cpu_seconds() - server_cpu
            waited = runqueue_seconds(os.getpid()) - waited
            at_all = await server.requests(api)
            asked = at_all - asked
            if profile is not None:
                profile.disable()
                profile.dump_stats(f"{args.profile}.{size}.{trial}")
            reporter = getattr(getattr(clusters[-1].inner, "adapter", None), "reporter", None)
            for _ in range(1200):  # the reports written, or 120 s
                if not getattr(reporter, "unwritten", 0):  # none, or a daemon that does not count them
                    break
                await anyio.sleep(0.1)
            afterwards = await server.requests(api) - at_all
            loop.stop()
            tg.cancel_scope.cancel()
    finally:
        await store.delete_stream()
        await store.close()
    load = os.getloadavg()
    pending = [name for name, node in (await bound(core, ns)).items() if not node]
    if pending:
        raise SystemExit(f"{len(pending)} pods of {ns} are not bound, though the daemon applied every admission")
    # make room for the next run: what a kubelet and the garbage collector would delete
    await core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    await BatchV1Api(api).delete_collection_namespaced_job(ns)
    return Run(
        size,
        total,
        timings.last - timings.first,
        all_bound - started,
        cpu,
        server_cpu,
        waited,
        asked,
        afterwards,
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        collector,
    )


async def client_overhead(api: ApiClient, node: str, requests: int = 1000) -> None:
    """Print the client's cost per request (64 in flight) with and without the HTTP session's per-request
    proxy/netrc lookups (`client.skip_environment_lookups`), interleaved twice."""
    session = api.rest_client.pool_manager
    core = CoreV1Api(api)
    limit = anyio.Semaphore(64)

    async def one() -> None:
        async with limit:
            await core.read_node(node, _preload_content=False)

    for lookups in (True, False, True, False):
        session._trust_env = lookups
        wall, cpu = time.perf_counter(), time.process_time()
        async with anyio.create_task_group() as tg:
            for _ in range(requests):
                tg.start_soon(one)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        what = "with env lookups   " if lookups else "without env lookups"
        print(f"client {what}: {requests} GETs in {wall:5.2f} s, {1000 * cpu / requests:.2f} ms CPU each", flush=True)
    skip_environment_lookups(api)


async def server_alone(api: ApiClient, server: Server, nodes: list[str], pods: int, connections: int) -> None:
    """Print what binding `pods` pods costs the API server with no scheduler in the way: the bench binds
    them itself (a KubeClient, 64 in flight, as the applier sends them), no watch, no decisions. Its rate
    bounds what any scheduler reaches on this server and machine (no kube-scheduler binary here to run)."""
    core = CoreV1Api(api)
    ns = "bench-server-alone"
    await namespace(core, ns)
    names = [f"p{i:05d}" for i in range(pods)]
    await gather(16, [lambda n=n: make_gang(api, ns, n, 1, True) for n in names])
    client = KubeClient(api, bind_connections=connections)
    limit = anyio.Semaphore(64)

    async def bind(i: int) -> None:
        async with limit:
            await client.bind(ns, f"{names[i]}-0", nodes[i % len(nodes)])

    wall, cpu, server_cpu = time.perf_counter(), time.process_time(), server.cpu_seconds()
    async with anyio.create_task_group() as tg:
        for i in range(pods):
            tg.start_soon(bind, i)
    wall, cpu, server_cpu = time.perf_counter() - wall, time.process_time() - cpu, server.cpu_seconds() - server_cpu
    await client.aclose()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"server alone: {pods} bindings {pods / wall:6.0f} pods/s ({wall:5.2f} s)  server CPU"
        f" {1000 * server_cpu / pods:.2f} ms/pod  client CPU {1000 * cpu / pods:.2f} ms/pod"
        f" ({connections or 'no'} pipelined connections)  load {load}",
        flush=True,
    )
    await core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)


async def main(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in args.sizes.split(",")]
    runs: list[Run] = []
    async with servers() as (api, url, server):
        t = time.perf_counter()
        core = CoreV1Api(api)
        names = [f"node-{i:04d}" for i in range(args.nodes)]
        await gather(32, [lambda n=n: make_node(core, n, 8) for n in names])
        print(f"{args.nodes} Ready 8-GPU nodes in {time.perf_counter() - t:.1f} s", flush=True)
        await client_overhead(api, names[0])
        if args.server_alone:
            await server_alone(
                api, server, names, args.pods, 32 if args.bind_connections is None else args.bind_connections
            )
        for trial in range(args.trials):
            for size in sizes:
                run = await one_run(api, url, server, args, size, trial)
                runs.append(run)
                print(run.line(), flush=True)
    missed = False
    print(f"summary (target first->last >= {TARGET:.0f} pods/s):")
    for size in sizes:
        mine = [r for r in runs if r.size == size]
        rates = sorted(r.pods / r.first_to_last for r in mine)
        starts = sorted(r.pods / r.start_to_all for r in mine)
        missed = missed or rates[-1] < TARGET
        print(
            f"  gangs of {size:>3}: first->last {rates[0]:.0f}-{rates[-1]:.0f} pods/s,"
            f" start->all {starts[0]:.0f}-{starts[-1]:.0f} pods/s over {len(mine)} runs"
        )
    return 1 if missed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=2000, help="pods per run (gangs = pods / size, rounded)")
    parser.add_argument("--sizes", default="1,8,32", help="gang sizes, one run each per trial")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a run may take to bind every pod")
    parser.add_argument(
        "--profile", help="cProfile (CPU time) the daemon from its start to all bound into PROFILE.SIZE.TRIAL"
    )
    parser.add_argument("--log", help="write the daemon's JSON log here (default: a temporary file)")
    parser.add_argument("--no-report", dest="report", action="store_false", help="write no Kubernetes Events")
    parser.add_argument("--lookups", type=int, help="owner lookups in flight at most (default: the adapter's)")
    parser.add_argument(
        "--no-server-alone", dest="server_alone", action="store_false", help="skip binding without the daemon first"
    )
    parser.add_argument(
        "--bind-connections", type=int, help="pipelined connections for bindings (default: the adapter's; 0: none)"
    )
    args = parser.parse_args()
    if not START.is_file():
        print(f"skipped: no real API server ({START} is absent; it is ../shared/k8s/start beside the repository)")
        sys.exit(0)
    with open(args.log, "w") if args.log else tempfile.TemporaryFile("w") as logfile:
        configure_logging("info", "json", stream=logfile)  # as deployed: JSON lines at info (here to a file)
        heap.tune()  # as deployed: the daemon's collector thresholds
        code = anyio.run(main, args)
    sys.exit(code)
