"""`muster audit [--from POINT] [--to POINT]`: re-derive every recorded decision and compare.

Prints "N decisions re-derived identically, M differ" and, for each cycle
that differs, its sequences and the recorded and re-derived decisions.
Exit status 1 when anything differs (a tampered log, or a code change that
alters past behaviour), 0 otherwise.
"""

from __future__ import annotations

import argparse
from typing import IO, Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    from muster.replay.cliargs import POINT_HELP, add_common

    p.add_argument("--from", dest="start", metavar="POINT", help=f"first point to audit: {POINT_HELP}")
    p.add_argument("--to", dest="end", metavar="POINT", help="last point to audit (default: the end)")
    p.add_argument("--show", type=int, default=20, metavar="N", help="show at most N differing cycles (default 20)")
    add_common(p)


def run(args: argparse.Namespace) -> int:
    from muster.replay.cliutil import run_command, window_args

    async def body(source: Any, store: Any) -> int:
        from muster.replay.audit import audit, report_document
        from muster.replay.cliutil import emit, open_snapshots

        window = await window_args(source, args)
        snapshots = await open_snapshots(args, source, store) if window.start is not None else None
        report = await audit(source, start=window.start, end=window.end, snapshots=snapshots, verify=args.verify)
        if args.output != "table":
            emit(args.output, report_document(report))
        else:
            render(report, show=args.show)
        return 0 if report.ok else 1

    code: int = run_command(args, body, "audit")
    return code


def render(report: Any, out: IO[str] | None = None, *, show: int = 20) -> None:
    from muster.events.codec import encode
    from muster.replay.audit import brief
    from muster.replay.cliutil import console
    from muster.replay.points import Clock

    con = console(out)
    style = "green" if report.ok else "red"
    con.print(f"[bold {style}]{report.headline()}[/bold {style}]", highlight=False)
    notes = [f"{report.cycles:,} cycles audited ({report.cycles_identical:,} identical)"]
    notes.append(f"seq {report.from_seq:,}..{report.to_seq:,} of {report.source}, {report.events:,} events")
    if report.fenced:
        notes.append(f"{report.fenced:,} fenced decisions of a deposed leader (ignored by the fold)")
    if report.inputs:
        notes.append(f"{report.inputs:,} input rejections (cycle 0) not audited")
    if report.unrecorded:
        notes.append(
            f"{len(report.unrecorded):,} settling cycles where the code decides what the log does not show "
            "(a daemon that decided later, or deleted decisions: see --output json)"
        )
    if report.settled_unchecked:
        notes.append(
            f"{report.settled_unchecked:,} CycleSettled records of a memo this window cannot rebuild (it starts "
            "mid-term): checked to decide nothing else"
        )
    if report.skipped_partial:
        notes.append(f"{report.skipped_partial:,} decisions of a cycle that began before --from")
    con.print("; ".join(notes) + f"; {report.seconds:.2f}s", highlight=False)
    clock = None
    for b in report.differences[:show]:
        if clock is None:
            clock = Clock.for_log(b.at)
        seqs = f"seq {b.first_seq}" if b.first_seq == b.last_seq else f"seq {b.first_seq}..{b.last_seq}"
        con.print(
            f"\n[bold]{seqs}[/bold] · cycle {b.cycle} · epoch {b.epoch} · {clock.at(b.at)}: "
            f"{b.differ} differ, {b.identical} identical",
            highlight=False,
        )
        if b.error:
            con.print(f"  decide failed: {b.error}", highlight=False, markup=False)
        derived = [encode(e) for e in b.derived]
        recorded = [encode(e) for e in b.recorded]
        con.print("  recorded:", highlight=False)
        for i, ev in enumerate(b.recorded):
            same = i < len(derived) and derived[i] == recorded[i]
            con.print(f"    {'=' if same else '!'} {b.seqs[i]}  {brief(ev)}", highlight=False, markup=False)
        con.print("  re-derived:", highlight=False)
        if not b.derived:
            con.print("    (nothing)", highlight=False)
        for i, ev in enumerate(b.derived):
            same = i < len(recorded) and derived[i] == recorded[i]
            con.print(f"    {'=' if same else '!'} {brief(ev)}", highlight=False, markup=False)
    if len(report.differences) > show:
        con.print(f"\n... and {len(report.differences) - show} more differing cycles (--show N, or --output json)")
