"""Billing ledger throughput (not a test; prints numbers).

Generates a realistic log in memory: a 2,048-GPU cluster of two GPU models,
24 queues, jobs arriving over days (1-64 GPUs in 8-GPU pods, lognormal
runtimes, CPU and memory requests, some on borrowed quota, some scavenger),
GPU utilization sampled every 5 minutes per running job, preemptions with
readmission, node failures and returns. Then measures:

  fold        decode + `evolve_billing` from in-memory bytes, no database
  fold+sqlite decode + fold + one SQLite transaction per batch (rows, cursor,
              tracker snapshot): the subscriber's path minus NATS   target >= 50,000 events/s
  nats        (with --nats N) the real subscriber on N events through an
              embedded nats-server: fetch, decode, fold, SQLite, ack

Both paths must give the same ledger; the script checks it.

Usage: python bench/bench_billing.py [--events 1000000] [--batch 1000] [--nats 100000] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import math
import pstats
import random
import sys
import tempfile
import time
from pathlib import Path

from muster.daemon.billing_store import LedgerDB
from muster.events import codec
from muster.events.types import (
    Event,
    GpuUtilizationSampled,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    LeaderElected,
    NodeAdded,
    NodeUpdated,
    PodSet,
    PriorityClassConfigured,
    QueueConfigured,
)
from muster.projections.billing import evolve_billing, fold_billing, settle, skip_bad
from muster.projections.ledger import Ledger, drain, merge_into, new_billing_state

T0 = 1_735_689_600  # 2025-01-01T00:00:00Z
LABEL = "nvidia.com/gpu.product"
MODELS = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3")
SAMPLE_EVERY = 300
GIB96 = 96 << 30


def realistic_log(n: int, *, nodes: int = 256, seed: int = 11) -> list[Event]:
    """About `n` events of a busy cluster, in event-time order."""
    rng = random.Random(seed)
    setup: list[Event] = [
        LeaderElected(at=T0, epoch=1, holder="muster-0"),
        PriorityClassConfigured(at=T0, name="production", value=1000, preemptible=False),
        PriorityClassConfigured(at=T0, name="training", value=100),
        PriorityClassConfigured(at=T0, name="scavenger", value=0),
    ]
    queues = [f"team-{i:02}" for i in range(24)]
    setup += [QueueConfigured(at=T0, name=q, cohort="org", nominal={"gpu": 64}) for q in queues]
    node_names = [f"gpu-{i:04}" for i in range(nodes)]
    node_model = {name: MODELS[i % 2] for i, name in enumerate(node_names)}
    setup += [
        NodeAdded(
            at=T0,
            node=name,
            labels={LABEL: node_model[name]},
            capacity={"gpu": 8, "cpu": 128_000, "memory": 1 << 40},
        )
        for name in node_names
    ]
    timeline: list[tuple[int, int, Event]] = []
    order = 0

    def emit(at: int, ev: Event) -> None:
        nonlocal order
        timeline.append((at, order, ev))
        order += 1

    at = T0
    job_no = 0
    while len(timeline) + len(setup) < n:
        at += int(rng.expovariate(1 / 40)) + 1
        job = f"job-{job_no:07}"
        job_no += 1
        queue = rng.choice(queues)
        pods = rng.choice((1, 1, 1, 2, 4, 8))
        gpus_per_pod = 8 if pods > 1 else rng.choice((1, 2, 4, 8))
        pclass = rng.choices(("training", "scavenger", "production"), (6, 3, 1))[0]
        runtime = min(48 * 3600, int(math.exp(rng.gauss(8.3, 1.0))))  # median ~70 min
        first = rng.randrange(nodes)
        placement = {f"worker-{i}": node_names[(first + i) % nodes] for i in range(pods)}
        emit(
            at,
            JobSubmitted(
                at=at,
                job=job,
                queue=queue,
                priority_class=pclass,
                podsets=[
                    PodSet(
                        name="worker",
                        count=pods,
                        requests={
                            "gpu": gpus_per_pod,
                            "cpu": 12_000 * gpus_per_pod,
                            "memory": (96 << 30) * gpus_per_pod,
                        },
                    )
                ],
                runtime=runtime,
                checkpoint_every=1800,
            ),
        )
        admit = at + rng.randint(0, 900)
        borrowed = {"gpu": pods * gpus_per_pod // 2} if rng.random() < 0.15 else {}
        emit(admit, JobAdmitted(at=admit, job=job, queue=queue, placement=placement, borrowed=borrowed, epoch=1))
        emit(admit + 30, JobStarted(at=admit + 30, job=job))
        util = rng.betavariate(2, 2)
        end = admit + runtime
        if rng.random() < 0.08:  # preempted once, readmitted ten minutes later
            cut = admit + rng.randint(60, max(61, runtime - 1))
            for t in range(admit + SAMPLE_EVERY, cut, SAMPLE_EVERY):
                emit(t, GpuUtilizationSampled(at=t, job=job, gpu=round(min(1.0, max(0.0, rng.gauss(util, 0.1))), 3)))
            lost = (cut - admit) % 1800 * pods * gpus_per_pod
            emit(
                cut, JobPreempted(at=cut, job=job, preemptor=None, reason="ReclaimWithinCohort", lost_gpu_seconds=lost)
            )
            admit = cut + 600
            emit(admit, JobAdmitted(at=admit, job=job, queue=queue, placement=placement, epoch=1))
            end = admit + runtime - (cut - admit + 600) // 1800 * 1800
        for t in range(admit + SAMPLE_EVERY, end, SAMPLE_EVERY):
            emit(t, GpuUtilizationSampled(at=t, job=job, gpu=round(min(1.0, max(0.0, rng.gauss(util, 0.1))), 3)))
        fate = rng.random()
        if fate < 0.9:
            emit(end, JobFinished(at=end, job=job))
        elif fate < 0.97:
            emit(end, JobFailed(at=end, job=job, reason="OOMKilled"))
        else:
            emit(end, JobCancelled(at=end, job=job))
        if rng.random() < 0.01:  # a node fails and comes back after an hour
            name = rng.choice(node_names)
            labels, cap = {LABEL: node_model[name]}, {"gpu": 8, "cpu": 128_000, "memory": 1 << 40}
            emit(at, NodeUpdated(at=at, node=name, labels=labels, capacity=cap, ready=False))
            emit(at + 3600, NodeUpdated(at=at + 3600, node=name, labels=labels, capacity=cap))
    timeline.sort(key=lambda x: (x[0], x[1]))
    return (setup + [ev for _, _, ev in timeline])[:n]


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:>10,.0f} events/s  ({n:,} events in {seconds:.2f} s)"


def fold_only(raws: list[bytes]) -> tuple[float, Ledger]:
    state = new_billing_state()
    start = time.perf_counter()
    for seq, raw in enumerate(raws, start=1):
        try:
            evolve_billing(state, seq, codec.decode(raw))
        except codec.DecodeError as exc:
            skip_bad(state, seq, exc.message)
    settle(state)
    return time.perf_counter() - start, state.ledger


def fold_sqlite(raws: list[bytes], db_path: Path, batch: int) -> tuple[float, int]:
    with LedgerDB.open(f"sqlite:///{db_path}") as db:
        db.load()
        state = new_billing_state()
        commits = 0
        start = time.perf_counter()
        for i in range(0, len(raws), batch):
            for seq, raw in enumerate(raws[i : i + batch], start=i + 1):
                try:
                    evolve_billing(state, seq, codec.decode(raw))
                except codec.DecodeError as exc:
                    skip_bad(state, seq, exc.message)
            if i + batch >= len(raws):
                settle(state)
            db.commit(drain(state), state.tracker)
            commits += 1
        return time.perf_counter() - start, commits


def ledger_from_db(db_path: Path) -> Ledger:
    with LedgerDB.open(f"sqlite:///{db_path}") as db:
        usage, capacity, queues = db.read_window()
        return Ledger(usage=dict(usage), capacity=dict(capacity), queues=queues, jobs=db.jobs())


def same_ledger(a: Ledger, b: Ledger) -> bool:
    return a.usage == b.usage and a.capacity == b.capacity and a.jobs == b.jobs


async def through_nats(events: list[Event], db_path: Path, batch: int) -> tuple[float, float]:
    """(append seconds, subscriber seconds) for `events` through an embedded nats-server."""
    import nats

    from muster.daemon.billing import BillingMetrics, BillingSubscriber, SubscriberOptions
    from muster.events.embedded import EmbeddedNats
    from muster.events.store import EventStore

    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats") as server:
        store = await EventStore.connect(server.url)
        try:
            t = time.perf_counter()
            for i in range(0, len(events), 5000):
                await store.append(events[i : i + 5000])
            appended = time.perf_counter() - t
        finally:
            await store.close()
        nc = await nats.connect(server.url)
        ledger = LedgerDB.open(f"sqlite:///{db_path}")
        try:
            sub = BillingSubscriber(nc.jetstream(), ledger, SubscriberOptions(batch=batch), BillingMetrics())
            t = time.perf_counter()
            await sub.start()
            await sub.run(once=True)
            folded = time.perf_counter() - t
            assert sub.tracker.seq == len(events), (sub.tracker.seq, len(events))
        finally:
            await sub.close()
            await nc.close()
            ledger.close()
        return appended, folded


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=1000, help="events per SQLite transaction")
    p.add_argument("--nats", type=int, default=0, metavar="N", help="also run the real subscriber on N events")
    p.add_argument("--profile", action="store_true", help="profile the fold+sqlite path")
    args = p.parse_args()

    t = time.perf_counter()
    events = realistic_log(args.events)
    raws = [codec.encode(e) for e in events]
    kinds: dict[str, int] = {}
    for e in events:
        kinds[type(e).__name__] = kinds.get(type(e).__name__, 0) + 1
    mix = ", ".join(f"{k} {v / len(events):.1%}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])[:5])
    span_h = (events[-1].at - T0) / 3600
    print(
        f"log: {len(events):,} events over {span_h:,.0f} h of event time, generated in {time.perf_counter() - t:.1f} s"
    )
    print(f"     mix: {mix}")

    seconds, ledger = fold_only(raws)
    rows = f"ledger rows: {len(ledger.usage):,} usage, {len(ledger.capacity):,} capacity"
    print(f"fold        {rate(len(raws), seconds)}   {rows}")

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "ledger.db"
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
        seconds, commits = fold_sqlite(raws, db, args.batch)
        if args.profile:
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        eps = len(raws) / seconds
        size = sum(f.stat().st_size for f in Path(tmp).iterdir()) / 1e6
        verdict = "ok" if eps >= 50_000 else "BELOW TARGET"
        detail = f"{commits:,} transactions of {args.batch}, {size:.0f} MB  [{verdict}: >= 50,000]"
        print(f"fold+sqlite {rate(len(raws), seconds)}   {detail}")
        if not same_ledger(ledger_from_db(db), ledger):
            print("MISMATCH: the SQLite ledger differs from the in-memory fold")
            return 1
        print("            the SQLite ledger equals the in-memory fold")
        ok = eps >= 50_000

        if args.nats:
            sub_events = events[: args.nats]
            appended, folded = asyncio.run(through_nats(sub_events, Path(tmp) / "nats-ledger.db", args.batch))
            print(f"nats append {rate(len(sub_events), appended)}")
            print(f"nats billing{rate(len(sub_events), folded)}   (fetch + decode + fold + SQLite + ack)")
            expected = fold_billing(enumerate(sub_events, start=1))
            total = Ledger()
            merge_into(total, expected.ledger)
            if not same_ledger(ledger_from_db(Path(tmp) / "nats-ledger.db"), total):
                print("MISMATCH: the subscriber's ledger differs from the in-memory fold")
                return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
