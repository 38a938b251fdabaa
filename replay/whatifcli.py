"""`muster whatif --queues queues.yaml [--from POINT] [--to POINT]`: a log's jobs under another configuration.

Runs the submissions and node changes of the window through the scheduler
core in virtual time with the given queues (and, if given, cohorts, priority
classes, fair sharing, idle reclaim), then shows per queue and per job the
admission wait, preemptions, GPU-hours and utilization, real vs what-if.
Exit status 2 on a configuration that cannot be used (file, line, why).
"""

from __future__ import annotations

import argparse
from typing import IO, Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    from muster.replay.cliargs import POINT_HELP, add_common

    p.add_argument(
        "--queues", required=True, metavar="FILE", help="YAML with queues (and cohorts, priority_classes...)"
    )
    p.add_argument("--from", dest="start", metavar="POINT", help=f"window start: {POINT_HELP}")
    p.add_argument(
        "--to",
        dest="end",
        metavar="POINT",
        help="window end (default: the end of the log; the what-if "
        "side then runs until every job it can run has finished)",
    )
    p.add_argument("--jobs", type=int, default=20, metavar="N", help="show the N jobs whose wait changed most")
    add_common(p)


def run(args: argparse.Namespace) -> int:
    import sys

    from muster.replay.cliutil import UsageError, run_command, window_args

    async def body(source: Any, store: Any) -> int:
        if args.jobs < 0:
            raise UsageError(f"--jobs {args.jobs}: a number of jobs to show, 0 or more")
        from muster.replay.cliutil import emit, open_snapshots
        from muster.replay.whatif import whatif
        from muster.replay.whatifconfig import WhatIfError, read_config

        window = await window_args(source, args)
        try:
            text = read_config(args.queues)
            snapshots = await open_snapshots(args, source, store) if window.start is not None else None
            result = await whatif(source, text, args.queues, start=window.start, end=window.end, snapshots=snapshots)
        except WhatIfError as exc:
            print(f"muster whatif: {exc}", file=sys.stderr)
            return 2
        doc = document(result)
        if args.output != "table":
            emit(args.output, doc, doc.get("jobs"))
        else:
            render(doc, jobs=args.jobs)
        return 0

    code: int = run_command(args, body, "whatif")
    return code


def document(result: Any) -> dict[str, Any]:
    return {
        "window": {"from_seq": result.from_seq, "to_seq": result.to_seq, "t0": result.t0},
        "queues_changed": result.queues_changed,
        "cluster": result.cluster(),
        "queues": result.queue_rows(),
        "jobs": result.job_rows(),
        "notes": result.notes,
    }


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def _job_wait(side: dict[str, Any]) -> str:
    if side["wait"] is not None:
        return _wait(side["wait"])
    return f">{_wait(side['waiting'])}" if side["waiting"] is not None else "-"


def _wait(v: float | int | None) -> str:
    from muster.replay.points import duration

    return "-" if v is None else duration(v)


def _delta(real: float | int | None, alt: float | int | None) -> str:
    from muster.replay.points import duration

    if real is None or alt is None:
        return ""
    d = alt - real
    if d == 0:
        return "="
    text: str = ("+" if d > 0 else "-") + duration(abs(d))
    return text


def render(doc: dict[str, Any], out: IO[str] | None = None, *, jobs: int = 20) -> None:
    from rich.table import Table

    from muster.replay.cliutil import add_row, console
    from muster.replay.points import gpu_hours

    con = console(out)
    w = doc["window"]
    c = doc["cluster"]
    con.print(
        f"[bold]What if[/bold] seq {w['from_seq']:,}..{w['to_seq']:,} ran with the new configuration "
        f"(changed queues: {', '.join(doc['queues_changed']) or 'none'})",
        highlight=False,
    )
    con.print(
        f"cluster GPU utilization: real {c['real']['utilization'] * 100:.1f}% over {_wait(c['real']['seconds'])}, "
        f"what-if {c['whatif']['utilization'] * 100:.1f}% over {_wait(c['whatif']['seconds'])}",
        highlight=False,
    )
    t = Table(title="Queues: real -> what-if", title_justify="left")
    for col in (
        "queue",
        "jobs",
        "mean wait",
        "Δ",
        "p50 wait",
        "p90 wait",
        "never admitted",
        "preemptions",
        "GPU-hours",
        "borrowed GPU-h",
        "of cluster",
        "of nominal",
    ):
        t.add_column(col, justify="left" if col == "queue" else "right")
    for q in doc["queues"]:
        r, a = q["real"], q["whatif"]
        add_row(
            t,
            q["queue"] + (" *" if q["changed"] else ""),
            q["jobs"],
            f"{_wait(r['wait_mean'])} -> {_wait(a['wait_mean'])}",
            _delta(r["wait_mean"], a["wait_mean"]),
            f"{_wait(r['wait_p50'])} -> {_wait(a['wait_p50'])}",
            f"{_wait(r['wait_p90'])} -> {_wait(a['wait_p90'])}",
            f"{r['never_admitted']} -> {a['never_admitted']}",
            f"{r['preemptions']} -> {a['preemptions']}",
            f"{gpu_hours(r['gpu_seconds'])} -> {gpu_hours(a['gpu_seconds'])}",
            f"{gpu_hours(r['borrowed_gpu_seconds'])} -> {gpu_hours(a['borrowed_gpu_seconds'])}",
            f"{_pct(r['cluster_share'])} -> {_pct(a['cluster_share'])}",
            f"{_pct(r['of_nominal'])} -> {_pct(a['of_nominal'])}",
        )
        # a queue with flavors: its GPU-hours on each flavor, real -> what-if
        real_f, alt_f = r.get("flavor_gpu_seconds", {}), a.get("flavor_gpu_seconds", {})
        for flavor in sorted(set(real_f) | set(alt_f)):
            hours = f"{gpu_hours(real_f.get(flavor, 0))} -> {gpu_hours(alt_f.get(flavor, 0))}"
            add_row(t, f"  on {flavor}", "", "", "", "", "", "", "", hours, "", "", "")
    con.print(t)
    # a job rejected on both sides has no wait to compare
    rows = [
        j
        for j in doc["jobs"]
        if j["whatif"] is not None and not (j["real"]["status"] == j["whatif"]["status"] == "rejected")
    ]

    def change(j: dict[str, Any]) -> float:
        rw = j["real"]["wait"] if j["real"]["wait"] is not None else j["real"]["waiting"]
        aw = j["whatif"]["wait"] if j["whatif"]["wait"] is not None else j["whatif"]["waiting"]
        return float(abs((aw or 0) - (rw or 0)) + abs(j["whatif"]["preemptions"] - j["real"]["preemptions"]) * 1e-3)

    rows.sort(key=lambda j: (-change(j), j["job"]))
    if rows and jobs > 0:
        jt = Table(title=f"Jobs whose wait changed most (of {len(doc['jobs'])})", title_justify="left")
        for col in ("job", "queue", "GPUs", "submitted", "wait", "Δ", "preemptions", "GPU-hours", "status"):
            jt.add_column(col, justify="left" if col in ("job", "queue", "status") else "right", overflow="fold")
        for j in rows[:jobs]:
            r, a = j["real"], j["whatif"]
            rw, aw = _job_wait(r), _job_wait(a)
            add_row(
                jt,
                j["job"],
                j["queue"],
                j["gpus"],
                f"+{_wait(j['submitted'])}",
                f"{rw} -> {aw}",
                _delta(r["wait"], a["wait"]),
                f"{r['preemptions']} -> {a['preemptions']}",
                f"{gpu_hours(r['gpu_seconds'])} -> {gpu_hours(a['gpu_seconds'])}",
                f"{r['status']} -> {a['status']}",
            )
        con.print(jt)
    for n in doc["notes"]:
        con.print(f"note: {n}", highlight=False, markup=False)
