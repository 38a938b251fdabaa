"""The `muster` command: one entry point, one module per subcommand.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`
and is imported only when its command runs, so `muster sim` never loads the
Kubernetes client.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("muster.replay.simcli", "run the scheduler core over a scenario in virtual time"),
    "billing": ("muster.daemon.billingcli", "chargeback: fold the log into a GPU ledger and report on it"),
    "daemon": ("muster.daemon.daemoncli", "run the scheduler daemon (one replica; leader-elected)"),
    "queues": (
        "muster.queuescli",
        "the queues and cohorts: quota, borrowing, admitted and pending work; `queues apply FILE`",
    ),
    "submit": ("muster.submitcli", "submit a gang (a JobSubmitted) from flags or a YAML file"),
    "jobs": ("muster.replay.jobscli", "the jobs of the log, squeue-like: state, queue position, age, why each waits"),
    "cancel": ("muster.controlcli", "end jobs: JobCancelled on the log; the cluster's workload is stopped"),
    "hold": ("muster.controlcli", "keep pending jobs from being scheduled (they keep their place) until released"),
    "release": ("muster.controlcli", "let held jobs be scheduled again"),
    "demo": ("muster.demo.cli", "muster end to end on a laptop: embedded NATS, emulated cluster, live view"),
    "replay": ("muster.replay.replaycli", "the cluster state at any point of the log"),
    "explain": ("muster.replay.explaincli", "a job's story from the log, and what it waits for"),
    "audit": ("muster.replay.auditcli", "re-derive every recorded decision and compare"),
    "whatif": ("muster.replay.whatifcli", "replay a log's jobs under another queue configuration"),
    "snapshot": ("muster.replay.snapshotcli", "write and verify snapshots of the folded state"),
    "completion": ("muster.completioncli", "print a shell completion script: `source <(muster completion bash)`"),
    "ui": ("muster.ui.uicli", "the web dashboard: cluster, queues, jobs, chargeback, at any point of the log"),
}


def version() -> str:
    """The installed distribution's version (`muster-scheduler` in pyproject.toml)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("muster-scheduler")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="muster", description="An event-sourced gang scheduler for GPU batch work.")
    from muster.projections import CORE

    parser.add_argument("--version", action="version", version=f"muster {version()}, core: {CORE}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module_name)
        importlib.import_module(module_name).add_arguments(p)
    _mark_leaves(parser)
    return parser


def _mark_leaves(parser: argparse.ArgumentParser) -> None:
    """Each (sub)command parser records itself, so a stray argument is reported with its own usage."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                child.set_defaults(_parser=child)
                _mark_leaves(child)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        leaf: argparse.ArgumentParser = getattr(args, "_parser", parser)
        leaf.error(f"unrecognized arguments: {' '.join(extra)}")  # exits 2
    module = importlib.import_module(args._module)
    try:
        code: int = module.run(args)
        sys.stdout.flush()  # here, not at the interpreter's exit, so a reader gone by then is seen below
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return reader_gone()
    except BaseExceptionGroup as group:
        # a command that runs a task group (`demo`) raises the closed pipe of one of its tasks in a group
        if group.split(BrokenPipeError)[1] is not None:
            raise
        return reader_gone()
    return code


SIGPIPE_STATUS = 128 + 13
"""The status a shell reports for `git log | head`: git dies of SIGPIPE when its reader has gone."""


def reader_gone() -> int:
    """Every command's end when the reader of its output closed the pipe (`muster sim | head`): it has what
    it wanted, so no message and the status POSIX tools give (141, as `git log` and `yes` do); the rest of
    the output goes to /dev/null, so the interpreter's last flush does not fail again."""
    import os

    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return SIGPIPE_STATUS


if __name__ == "__main__":
    sys.exit(main())
