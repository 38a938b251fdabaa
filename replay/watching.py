"""Printing a status view once, or again each time the log changed it (`--watch`).

Role: one behaviour for `muster jobs` and `muster queues`. Without `--watch` the view is
printed once in the form `-o` asks. With it:
- a table on a terminal is redrawn in place (rich Live), as `kubectl get -w` keeps a screen;
- a table into a pipe or file is printed again after each change, under its title;
- `-o jsonl` prints only the rows that changed (their volatile `age` aside), and a row
  `{KEY: ..., "removed": true}` for one that left the view (a job that ended, say);
- `-o json` prints the whole document again.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from types import TracebackType
from typing import IO, Any

View = Callable[[Any], tuple[dict[str, Any], list[dict[str, Any]]]]
"""A replayed state -> (the view's JSON document, its rows)."""

VOLATILE = ("age", "now")


def _stable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in VOLATILE}


class Printer:
    def __init__(self, output: str, watch: bool, *, key: str, out: IO[str] | None = None) -> None:
        from muster.replay.cliutil import console

        self.output = output
        self.watch = watch
        self.key = key
        self.out = out if out is not None else sys.stdout
        self.console = console(self.out)
        self.live: Any = None
        self.seen: dict[str, dict[str, Any]] = {}

    def __enter__(self) -> Printer:
        if self.watch and self.output not in ("json", "jsonl") and self.out.isatty():
            from rich.live import Live

            self.live = Live(console=self.console, auto_refresh=False)
            self.live.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.live is not None:
            self.live.stop()

    def show(self, doc: dict[str, Any], rows: list[dict[str, Any]], table: Callable[[dict[str, Any]], Any]) -> None:
        """Print the view (`doc` for json, `rows` for jsonl, `table(doc)` for a table)."""
        if self.output == "json":
            from muster.replay.cliutil import dump_json

            dump_json(doc, self.out)
        elif self.output == "jsonl":
            self._lines(rows)
        else:
            shown = table(doc)
            if self.live is not None:
                from rich.text import Text

                self.live.update(Text(shown) if isinstance(shown, str) else shown, refresh=True)
            elif isinstance(shown, str):  # a big table, already laid out (`cliutil.plain_table`)
                self.out.write(shown)
            else:
                self.console.print(shown)
        self.out.flush()

    def _lines(self, rows: list[dict[str, Any]]) -> None:
        from muster.replay.cliutil import json_line

        now = {str(r[self.key]): r for r in rows}
        for key, row in now.items():
            before = self.seen.get(key)
            if before is None or _stable(before) != _stable(row):
                self.out.write(json_line(row) + "\n")
        for key in sorted(self.seen.keys() - now.keys()):
            self.out.write(json_line({self.key: key, "removed": True}) + "\n")
        self.seen = now


def build(view: View, replayed: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The view of a state just loaded or refreshed.

    The state lives as long as the command: its objects (millions on a long log, fresh from
    a snapshot's decoder) are moved out of the cyclic collector's reach first (`gc.freeze`),
    else the allocations of the rows and of the printing trigger full passes over them
    (0.35 cpu-s on a 1M-event log, more than the view). Refcounting still frees them.
    """
    import gc

    from muster.replay.heap import no_gc

    gc.freeze()
    with no_gc():  # rows for 100k jobs: no collection while they are built
        return view(replayed)


def add_watch_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-w", "--watch", action="store_true", help="keep following the log and refresh")
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="seconds between looks (--watch)")


def run_view(args: argparse.Namespace, prog: str, key: str, view: View, table: Callable[[dict[str, Any]], Any]) -> int:
    """Run a status command: the state at `--at` (or followed, `--watch`), shown as `view` and `table` say."""
    from muster.replay.cliutil import UsageError, open_snapshots, point_arg, point_reader, run_command
    from muster.replay.rebuild import states

    async def body(source: Any, store: Any) -> int:
        if args.watch and args.at != "end":
            raise UsageError("--watch follows the end of the log; it does not go with --at")
        if args.interval <= 0:
            raise UsageError("--interval must be above 0")
        point = point_arg(args.at, "--at")
        source = await point_reader(source, point, "--at")
        snapshots = await open_snapshots(args, source, store)
        follow = args.interval if args.watch else None
        with Printer(args.output, args.watch, key=key) as printer:
            async for replayed in states(source, point, snapshots, verify=args.verify, watch=follow):
                doc, rows = build(view, replayed)
                printer.show(doc, rows, table)
        return 0

    code: int = run_command(args, body, prog)
    return code
