"""The daemon's submit -> admission-decision latency and throughput (not a test; prints numbers).

One embedded nats-server (JetStream on disk). This process runs the real
daemon loop (`SchedulerLoop`, NATS KV leader election) against an in-process
simulated cluster of `--nodes` 8-GPU nodes (`demo/simcluster.py`: gangs run
for their runtime and report JobStarted/JobFinished through the log, as the
Kubernetes adapter does). A second process plays the users: it appends
`--rate` JobSubmitted per second for `--seconds`, and follows the log; a
job's latency is from just before its submission's append to the moment the
submitter reads its JobAdmitted on the log (so it includes the append, the
delivery to the daemon, the debounce, `decide`, the fenced append of the
decision, and the delivery back).

The load stays under capacity (gangs of 1-8 pods of 1-8 GPUs, mostly small,
running 1-3 s), so the latency measured is the scheduler's, not queueing for
GPUs. Jobs that had to wait for capacity are counted apart.

Usage: python bench/bench_daemon.py [--nodes 1000] [--rate 200] [--seconds 30]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

STREAM, PREFIX = "BENCH", "bench"


def gang(rng: random.Random, i: int) -> Any:
    from muster.events.types import JobId, JobSubmitted, PodSet, QueueName

    pods = rng.choices((1, 2, 4, 8), (50, 25, 15, 10))[0]
    gpus = rng.choices((1, 2, 4, 8), (30, 20, 20, 30))[0]
    return JobSubmitted(
        at=int(time.time()),
        job=JobId(f"bench-{i:06d}"),
        queue=QueueName(f"team-{i % 4}"),
        priority_class="training",
        podsets=[PodSet(name="worker", count=pods, requests={"gpu": gpus})],
        runtime=rng.randint(1, 3),
    )


# ---------------------------------------------------------------- the users (a separate process)


async def submitter(url: str, rate: float, seconds: float, seed: int) -> dict[str, Any]:
    from muster.events.store import EventStore
    from muster.events.types import JobAdmitted, JobInadmissible

    store = await EventStore.connect(url, stream=STREAM, prefix=PREFIX, create=False)
    rng = random.Random(seed)
    sent: dict[str, float] = {}
    admitted: dict[str, float] = {}
    waited: set[str] = set()
    total = int(rate * seconds)
    start_seq = await store.last_seq() + 1

    async def follow() -> None:
        async with contextlib.aclosing(store.follow(start_seq)) as events:
            async for stored in events:
                ev = stored.event
                if isinstance(ev, JobAdmitted) and ev.job in sent and ev.job not in admitted:
                    admitted[ev.job] = time.time()
                    if len(admitted) == total:
                        all_admitted.set()
                elif isinstance(ev, JobInadmissible) and ev.job in sent:
                    waited.add(ev.job)

    lag = []
    all_admitted = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        t0 = time.monotonic()
        for i in range(total):
            due = t0 + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                await anyio.sleep(delay)
            else:
                lag.append(-delay)
            ev = gang(rng, i)
            sent[ev.job] = time.time()
            await store.append([ev], msg_ids=[f"submit:{ev.job}"])
        submit_seconds = time.monotonic() - t0
        with anyio.move_on_after(30):
            await all_admitted.wait()
        tg.cancel_scope.cancel()
    await store.close()
    latencies = {j: admitted[j] - sent[j] for j in admitted}
    return {
        "submitted": len(sent),
        "submit_seconds": submit_seconds,
        "late_submissions": sum(1 for x in lag if x > 0.01),
        "admitted": len(admitted),
        "latency_immediate": [v for j, v in latencies.items() if j not in waited],
        "latency_waited": [v for j, v in latencies.items() if j in waited],
        "first_sent": min(sent.values()),
        "last_admitted": max(admitted.values()) if admitted else 0.0,
    }


# ---------------------------------------------------------------- the daemon (this process)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def main(args: argparse.Namespace) -> None:
    from muster.daemon.leader import KvElector
    from muster.daemon.logs import configure_logging
    from muster.daemon.loop import LoopOptions, SchedulerLoop
    from muster.demo.simcluster import SimulatedCluster, block_rack_nodes
    from muster.events.embedded import EmbeddedNats
    from muster.events.store import EventStore
    from muster.events.types import (
        CohortConfigured,
        CohortName,
        PriorityClassConfigured,
        QueueConfigured,
        QueueName,
        SchedulerConfigured,
    )

    configure_logging("warning", "console")
    # 1,000 nodes: 5 blocks x 10 racks x 20 nodes of 8 GPUs
    blocks = args.nodes // 200
    nodes = (
        block_rack_nodes(blocks, 10, 20, 8)
        if blocks and args.nodes % 200 == 0
        else block_rack_nodes(1, 1, args.nodes, 8)
    )
    gpus = 8 * len(nodes)
    with tempfile.TemporaryDirectory(prefix="bench-daemon-") as tmp, EmbeddedNats(Path(tmp) / "nats") as server:
        store = await EventStore.connect(server.url, stream=STREAM, prefix=PREFIX)
        config = [
            SchedulerConfigured(at=0, levels=["muster.dev/block", "muster.dev/rack"]),
            PriorityClassConfigured(at=0, name="training", value=100),
            CohortConfigured(at=0, name=CohortName("org")),
        ]
        config += [
            QueueConfigured(at=0, name=QueueName(f"team-{i}"), cohort=CohortName("org"), nominal={"gpu": gpus // 4})
            for i in range(4)
        ]
        await store.append(config)
        loop = SchedulerLoop(
            store,
            elector=KvElector(store.js, holder="bench", bucket="bench-leader", ttl=10),
            cluster=lambda state: SimulatedCluster(nodes, state),
            options=LoopOptions(debounce=args.debounce),
        )
        async with anyio.create_task_group() as tg:
            await tg.start(loop.run)
            with anyio.fail_after(30):
                await loop.first_term.wait()
            print(f"daemon leads; {len(nodes)} nodes, {gpus} GPUs; submitting {args.rate:g}/s for {args.seconds:g} s")
            cmd = [sys.executable, __file__, "--role", "submitter", "--url", server.url]
            cmd += ["--rate", str(args.rate), "--seconds", str(args.seconds), "--seed", str(args.seed)]
            t_start_events = loop.folded_seq
            proc = await anyio.run_process(cmd, check=True)
            result = json.loads(proc.stdout)
            events_written = loop.folded_seq - t_start_events
            m = loop.metrics
            cycles = m.registry.get_sample_value("muster_cycle_duration_seconds_count") or 0
            cycle_sum = m.registry.get_sample_value("muster_cycle_duration_seconds_sum") or 0
            conflicts = m.registry.get_sample_value("muster_append_conflicts_total") or 0
            loop.stop()
        await store.close()

    immediate = result["latency_immediate"]
    waited = result["latency_waited"]
    span = result["last_admitted"] - result["first_sent"]
    ms = 1000.0
    print(
        f"submitted {result['submitted']} gangs in {result['submit_seconds']:.1f} s "
        f"({result['submitted'] / result['submit_seconds']:.0f}/s; {result['late_submissions']} sent >10 ms late)"
    )
    print(f"admitted  {result['admitted']} ({result['admitted'] / span:.0f}/s over {span:.1f} s)")
    print(
        f"latency submit -> admission on the log (admitted at once, n={len(immediate)}): "
        f"p50 {pct(immediate, 0.5) * ms:.1f} ms  p90 {pct(immediate, 0.9) * ms:.1f} ms  "
        f"p99 {pct(immediate, 0.99) * ms:.1f} ms  max {max(immediate, default=0) * ms:.1f} ms"
    )
    if waited:
        print(
            f"  jobs that waited for capacity first (n={len(waited)}): p50 {pct(waited, 0.5) * ms:.0f} ms "
            f"p99 {pct(waited, 0.99) * ms:.0f} ms"
        )
    mean_decide = cycle_sum / max(cycles, 1) * ms
    print(
        f"daemon: {events_written} events folded, {cycles:.0f} cycles (mean decide {mean_decide:.2f} ms), "
        f"{conflicts:.0f} fenced appends refused and re-decided"
    )
    if immediate:
        print(f"all admitted latencies: mean {statistics.mean(immediate + waited) * ms:.1f} ms")


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--rate", type=float, default=200.0, help="gang submissions per second")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--debounce", type=float, default=0.002, help="the loop's debounce in seconds")
    p.add_argument("--role", choices=("daemon", "submitter"), default="daemon", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "submitter":
        from muster.daemon.logs import configure_logging

        configure_logging("warning", "console")
        print(json.dumps(anyio.run(submitter, args.url, args.rate, args.seconds, args.seed)))
        return
    anyio.run(main, args)


if __name__ == "__main__":
    cli()
