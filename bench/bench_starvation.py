"""Does a big gang starve? Queueing delay per policy on the Philly trace and on a synthetic trace of mixed gang sizes.

Prints, per trace and policy, the queueing delay (first admission less submission;
a job still pending at the end counts with what it waited so far, see
`replay/waits.py`): average, p50, p99 and maximum over all jobs, and the same for
the big gangs (32 GPUs or more), the average per gang size class with its share of
all the waiting (who pays), the queues offering more than their nominal quota apart
from the others when there are such, for a policy that reserves how its reservations'
hosts drained against the hosts that drained first (`Drains`), then a GOALS block:
issue 12's goals, met or not, for `reserve` and `reserve+limits`. Not a test: it
prints numbers and exits 0.

Policies:
- `default`: `muster sim` with today's defaults (`best_effort_fifo` everywhere);
- `strict_fifo`: the same with every queue `strict_fifo`;
- `reserve`: `best_effort_fifo` with every queue `reserve_after` (the trace's
  `RECOMMENDED`, or `--reserve-after`; reservations, `projections/reservations.py`),
  no job declaring a time limit;
- `reserve+limits`: the same with every job declaring a limit of its runtime
  times `--limit-factor` (so it is never ended by it), which backfill reads;
- `reserve+limits+shortest`: `reserve+limits` with every queue
  `shortest_limit_first` (a queue's jobs of equal priority by declared limit,
  as Slurm's multifactor priority weighs size and age);
- `fifo`, `sjf`: reference simulators over one pool of the cluster's GPUs, no
  quotas and no placement: `fifo` admits in submission order and its head
  blocks everyone (no backfill); `sjf` admits the shortest job that fits first
  and passes those that do not. The issue's goal lines were set against these.
- `fifo-nodes`, `sjf-nodes`: the same orders on the cluster's nodes (pods of
  `gpus_per_pod` GPUs, each on the tightest 8-GPU node that holds it, the gang all
  or nothing; no quota): a 64-GPU gang needs 8 free nodes, as in muster and in
  any real FIFO or SJF scheduler. GOALS prints every goal against both.
- `easy-nodes`: the textbook answer, EASY backfill on the nodes (`run_reference_easy`):
  shortest declared limit first, and the oldest job past `reserve_after` (the
  `reserve+limits` one) blocks every job whose limit does not end by its shadow
  time. Not a goal line: it shows where a simpler scheduler lands on the same
  avg / max trade-off (`--sweep` prints it beside muster's at each value).

Traces:
- `philly`: ../shared/traces/philly (skipped when absent), the first `--jobs`
  jobs by submission, one queue per virtual cluster with `nominal` = its GPUs
  (vc_nodes.csv x 8, times `--shrink` for contention), all in one cohort; jobs
  of virtual clusters without nodes, and gangs larger than the cluster, are
  left out (counted in the header line);
- `synthetic`: 4 queues of 64 GPUs in one cohort on 32 nodes of 8 GPUs, gangs
  of 1 to 64 GPUs (most small), seeded arrivals at offered load `--load`.

Usage: python bench/bench_starvation.py [--only philly,synthetic] [--jobs N] [--shrink F] [--load L]
       [--policies default,reserve,...] [--reserve-after S] [--limit-factor F] [--starved N] [--sweep S,S,...]
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from starvation_references import run_reference, run_reference_easy, run_reference_nodes
from starvation_traces import PHILLY, Trace, demand, gpus_per_pod, philly, synthetic

from muster.events import types as events
from muster.events.types import Event, JobAdmitted, JobInadmissible, ReservationMade, ReservationReleased
from muster.replay.scenario import load
from muster.replay.simulator import simulate
from muster.replay.waits import SIZE_CLASSES, Wait, WaitStats, run_waits, size_class, stats

BIG = 32
"""Gangs of at least this many GPUs are the ones that starve."""


@dataclass(frozen=True)
class Recommended:
    """The `reserve_after` (seconds) README recommends for a trace: without declared limits a reservation's
    start is unknown and its room idles until it fits, so it is kept for the jobs that starve."""

    no_limits: int
    limits: int


RECOMMENDED = {"philly": Recommended(3600, 3600), "synthetic": Recommended(21600, 600)}
"""Trace -> what `reserve` and `reserve+limits` run."""


# ---------------------------------------------------------------- policies


@dataclass
class Story:
    """What one job went through in a `muster sim` run, for `--starved`."""

    admitted: int | None = None
    reason: str = ""
    """Its last `JobInadmissible` reason."""
    reserved: int | None = None
    """When it was first reserved for."""
    promised: int | None = None
    """The expected start of its first reservation."""
    moves: int = 0
    """Its reservations replaced."""


@dataclass
class Drains:
    """How long the hosts of each job's first reservation took to drain (the latest end, by the trace's runtimes,
    of the jobs running on them when it was made), against the same number of hosts of the cluster that drained
    first: the best a plan could have picked, known only afterwards (without limits a plan guesses which end first)."""

    held: list[int]
    best: list[int]

    def line(self) -> str:
        if not self.held:
            return "no reservations"
        return (
            f"{len(self.held)} first reservations: their hosts drained in avg {sum(self.held) / len(self.held):,.0f} / "
            f"max {max(self.held):,} s; the hosts that drained first in avg {sum(self.best) / len(self.best):,.0f} / "
            f"max {max(self.best):,} s"
        )


class Occupancy:
    """Which jobs run on which host in a `muster sim` run, and when each ends by its runtime (`Drains`)."""

    def __init__(self, runtime: dict[str, int]) -> None:
        self.runtime = runtime
        self.on: dict[str, dict[str, int]] = {}
        """Host -> job -> its end."""
        self.hosts_of: dict[str, set[str]] = {}
        self.drains = Drains([], [])

    def admitted(self, ev: JobAdmitted) -> None:
        hosts = self.hosts_of[ev.job] = set(ev.placement.values())
        for h in hosts:
            self.on.setdefault(h, {})[ev.job] = ev.at + self.runtime[ev.job]

    def ended(self, job: str) -> None:
        for h in self.hosts_of.pop(job, ()):
            self.on[h].pop(job, None)

    def reserved(self, ev: ReservationMade, hosts: list[str]) -> None:
        drain = {h: max([ev.at, *self.on.get(h, {}).values()]) - ev.at for h in hosts}
        self.drains.held.append(max(drain[h] for h in ev.nodes))
        self.drains.best.append(sorted(drain.values())[len(ev.nodes) - 1])


@dataclass
class Run:
    """One policy's waits, and for `muster sim` how the nominal-quota guarantee fared, each job's story and how
    its reservations drained."""

    waits: list[Wait]
    guarantee: Guarantee | None = None
    stories: dict[str, Story] | None = None
    drains: Drains | None = None


@dataclass
class Guarantee:
    """Jobs reserved for within their queue's nominal quota with a known expected start, and how many of
    them were admitted after it (the spec's bound: the longest running limit in their way)."""

    jobs: int = 0
    late: int = 0
    worst: int = 0
    """The most seconds one was admitted after its expected start."""


def run_muster(
    trace: Trace, d: Path, strategy: str, reserve_after: int | None = None, limit_factor: float | None = None
) -> Run:
    """`muster sim` on the trace, every queue with `strategy` (and `reserve_after`); with `limit_factor`
    every job declares a time limit of its runtime times that factor (rounded up)."""
    name = f"{trace.name}-{strategy}-{reserve_after}-{limit_factor}"
    rows = d / f"{name}.csv"
    with rows.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job", "submit", "queue", "gpus", "gpus_per_pod", "runtime", "limit"])
        for j in trace.jobs:
            limit = math.ceil(j.runtime * limit_factor) if limit_factor is not None else ""
            w.writerow([j.job, j.submit, j.queue, j.gpus, gpus_per_pod(j.gpus), j.runtime, limit])
    nodes = sum(trace.nominal.values()) // 8
    reserve = f", reserve_after: {reserve_after}" if reserve_after is not None else ""
    queues = "".join(
        f"  - {{name: {q}, cohort: org, nominal: {{gpu: {g}}}, queueing_strategy: {strategy}{reserve}}}\n"
        for q, g in sorted(trace.nominal.items())
    )
    text = (
        f'nodes:\n  - generate: {{count: {nodes}, name: "n{{i}}", capacity: {{gpu: 8}}}}\n'
        f"cohorts:\n  - {{name: org}}\nqueues:\n{queues}timeline_csv: {rows.name}\n"
    )
    path = d / f"{name}.yaml"
    path.write_text(text)
    promised: dict[str, int] = {}
    started: dict[str, int] = {}
    stories: dict[str, Story] = {}
    hosts = [f"n{i}" for i in range(nodes)]
    occupancy = Occupancy({j.job: j.runtime for j in trace.jobs})

    def watch(ev: Event) -> None:
        if isinstance(ev, ReservationMade):
            story = stories.setdefault(ev.job, Story())
            if story.reserved is None:
                story.reserved, story.promised = ev.at, ev.expected_start
                occupancy.reserved(ev, hosts)
            nominal = ev.reason == "within its queue's nominal quota"
            if nominal and ev.job not in promised and ev.expected_start is not None:
                promised[ev.job] = ev.expected_start
        elif isinstance(ev, JobAdmitted):
            occupancy.admitted(ev)
            story = stories.setdefault(ev.job, Story())
            if story.admitted is None:
                story.admitted = ev.at
            if ev.job in promised:
                started.setdefault(ev.job, ev.at)
        elif isinstance(ev, JobInadmissible):
            stories.setdefault(ev.job, Story()).reason = ev.reason
        elif isinstance(ev, ReservationReleased) and ev.reason == "replaced":
            stories.setdefault(ev.job, Story()).moves += 1
        elif isinstance(ev, events.JobFinished | events.JobFailed | events.JobPreempted):
            occupancy.ended(ev.job)

    waits = run_waits(simulate(load(path), keep_events=False, on_event=watch))
    g = Guarantee(jobs=len(promised))
    for job, start in promised.items():
        at = started.get(job)
        if at is None or at > start:
            g.late += 1
            g.worst = max(g.worst, (at if at is not None else start) - start)
    return Run(waits, g, stories, occupancy.drains)


# ---------------------------------------------------------------- report


def _fmt(s: WaitStats) -> str:
    return f"avg={s.avg:>10,.0f} p50={s.p50:>9,} p99={s.p99:>10,} max={s.max:>10,} pending={s.waiting}"


def by_size(waits: list[Wait]) -> str:
    """Average wait per gang size class and each class's share of all the waiting: who pays for a policy."""
    total = sum(w.seconds for w in waits) or 1
    cells = []
    for name, _ in SIZE_CLASSES:
        ws = [w.seconds for w in waits if size_class(w.gpus) == name]
        if ws:
            cells.append(f"{name}: {sum(ws) / len(ws):,.0f} ({sum(ws) / total:.0%})")
    return "avg by GPUs: " + ", ".join(cells)


def by_demand(waits: list[Wait], over: set[str]) -> str:
    """The waits of the queues that offer no more than their nominal quota, and of those that offer more."""
    mine = stats(w for w in waits if w.queue not in over)
    theirs = stats(w for w in waits if w.queue in over)
    return (
        f"queues within their quota: avg {mine.avg:,.0f} / max {mine.max:,} s; "
        f"queues over it ({len(over)}): avg {theirs.avg:,.0f} / max {theirs.max:,} s"
    )


def starved(trace: Trace, run: Run, n: int) -> None:
    """The `n` longest waits of a `muster sim` run, each with what it went through (`--starved`), after a line
    that splits them: how long they waited before their first reservation and after it."""
    if not run.stories or n <= 0:
        return
    stories = run.stories
    end = max((s.admitted or 0 for s in stories.values()), default=0)
    waits = []
    for j in trace.jobs:
        at = stories.get(j.job, Story()).admitted
        waits.append(((at if at is not None else max(end, j.submit)) - j.submit, j))
    waits.sort(key=lambda w: (-w[0], w[1].submit))
    # where the worst waits come from: before their first reservation, or after it (the drain and the stack)
    split = [
        (s.reserved - j.submit, wait - (s.reserved - j.submit))
        for wait, j in waits[:n]
        if (s := stories.get(j.job)) and s.reserved is not None
    ]
    if split:
        before, after = [b for b, _ in split], [a for _, a in split]
        print(
            f"    the {n} longest: {len(split)} reserved for, avg {sum(before) / len(split):,.0f} s before their first "
            f"reservation (max {max(before):,}), {sum(after) / len(split):,.0f} s after it (max {max(after):,})",
            flush=True,
        )
    for wait, j in waits[:n]:
        s = stories.get(j.job, Story())
        reserved = f"reserved after {s.reserved - j.submit:,} s" if s.reserved is not None else "never reserved"
        if s.promised is not None:
            reserved += f", first expected start +{s.promised - j.submit:,} s"
        if s.reserved is not None and s.admitted is not None:
            reserved += f", started {s.admitted - s.reserved:,} s after it"  # the drain of the room it held
        print(
            f"    {j.job} {j.queue} {j.gpus} GPUs runtime {j.runtime:,} s: waited {wait:,} s; {reserved}, "
            f"{s.moves} moves; last reason: {s.reason or '-'}",
            flush=True,
        )


def report(
    trace: Trace, d: Path, policies: list[str], after: Recommended, limit_factor: float, starved_n: int = 0
) -> None:
    print(
        f"{trace.name}: {trace.note}; reserve_after {after.no_limits} s (reserve), {after.limits} s "
        f"(reserve+limits), limits {limit_factor}x runtime",
        flush=True,
    )
    runners: dict[str, Callable[[], Run]] = {
        "default": lambda: run_muster(trace, d, "best_effort_fifo"),
        "strict_fifo": lambda: run_muster(trace, d, "strict_fifo"),
        "reserve": lambda: run_muster(trace, d, "best_effort_fifo", after.no_limits),
        "reserve+limits": lambda: run_muster(trace, d, "best_effort_fifo", after.limits, limit_factor),
        "reserve+limits+shortest": lambda: run_muster(trace, d, "shortest_limit_first", after.limits, limit_factor),
        "fifo": lambda: Run(run_reference(trace, "fifo")),
        "sjf": lambda: Run(run_reference(trace, "sjf")),
        "fifo-nodes": lambda: Run(run_reference_nodes(trace, "fifo")),
        "sjf-nodes": lambda: Run(run_reference_nodes(trace, "sjf")),
        "easy-nodes": lambda: Run(run_reference_easy(trace, after.limits, limit_factor)),
    }
    over = {q for q, load in demand(trace).items() if load > 1}
    if over:
        shown = ", ".join(f"{q} {load:.2f}x" for q, load in sorted(demand(trace).items()) if q in over)
        print(f"  queues offering more than their nominal quota over the trace: {shown}", flush=True)
    runs: dict[str, Run] = {}
    for name in policies:
        c0 = time.process_time()
        run = runs[name] = runners[name]()
        cpu = time.process_time() - c0
        big = stats(w for w in run.waits if w.gpus >= BIG)
        print(f"  {name:<14} all: {_fmt(stats(run.waits))}  cpu={cpu:6.1f}s", flush=True)
        print(f"  {'':<14} >={BIG} GPUs: {_fmt(big)}  ({big.jobs} gangs)", flush=True)
        print(f"  {'':<14} {by_size(run.waits)}", flush=True)
        if over:
            print(f"  {'':<14} {by_demand(run.waits, over)}", flush=True)
        if run.drains is not None and run.drains.held:
            print(f"  {'':<14} drains: {run.drains.line()}", flush=True)
        starved(trace, run, starved_n)
    goals(trace.name, runs)


def sweep(trace: Trace, d: Path, values: list[int], limit_factor: float) -> None:
    """`reserve_after` is a knob: the trade-off it sets between average and maximum wait, per value (`--sweep`)."""
    print(
        f"  SWEEP ({trace.name}) reserve_after: avg / max wait of reserve, reserve+limits, easy-nodes (the same wait "
        "before a job blocks, the same limits)",
        flush=True,
    )
    for after in values:
        c0 = time.process_time()
        plain = stats(run_muster(trace, d, "best_effort_fifo", after).waits)
        limits = stats(run_muster(trace, d, "best_effort_fifo", after, limit_factor).waits)
        cpu = time.process_time() - c0
        easy = stats(run_reference_easy(trace, after, limit_factor))
        print(
            f"    {after:>9,} s: reserve {plain.avg:>9,.0f} / {plain.max:>10,}   "
            f"reserve+limits {limits.avg:>9,.0f} / {limits.max:>10,}   "
            f"easy-nodes {easy.avg:>9,.0f} / {easy.max:>10,}   cpu={cpu:6.1f}s",
            flush=True,
        )


def goals(name: str, runs: dict[str, Run]) -> None:
    """Issue 12's goals, met or not, for the recommended policy without (`reserve`) and with declared
    limits (`reserve+limits`); a goal whose runs were not made says so."""
    figures = {k: stats(r.waits) for k, r in runs.items()}
    print(f"  GOALS ({name})", flush=True)

    def line(goal: str, policy: str, ref: str, ok: Callable[[WaitStats, WaitStats], bool], shown: str) -> None:
        if policy not in figures or ref not in figures:
            print(f"    {goal}: not run (needs {policy} and {ref})", flush=True)
            return
        mine, theirs = figures[policy], figures[ref]
        verdict = "met" if ok(mine, theirs) else "NOT MET"
        a, b = (mine.max, theirs.max) if shown == "max" else (mine.avg, theirs.avg)
        print(f"    {goal}: {verdict} ({policy} {a:,.0f} s vs {ref} {b:,.0f} s)", flush=True)

    shortest = "reserve+limits+shortest"
    # each goal against both references: one pool of GPUs (the lines), and pods on nodes
    for fifo, sjf in (("fifo", "sjf"), ("fifo-nodes", "sjf-nodes")):
        line("max wait <= FIFO's, no limits", "reserve", fifo, lambda m, t: m.max <= t.max, "max")
        line("avg wait <= 0.6x FIFO's, no limits", "reserve", fifo, lambda m, t: m.avg <= 0.6 * t.avg, "avg")
        line("max wait <= FIFO's, with limits", "reserve+limits", fifo, lambda m, t: m.max <= t.max, "max")
        line("avg wait <= SJF's, with limits", "reserve+limits", sjf, lambda m, t: m.avg <= t.avg, "avg")
        line("max wait <= FIFO's, with limits, shortest first", shortest, fifo, lambda m, t: m.max <= t.max, "max")
        line("avg wait <= SJF's, with limits, shortest first", shortest, sjf, lambda m, t: m.avg <= t.avg, "avg")
    for policy in ("reserve+limits", shortest):
        run = runs.get(policy)
        g = run.guarantee if run is not None else None
        if g is None:
            print(f"    nominal-quota gangs start by their expected start: not run (needs {policy})", flush=True)
            continue
        verdict = "met" if g.late == 0 else "NOT MET"
        print(
            f"    nominal-quota gangs start by their expected start, {policy}: {verdict} "
            f"({g.jobs} reserved within nominal quota, {g.late} late, worst by {g.worst:,} s)",
            flush=True,
        )


def _after(given: int | None, trace: Trace) -> Recommended:
    return Recommended(given, given) if given is not None else RECOMMENDED[trace.name]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="philly,synthetic")
    ap.add_argument(
        "--policies",
        default="default,strict_fifo,reserve,reserve+limits,reserve+limits+shortest,fifo,sjf,fifo-nodes,sjf-nodes,easy-nodes",
    )
    ap.add_argument(
        "--reserve-after",
        type=int,
        default=None,
        help="reserve, reserve+limits: every queue's reserve_after (default: the trace's in RECOMMENDED)",
    )
    ap.add_argument(
        "--limit-factor",
        type=float,
        default=1.5,
        help="reserve+limits: each job's declared limit is its runtime times this",
    )
    ap.add_argument(
        "--starved", type=int, default=0, help="print the N longest waits of each muster policy with their reasons"
    )
    ap.add_argument(
        "--sweep", default="", help="comma-separated reserve_after values: print avg / max wait of each (SWEEP)"
    )
    ap.add_argument("--jobs", type=int, default=20_000, help="jobs of each trace (Philly: the first by submission)")
    ap.add_argument("--shrink", type=float, default=0.2, help="Philly: fraction of each VC's nodes kept")
    ap.add_argument("--load", type=float, default=0.9, help="synthetic: offered load")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    policies = [p for p in args.policies.split(",") if p]
    values = [int(v) for v in args.sweep.split(",") if v]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        if "philly" in only:
            trace = philly(args.jobs, args.shrink)
            if trace is None:
                print(f"philly: trace not found in {PHILLY}, skipped", flush=True)
            else:
                report(trace, d, policies, _after(args.reserve_after, trace), args.limit_factor, args.starved)
                sweep(trace, d, values, args.limit_factor)
        if "synthetic" in only:
            trace = synthetic(args.jobs, args.load)
            report(trace, d, policies, _after(args.reserve_after, trace), args.limit_factor, args.starved)
            sweep(trace, d, values, args.limit_factor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
