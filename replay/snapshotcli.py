"""`muster snapshot [--every N] [--verify] [--follow] [--list]`: write and check snapshots of the folded state.

One shot: start from the nearest trusted snapshot (checking unverified ones
on the way; with --verify, every snapshot from the start of the log), fold
to the end of the log and write a snapshot whenever the sequence crosses a
multiple of N. Snapshots written here are verified by construction (folded
from a trusted point). With --follow (a stream only) it keeps following the
log and writing, which is what a daemon-side snapshotter does. Snapshots go
to the object store bucket STREAM-snapshots (or --snapshots), or to a
directory for a file log (--snapshots DIR).
"""

from __future__ import annotations

import argparse
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    from muster.replay.cliargs import add_source_arguments

    add_source_arguments(p)
    p.add_argument("--snapshots", metavar="WHERE", help="bucket (NATS; default STREAM-snapshots) or directory (--log)")
    p.add_argument("--every", type=int, default=50_000, metavar="N", help="a snapshot every N events (default 50000)")
    p.add_argument("--format", choices=["msgpack+zlib", "msgpack", "json"], default="msgpack+zlib")
    p.add_argument("--verify", action="store_true", help="check every existing snapshot against a fold from the start")
    p.add_argument("--follow", action="store_true", help="keep following the stream and writing snapshots")
    p.add_argument("--list", action="store_true", help="only list the snapshots")
    p.add_argument("--output", choices=["table", "json"], default="table")


def run(args: argparse.Namespace) -> int:
    import sys

    from muster.replay.cliutil import UsageError, run_command

    if args.every < 1:
        print("muster snapshot: --every must be at least 1", file=sys.stderr)
        return 2

    async def body(source: Any, store: Any) -> int:
        from muster.replay.cliutil import dump_json, open_snapshots

        if store is None and not args.snapshots:
            raise UsageError("a file log keeps its snapshots in a directory: add --snapshots DIR")
        if args.follow and store is None:
            raise UsageError("--follow needs a stream (--nats/--stream), not a file")
        snapshots = await open_snapshots(args, source, store, create=not args.list)
        if snapshots is None:
            print(f"no snapshots for {source.name}")
            return 0
        if args.list:
            metas = await snapshots.catalog()
            if args.output == "json":
                from muster.replay.snapshots import describe

                dump_json([describe(m) for m in metas])
            else:
                render_list(metas)
            return 0
        from muster.replay.snapshots import write_snapshots

        doc = await write_snapshots(
            source, snapshots, every=args.every, fmt=args.format, verify=args.verify, follow=args.follow, store=store
        )
        if args.output == "json":
            dump_json(doc)
        else:
            print(
                f"{source.name}: at seq {doc['seq']:,}; wrote {len(doc['written'])} snapshot(s)"
                + (f" (seq {', '.join(str(s) for s in doc['written'])})" if doc["written"] else "")
                + f", checked {len(doc['checked'])} against the fold ({len(doc['verified'])} newly verified), "
                f"discarded {len(doc['discarded'])}; "
                f"started from {doc['started_from']}, folded {doc['folded']:,} events in {doc['seconds']:.2f}s"
            )
        return 0

    code: int = run_command(args, body, "snapshot")
    return code


def _size(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def render_list(metas: list[Any]) -> None:
    from rich.table import Table

    from muster.replay.cliutil import add_row, console

    con = console()
    t = Table(title="Snapshots", title_justify="left")
    for col in ("seq", "at", "jobs", "format", "size", "verified", "written"):
        t.add_column(col, justify="right" if col in ("seq", "at", "jobs", "size") else "left")
    for m in metas:
        verified = "yes" if m.is_verified else "no"
        if m.is_verified and m.verified_from is not None:
            verified += f" (from {m.verified_from})"
        add_row(t, f"{m.seq:,}", m.at, f"{m.jobs:,}", m.format, _size(m.size), verified, m.written)
    con.print(t)
