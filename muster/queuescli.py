"""`muster queues apply FILE`: append the queue configuration of a YAML file to the log.

The file uses the field names of spec/scenario.md (and of the configuration
events): `topology.levels`, `fair_sharing`, `idle_reclaim`, `priority_classes`,
`cohorts`, `queues`. It is read by the scenario reader of `muster sim`, so
both accept exactly the same thing and report errors with file and line;
scenario-only keys (`nodes`, `timeline`, `timeline_csv`, `until`) are refused.

It appends one SchedulerConfigured, then every PriorityClassConfigured,
CohortConfigured and QueueConfigured, in file order, stamped with the current
time. Applying the same file again is harmless (a configuration event
replaces the previous one of its name). A queue removed from the file is not
deleted from the log.

This lives in the `muster` (CLI) package because it reuses `muster.replay`'s
reader, which the daemon layer may not import.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from muster.events.types import Event


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from muster.adminconnect import add_nats_arguments

    sub = parser.add_subparsers(dest="queues_command", metavar="SUBCOMMAND")
    sub.required = True
    apply = sub.add_parser("apply", help="append the queues, cohorts and priority classes of FILE to the log")
    apply.add_argument("file", metavar="FILE", help="queues YAML (spec/scenario.md field names)")
    apply.add_argument("--dry-run", action="store_true", help="print the events as JSON lines; append nothing")
    add_nats_arguments(apply)


_SCENARIO_ONLY = "nodes, timeline, timeline_csv and until belong in a `muster sim` scenario, not a queues file"


def load_events(path: str, at: int) -> list[Event]:
    """The configuration events of a queues file (raises ScenarioError naming file and line)."""
    import msgspec

    from muster.events.types import NodeAdded
    from muster.replay.scenario import ScenarioError, load

    scenario = load(path)
    if scenario.nodes or scenario.inputs or scenario.until is not None:
        raise ScenarioError(path, None, _SCENARIO_ONLY)
    return [msgspec.structs.replace(ev, at=at) for ev in scenario.config if not isinstance(ev, NodeAdded)]


def run(args: argparse.Namespace) -> int:
    import time

    import anyio

    from muster.replay.scenario import ScenarioError

    try:
        events = load_events(args.file, int(time.time()))
    except ScenarioError as exc:
        print(f"muster queues apply: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        from muster.events.codec import encode

        for ev in events:
            print(encode(ev).decode())
        return 0
    from muster.adminconnect import CommandFailed

    try:
        code: int = anyio.run(_append, args, events)
    except CommandFailed as exc:
        return exc.code
    return code


async def _append(args: argparse.Namespace, events: list[Event]) -> int:
    import collections
    import uuid

    from muster.adminconnect import open_store
    from muster.events.store import StoreError

    store = await open_store(args, command="queues apply")
    try:
        run_id = uuid.uuid4().hex[:12]
        try:
            seqs = await store.append(events, msg_ids=[f"config:{run_id}:{i}" for i in range(len(events))])
        except StoreError as exc:
            print(f"muster queues apply: appending failed: {exc}", file=sys.stderr)
            return 1
    finally:
        await store.close()
    counts = collections.Counter(type(ev).__name__ for ev in events)
    what = ", ".join(f"{n} {name}" for name, n in counts.items())
    where = f"{min(seqs)}..{max(seqs)}" if seqs else "-"
    print(f"appended {len(events)} events to {store.stream} (sequences {where}): {what}")
    return 0
