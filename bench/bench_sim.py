"""Scale benchmark of the scheduler core through `muster sim` (not a test).

Generates scenario files and runs them with the simulator in this process
(the same code path as `muster sim`, minus printing), then prints decisions/s
and wall time:

  (a) 5 cohorts x 6 queues, 15,000 Poisson arrivals at 90 % load    target < 15 s CPU
  (a3) (a) over three flavors (one block each: h100, a100, l4), every queue
      with quota in each (each flavor's adding up to its GPUs, as (a)'s to the
      cluster's), half trying them in the other order                target < 15 s CPU
  (a3-over) (a3) with every queue 8 on each flavor: quota 1.5x the GPUs
  (kueue) Kueue's test/performance/scheduler baseline, 1 CPU -> 1 GPU and
      1 ms -> 1 s: 5 cohorts x 6 queues (nominal 20, borrowing limit 100,
      reclaim_within_cohort Any, within_queue LowerPriority); per queue 350
      small 1-GPU jobs every 100 s running 200 s at priority 50, 100 medium
      5-GPU every 500 s running 500 s at 100, 50 large 20-GPU every 1,200 s
      running 1,000 s at 200, in pods of 1 GPU (Kueue's have no nodes);
      76 nodes of 8 GPUs                                           target < 15 s CPU
  (b) 1,000 queues in 10 cohorts, 50,000 jobs                       target < 30 s CPU
  (c) 10,000 nodes of 8 GPUs in blocks and racks, 20,000 gangs of
      1-64 pods, half with a required topology                      target >= 1,000 admissions/s
  scaling: (c)-shaped runs at 1,000 vs 10,000 nodes (cost per decision)
  depth: 100,000 pending jobs that do not fit, one release: the next cycle   target < 5 ms
  philly: the Microsoft Philly trace (if ../shared/traces/philly is present)

It first prints which core runs: compiled by mypyc (`make core`, as `make bench`
and `make test` build it) or Python (MUSTER_CORE=python, or no compiler).
Every shape prints CPU seconds (and admissions per CPU second: on a shared
machine wall time runs several times CPU time), evictions per admitted gang
and the GPU-hours of work lost to preemption (since each victim's last
checkpoint).

Usage: python bench/bench_sim.py [--only a,a3,a3-over,kueue,b,c,scale,depth,philly] [--jobs-scale 0.1] [--keep DIR]
"""

from __future__ import annotations

import argparse
import csv
import gc
import random
import sys
import tempfile
import time
from pathlib import Path

from muster.events.types import Event, JobAdmitted, JobInadmissible, JobPreempted, JobRejected
from muster.projections import CORE
from muster.replay.scenario import load
from muster.replay.simulator import simulate

ROOT = Path(__file__).resolve().parent.parent
PHILLY = ROOT.parent / "shared" / "traces" / "philly"

LOAD = 0.9
"""Offered load of (a) and (b): arrivals sized for this fraction of the cluster (--load)."""

PRIORITIES = """priority_classes:
  - {name: inference, value: 1000, preemptible: false}
  - {name: training, value: 100}
  - {name: scavenger, value: 0}
"""


def _queues_yaml(names: list[tuple[str, str]], nominal: int, policy: str) -> str:
    lines = ["queues:"]
    for name, cohort in names:
        lines.append(f"  - name: {name}")
        lines.append(f"    cohort: {cohort}")
        lines.append(f"    nominal: {{gpu: {nominal}}}")
        lines.append(f"    preemption: {policy}")
    return "\n".join(lines) + "\n"


def _write_csv(path: Path, rows: list[dict[str, object]]) -> None:
    cols = ["job", "submit", "queue", "gpus", "gpus_per_pod", "runtime"]
    cols += ["priority_class", "checkpoint_every", "topology"]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in cols})


def _scenario(
    d: Path,
    name: str,
    *,
    nodes_yaml: str,
    levels: list[str],
    cohorts: list[str],
    queues: list[tuple[str, str]],
    nominal: int,
    rows: list[dict[str, object]],
    policy: str = "{within_queue: LowerPriority, reclaim_within_cohort: Any}",
) -> Path:
    csv_path = d / f"{name}.csv"
    _write_csv(csv_path, rows)
    text = (
        f"topology:\n  levels: [{', '.join(levels)}]\n"
        + nodes_yaml
        + PRIORITIES
        + "cohorts:\n"
        + "".join(f"  - {{name: {c}}}\n" for c in cohorts)
        + _queues_yaml(queues, nominal, policy)
        + f"timeline_csv: {csv_path.name}\n"
    )
    path = d / f"{name}.yaml"
    path.write_text(text)
    return path


def _nodes(blocks: int, racks: int, per_rack: int) -> str:
    bl = ", ".join(f"b{i}" for i in range(blocks))
    rl = ", ".join(f"r{i}" for i in range(racks))
    return (
        "nodes:\n  - generate:\n"
        f"      count: {per_rack}\n"
        '      name: "{block}-{rack}-n{i}"\n'
        f"      labels: {{block: [{bl}], rack: [{rl}]}}\n"
        "      capacity: {gpu: 8}\n"
    )


def _jobs(
    rng: random.Random,
    n: int,
    queues: list[str],
    *,
    gpus_total: int,
    load: float,
    sizes: list[tuple[int, float]],
    runtime: tuple[int, int],
    topology_share: float = 0.0,
    topo_levels: tuple[str, ...] = ("block",),
) -> list[dict[str, object]]:
    """Poisson-ish arrivals sized so the offered load is `load` times the cluster."""
    mean_gpus = sum(s * w for s, w in sizes) / sum(w for _, w in sizes)
    mean_rt = (runtime[0] + runtime[1]) / 2
    rate = load * gpus_total / (mean_gpus * mean_rt)  # jobs per second
    t = 0.0
    rows = []
    weights = [w for _, w in sizes]
    for i in range(n):
        t += rng.expovariate(rate)
        gpus = rng.choices([s for s, _ in sizes], weights)[0]
        row: dict[str, object] = {
            "job": f"j{i}",
            "submit": int(t),
            "queue": rng.choice(queues),
            "gpus": gpus,
            "gpus_per_pod": 8,
            "runtime": rng.randint(*runtime),
            "priority_class": rng.choice(["training", "training", "scavenger"]),
        }
        if rng.random() < 0.5:
            row["checkpoint_every"] = 600
        if gpus >= 8 and rng.random() < topology_share:
            level = rng.choice(topo_levels)
            row["topology"] = f"required:{level}"
        rows.append(row)
    return rows


def run(path: Path) -> dict[str, float]:
    counts = {"admitted": 0, "preempted": 0, "inadmissible": 0, "rejected": 0, "events": 0, "lost_gpu_s": 0}

    def count(ev: Event) -> None:
        counts["events"] += 1
        if isinstance(ev, JobAdmitted):
            counts["admitted"] += 1
        elif isinstance(ev, JobPreempted):
            counts["preempted"] += 1
            counts["lost_gpu_s"] += ev.lost_gpu_seconds
        elif isinstance(ev, JobInadmissible):
            counts["inadmissible"] += 1
        elif isinstance(ev, JobRejected):
            counts["rejected"] += 1

    t0 = time.perf_counter()
    scenario = load(path)
    t1 = time.perf_counter()
    c1 = time.process_time()
    result = simulate(scenario, on_event=count, keep_events=False)
    c2 = time.process_time()
    t2 = time.perf_counter()
    decisions = counts["admitted"] + counts["preempted"] + counts["inadmissible"] + counts["rejected"]
    acct = result.accounting
    util = acct.used_gpu_seconds / acct.capacity_gpu_seconds if acct.capacity_gpu_seconds else 0.0
    return {
        **counts,
        "decisions": decisions,
        "cycles": result.cycles,
        "load_s": t1 - t0,
        "sim_s": t2 - t1,
        "cpu_s": c2 - c1,
        "evictions_per_gang": counts["preempted"] / counts["admitted"] if counts["admitted"] else 0.0,
        "lost_gpu_h": counts["lost_gpu_s"] / 3600,
        "wall_s": t2 - t0,
        "decisions_per_s": decisions / (t2 - t1) if t2 > t1 else 0.0,
        "admissions_per_s": counts["admitted"] / (t2 - t1) if t2 > t1 else 0.0,
        "admissions_per_cpu_s": counts["admitted"] / (c2 - c1) if c2 > c1 else 0.0,
        "utilization": util,
        "nodes": len(result.state.nodes),
        "jobs": len(result.state.jobs),
    }


def case_a(d: Path, scale: float) -> Path:
    rng = random.Random(1)
    cohorts = [f"c{i}" for i in range(5)]
    queues = [(f"c{i}-q{j}", f"c{i}") for i in range(5) for j in range(6)]
    nodes = _nodes(3, 5, 4)  # 60 nodes, 480 GPUs; 30 queues x 16 nominal
    rows = _jobs(
        rng,
        int(15_000 * scale),
        [q for q, _ in queues],
        gpus_total=480,
        load=LOAD,
        sizes=[(1, 0.6), (8, 0.3), (32, 0.1)],
        runtime=(60, 900),
    )
    return _scenario(
        d, "a", nodes_yaml=nodes, levels=["block", "rack"], cohorts=cohorts, queues=queues, nominal=16, rows=rows
    )


def case_flavors(d: Path, scale: float, over: bool = False) -> Path:
    """(a) with a resource group over three flavors (one block each) instead of one GPU pool.

    As in (a), the queues' nominal quota adds up to the GPUs: each flavor's to its block's 160 (every
    queue 16 in all, 6 on one flavor and 5 on the others, in turn). `over` is the shape (a3) had before,
    every queue 8 on each flavor: 1.5x each flavor's GPUs, more contended than (a) by construction."""
    path = case_a(d, scale)
    text = path.read_text()
    head, _, rest = text.partition("queues:\n")
    queues, _, tail = rest.partition("timeline_csv:")
    flavors = "flavors:\n" + "".join(
        f"  - {{name: {f}, node_labels: {{block: {b}}}}}\n" for f, b in (("h100", "b0"), ("a100", "b1"), ("l4", "b2"))
    )
    names = ["h100", "a100", "l4"]
    out = []
    n = 0
    for i, line in enumerate(queues.splitlines()):
        if "nominal:" in line:
            quota = [8, 8, 8] if over else [6 if k == n % 3 else 5 for k in range(3)]
            order = list(zip(names, quota, strict=True))
            ranked = order if (i // 4) % 2 == 0 else order[::-1]
            fl = ", ".join(f"{{name: {f}, nominal: {{gpu: {q}}}}}" for f, q in ranked)
            out.append(f"    resource_groups: [{{covered: [gpu], flavors: [{fl}]}}]")
            n += 1
        else:
            out.append(line)
    flavored = d / ("a3-over.yaml" if over else "a3.yaml")
    flavored.write_text(head + flavors + "queues:\n" + "\n".join(out) + "\ntimeline_csv:" + tail)
    return flavored


def case_kueue(d: Path, scale: float) -> Path:
    """Kueue's scheduler perf baseline (see the module docstring); `scale` shrinks the job counts."""
    cohorts = [f"c{i}" for i in range(5)]
    queues = [(f"c{i}-q{j}", f"c{i}") for i in range(5) for j in range(6)]
    classes = [
        # (name, count, every s, runtime s, priority class, GPUs, GPUs per pod)
        ("small", 350, 100, 200, "p50", 1, 1),
        ("medium", 100, 500, 500, "p100", 5, 1),
        ("large", 50, 1200, 1000, "p200", 20, 1),
    ]
    rows: list[dict[str, object]] = []
    for q, _ in queues:
        for name, count, every, runtime, prio, gpus, per_pod in classes:
            for i in range(max(1, int(count * scale))):
                row = {"job": f"{q}-{name}-{i}", "submit": i * every, "queue": q, "gpus": gpus}
                row |= {"gpus_per_pod": per_pod, "runtime": runtime, "priority_class": prio}
                rows.append(row)
    rows.sort(key=lambda r: (int(str(r["submit"])), str(r["job"])))
    csv_path = d / "kueue.csv"
    _write_csv(csv_path, rows)
    lines = ["queues:"]
    for name, cohort in queues:
        lines.append(f"  - {{name: {name}, cohort: {cohort}, nominal: {{gpu: 20}}, borrowing_limit: {{gpu: 100}},")
        lines.append("     preemption: {within_queue: LowerPriority, reclaim_within_cohort: Any}}")
    text = (
        "topology:\n  levels: [block, rack]\n"
        + _nodes(1, 19, 4)  # 76 nodes, 608 GPUs; 30 queues x 20 nominal
        + "priority_classes:\n  - {name: p50, value: 50}\n  - {name: p100, value: 100}\n  - {name: p200, value: 200}\n"
        + "cohorts:\n"
        + "".join(f"  - {{name: {c}}}\n" for c in cohorts)
        + "\n".join(lines)
        + f"\ntimeline_csv: {csv_path.name}\n"
    )
    path = d / "kueue.yaml"
    path.write_text(text)
    return path


def depth(pending: int = 100_000) -> dict[str, float]:
    """`pending` jobs that cannot fit wait in one queue; one job finishes: how long the next cycle takes."""
    from muster.events.types import JobFinished, JobSubmitted, NodeAdded, PodSet, QueueConfigured, SchedulerConfigured
    from muster.projections.cluster import evolve
    from muster.projections.scheduler import decide
    from muster.projections.state import ClusterState

    state = ClusterState()
    setup: list[Event] = [
        SchedulerConfigured(at=0, levels=["rack"]),
        QueueConfigured(at=0, name="q", nominal={"gpu": 64}),
    ]
    setup += [NodeAdded(at=0, node=f"n{i}", labels={"rack": f"r{i // 4}"}, capacity={"gpu": 8}) for i in range(8)]
    setup.append(JobSubmitted(at=0, job="runner", queue="q", podsets=[PodSet(name="w", count=8, requests={"gpu": 8})]))
    for ev in setup:
        evolve(state, ev)
    for ev in decide(state, 0):
        evolve(state, ev)
    for i in range(pending):
        evolve(
            state, JobSubmitted(at=1, job=f"w{i}", queue="q", podsets=[PodSet(name="w", count=1, requests={"gpu": 8})])
        )
    # each timed cycle starts from a collected heap: the 100,000 events made just before it
    # would otherwise trigger a full collection inside it (the collector's cost, not the cycle's)
    gc.collect()
    t0 = time.perf_counter()
    first = decide(state, 1)
    t1 = time.perf_counter()
    for ev in first:
        evolve(state, ev)
    gc.collect()
    t2 = time.perf_counter()
    idle = decide(state, 1)
    t3 = time.perf_counter()
    evolve(state, JobFinished(at=2, job="runner"))
    gc.collect()
    t4, c4 = time.perf_counter(), time.process_time()
    after = decide(state, 2)
    t5, c5 = time.perf_counter(), time.process_time()
    return {
        "pending": pending,
        "first_s": t1 - t0,
        "idle_ms": (t3 - t2) * 1000,
        "after_release_ms": (t5 - t4) * 1000,
        "after_release_cpu_ms": (c5 - c4) * 1000,
        "first_decisions": len(first),
        "idle_decisions": len(idle),
        "after_decisions": len(after),
    }


def case_b(d: Path, scale: float) -> Path:
    rng = random.Random(2)
    cohorts = [f"c{i}" for i in range(10)]
    queues = [(f"c{i}-q{j}", f"c{i}") for i in range(10) for j in range(100)]
    nodes = _nodes(10, 10, 10)  # 1,000 nodes, 8,000 GPUs; 1,000 queues x 8 nominal
    rows = _jobs(
        rng,
        int(50_000 * scale),
        [q for q, _ in queues],
        gpus_total=8000,
        load=LOAD,
        sizes=[(1, 0.6), (8, 0.3), (32, 0.1)],
        runtime=(60, 900),
    )
    return _scenario(
        d, "b", nodes_yaml=nodes, levels=["block", "rack"], cohorts=cohorts, queues=queues, nominal=8, rows=rows
    )


def case_c(d: Path, scale: float, nodes_total: int = 10_000, name: str = "c") -> Path:
    rng = random.Random(3)
    blocks = max(1, nodes_total // 1000)
    nodes = _nodes(blocks, 25, 40)  # 1,000 nodes per block, 40 per rack
    queues = [(f"team-{i}", "org") for i in range(8)]
    gpus = blocks * 1000 * 8
    sizes = [(8 * p, w) for p, w in ((1, 0.3), (2, 0.15), (4, 0.15), (8, 0.15), (16, 0.1), (32, 0.1), (64, 0.05))]
    rows = _jobs(
        rng,
        int(20_000 * scale),
        [q for q, _ in queues],
        gpus_total=gpus,
        load=1.0,
        sizes=sizes,
        runtime=(300, 3600),
        topology_share=0.5,
        topo_levels=("block", "rack"),
    )
    # a 64-pod gang cannot fit one 40-node rack: such gangs ask for a block
    for r in rows:
        if r.get("topology") == "required:rack" and int(str(r["gpus"])) > 40 * 8:
            r["topology"] = "required:block"
    return _scenario(
        d,
        name,
        nodes_yaml=nodes,
        levels=["block", "rack"],
        cohorts=["org"],
        queues=queues,
        nominal=gpus // 8,
        rows=rows,
        policy="{within_queue: LowerPriority, reclaim_within_cohort: LowerPriority}",
    )


def case_philly(d: Path, scale: float) -> Path | None:
    src = PHILLY / "philly.csv"
    if not src.exists():
        return None
    with src.open() as f:
        raw = list(csv.DictReader(f))
    raw.sort(key=lambda r: r["timestamp"])
    raw = raw[: int(len(raw) * scale)] if scale < 1 else raw
    import datetime as dt

    t0 = dt.datetime.fromisoformat(raw[0]["timestamp"])
    vcs = sorted({r["cluster"] for r in raw})
    rows = []
    for i, r in enumerate(raw):
        gpus = int(r["num_gpus"])
        per_pod = 8 if gpus >= 8 else max(gpus, 1)
        if gpus >= 8 and gpus % 8:
            per_pod = gpus  # odd sizes: one pod
        rows.append(
            {
                "job": f"p{i}",
                "submit": int((dt.datetime.fromisoformat(r["timestamp"]) - t0).total_seconds()),
                "queue": f"vc-{r['cluster']}",
                "gpus": gpus,
                "gpus_per_pod": per_pod,
                "runtime": int(float(r["duration"])),
            }
        )
    # a shrunken cluster for contention: 64 nodes of 8 GPUs in 2 blocks
    nominal = 512 // len(vcs)
    return _scenario(
        d,
        "philly",
        nodes_yaml=_nodes(2, 4, 8),
        levels=["block", "rack"],
        cohorts=["org"],
        queues=[(f"vc-{v}", "org") for v in vcs],
        nominal=nominal,
        rows=rows,
    )


def fmt_row(name: str, r: dict[str, float], target: str) -> str:
    return (
        f"{name:<14} jobs={int(r['jobs']):>6} nodes={int(r['nodes']):>6} admitted={int(r['admitted']):>6} "
        f"preempted={int(r['preempted']):>5} decisions={int(r['decisions']):>7} cycles={int(r['cycles']):>7} "
        f"sim={r['sim_s']:7.2f}s wall={r['wall_s']:7.2f}s decisions/s={r['decisions_per_s']:9.0f} "
        f"admissions/s={r['admissions_per_s']:8.0f} (per CPU s {r['admissions_per_cpu_s']:.0f}) "
        f"util={r['utilization'] * 100:5.1f}% cpu={r['cpu_s']:7.2f}s "
        f"evictions/gang={r['evictions_per_gang']:.3f} lost={r['lost_gpu_h']:.1f} GPU-h  {target}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="a,a3,a3-over,kueue,b,c,scale,depth,philly")
    ap.add_argument("--jobs-scale", type=float, default=1.0, help="fraction of the job counts (for a quick look)")
    ap.add_argument("--keep", help="write the generated scenarios here instead of a temp dir")
    ap.add_argument("--load", type=float, default=0.9, help="offered load of (a) and (b) (1.1 = overload)")
    args = ap.parse_args(argv)
    global LOAD
    LOAD = args.load
    only = set(args.only.split(","))
    print(f"core: {CORE}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(args.keep) if args.keep else Path(tmp)
        d.mkdir(parents=True, exist_ok=True)
        if "a" in only:
            print(fmt_row("(a) 30 queues", run(case_a(d, args.jobs_scale)), "target cpu < 15 s"), flush=True)
        if "a3" in only:
            print(fmt_row("(a3) 3 flavors", run(case_flavors(d, args.jobs_scale)), "target cpu < 15 s"), flush=True)
        if "a3-over" in only:
            over = run(case_flavors(d, args.jobs_scale, over=True))
            print(fmt_row("(a3-over)", over, "quota 1.5x each flavor's GPUs; no target"), flush=True)
        if "kueue" in only:
            print(fmt_row("kueue baseline", run(case_kueue(d, args.jobs_scale)), "target cpu < 15 s"), flush=True)
        if "b" in only:
            print(fmt_row("(b) 1k queues", run(case_b(d, args.jobs_scale)), "target cpu < 30 s"), flush=True)
        if "c" in only:
            print(fmt_row("(c) 10k nodes", run(case_c(d, args.jobs_scale)), "target >= 1,000 admissions/s"), flush=True)
        if "scale" in only:
            small = run(case_c(d, args.jobs_scale * 0.25, 1000, "scale-1k"))
            large = run(case_c(d, args.jobs_scale * 0.25, 10_000, "scale-10k"))
            print(fmt_row("scale 1k", small, ""), flush=True)
            print(fmt_row("scale 10k", large, ""), flush=True)
            per_small = small["sim_s"] / max(1, small["decisions"]) * 1e6
            per_large = large["sim_s"] / max(1, large["decisions"]) * 1e6
            print(
                f"cost per decision: {per_small:.0f} us at 1k nodes, {per_large:.0f} us at 10k nodes "
                f"(x{per_large / per_small:.2f} for x10 nodes)",
                flush=True,
            )
        if "depth" in only:
            r = depth(max(1, int(100_000 * args.jobs_scale)))
            print(
                f"depth          pending={int(r['pending'])} first cycle {r['first_s']:.2f}s "
                f"({int(r['first_decisions'])} decisions), idle cycle {r['idle_ms']:.2f} ms "
                f"({int(r['idle_decisions'])}), cycle after one release {r['after_release_ms']:.2f} ms "
                f"({r['after_release_cpu_ms']:.2f} ms CPU) "
                f"({int(r['after_decisions'])} decisions)  target < 5 ms",
                flush=True,
            )
        if "philly" in only:
            p = case_philly(d, args.jobs_scale)
            if p is None:
                print("philly: trace not found, skipped", flush=True)
            else:
                print(fmt_row("philly", run(p), "64 nodes, 15 VC queues"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
