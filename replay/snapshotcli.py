"""`muster snapshot [--every N] [--verify] [--follow [--leader BUCKET/KEY | --log-leader]] [--list]`.

One shot: start from the nearest trusted snapshot (checking unverified ones
on the way; with --verify, every snapshot from the start of the log), fold
to the end of the log and write a snapshot whenever the sequence crosses a
multiple of N. Snapshots written here are verified by construction (folded
from a trusted point). With --follow (a stream only) it keeps following the
log and writing, printing a line per due point. Snapshots go to the object
store bucket STREAM-snapshots (or --snapshots), or to a directory for a file
log (--snapshots DIR).

Production (the Helm chart's `snapshots` sidecar, one per daemon replica):
`muster snapshot --config /etc/muster/config.yaml --follow --every 50000
--leader muster-leader/leader --holder $(POD_NAME)`. `--config` reads the
`nats` block of the daemon's config file (url, stream, subject_prefix,
inbox_prefix, auth and TLS files), so the sidecar connects as the daemon
does. `--leader` gates the writes on the daemon's leader election: a
snapshot is written only if, when it falls due, the leader key names
`--holder` (default: $MUSTER_IDENTITY, the config's `identity`, $POD_NAME,
then the host name, the daemon's own order without its pid). `--log-leader`
gates them on the log instead: the last `LeaderElected` folded names
`--holder` (the chart's choice with the Lease backend, whose lease is no KV
key; it works with either). Every replica folds; the leader's writes. A double write at a handover is harmless:
snapshots are keyed by sequence and verified on load.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from muster.replay.natsconnect import ConfigProblem, NatsSettings, read_config

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_KEY = re.compile(r"^[-/_=.A-Za-z0-9]+$")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from muster.replay.cliargs import add_output, add_source_arguments

    add_source_arguments(p)
    p.add_argument("--snapshots", metavar="WHERE", help="bucket (NATS; default STREAM-snapshots) or directory (--log)")
    p.add_argument("--every", type=int, default=50_000, metavar="N", help="a snapshot every N events (default 50000)")
    p.add_argument(
        "--format",
        choices=["msgpack+zlib", "msgpack", "json"],
        default="msgpack+zlib",
        help="encoding of the snapshots written (default msgpack+zlib; json is for reading them by eye)",
    )
    p.add_argument("--verify", action="store_true", help="check every existing snapshot against a fold from the start")
    p.add_argument("--follow", action="store_true", help="keep following the stream and writing snapshots")
    p.add_argument(
        "--leader",
        metavar="BUCKET[/KEY]",
        help="write only while this KV key of the daemon's leader election names --holder "
        "(e.g. muster-leader/leader; KEY defaults to leader)",
    )
    p.add_argument(
        "--log-leader",
        action="store_true",
        help="write only while the log's current leader (its last LeaderElected) is --holder (either election backend)",
    )
    p.add_argument(
        "--holder",
        metavar="NAME",
        help="this replica's name in the leader key (default: $MUSTER_IDENTITY, the config's identity, "
        "$POD_NAME, the host name)",
    )
    p.add_argument("--list", action="store_true", help="only list the snapshots")
    add_output(p)


def parse_leader(spec: str) -> tuple[str, str]:
    """`BUCKET` or `BUCKET/KEY` (KEY defaults to the daemon's `leader`)."""
    from muster.events.leases import LEADER_KEY

    bucket, _, key = spec.partition("/")
    key = key or LEADER_KEY
    if not _NAME.match(bucket) or not _KEY.match(key) or key.startswith(".") or key.endswith("."):
        raise ValueError(f"--leader {spec!r}: expected BUCKET or BUCKET/KEY (a KV bucket name and key)")
    return bucket, key


def default_holder(settings: NatsSettings | None) -> str:
    """The daemon's identity order: $MUSTER_IDENTITY, the config's identity, $POD_NAME, the host name."""
    import socket

    return (
        os.environ.get("MUSTER_IDENTITY")
        or (settings.identity if settings is not None else None)
        or os.environ.get("POD_NAME")
        or socket.gethostname()
    )


def run(args: argparse.Namespace) -> int:
    import sys

    from muster.replay.cliutil import UsageError, run_command

    if args.every < 1:
        print("muster snapshot: --every must be at least 1", file=sys.stderr)
        return 2
    leader: tuple[str, str] | None = None
    settings: NatsSettings | None = None
    try:
        if args.leader:
            leader = parse_leader(args.leader)
        if args.config and not args.log:
            settings = read_config(args.config)
    except (ValueError, ConfigProblem) as exc:
        print(f"muster snapshot: {exc}", file=sys.stderr)
        return 2
    holder = args.holder or default_holder(settings)

    async def body(source: Any, store: Any) -> int:
        from muster.replay.cliutil import emit, open_snapshots

        if store is None and not args.snapshots:
            raise UsageError("a file log keeps its snapshots in a directory: add --snapshots DIR")
        if args.follow and store is None:
            raise UsageError("--follow needs a stream (--nats/--stream), not a file")
        if leader is not None and store is None:
            raise UsageError("--leader needs a stream (--nats/--stream): the leader key is in NATS")
        if leader is not None and args.log_leader:
            raise UsageError("--leader and --log-leader are two gates: give one")
        snapshots = await open_snapshots(args, source, store, create=not args.list)
        if snapshots is None:
            print(f"no snapshots for {source.name}")
            return 0
        if args.list:
            metas = await snapshots.catalog()
            if args.output != "table":
                from muster.replay.snapshotcodec import describe

                rows = [describe(m) for m in metas]
                emit(args.output, rows, rows)
            else:
                render_list(metas)
            return 0
        from muster.replay.snapshotcodec import SnapshotMeta
        from muster.replay.snapshotwriter import KvLeaderGate, LeaderGate, LogLeaderGate, write_snapshots

        gate: LeaderGate | None = None
        if leader is not None:
            gate = KvLeaderGate(store.js, holder, bucket=leader[0], key=leader[1])
        elif args.log_leader:
            gate = LogLeaderGate(holder)

        def progress(seq: int, meta: SnapshotMeta | None) -> None:
            if meta is not None and meta.format != args.format:
                print(
                    f"muster snapshot: seq {seq:,}: the state holds a number past {args.format}'s 64-bit integers "
                    f"(a job the scheduler rejects); written as {meta.format}",
                    file=sys.stderr,
                )
            if not args.follow:
                return  # the summary says it all
            if args.output != "table":
                import json

                line: dict[str, Any] = {"seq": seq, "written": meta is not None}
                if meta is None and gate is not None:
                    line["reason"] = gate.why_not()
                print(json.dumps(line), flush=True)
            elif meta is not None:
                print(f"{source.name}: wrote the snapshot at seq {seq:,} ({meta.jobs:,} jobs)", flush=True)
            else:
                why = gate.why_not() if gate is not None else "not allowed"
                print(f"{source.name}: seq {seq:,} left to the leader: {why}", flush=True)

        if args.follow and args.output == "table":
            gating = f", while {leader[0]}/{leader[1]} names {holder!r}" if leader is not None else ""
            if args.log_leader:
                gating = f", while the log's leader is {holder!r}"
            print(f"{source.name}: following, a snapshot every {args.every:,} events{gating}", flush=True)
        doc = await write_snapshots(
            source,
            snapshots,
            every=args.every,
            fmt=args.format,
            verify=args.verify,
            follow=args.follow,
            store=store,
            gate=gate,
            progress=progress,
        )
        if args.output != "table":
            emit(args.output, doc)
        else:
            skipped = f", left {len(doc['skipped'])} to the leader" if doc["skipped"] else ""
            print(
                f"{source.name}: at seq {doc['seq']:,}; wrote {len(doc['written'])} snapshot(s)"
                + (f" (seq {', '.join(str(s) for s in doc['written'])})" if doc["written"] else "")
                + skipped
                + f", checked {len(doc['checked'])} against the fold ({len(doc['verified'])} newly verified), "
                f"discarded {len(doc['discarded'])}; "
                f"started from {doc['started_from']}, folded {doc['folded']:,} events in {doc['seconds']:.2f}s"
            )
        return 0

    # a sidecar may start before NATS answers or before its daemon created the stream: it waits
    code: int = run_command(args, body, "snapshot", wait=args.follow)
    return code


def _size(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def render_list(metas: list[Any]) -> None:
    from rich.table import Table

    from muster.replay.cliutil import add_row, console
    from muster.replay.points import Clock

    con = console()
    # a cluster's event times are epoch seconds: shown as dates, as every other command shows them
    clock = Clock.for_log(max((m.at for m in metas), default=0))
    t = Table(title="Snapshots", title_justify="left")
    for col in ("seq", "at", "jobs", "format", "size", "verified", "written"):
        t.add_column(col, justify="right" if col in ("seq", "at", "jobs", "size") else "left")
    for m in metas:
        verified = "yes" if m.is_verified else "no"
        if m.is_verified and m.verified_from is not None:
            verified += f" (from {m.verified_from})"
        add_row(t, f"{m.seq:,}", clock.at(m.at), f"{m.jobs:,}", m.format, _size(m.size), verified, m.written)
    con.print(t)
