"""`muster sim SCENARIO.yaml`: the scheduler core over a virtual cluster in virtual time.

Exit status: 0 on a completed run; 2 on an invalid scenario, with a message
naming the file, the line and what is wrong (never a traceback), or on
`--summary` without `-o jsonl`.
"""

from __future__ import annotations

import argparse
import sys
from typing import IO, Any

import msgspec

from muster.events.codec import encode
from muster.events.types import Event


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario YAML file (see docs/spec/scenario.md)")
    p.add_argument(
        "-o",
        "--output",
        choices=["table", "json", "jsonl"],
        default="table",
        help="human table (default), the summary as one JSON document (json), or the log: one event per line (jsonl)",
    )
    p.add_argument(
        "--summary",
        action="store_true",
        help="with -o jsonl: end with a Summary line (the table and -o json are the summary: refused with them)",
    )


def summary(result: Any) -> dict[str, Any]:
    """The `Summary` object: per job, per queue, cluster utilization, and queueing delay (`replay.waits`)."""
    from muster.replay import waits

    acct = result.accounting
    jobs = {
        job_id: {
            "submitted": js.submitted,
            "admitted": js.admitted,
            "finished": js.finished,
            "preemptions": js.preemptions,
            "status": js.status,
        }
        for job_id, js in sorted(acct.jobs.items())
    }
    queues = {
        name: {"gpu_seconds": qs.gpu_seconds, "borrowed_gpu_seconds": qs.borrowed_gpu_seconds}
        for name, qs in sorted(acct.queues.items())
    }
    for name in sorted(result.state.queues):
        queues.setdefault(name, {"gpu_seconds": 0, "borrowed_gpu_seconds": 0})
    for name, per_flavor in sorted(acct.flavors.items()):
        queues[name]["flavors"] = {
            f: {"gpu_seconds": fs.gpu_seconds, "borrowed_gpu_seconds": fs.borrowed_gpu_seconds}
            for f, fs in sorted(per_flavor.items())
        }
    util = acct.used_gpu_seconds / acct.capacity_gpu_seconds if acct.capacity_gpu_seconds else 0.0
    return {
        "type": "Summary",
        "at": result.end,
        "jobs": jobs,
        "queues": dict(sorted(queues.items())),
        "cluster": {
            "gpu_seconds_capacity": acct.capacity_gpu_seconds,
            "gpu_seconds_used": acct.used_gpu_seconds,
            "gpu_utilization": round(util, 6),
        },
        "cycles": result.cycles,
        "queueing": waits.summary(result),
    }


def run(args: argparse.Namespace) -> int:
    from muster.replay.scenario import load
    from muster.replay.simulator import SimulationError, simulate
    from muster.replay.specreader import ScenarioError

    if args.summary and args.output != "jsonl":
        # the table and the json document are the summary already: saying nothing would read as "done"
        print(
            f"muster sim: --summary goes with -o jsonl (it adds a Summary line to the log); "
            f"-o {args.output} prints the summary already",
            file=sys.stderr,
        )
        return 2
    try:
        scenario = load(args.scenario)
    except ScenarioError as exc:
        print(f"muster sim: invalid scenario: {exc}", file=sys.stderr)
        return 2
    out = sys.stdout
    if args.output == "jsonl":
        buf = out.buffer

        def emit(ev: Event) -> None:
            buf.write(encode(ev))
            buf.write(b"\n")

        try:
            result = simulate(scenario, on_event=emit, keep_events=False)
        except SimulationError as exc:
            print(f"muster sim: {exc}", file=sys.stderr)
            return 1
        if args.summary:
            buf.write(msgspec.json.encode(summary(result)))
            buf.write(b"\n")
        buf.flush()
        return 0
    try:
        result = simulate(scenario, keep_events=False)
    except SimulationError as exc:
        print(f"muster sim: {exc}", file=sys.stderr)
        return 1
    if args.output == "json":
        from muster.replay.cliutil import dump_json

        dump_json(summary(result), out)
        return 0
    print_tables(result, out)
    return 0


def _t(v: int | None) -> str:
    return "-" if v is None else str(v)


def _nominal_gpu(queue: Any) -> str:
    """A queue's nominal GPUs; with flavors, the sum over them."""
    if queue is None:
        return "-"
    from muster.projections.resources import gpus_of

    if queue.resource_groups or "gpu" in queue.nominal:
        return str(gpus_of(queue.nominal))
    return "-"


def print_tables(result: Any, out: IO[str]) -> None:
    from rich.table import Table

    from muster.replay.cliutil import console as rich_console

    console = rich_console(out, width=120)
    s = summary(result)
    jobs = s["jobs"]
    state = result.state
    if len(jobs) <= 60:
        t = Table(title=f"Jobs (t={result.end})")
        for col in ("job", "queue", "gpus", "status", "submitted", "admitted", "finished", "wait", "preempted", "why"):
            t.add_column(col, overflow="fold")
        for job_id, js in jobs.items():
            job = state.jobs.get(job_id)
            wait = (js["admitted"] - js["submitted"]) if js["admitted"] is not None else None
            t.add_row(
                job_id,
                job.queue if job else "?",
                str(job.gpus) if job else "?",
                js["status"],
                _t(js["submitted"]),
                _t(js["admitted"]),
                _t(js["finished"]),
                _t(wait),
                str(js["preemptions"]),
                job.reason if job and js["status"] in ("pending", "rejected") else "",
            )
        console.print(t)
    else:
        counts: dict[str, int] = {}
        for js in jobs.values():
            counts[js["status"]] = counts.get(js["status"], 0) + 1
        waits = sorted(js["admitted"] - js["submitted"] for js in jobs.values() if js["admitted"] is not None)
        p50 = waits[len(waits) // 2] if waits else 0
        p99 = waits[min(len(waits) - 1, (len(waits) * 99) // 100)] if waits else 0
        console.print(
            f"{len(jobs)} jobs: "
            + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
            + f"; admission wait p50 {p50}s, p99 {p99}s"
        )
    q = Table(title="Queues")
    for col in ("queue", "cohort", "nominal gpu", "GPU-hours used", "GPU-hours borrowed", "pending"):
        q.add_column(col)
    pending: dict[str, int] = {}
    for job in state.jobs.values():
        if job.status == "pending":
            pending[job.queue] = pending.get(job.queue, 0) + 1
    for name, qs in s["queues"].items():
        queue = state.queues.get(name)
        q.add_row(
            name,
            (queue.cohort or "-") if queue else "-",
            _nominal_gpu(queue),
            f"{qs['gpu_seconds'] / 3600:.1f}",
            f"{qs['borrowed_gpu_seconds'] / 3600:.1f}",
            str(pending.get(name, 0)),
        )
        # a queue with flavors: one row per flavor of its GPU quota
        for group in queue.resource_groups if queue else []:
            if "gpu" not in group.covered:
                continue
            for fq in group.flavors:
                fs = qs.get("flavors", {}).get(fq.name, {})
                q.add_row(
                    f"  {name} on {fq.name}",
                    "",
                    str(fq.nominal.get("gpu", 0)),
                    f"{fs.get('gpu_seconds', 0) / 3600:.1f}",
                    f"{fs.get('borrowed_gpu_seconds', 0) / 3600:.1f}",
                    "",
                )
    console.print(q)
    w = Table(title="Queueing delay, seconds (still pending: waited so far)")
    for col in ("by", "jobs", "still pending", "avg", "p50", "p99", "max"):
        w.add_column(col)
    for kind, groups in (("queue", s["queueing"]["queues"]), ("size (GPUs)", s["queueing"]["sizes"])):
        for name, st in groups.items():
            w.add_row(f"{kind} {name}", *(str(st[k]) for k in ("jobs", "waiting", "avg", "p50", "p99", "max")))
    console.print(w)
    c = s["cluster"]
    console.print(
        f"cluster GPU utilization {c['gpu_utilization'] * 100:.1f}% over {result.end}s; {result.cycles} cycles"
    )
