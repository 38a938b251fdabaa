"""Plumbing shared by the replay commands: arguments, opening the log and snapshots, output.

Exit status of every replay command: 0 done; 1 a finding (audit differences)
or NATS not answering; 2 bad arguments or a log that cannot be opened (a
missing file or stream, not a NATS URL), with a one-line message and never a
traceback; 141, silently, when the reader of the output has gone (`muster.cli.reader_gone`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import re
import sys
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import IO, Any

from muster.events.codec import DecodeError, decode
from muster.events.store import BadEvent, EventStore, StoredEvent, StoreError
from muster.projections.resources import gpus_of
from muster.replay.points import EPOCH_THRESHOLD, Clock, Point, PointError, parse_point
from muster.replay.snapshots import Discarded, Snapshots
from muster.replay.snapshotstores import DirSnapshots, NatsSnapshots, default_bucket
from muster.replay.source import LogSource, QueueLog, SourceError, SourceUnavailable, open_source


class UsageError(Exception):
    """Bad arguments: printed, exit 2."""


SCOPE_HINT = "--scope reads the subjects of one prefix: is the log's --subject-prefix given?"
"""What a `--scope` that finds nothing at all most likely means (a log of another subject prefix)."""


def require_known(flag: str, wanted: Iterable[str], known: Iterable[str], what: str, *, hint: str = "") -> None:
    """One rule for every filter that takes a name (`--queue`, `--namespace`, `--scope`): a name the log never
    saw is a UsageError naming what it has, not an empty answer, which reads as "nothing there" for a typo.
    `hint` is added when the log has none at all."""
    have = sorted(set(known))
    missing = sorted(set(wanted) - set(have))
    if missing:
        shown = ", ".join(have[:20]) + (f" and {len(have) - 20} more" if len(have) > 20 else "")
        extra = f"; {hint}" if hint and not have else ""
        raise UsageError(f"{flag} {missing[0]}: no such {what} on the log ({what}s: {shown or 'none'}){extra}")


_BUCKET = re.compile(r"[A-Za-z0-9_-]+")


def point_arg(text: str | None, what: str) -> Point:
    if text is None:
        return Point()
    try:
        return parse_point(text)
    except PointError as exc:
        raise UsageError(f"{what}: {exc}") from None


async def _edge(source: LogSource, forward: bool) -> tuple[int, int] | None:
    """(seq, time) of the first (or last) event that decodes, looking at most 100 sequences in."""
    last = await source.last_seq()
    if last < 1:
        return None
    span = range(1, min(last, 100) + 1) if forward else range(last, max(0, last - 100), -1)
    for seq in span:
        raw = await source.raw(seq)
        if not raw or not raw.strip():
            continue
        try:
            return seq, decode(raw).at
        except DecodeError:
            continue
    return None


async def check_point(source: LogSource, point: Point | None, what: str) -> None:
    """Refuse (UsageError, exit 2) a point before the log's first event or after its last one."""
    if point is None or point.is_end:
        return
    first, last = await _edge(source, True), await _edge(source, False)
    _refuse_outside(source.name, point, what, first, last)


def _refuse_outside(
    name: str, point: Point, what: str, first: tuple[int, int] | None, last: tuple[int, int] | None
) -> None:
    """The one rule of a point outside the log: UsageError naming the log's first or last event."""
    if first is None or last is None:
        raise UsageError(f"{what} {point.text}: the log {name} holds no event")
    clock = Clock.for_log(last[1])
    if point.seq is None and point.time is not None and not clock.epoch and point.time >= EPOCH_THRESHOLD:
        raise UsageError(
            f"{what} {point.text} is a date and time, but {name} is a sim log: its times are seconds from its "
            f"start ({clock.at(first[1])} to {clock.at(last[1])}); give @SECONDS (@3600 or @1h)"
        )
    refuse_past_end(name, point, what, last)
    if point.seq is not None:
        if point.seq < first[0]:
            raise UsageError(f"{what} {point.text} is before the start of {name}, which starts at seq {first[0]:,}")
    elif point.time is not None and point.time < first[1]:
        raise UsageError(
            f"{what} {point.text} is before the start of {name}: its first event is at {clock.at(first[1])}"
        )


def refuse_past_end(name: str, point: Point, what: str, last: tuple[int, int]) -> None:
    """The one rule of a point past a log's last event (`last`: its seq and time): UsageError naming it (the
    dashboard asks it too: a page at a time the log never reached would be told as of that time)."""
    if point.seq is not None:
        if point.seq > last[0]:
            raise UsageError(f"{what} {point.text} is past the end of {name}, which ends at seq {last[0]:,}")
    elif point.time is not None and point.time > last[1]:
        clock = Clock.for_log(last[1])
        raise UsageError(f"{what} {point.text} is past the end of {name}: its last event is at {clock.at(last[1])}")


async def point_reader(source: LogSource, point: Point, what: str) -> LogSource:
    """The source a view at `point` reads through, the point checked (UsageError when outside the log).

    A source that reads by sequence is checked now (two small reads). A queue's scoped view
    may not: its edges are found only by reading its events, so the view's own read checks
    the point (`PointReading`) instead of a whole read of its own before it.
    """
    if isinstance(source, QueueLog) and not point.is_end:
        return PointReading(source, point, what)
    await check_point(source, point, what)
    return source


class PointReading:
    """A source that checks a point against the events it yields, once a read from the log's start ends.

    The read applies the point's time itself (the source reads on past it): the first event
    after it shows the point is inside the log, and the read stops there, as `until` stops it.
    """

    def __init__(self, source: QueueLog, point: Point, what: str) -> None:
        self.source = source
        self.point = point
        self.what = what
        self.name = source.name

    async def last_seq(self) -> int:
        last: int = await self.source.last_seq()
        return last

    async def raw(self, seq: int) -> bytes | None:
        raw: bytes | None = await self.source.raw(seq)
        return raw

    async def batches(
        self, from_seq: int = 1, to_seq: int | None = None, *, until: int | None = None
    ) -> AsyncGenerator[list[StoredEvent], None]:
        first: tuple[int, int] | None = None  # (seq, time) of the first event read
        last: tuple[int, int] | None = None  # of the last one at or before the point
        later: tuple[int, int] | None = None  # of the first one after the point's time
        async with contextlib.aclosing(self.source.batches(from_seq, to_seq)) as batches:
            async for batch in batches:
                if not batch:
                    continue
                if first is None:
                    first = (batch[0].seq, batch[0].event.at)
                cut = len(batch) if until is None else _count_until(batch, until)
                if cut:
                    last = (batch[cut - 1].seq, batch[cut - 1].event.at)
                    yield batch if cut == len(batch) else batch[:cut]
                if cut < len(batch):
                    later = (batch[cut].seq, batch[cut].event.at)
                    break
        if from_seq <= 1:
            await self._check(first, last, later)

    async def _check(
        self, first: tuple[int, int] | None, last: tuple[int, int] | None, later: tuple[int, int] | None
    ) -> None:
        point = self.point
        if first is None:  # nothing read: an empty view, or a sequence before its first event
            upto = f" up to seq {point.seq:,}" if point.seq is not None else ""
            raise UsageError(f"{self.what} {point.text}: the log {self.name} holds no event{upto}")
        if later is not None:
            last = later  # the log goes on past the point's time
        elif last is not None and point.seq is not None and point.seq <= await self.source.last_seq():
            last = (point.seq, last[1])  # read up to the point, which the stream holds
        _refuse_outside(self.name, point, self.what, first, last)


def _count_until(batch: list[StoredEvent], until: int) -> int:
    """How many of `batch` come before its first event later than `until` (where a read with `until` stops)."""
    return next((i for i, stored in enumerate(batch) if stored.event.at > until), len(batch))


@dataclass(frozen=True)
class Window:
    """`--from`/`--to` of `audit` and `whatif`: where the window starts and ends (None: the log's start, end)."""

    start: Point | None
    end: Point | None


async def window_args(source: LogSource, args: argparse.Namespace) -> Window:
    """`--from` and `--to` (`args.start`, `args.end`), each inside the log and in order, or UsageError (exit 2)."""
    start = point_arg(args.start, "--from") if args.start else None
    end = point_arg(args.end, "--to") if args.end else None
    if start is not None and end is not None:
        for a, b in ((start.seq, end.seq), (start.time, end.time)):
            if a is not None and b is not None and a > b:
                raise UsageError(f"--from {start.text} comes after --to {end.text}")
    await check_point(source, start, "--from")
    await check_point(source, end, "--to")
    return Window(start, end)


def stderr_bad(bad: BadEvent) -> None:
    print(f"muster: skipped a bad event at seq {bad.seq}: {bad.error}", file=sys.stderr)


def stderr_discarded(d: Discarded) -> None:
    print(f"muster: {d}", file=sys.stderr)


async def open_snapshots(
    args: argparse.Namespace, source: LogSource, store: EventStore | None, *, create: bool = False
) -> Snapshots | None:
    """The snapshots the arguments name (None with --no-snapshots, --scope, or when there are none).

    A snapshot holds every queue's state: a reader of one queue's subjects (`--scope`) folds from the start.
    """
    if getattr(args, "no_snapshots", False) or getattr(args, "scope", None) is not None:
        return None
    where = getattr(args, "snapshots", None)
    if store is None:
        if where is None:
            return None
        return Snapshots(DirSnapshots(where), source, report=stderr_discarded)
    if where is not None and not _BUCKET.fullmatch(where):
        raise UsageError(
            f"--snapshots {where}: with a NATS log it names an object store bucket (letters, digits, - and _); "
            "a directory goes with --log FILE"
        )
    backend = await NatsSnapshots.open(store.js, where or default_bucket(store.stream), create=create)
    if backend is None:
        return None
    return Snapshots(backend, source, report=stderr_discarded)


def run_command(
    args: argparse.Namespace,
    body: Callable[[LogSource, EventStore | None], Awaitable[int]],
    prog: str,
    *,
    wait: bool = False,
) -> int:
    """Open the log the arguments name (`wait`: until it can be) and run `body`; known failures exit 1 or 2."""
    import anyio

    _quiet_logs()

    async def main() -> int:
        async with open_source(args, stderr_bad, wait=wait) as (source, store):
            return await body(source, store)

    from nats.errors import Error as NatsError

    try:
        return anyio.run(main)
    except (SourceError, UsageError) as exc:
        print(f"muster {prog}: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, SourceUnavailable) else 2
    except NatsError as exc:  # a request refused or timed out mid-way: say so, no traceback
        print(f"muster {prog}: NATS: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except StoreError as exc:  # the log cannot be read through: a damaged archive segment, a hole, permissions
        print(f"muster {prog}: {exc}{refusal_hint(args, exc)}", file=sys.stderr)
        return 1


def refusal_hint(args: argparse.Namespace, exc: Exception) -> str:
    """What to try when NATS refused reading the whole log: a queue's identity reads its own subjects."""
    from muster.events.store import StoreRefused

    if isinstance(exc, StoreRefused) and getattr(args, "scope", None) is None and hasattr(args, "scope"):
        return "; an identity of one queue reads its own jobs with --scope QUEUE"
    return ""


class _Stderr:
    """Whatever `sys.stderr` is when a line is written (tests swap it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _quiet_logs() -> None:
    """Library logs (NATS reconnects...) go to stderr, warnings and up: stdout is the command's output."""
    import logging

    import structlog

    if not structlog.is_configured():
        structlog.configure(
            wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
            logger_factory=structlog.PrintLoggerFactory(_Stderr()),  # type: ignore[arg-type]
        )


def json_line(obj: Any) -> str:
    """`obj` as one line of JSON (what JSON cannot hold, as its `str`): the form of `-o jsonl`.

    msgspec, not `json`: `muster jobs --all -o jsonl` writes a line per job the log ever saw."""
    import msgspec

    return msgspec.json.encode(obj, enc_hook=str).decode()


def dump_json(obj: Any, out: IO[str] | None = None) -> None:
    """`obj` as one indented JSON document (`-o json`)."""
    import msgspec

    out = out if out is not None else sys.stdout
    out.write(msgspec.json.format(msgspec.json.encode(obj, enc_hook=str), indent=2).decode())
    out.write("\n")


def emit(output: str, doc: Any, rows: list[Any] | None = None, out: IO[str] | None = None) -> None:
    """Print a command's answer as data: `json`, one document; `jsonl`, its `rows` one per line (a
    command whose answer is one record prints that record on one line)."""
    out = out if out is not None else sys.stdout
    if output == "json":
        dump_json(doc, out)
        return
    for row in rows if rows is not None else [doc]:
        out.write(json_line(row) + "\n")


class Report:
    """What an acting command (submit, apply, cancel...) tells, in the form `-o` asks: a line of text
    per thing done (table), or its record: one per line as it happens (jsonl), or all of them as one
    JSON list at `close()` (json)."""

    def __init__(self, output: str, out: IO[str] | None = None) -> None:
        self.output = output
        self.out = out if out is not None else sys.stdout
        self.records: list[dict[str, Any]] = []

    def say(self, text: str, **record: Any) -> None:
        if self.output == "table":
            self.out.write(text + "\n")
        elif self.output == "jsonl":
            self.out.write(json_line(record) + "\n")
        else:
            self.records.append(record)
        self.out.flush()

    def close(self) -> None:
        if self.output == "json":
            dump_json(self.records, self.out)


def console(out: IO[str] | None = None, *, width: int | None = None) -> Any:
    """The rich console every command prints through: the terminal's width on a terminal, 140 columns into a
    file or pipe (`width`: that many on both). A write to a pipe whose reader has gone raises BrokenPipeError,
    which `muster.cli.main` ends as every command's pipe ends (rich alone would exit 1 at once)."""
    out = out if out is not None else sys.stdout
    tty = out.isatty()
    return _pipe_console()(file=out, width=width or (None if tty else 140), no_color=not tty)


@functools.cache
def _pipe_console() -> Any:
    """rich's Console, but leaving a closed pipe to the caller (its hook's default is SystemExit(1))."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True  # nothing more is written to a reader that has gone
            raise BrokenPipeError

    return PipeConsole


def gpus(resources: dict[str, int] | None) -> str:
    """A resource vector's GPUs: `16`, or on flavors their sum and each flavor's (`127 (a100 66, h100 61)`)."""
    if not resources:
        return "-"
    flavors = {k.partition("@")[2]: v for k, v in sorted(resources.items()) if k.startswith("gpu@")}
    if not flavors:
        v = resources.get("gpu")
        return "-" if v is None else f"{v:,}"
    each = ", ".join(f"{f} {v:,}" for f, v in flavors.items())
    return f"{gpus_of(resources):,} ({each})"


PLAIN_ROWS = 2000
"""A table of more rows is printed as plain aligned text (`plain_table`)."""


def plain_table(title: str, columns: list[str], rows: list[list[str]], right: frozenset[str]) -> str:
    """A table as aligned plain text, columns two spaces apart, no cell ever cut or wrapped.

    What a big table is printed as: rich measures, wraps and lays out every cell, a minute of
    CPU for the 100,000 rows of `muster jobs --all` on a long log; this takes a tenth of a second.
    """
    from rich.cells import cell_len

    def width(text: str) -> int:
        return len(text) if text.isascii() else cell_len(text)

    widths = [width(c) for c in columns]
    for row in rows:
        for i, cell in enumerate(row):
            w = width(cell)
            if w > widths[i]:
                widths[i] = w
    flush = [c in right for c in columns]

    def line(cells: list[str]) -> str:
        parts = []
        for cell, w, to_right in zip(cells, widths, flush, strict=True):
            pad = " " * (w - width(cell))
            parts.append(pad + cell if to_right else cell + pad)
        return "  ".join(parts).rstrip()

    return "\n".join([title, line(columns), *(line(r) for r in rows)]) + "\n"


def add_row(table: Any, *cells: object) -> None:
    """A table row of plain text: names and reasons may contain `[...]`, which rich would read as markup."""
    from rich.text import Text

    table.add_row(*(Text(str(c)) for c in cells))
