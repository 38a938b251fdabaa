"""`muster jobs`: the jobs of the log, squeue-like: state, queue position, age, why each waits.

Reads the folded state (the nearest snapshot plus the events since, see `rebuild`), by
default the live jobs (pending, held, running) of every queue. Filters: `--queue`,
`--state`, `--namespace`; `--all` for every state. `--scope QUEUE` reads only what that
queue's own identity may (its jobs' events, the configuration, nodes, leadership) and shows
its jobs. `-o wide` adds the full id, namespace,
shape, priority, preemptions and nodes; `-o json` and `-o jsonl` print the rows as data.
`--watch` keeps reading the log and refreshes the table in place on a terminal (like
`kubectl get -w`); into a pipe, or with `-o jsonl`, it prints the rows that changed.

The table names a job by its short name when that names it alone (it can be typed
back into `explain`, `cancel`...), else by its full id; ids are wrapped, never cut.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    from muster.replay.cliargs import (
        POINT_HELP,
        add_output,
        add_scope_argument,
        add_snapshot_arguments,
        add_source_arguments,
    )
    from muster.replay.status import STATES
    from muster.replay.watching import add_watch_arguments

    p.add_argument("-q", "--queue", action="append", metavar="QUEUE", help="only these queues (repeat or a,b)")
    p.add_argument(
        "-t",
        "--state",
        action="append",
        metavar="STATE",
        help=f"only these states (repeat or a,b): {', '.join(STATES)} (default: pending, held, running)",
    )
    p.add_argument("-n", "--namespace", action="append", metavar="NS", help="only jobs of these Kubernetes namespaces")
    p.add_argument("-a", "--all", action="store_true", help="jobs in every state, ended ones too")
    p.add_argument("--at", metavar="POINT", default="end", help=f"the jobs as they were at: {POINT_HELP} (default)")
    add_watch_arguments(p)
    add_output(p, "wide")
    add_source_arguments(p)
    add_scope_argument(p)
    add_snapshot_arguments(p)


def _split(values: list[str] | None) -> frozenset[str]:
    return frozenset(v.strip() for item in values or () for v in item.split(",") if v.strip())


def job_filter(args: argparse.Namespace, state: Any) -> Any:
    """The filter the flags ask for; raises UsageError for a state, queue or namespace the log does not have."""
    from muster.replay.cliutil import SCOPE_HINT, UsageError, require_known
    from muster.replay.status import LIVE, STATES, JobFilter, namespace_of

    states = _split(args.state)
    unknown = sorted(states - set(STATES))
    if unknown:
        raise UsageError(f"--state {unknown[0]}: not a state (one of {', '.join(STATES)})")
    if args.all:
        states = frozenset(STATES)
    queues = _split(args.queue)
    require_known("--queue", queues, state.queues, "queue")
    if not queues and args.scope is not None:
        require_known("--scope", {args.scope}, state.queues, "queue", hint=SCOPE_HINT)
        queues = frozenset({args.scope})
    namespaces = _split(args.namespace)
    seen = {namespace_of(j) for j in state.jobs.values()} - {""}  # "": jobs of `muster submit`, of no namespace
    require_known("--namespace", namespaces, seen, "namespace")
    return JobFilter(queues=queues, states=states or LIVE, namespaces=namespaces)


def run(args: argparse.Namespace) -> int:
    from muster.replay.cliutil import point_arg
    from muster.replay.points import as_of
    from muster.replay.watching import run_view

    def view(replayed: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        # a past point's ages are as they were then, not as they would be now
        point = point_arg(args.at, "--at")  # run_view checked it before it read the log
        now = None if point.is_end else as_of(point, replayed.state.now)
        doc = document(replayed, job_filter(args, replayed.state), now)
        return doc, doc["jobs"]

    return run_view(args, "jobs", "job", view, lambda d: render(d, wide=args.output == "wide"))


def document(replayed: Any, flt: Any, now: int | None = None) -> dict[str, Any]:
    import time

    from muster.replay.points import Clock
    from muster.replay.status import job_rows

    state = replayed.state
    clock = Clock.for_log(state.now, int(time.time()) if now is None else now)
    # at the end of a cluster's log, ages run to the wall clock; of a sim's, to its last event
    at = now if now is not None else clock.now if clock.epoch and clock.now is not None else state.now
    return {
        "seq": replayed.seq,
        "at": state.now if now is None else now,
        "epoch_time": clock.epoch,
        "now": at,
        "jobs": job_rows(state, flt, at),
    }


def render(doc: dict[str, Any], *, wide: bool = False) -> Any:
    """The jobs table: a rich renderable, or plain text for `wide` and for more than `cliutil.PLAIN_ROWS` jobs."""
    from rich.table import Table

    from muster.replay.cliutil import PLAIN_ROWS, add_row, plain_table

    title = f"{len(doc['jobs'])} jobs at seq {doc['seq']:,}"
    cols = ["JOB", "QUEUE", "STATE", "POS", "GPUS", "AGE"]
    if wide:
        cols += ["ID", "NAMESPACE", "SHAPE", "PRIORITY", "PREEMPTED", "NODES"]
    cols.append("REASON")
    right = frozenset({"POS", "GPUS", "AGE", "PREEMPTED"})
    cells = [_cells(r, wide) for r in doc["jobs"]]
    if wide or len(cells) > PLAIN_ROWS:
        # wide, as kubectl's: lines as long as they need, so that no id is folded over lines to copy back
        return plain_table(title, cols, cells, right)
    t = Table(title=title, title_justify="left", box=None)
    for col in cols:
        # ids wrap, never cut: what the table shows can be copied back into a command
        t.add_column(col, justify="right" if col in right else "left", overflow="fold")
    for row in cells:
        add_row(t, *row)
    return t


def _cells(r: dict[str, Any], wide: bool) -> list[str]:
    from muster.replay.points import duration

    cells = [
        r["name"],
        r["queue"],
        r["state"],
        str(r["position"]) if r["position"] is not None else "",
        str(r["gpus"]),
        duration(r["age"]),
    ]
    if wide:
        nodes = r["nodes"]
        cells += [
            r["job"],
            r["namespace"] or "-",
            r["shape"],
            f"{r['priority_class'] or '-'} ({r['priority']})",
            str(r["preemptions"] or ""),
            ", ".join(nodes[:4]) + (f" +{len(nodes) - 4}" if len(nodes) > 4 else ""),
        ]
    cells.append(r["reason"] or "")
    return cells
