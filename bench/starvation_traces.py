"""The traces `bench_starvation` runs: Philly's first jobs by submission and a seeded synthetic mix of gang sizes.

A trace is its jobs (submission, queue, GPUs, runtime) and each queue's nominal
quota; the cluster has the quotas' sum in nodes of 8 GPUs. `bench_starvation`'s
docstring says how each is built.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import random
from dataclasses import dataclass
from pathlib import Path

PHILLY = Path(__file__).resolve().parents[2] / "shared" / "traces" / "philly"


@dataclass(frozen=True)
class TraceJob:
    job: str
    submit: int
    queue: str
    gpus: int
    runtime: int


@dataclass(frozen=True)
class Trace:
    name: str
    jobs: list[TraceJob]
    nominal: dict[str, int]
    """Queue -> nominal GPUs; the cluster has their sum, in nodes of 8 GPUs."""
    note: str


def philly(jobs: int, shrink: float) -> Trace | None:
    src, vcs = PHILLY / "philly.csv", PHILLY / "vc_nodes.csv"
    if not src.exists() or not vcs.exists():
        return None
    with vcs.open() as f:
        nodes = {r["vc"]: max(1, round(int(r["node num"]) * shrink)) for r in csv.DictReader(f)}
    nominal = {f"vc-{vc}": n * 8 for vc, n in sorted(nodes.items())}
    total = sum(nominal.values())
    with src.open() as f:
        raw = sorted(csv.DictReader(f), key=lambda r: r["timestamp"])
    t0 = dt.datetime.fromisoformat(raw[0]["timestamp"])
    out: list[TraceJob] = []
    dropped = 0
    for i, r in enumerate(raw):
        if len(out) >= jobs:
            break
        gpus = int(r["num_gpus"])
        if r["cluster"] not in nodes or gpus > total or gpus < 1:
            dropped += 1
            continue
        submit = int((dt.datetime.fromisoformat(r["timestamp"]) - t0).total_seconds())
        out.append(TraceJob(f"p{i}", submit, f"vc-{r['cluster']}", gpus, max(1, int(float(r["duration"])))))
    note = f"{len(out)} jobs ({dropped} left out), {total} GPUs, shrink {shrink}, {_load(out, total):.2f} offered load"
    return Trace("philly", out, nominal, note)


def synthetic(jobs: int, load_: float, seed: int = 7) -> Trace:
    rng = random.Random(seed)
    queues = [f"team-{c}" for c in "abcd"]
    nominal = {q: 64 for q in queues}
    total = sum(nominal.values())
    sizes = [(1, 40), (2, 10), (4, 10), (8, 20), (16, 10), (32, 6), (64, 4)]
    mean_gpus = sum(s * w for s, w in sizes) / sum(w for _, w in sizes)
    mu, sigma = 7.3, 1.0
    mean_runtime = math.exp(mu + sigma * sigma / 2)
    rate = load_ * total / (mean_gpus * mean_runtime)
    t = 0.0
    out: list[TraceJob] = []
    for i in range(jobs):
        t += rng.expovariate(rate)
        gpus = rng.choices([s for s, _ in sizes], [w for _, w in sizes])[0]
        runtime = max(60, int(rng.lognormvariate(mu, sigma)))
        out.append(TraceJob(f"s{i}", int(t), rng.choice(queues), gpus, runtime))
    note = f"{len(out)} jobs, {total} GPUs, seed {seed}, {_load(out, total):.2f} offered load"
    return Trace("synthetic", out, nominal, note)


def _load(jobs: list[TraceJob], gpus: int) -> float:
    if not jobs:
        return 0.0
    span = max(1, max(j.submit for j in jobs) - min(j.submit for j in jobs))
    return sum(j.gpus * j.runtime for j in jobs) / (gpus * span)


def gpus_per_pod(gpus: int) -> int:
    """GPUs per pod of a gang on 8-GPU nodes: the largest divisor of its size up to 8 (12 GPUs: 3 pods of 4)."""
    return max(d for d in range(1, min(gpus, 8) + 1) if gpus % d == 0)


def demand(trace: Trace) -> dict[str, float]:
    """Each queue's offered load on its own nominal quota over the trace: above 1, it runs beyond its share
    only on borrowed room, which a quota lends only while others leave it idle."""
    span = max(1, max(j.submit for j in trace.jobs) - min(j.submit for j in trace.jobs))
    work: dict[str, int] = {}
    for j in trace.jobs:
        work[j.queue] = work.get(j.queue, 0) + j.gpus * j.runtime
    return {q: work.get(q, 0) / (g * span) for q, g in trace.nominal.items()}
