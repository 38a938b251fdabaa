"""`muster billing report`: the ledger priced and grouped, as a table, CSV, JSON and a PNG.

Role: read one consistent snapshot of the ledger window, price it with the rate
card (`projections.chargeback`), and render it. Rendering only formats what
`build_report` computed: the CSV rows and the JSON rows carry the same decimal
values, and the JSON totals are their sums, so a spreadsheet's column sums
match the JSON exactly. The CSV has no totals line (summing it would count the
totals twice).
"""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

import msgspec
import yaml

from muster.daemon.billing_store import LedgerDB
from muster.projections.chargeback import ROW_NUMBERS, HourPoint, Report, ReportRow, build_report, hourly_series
from muster.projections.ledger import HOUR
from muster.projections.ratecard import RateCard, RateCardError, parse_rate_card

CSV_COLUMNS: tuple[str, ...] = ("key", "queue", "team", *ROW_NUMBERS, "efficiency", "rate_versions")


def load_rate_card(path: str | Path) -> RateCard:
    """Read and validate a rate card YAML file: OSError, or a RateCardError naming the file (`FILE:LINE` for
    malformed YAML)."""
    from muster.replay.specreader import malformed

    with open(path, encoding="utf-8") as f:
        try:
            doc = yaml.safe_load(f)
        except (yaml.YAMLError, RecursionError) as exc:
            raise RateCardError(malformed(str(path), exc)) from None
    try:
        return parse_rate_card(doc)
    except RateCardError as exc:
        raise RateCardError(f"{path}: {exc}") from None


def render_csv(report: Report, out: IO[str]) -> None:
    w = csv.writer(out, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for r in report.rows:
        w.writerow(_csv_values(r))


def _csv_values(r: ReportRow) -> list[str]:
    values = [r.key, r.queue, r.team]
    values += [str(getattr(r, name)) for name in ROW_NUMBERS]
    values.append("" if r.efficiency is None else str(r.efficiency))
    values.append(";".join(r.rate_versions))
    return values


_json = msgspec.json.Encoder(decimal_format="number")


def render_json(report: Report, out: IO[str]) -> None:
    out.write(_json.encode(report).decode())
    out.write("\n")


def _when(t: int) -> str:
    if t >= 10**8:  # epoch seconds; smaller values are the virtual seconds of `muster sim`
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M")
    return f"t={t}"


def render_table(
    report: Report, out: IO[str], *, skipped: int = 0, priced: bool = True, asked: tuple[int, int] | None = None
) -> None:
    """The report as a table with its notes; `priced`: a rate card was given; `asked`: the window asked for."""
    from rich.table import Table

    from muster.replay.cliutil import console as rich_console

    cur = report.currency
    title = f"GPU chargeback by {report.by}, {_when(report.start)} to {_when(report.end)}"
    table = Table(title=title, title_justify="left")
    for name, justify in (
        (report.by, "left"),
        ("GPU-h alloc", "right"),
        ("used", "right"),
        ("idle", "right"),
        ("borrowed", "right"),
        ("lost", "right"),
        ("eff.", "right"),
        (f"cost {cur}".strip(), "right"),
        ("idle share", "right"),
        (f"total {cur}".strip(), "right"),
        ("rates", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]

    def cells(r: ReportRow) -> list[str]:
        return [
            r.key,
            _h(r.allocated_gpu_hours),
            _h(r.used_gpu_hours),
            _h(r.idle_gpu_hours),
            _h(r.borrowed_gpu_hours),
            _h(r.lost_gpu_hours),
            "-" if r.efficiency is None else f"{r.efficiency * 100:.0f}%",
            _m(r.cost),
            _m(r.idle_share_cost),
            _m(r.total_cost),
            ",".join(r.rate_versions),
        ]

    rows = report.rows
    if report.by == "job":
        # the jobs that wasted the most GPU time first: what a per-job report is read for (csv/json keep key order)
        rows = sorted(rows, key=lambda r: (-r.idle_gpu_hours, r.key))
    for r in rows:
        table.add_row(*cells(r))
    table.add_section()
    table.add_row(*cells(report.totals), style="bold")
    console = rich_console(out, width=160)
    console.print(table)
    idle = report.idle_capacity
    console.print(
        f"Cluster capacity {_h(idle.capacity_gpu_hours)} GPU-h, held {_h(idle.allocated_gpu_hours)}, "
        f"nobody held {_h(idle.unallocated_gpu_hours)} (cost {f'{_m(idle.cost)} {cur}'.strip()}; "
        f"shared: {idle.shared})."
    )
    notes = ["eff. = used / allocated GPU-hours, over the time utilization was sampled (idle likewise)"]
    if report.by == "job":
        notes.append("jobs with the most idle GPU-hours first")
    if asked is not None and asked != (report.start, report.end):
        notes.append(
            f"the ledger counts whole hours: the window asked for, {_when(asked[0])} to {_when(asked[1])}, "
            "is counted as the hours it touches (the title's)"
        )
    if not priced:
        # without a card every hour is unpriced: that is no card's fault of coverage
        if report.totals.allocated_gpu_hours:
            notes.append("no rate card given (--rates): costs are zero")
    elif report.unpriced_gpu_hours:
        notes.append(f"{_h(report.unpriced_gpu_hours)} GPU-h before the first rate card version are unpriced")
    if report.unknown_team_queues:
        notes.append(
            f"the rate card's teams name queues the ledger never saw: {', '.join(report.unknown_team_queues)} "
            "(a queue it does not name is its own team)"
        )
    for version, models in report.unnamed_models.items():
        notes.append(
            f"rate card version {version} names no GPU model {', '.join(models)} in gpu_hour: "
            "priced at its `default` (0 when it has none)"
        )
    if skipped:
        notes.append(f"{skipped} malformed event(s) were skipped (see `billing_skipped`)")
    for note in notes:
        console.print(f"Note: {note}.")


def _h(d: Decimal) -> str:
    return f"{d:,.2f}"


def _m(d: Decimal) -> str:
    return f"{d:,.2f}"


def render_plot(series: Sequence[HourPoint], path: str | Path, *, title: str, by: str = "queue") -> list[str]:
    """Stacked allocated GPU-hours per queue (`by="flavor"`: per flavor) over time, and allocated vs used
    vs capacity (per flavor: GPU-hours of unlike GPUs are not added up); returns the stacked series' names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # step(where="post") draws each value until the next x: repeat the last hour once so it gets its width
    points = [*series, series[-1]] if series else []
    hours_x = [p.hour for p in series] + ([series[-1].hour + HOUR] if series else [])
    epoch = bool(hours_x) and hours_x[0] >= 10**8
    xs: list[Any] = [datetime.fromtimestamp(h, UTC) for h in hours_x] if epoch else [h / HOUR for h in hours_x]
    flavored = by == "flavor"
    queues = sorted({q for p in series for q in (p.allocated_by_flavor if flavored else p.allocated_by_queue)})
    stacks = [
        [(p.allocated_by_flavor if flavored else p.allocated_by_queue).get(q, 0) / HOUR for p in points] for q in queues
    ]
    allocated = [sum(p.allocated_by_queue.values()) / HOUR for p in points]
    used = [p.used_mgpu_s / (HOUR * 1000) for p in points]
    sampled = [p.sampled_gpu_s / HOUR for p in points]
    capacity = [p.capacity_gpu_s / HOUR for p in points]

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 8), sharex=True, constrained_layout=True)
    if stacks:
        top.stackplot(xs, stacks, labels=queues, step="post", alpha=0.85)
    top.step(xs, capacity, where="post", color="black", linewidth=1.2, label="capacity")
    top.set_ylabel("GPU-hours per hour")
    top.set_title(f"{title}: allocated GPU-hours by {'flavor' if flavored else 'queue'}")
    top.legend(loc="upper left", fontsize="small", ncol=min(4, len(queues) + 1))
    top.grid(alpha=0.3)

    if flavored:
        _plot_per_flavor(bottom, xs, points, queues)
    else:
        bottom.step(xs, capacity, where="post", color="black", linewidth=1.0, label="capacity")
        bottom.step(xs, allocated, where="post", color="tab:blue", linewidth=1.8, label="allocated")
        bottom.step(
            xs, sampled, where="post", color="tab:blue", linestyle=":", linewidth=1.0, label="allocated (sampled)"
        )
        bottom.step(xs, used, where="post", color="tab:green", linewidth=1.8, label="used")
    total_alloc = sum(allocated[:-1])
    total_cap = sum(capacity[:-1])
    total_used = sum(used[:-1])
    total_sampled = sum(sampled[:-1])
    parts = []
    if total_cap:
        parts.append(f"allocation {100 * total_alloc / total_cap:.0f}% of capacity")
    if total_sampled:
        parts.append(f"utilization {100 * total_used / total_sampled:.0f}% of sampled allocation")
    what = "allocated vs used vs capacity per flavor" if flavored else "allocated vs used"
    bottom.set_title(what + (f" ({', '.join(parts)})" if parts else ""))
    bottom.set_ylabel("GPU-hours per hour")
    bottom.set_xlabel("time (UTC)" if epoch else "hours")
    bottom.legend(loc="upper left", fontsize="small")
    bottom.grid(alpha=0.3)
    if epoch:
        fig.autofmt_xdate()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return queues


def _plot_per_flavor(ax: Any, xs: list[Any], points: Sequence[HourPoint], flavors: list[str]) -> None:
    """Per flavor, in one colour each: capacity (thin), allocated (thick) and used (dashed)."""
    names = sorted({*flavors, *(f for p in points for f in p.capacity_by_flavor)})
    for i, name in enumerate(names):
        lines = (
            ("capacity", [p.capacity_by_flavor.get(name, 0) / HOUR for p in points], "-", 0.8),
            ("allocated", [p.allocated_by_flavor.get(name, 0) / HOUR for p in points], "-", 1.8),
            ("used", [p.used_by_flavor.get(name, 0) / (HOUR * 1000) for p in points], "--", 1.2),
        )
        for what, ys, style, width in lines:
            ax.step(xs, ys, where="post", color=f"C{i % 10}", linestyle=style, linewidth=width, label=f"{name} {what}")


def plot_problem(path: str) -> str | None:
    """Why a plot cannot be written to `path` (no matplotlib, an unknown image type, a missing folder), or None."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return "--plot needs matplotlib, an extra: pip install 'muster-scheduler[plot]'"

    kinds = sorted(Figure().canvas.get_supported_filetypes())
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in kinds:
        return f"--plot {path}: the file name must end in an image type ({', '.join('.' + k for k in kinds)})"
    folder = Path(path).parent
    if not folder.is_dir():
        return f"--plot {path}: folder {folder} does not exist"
    return None


def report_command(args: Any) -> int:
    """Run `muster billing report` with parsed arguments."""
    from muster.daemon.billing_store import LedgerError, LedgerUnreachable
    from muster.projections.ratecard import RateCardError, parse_time

    if args.plot and (problem := plot_problem(args.plot)) is not None:
        print(f"muster billing report: {problem}", file=sys.stderr)
        return 2

    try:
        rates = load_rate_card(args.rates) if args.rates else None
    except OSError as exc:
        print(f"muster billing report: rate card {args.rates}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except RateCardError as exc:
        print(f"muster billing report: rate card {exc}", file=sys.stderr)
        return 2
    try:
        ledger = LedgerDB.open(args.db, create=False)
    except LedgerError as exc:
        print(f"muster billing report: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, LedgerUnreachable) else 2
    with ledger:
        try:
            start = parse_time(args.start) if args.start is not None else None
            end = parse_time(args.end) if args.end is not None else None
        except ValueError as exc:
            print(f"muster billing report: {exc}", file=sys.stderr)
            return 2
        if start is None or end is None:
            span = ledger.span()
            if span is None:
                seq = ledger.applied_seq()
                print(
                    f"muster billing report: the ledger holds no GPU usage or capacity yet (it has applied the log "
                    f"up to sequence {seq}); nothing to report",
                    file=sys.stderr,
                )
                return 0
            start = span[0] if start is None else start
            end = span[1] if end is None else end
        if end <= start:
            # a bound the user did not give is the ledger's: say so rather than name a flag they never typed
            if args.end is None:
                why = f"--from ({_when(start)}) is at or after the ledger's end ({_when(end)})"
            elif args.start is None:
                why = f"--to ({_when(end)}) is at or before the ledger's start ({_when(start)})"
            else:
                why = f"--to ({_when(end)}) must be after --from ({_when(start)})"
            print(f"muster billing report: {why}", file=sys.stderr)
            return 2
        usage, capacity, queues = ledger.read_window(start, end)
        skipped = len(ledger.skipped())
    report = build_report(
        usage, capacity, queues, start=start, end=end, by=args.by, rates=rates, share_idle=args.share_idle
    )
    out = io.StringIO()
    if args.format == "csv":
        render_csv(report, out)
    elif args.format == "json":
        render_json(report, out)
    elif args.format == "jsonl":
        for row in report.rows:
            out.write(_json.encode(row).decode() + "\n")
    else:
        render_table(report, out, skipped=skipped, priced=rates is not None, asked=(start, end))
    sys.stdout.write(out.getvalue())
    if args.plot:
        series = hourly_series(usage, capacity, start=start, end=end)
        try:
            render_plot(series, args.plot, title=f"{_when(start)} to {_when(end)}", by=args.by)
        except OSError as exc:
            print(
                f"muster billing report: cannot write the plot to {args.plot}: {exc.strerror or exc}", file=sys.stderr
            )
            return 1
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0
