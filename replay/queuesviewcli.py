"""`muster queues` (no subcommand): per queue and cohort, quota, borrowing, lending, admitted and pending work.

Per queue (GPUs): nominal quota, used, borrowed (used above nominal), lent (its unused
nominal that others of its cohort tree use), running and pending gangs and their GPUs,
held gangs, and its fair share (the scheduler's weighted dominant resource share, per
mille; 0 within nominal); a queue with flavors has its quota, used, borrowed and lent GPUs on
one line per flavor (`flavors` in JSON), as GPUs of unlike models do not add up. Per cohort
the same figures summed over its subtree (per flavor, too). Read from
the folded state like `muster jobs`; `--watch` refreshes, `-o json|jsonl` prints data
(jsonl: one row per queue, then per cohort, each with its `kind`). `--scope QUEUE` reads only
what that queue's own identity may (as `muster jobs --scope`) and shows that queue alone: the
other queues' jobs are not among what it reads, so no cohort sums are shown.
"""

from __future__ import annotations

import argparse
from typing import Any

from muster.replay.points import END, Point


def add_arguments(p: argparse.ArgumentParser) -> None:
    from muster.replay.cliargs import (
        POINT_HELP,
        add_output,
        add_scope_argument,
        add_snapshot_arguments,
        add_source_arguments,
    )
    from muster.replay.watching import add_watch_arguments

    p.add_argument("--at", metavar="POINT", default="end", help=f"the queues as they were at: {POINT_HELP} (default)")
    add_watch_arguments(p)
    add_output(p)
    add_source_arguments(p)
    add_scope_argument(p)
    add_snapshot_arguments(p)


def run(args: argparse.Namespace) -> int:
    from muster.replay.cliutil import point_arg
    from muster.replay.watching import run_view

    def queues(replayed: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        return view(replayed, args.scope, point_arg(args.at, "--at"))  # run_view checked the point

    return run_view(args, "queues", "name", queues, render)


def view(replayed: Any, scope: str | None = None, point: Point = END) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The document of a replayed state, and its rows (queues, then cohorts) for `-o jsonl`."""
    doc = document(replayed, scope, point)
    rows = [{"kind": "queue", "name": r["queue"], **r} for r in doc["queues"]]
    rows += [{"kind": "cohort", "name": f"cohort:{r['cohort']}", **r} for r in doc["cohorts"]]
    return doc, rows


def document(replayed: Any, scope: str | None = None, point: Point = END) -> dict[str, Any]:
    """The queues and cohorts of the state as of `point` (`points.as_of`); with `scope`, that queue alone
    (UsageError when the log has none)."""
    from muster.replay.cliutil import SCOPE_HINT, require_known
    from muster.replay.points import as_of
    from muster.replay.status import cohort_status, queue_status

    state = replayed.state
    if scope is not None:
        require_known("--scope", {scope}, state.queues, "queue", hint=SCOPE_HINT)
    queues = queue_status(state)
    if scope is not None:
        queues = [q for q in queues if q["queue"] == scope]
    return {
        "seq": replayed.seq,
        "at": as_of(point, state.now),
        "queues": queues,
        "cohorts": cohort_status(state, queues) if scope is None else [],
    }


def _limit(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


def render(doc: dict[str, Any]) -> Any:
    """The queues table and, when there are cohorts, the cohorts table (one rich renderable)."""
    from rich.console import Group
    from rich.table import Table

    from muster.replay.cliutil import add_row

    counts = ("RUNNING", "PENDING", "HELD")
    q = Table(title=f"Queues at seq {doc['seq']:,} (GPUs)", title_justify="left", box=None)
    for col in ("QUEUE", "COHORT", "NOMINAL", "BORROW LIMIT", "USED", "BORROWED", "LENT", *counts, "FAIR SHARE"):
        q.add_column(col, justify="left" if col in ("QUEUE", "COHORT") else "right", overflow="fold")
    for r in doc["queues"]:
        # a queue with flavors has its GPU figures on one line per flavor: unlike GPUs are not added up
        flavored = bool(r["flavors"])
        add_row(
            q,
            r["queue"],
            r["cohort"] or "-",
            *(("",) * 5 if flavored else _quota_cells(r)),
            *(_gangs(r, c.lower()) for c in counts),
            _share(r["fair_share"]),
        )
        for f in r["flavors"]:
            add_row(q, f"  {f['flavor']}", "", *_quota_cells(f), "", "", "", "")
    parts: list[Any] = [q]
    if doc["cohorts"]:
        c = Table(title="Cohorts (their whole subtree)", title_justify="left", box=None)
        for col in ("COHORT", "PARENT", "QUEUES", "NOMINAL", "USED", "BORROWED", "LENT", *counts):
            c.add_column(col, justify="left" if col in ("COHORT", "PARENT", "QUEUES") else "right", overflow="fold")
        for r in doc["cohorts"]:
            flavored = bool(r["flavors"])
            add_row(
                c,
                r["cohort"],
                r["parent"] or "-",
                ", ".join(r["queues"]),
                *(("",) * 4 if flavored else _quota_cells(r, limit=False)),
                *(_gangs(r, k.lower()) for k in counts),
            )
            for f in r["flavors"]:
                add_row(c, f"  {f['flavor']}", "", "", *_quota_cells(f, limit=False), "", "", "")
        parts.append(c)
    return Group(*parts)


def _quota_cells(row: dict[str, Any], *, limit: bool = True) -> list[str]:
    """NOMINAL, (BORROW LIMIT,) USED, BORROWED, LENT of a queue's, cohort's or flavor's row."""
    cells = [f"{row['nominal']:,}", _limit(row["borrowing_limit"])] if limit else [f"{row['nominal']:,}"]
    return [*cells, f"{row['used']:,}", f"{row['borrowed']:,}", f"{row['lent']:,}"]


def _gangs(row: dict[str, Any], kind: str) -> str:
    """`3 (24)`: gangs and their GPUs."""
    n = row[f"{kind}_jobs"]
    return f"{n} ({row[f'{kind}_gpus']:,})" if n else "0"


def _share(per_mille: int) -> str:
    """A fair share for a person: `0.250`; `inf` for the core's unbounded share (a borrowing queue of
    weight 0, or one whose cohort lends none of what it borrows), which printed as 4611686018427388.000."""
    from muster.projections.quota import UNLIMITED

    return "inf" if per_mille >= UNLIMITED else f"{per_mille / 1000:.3f}"
