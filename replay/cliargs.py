"""Arguments shared by the replay commands; imports nothing heavy (every command's parser is built at start)."""

from __future__ import annotations

import argparse
import os

from muster.replay.natsconnect import add_connection_arguments

POINT_HELP = (
    "sequence (1234), event time in seconds (@1714531920; @3600 or @1h in a sim log), "
    "local date and time (2024-05-01T03:12), or end"
)


def add_source_arguments(p: argparse.ArgumentParser) -> None:
    """`--log FILE` or `--nats URL --stream NAME [--archive DIR]` (defaults: $NATS_URL, $MUSTER_STREAM or MUSTER)."""
    g = p.add_argument_group("log (a JSONL file, or a NATS JetStream stream)")
    g.add_argument("--log", metavar="FILE", help="JSONL log (`muster sim --output jsonl`); line N is sequence N")
    g.add_argument("--nats", metavar="URL", default=None, help="NATS server (default: $NATS_URL or the local default)")
    g.add_argument(
        "--stream",
        metavar="NAME",
        help="JetStream stream holding the log (default: --config's nats.stream, $MUSTER_STREAM or MUSTER)",
    )
    g.add_argument(
        "--subject-prefix",
        metavar="PREFIX",
        help="subject prefix of the log's events (default: --config's nats.subject_prefix, else muster), "
        "as `queues apply` and the daemon take it",
    )
    g.add_argument(
        "--archive",
        metavar="DIR|nats-object:BUCKET",
        default=os.environ.get("MUSTER_ARCHIVE") or None,
        help="sealed segments of what left the stream's window, in a directory or a JetStream object store bucket: "
        "read them, then the stream (default: $MUSTER_ARCHIVE)",
    )
    add_connection_arguments(g)


def add_scope_argument(p: argparse.ArgumentParser) -> None:
    """`--scope QUEUE`: read what that queue's own identity may read (a team's credentials)."""
    p.add_argument(
        "--scope",
        metavar="QUEUE",
        help="read only QUEUE's jobs' events and the cluster's configuration, nodes and leadership "
        "(what QUEUE's own NATS identity may read; no snapshots)",
    )


def add_snapshot_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("snapshots")
    g.add_argument(
        "--snapshots",
        metavar="WHERE",
        help="object store bucket (NATS; default STREAM-snapshots when it exists) or directory (with --log)",
    )
    g.add_argument("--no-snapshots", action="store_true", help="fold from the start of the log")
    g.add_argument(
        "--verify",
        choices=["marks", "full", "none"],
        default="marks",
        help="trust verified snapshots and check the others (marks, default); "
        "check every snapshot from the start (full); checksums only (none)",
    )


def add_common(p: argparse.ArgumentParser, *, snapshots: bool = True) -> None:
    add_source_arguments(p)
    if snapshots:
        add_snapshot_arguments(p)
    add_output(p)


def add_output(p: argparse.ArgumentParser, *extra: str) -> None:
    """`-o/--output table|json|jsonl` (plus `extra` forms such as `wide`), the same on every command."""
    forms = ["table", *extra, "json", "jsonl"]
    p.add_argument(
        "-o",
        "--output",
        choices=forms,
        default="table",
        help="human table (default), "
        + "".join(f"{e} (more columns), " for e in extra)
        + "one JSON document (json) or one JSON object per line (jsonl)",
    )
