"""`muster replay --at SEQ|@SECONDS|DATETIME`: the cluster as it was at a point of the log.

Prints the queues (nominal, used, borrowed, lent), free GPUs per topology
domain (and per node with --nodes), running jobs with --running, and the
pending jobs in queue order with the reason each waits. `--output json` for
tools. The state comes from the nearest trusted snapshot plus the events
since (see `muster.replay.snapshots`).
"""

from __future__ import annotations

import argparse
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from muster.replay.points import Point


def add_arguments(p: argparse.ArgumentParser) -> None:
    from muster.replay.cliargs import POINT_HELP, add_common

    p.add_argument("--at", metavar="POINT", default="end", help=f"where to stop: {POINT_HELP} (default)")
    p.add_argument("--nodes", action="store_true", help="also list every node")
    p.add_argument("--running", action="store_true", help="also list running jobs")
    add_common(p)


def run(args: argparse.Namespace) -> int:
    from muster.replay.cliutil import check_point, point_arg, run_command

    async def body(source: Any, store: Any) -> int:
        from muster.replay.cliutil import open_snapshots
        from muster.replay.rebuild import state_at

        point = point_arg(args.at, "--at")
        await check_point(source, point, "--at")
        snapshots = await open_snapshots(args, source, store)
        replayed = await state_at(source, point, snapshots, verify=args.verify)
        doc = document(replayed, point)
        if args.output != "table":
            from muster.replay.cliutil import emit

            emit(args.output, doc)
        else:
            render(doc, show_nodes=args.nodes, show_running=args.running)
        return 0

    code: int = run_command(args, body, "replay")
    return code


def document(replayed: Any, point: Point, now: int | None = None) -> dict[str, Any]:
    """The JSON form of a replayed state (also what the tables show), as of `point` (`points.as_of`);
    `now` is the wall clock "ago" is measured from."""
    import time

    from muster.replay.points import Clock, as_of
    from muster.replay.snapshotcodec import describe
    from muster.replay.views import (
        domain_rows,
        job_counts,
        node_rows,
        pending_rows,
        queue_rows,
        running_rows,
    )

    state = replayed.state
    clock = Clock.for_log(state.now, int(time.time()) if now is None else now)
    at = as_of(point, state.now)
    return {
        "point": point.text,
        "seq": replayed.seq,
        "last_seq": replayed.last_seq,
        "at": at,
        "at_local": clock.iso(at),
        "epoch_time": clock.epoch,
        "leader": {"epoch": state.epoch, "holder": state.leader},
        "cycle": state.cycle,
        "jobs": job_counts(state),
        "queues": queue_rows(state),
        "domains": domain_rows(state),
        "nodes": node_rows(state),
        "pending": pending_rows(state),
        "running": running_rows(state),
        "replay": {
            "snapshot": describe(replayed.snapshot) if replayed.snapshot is not None else None,
            "sealed_state": replayed.sealed,
            "events_folded": replayed.folded,
            "events_folded_to_verify": replayed.verify_folded,
            "discarded_snapshots": [{"seq": d.seq, "reason": d.reason} for d in replayed.discarded],
            "seconds": round(replayed.seconds, 3),
        },
    }


def render(
    doc: dict[str, Any], out: IO[str] | None = None, *, show_nodes: bool = False, show_running: bool = False
) -> None:
    import time

    from rich.table import Table

    from muster.replay.cliutil import add_row, console, gpus
    from muster.replay.points import Clock, duration

    con = console(out)
    clock = Clock(epoch=doc["epoch_time"], now=int(time.time()))
    at = doc["at"]
    rp = doc["replay"]
    head = f"Cluster at seq {doc['seq']:,} of {doc['last_seq']:,} · {clock.when(at)}"
    if doc["leader"]["epoch"]:
        head += f" · leader {doc['leader']['holder']} (epoch {doc['leader']['epoch']})"
    con.print(f"[bold]{head}[/bold]")
    source = f"from the snapshot at seq {rp['snapshot']['seq']:,}" if rp["snapshot"] else "from the start of the log"
    if rp.get("sealed_state") is not None:
        source = f"from the state sealed in the archive at seq {rp['sealed_state']:,}"
    extra = f", {rp['events_folded_to_verify']:,} more to verify snapshots" if rp["events_folded_to_verify"] else ""
    n = rp["events_folded"]
    con.print(f"rebuilt {source} + {n:,} event{'s' if n != 1 else ''}{extra} in {rp['seconds']:.2f}s")
    counts = ", ".join(f"{n} {k}" for k, n in doc["jobs"].items()) or "no jobs"
    con.print(f"jobs: {counts}")

    q = Table(title="Queues (GPUs)", title_justify="left")
    for col, justify in (
        ("queue", "left"),
        ("cohort", "left"),
        ("nominal", "right"),
        ("used", "right"),
        ("borrowed", "right"),
        ("lent", "right"),
        ("running", "right"),
        ("pending", "right"),
    ):
        q.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in doc["queues"]:
        add_row(
            q,
            r["queue"],
            r["cohort"] or "-",
            gpus(r["nominal"]),
            gpus(r["used"]) if r["used"] else "0",
            gpus(r["borrowed"]),
            gpus(r["lent"]),
            str(r["running"]),
            str(r["pending"]),
        )
    con.print(q)

    d = Table(title="Free GPUs by topology domain", title_justify="left")
    for col, justify in (
        ("domain", "left"),
        ("nodes", "right"),
        ("GPUs", "right"),
        ("used", "right"),
        ("free", "right"),
        ("most free on one node", "right"),
        ("unschedulable nodes", "right"),
    ):
        d.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in doc["domains"]:
        add_row(
            d,
            r["domain"] or "-",
            str(r["nodes"]),
            f"{r['gpus']:,}",
            f"{r['used']:,}",
            f"{r['free']:,}",
            str(r["largest_free"]),
            str(r["unschedulable"]) if r["unschedulable"] else "",
        )
    con.print(d)

    if show_nodes:
        n = Table(title="Nodes", title_justify="left")
        for col in ("node", "status", "GPUs", "used", "free", "jobs"):
            n.add_column(col, overflow="fold")
        for r in doc["nodes"]:
            add_row(
                n,
                r["node"],
                r["status"],
                str(r["gpus"]),
                str(r["used"]),
                str(r["free"]),
                ", ".join(f"{j}x{c}" if c > 1 else j for j, c in r["jobs"].items()),
            )
        con.print(n)

    if show_running:
        rt = Table(title="Running jobs", title_justify="left")
        for col in ("queue", "job", "priority", "GPUs", "admitted", "borrowed", "nodes"):
            rt.add_column(col, overflow="fold")  # ids wrap, never cut
        for r in doc["running"]:
            nodes = r["nodes"]
            add_row(
                rt,
                r["queue"],
                r["job"],
                r["priority_class"] or "-",
                f"{r['gpus']} ({r['shape']})",
                clock.at(r["admitted_at"]) + f" (for {duration(at - r['admitted_at'])})",
                gpus(r["borrowed"]),
                ", ".join(nodes[:4]) + (f" +{len(nodes) - 4}" if len(nodes) > 4 else ""),
            )
        con.print(rt)

    if doc["pending"]:
        p = Table(title="Pending jobs, in queue order", title_justify="left")
        for col in ("queue", "#", "job", "priority", "GPUs", "waiting", "preempted", "why"):
            p.add_column(col, overflow="fold")
        for r in doc["pending"]:
            add_row(
                p,
                r["queue"],
                str(r["position"]),
                r["job"],
                f"{r['priority_class'] or '-'} ({r['priority']})",
                f"{r['gpus']} ({r['shape']})",
                duration(at - r["submitted_at"]),
                str(r["preemptions"]) if r["preemptions"] else "",
                r["reason"],
            )
        con.print(p)
    else:
        con.print("no pending jobs")
    for r in rp["discarded_snapshots"]:
        con.print(f"[yellow]snapshot at seq {r['seq']} discarded: {r['reason']}[/yellow]")
