"""`muster queues apply FILE`: make the log's queue configuration what the file says, like `kubectl apply`.

(`muster queues` with no subcommand shows the queues: `muster.replay.queuesviewcli`.)

The file uses the field names of spec/scenario.md (and of the configuration
events): `topology.levels`, `fair_sharing`, `idle_reclaim`, `priority_classes`,
`cohorts`, `flavors`, `queues` (plain quota or `resource_groups` per flavor).
It is read by the scenario reader of `muster sim`, so both accept exactly
the same thing and report errors with file and line; scenario-only keys
(`nodes`, `timeline`, `timeline_csv`, `until`) are refused.

Apply is declarative: it reads the configuration the log folds to (the last
event on each configuration subject) and appends only what differs, stamped
with the current time: a SchedulerConfigured when a scheduler setting the
file gives differs, then the PriorityClassConfigured, CohortConfigured,
FlavorConfigured and QueueConfigured whose object differs or is new, in file order. Each object
the file names is replaced whole (a queue's unmentioned fields take their
defaults). What the file does not mention is left as it is: a file holding
only a queue leaves the topology levels, fair sharing and idle reclaim
alone. With `--prune`, scheduler settings the file does not give go back to
their defaults; queues, cohorts and priority classes the file leaves out stay
(the log has no event that removes one), and apply says so. Applying the same
file again appends nothing. `--dry-run` prints the differences and appends
nothing. Reading the configuration needs direct gets on the configuration
subjects (the admin identity has them, deploy/nats/accounts.conf).

`--scope QUEUE` (before or after `apply`) limits the apply to that queue, as
the scope of `jobs`, `cancel`, `hold` and `release` limits them to its jobs:
a file must define the queue, and one that would change anything else on the
log (another queue, a cohort, a class, a flavor, a scheduler setting) is
refused, naming each, with nothing appended (exit 2). Writing configuration
stays the admin identity's: a queue's own identity may neither read it by
direct get nor publish it, and NATS refuses it (exit 1). Every other flag
given before `apply` is honoured too, or refused when it only goes with
showing the queues (`--at`, `--watch`, `--log`...).

This lives in the `muster` (CLI) package because it reuses `muster.replay`'s
reader, which the daemon layer may not import.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from muster.events.store import EventStore
    from muster.events.types import Event, SchedulerConfigured
    from muster.replay.scenario import Scenario


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from muster.adminconnect import add_nats_arguments
    from muster.replay.cliargs import add_output
    from muster.replay.queuesviewcli import add_arguments as add_view_arguments

    # `muster queues` alone shows the queues; `muster queues apply FILE` changes them
    add_view_arguments(parser)
    sub = parser.add_subparsers(dest="queues_command", metavar="SUBCOMMAND", help="none: show the queues")
    apply_help = "make the log's queues, cohorts, priority classes and settings what FILE says (appends what differs)"
    apply = sub.add_parser("apply", help=apply_help, description=apply_help)
    apply.add_argument("file", metavar="FILE", help="queues YAML (the field names of docs/spec/scenario.md)")
    apply.add_argument("--dry-run", action="store_true", help="print what differs from the log; append nothing")
    apply.add_argument(
        "--prune", action="store_true", help="reset the scheduler settings FILE does not give to their defaults"
    )
    apply.add_argument(
        "--scope",
        metavar="QUEUE",
        help="change queue QUEUE alone: refuse (exit 2) a FILE that would change anything else on the log",
    )
    add_output(apply)
    add_nats_arguments(apply)
    _keep_flags_given_before(apply, parser)


def _keep_flags_given_before(apply: argparse.ArgumentParser, queues: argparse.ArgumentParser) -> None:
    """A flag both parsers take keeps its value when given before `apply` (`muster queues --scope Q --config F
    apply FILE`), as argparse would overwrite it with the subcommand's default; the view's own flags are
    recorded so that `run` refuses them with apply instead of ignoring them."""
    before = {a.dest: a for a in queues._actions if a.option_strings and a.dest != "help"}
    for action in apply._actions:
        if action.dest in before:
            action.default = argparse.SUPPRESS
    taken = {a.dest for a in apply._actions}
    view_only = {dest: (a.option_strings[-1], a.default) for dest, a in before.items() if dest not in taken}
    apply.set_defaults(_view_only=view_only)


_SETTINGS = {"topology": "levels", "fair_sharing": "fair_sharing", "idle_reclaim": "idle_reclaim"}
"""Top-level key of the file -> field of SchedulerConfigured."""


def load_file(path: str, known_cohorts: Any = (), known_flavors: Any = ()) -> Scenario:
    """The queues file as a scenario without nodes or timeline (raises ScenarioError naming file and line)."""
    from muster.replay.scenario import load

    return load(path, known_cohorts=known_cohorts, known_flavors=known_flavors, queues_file=True)


@dataclass
class Current:
    """The configuration the log folds to, by kind and name."""

    scheduler: SchedulerConfigured | None = None
    objects: dict[tuple[str, str], Event] = field(default_factory=dict)
    last_seq: int = 0


_KINDS = ("scheduler", "priorityclass", "cohort", "flavor", "queue")


async def read_current(store: EventStore) -> Current:
    """The last valid event of each configuration subject: what the fold of the log holds (each replaces
    the previous one of its name). A subject whose last message is not a valid event counts as absent,
    so apply writes the file's version again."""
    from nats.js.errors import NotFoundError

    from muster.events.codec import DecodeError, decode
    from muster.events.store import subject_problem
    from muster.events.types import SchedulerConfigured

    out = Current()
    for kind in _KINDS:
        info = await store.js.stream_info(store.stream, subjects_filter=f"{store.prefix}.{kind}.>")
        out.last_seq = max(out.last_seq, info.state.last_seq)
        for subject in sorted(info.state.subjects or {}):
            try:
                msg = await store.js.get_msg(store.stream, subject=subject, direct=True)
            except NotFoundError:
                continue
            try:
                event = decode(msg.data or b"")
            except DecodeError:
                continue
            if subject_problem(subject.encode(), event) is not None:
                continue
            if isinstance(event, SchedulerConfigured):
                out.scheduler = event
            else:
                out.objects[(kind, str(getattr(event, "name", "")))] = event
    return out


def _kind_and_name(event: Event) -> tuple[str, str]:
    """(subject kind, name) of a class, cohort or queue event: its key in `Current.objects`."""
    from muster.events.store import subject_for

    return subject_for(event).split(".")[1], str(getattr(event, "name", ""))


_LABEL = {"priorityclass": "priority class", "cohort": "cohort", "flavor": "flavor", "queue": "queue"}


def _label(event: Event) -> str:
    """`queue team-a`, `cohort org`, ... or `scheduler settings`: what a configuration event changes."""
    kind, name = _kind_and_name(event)
    return "scheduler settings" if kind == "scheduler" else f"{_LABEL[kind]} {name}"


def _fields(event: Event) -> dict[str, Any]:
    import msgspec

    d: dict[str, Any] = msgspec.to_builtins(event)
    for k in ("type", "at", "v", "name"):
        d.pop(k, None)
    return d


def _changes(old: Event, new: Event) -> list[str]:
    """`field: old -> new` for each field that differs."""
    import json

    a, b = _fields(old), _fields(new)
    return [f"{k}: {json.dumps(a.get(k))} -> {json.dumps(b.get(k))}" for k in b if a.get(k) != b.get(k)]


@dataclass
class Plan:
    """What applying a file appends, and what it says about it."""

    events: list[Event] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    """One per difference: `+ queue q`, `~ queue q: nominal: ... -> ...`."""
    kept: list[str] = field(default_factory=list)
    """One per object `--prune` cannot remove."""

    def beyond(self, queue: str) -> list[str]:
        """What the plan changes besides queue `queue` (`--scope`), by label."""
        return [_label(ev) for ev in self.events if _kind_and_name(ev) != ("queue", queue)]


def plan(scenario: Scenario, current: Current, at: int, *, prune: bool) -> Plan:
    """The events that make the log's configuration what the file says, and the differences they make."""
    import msgspec

    from muster.events.types import SchedulerConfigured

    out = Plan()
    events, lines = out.events, out.lines
    file_scheduler = next(ev for ev in scenario.config if isinstance(ev, SchedulerConfigured))
    have = current.scheduler or SchedulerConfigured(at=0)
    given = {f: getattr(file_scheduler, f) for key, f in _SETTINGS.items() if key in scenario.keys}
    want = msgspec.structs.replace(file_scheduler if prune else have, **given)
    changes = _changes(have, want)
    if changes:
        events.append(msgspec.structs.replace(want, at=at))
        lines += [f"~ scheduler: {c}" for c in changes]
    named: set[tuple[str, str]] = set()
    for ev in scenario.config:
        if isinstance(ev, SchedulerConfigured):
            continue
        key = _kind_and_name(ev)
        named.add(key)
        label = _label(ev)
        old = current.objects.get(key)
        if old is None:
            events.append(msgspec.structs.replace(ev, at=at))
            lines.append(f"+ {label}")
        elif changes := _changes(old, ev):
            events.append(msgspec.structs.replace(ev, at=at))
            lines += [f"~ {label}: {c}" for c in changes]
    if prune:
        for kind, name in sorted(set(current.objects) - named):
            out.kept.append(f"{_LABEL[kind]} {name} is kept: the log has no event that removes a {_LABEL[kind]}")
    return out


def run(args: argparse.Namespace) -> int:
    import anyio

    if args.queues_command is None:
        from muster.replay.queuesviewcli import run as show

        shown: int = show(args)
        return shown

    from muster.replay.specreader import ScenarioError

    view_flags = [flag for dest, (flag, default) in args._view_only.items() if getattr(args, dest) != default]
    if view_flags:
        flags = ", ".join(view_flags)
        print(f"muster queues apply: {flags} go with showing the queues, not with apply", file=sys.stderr)
        return 2
    try:
        # everything but the cohorts and flavors defined on the log, before connecting
        scenario = load_file(args.file, known_cohorts=None, known_flavors=None)
    except ScenarioError as exc:
        print(f"muster queues apply: {exc}", file=sys.stderr)
        return 2
    if args.scope is not None and all(_kind_and_name(ev) != ("queue", args.scope) for ev in scenario.config):
        print(f"muster queues apply: --scope {args.scope}: {args.file} defines no queue {args.scope}", file=sys.stderr)
        return 2
    from muster.adminconnect import CommandFailed

    try:
        code: int = anyio.run(_apply, args)
    except CommandFailed as exc:
        return exc.code
    return code


async def _apply(args: argparse.Namespace) -> int:
    import collections
    import time

    import nats.errors

    from muster.adminconnect import open_store
    from muster.events.store import StoreError
    from muster.replay.cliutil import Report
    from muster.replay.specreader import ScenarioError

    store = await open_store(args, command="queues apply", create=not args.dry_run)
    try:
        try:
            with store.refusals():
                current = await read_current(store)
        except (nats.errors.Error, StoreError) as exc:
            print(f"muster queues apply: cannot read the configuration on the log: {exc}", file=sys.stderr)
            return 1
        try:
            scenario = load_file(
                args.file,
                known_cohorts={n for k, n in current.objects if k == "cohort"},
                known_flavors={n for k, n in current.objects if k == "flavor"},
            )
        except ScenarioError as exc:
            print(f"muster queues apply: {exc}", file=sys.stderr)
            return 2
        changes = plan(scenario, current, int(time.time()), prune=args.prune)
        beyond = changes.beyond(args.scope) if args.scope is not None else []
        if beyond:
            print(
                f"muster queues apply: --scope {args.scope}: {args.file} would also change {', '.join(beyond)}; "
                "nothing appended",
                file=sys.stderr,
            )
            return 2
        events = changes.events
        for line in changes.kept:
            print(f"muster queues apply: {line}", file=sys.stderr)
        report = Report(args.output)
        for line in changes.lines:
            report.say(line, difference=line, appended=not args.dry_run)
        if not events:
            if args.output == "table":
                print(f"nothing to apply: {store.stream} already holds this configuration")
            report.close()
            return 0
        if args.dry_run:
            if args.output == "table":
                print(f"dry run: {len(events)} events would be appended to {store.stream}")
            report.close()
            return 0
        try:
            # a retried apply (same log, same differences) is stored once within the duplicate window
            ids = [f"config:{current.last_seq}:{i}:{_digest(ev)}" for i, ev in enumerate(events)]
            seqs = await store.append(events, msg_ids=ids)
        except StoreError as exc:
            print(f"muster queues apply: appending failed: {exc}", file=sys.stderr)
            return 1
    finally:
        await store.close()
    counts = collections.Counter(type(ev).__name__ for ev in events)
    what = ", ".join(f"{n} {name}" for name, n in counts.items())
    if args.output == "table":
        print(f"appended {len(events)} events to {store.stream} (sequences {min(seqs)}..{max(seqs)}): {what}")
    report.close()
    return 0


def _digest(event: Event) -> str:
    import hashlib

    import msgspec

    from muster.events.codec import encode

    return hashlib.sha256(encode(msgspec.structs.replace(event, at=0))).hexdigest()[:16]
