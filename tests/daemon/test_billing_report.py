"""`muster billing report`: formats that agree with each other, time arguments, the plot, clear errors."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from muster.cli import main
from muster.daemon.billing_store import LedgerDB
from muster.events.types import (
    Event,
    GpuUtilizationSampled,
    JobAdmitted,
    JobFinished,
    JobPreempted,
    JobSubmitted,
    NodeAdded,
    PodSet,
    QueueConfigured,
)
from muster.projections.billing import fold_billing
from muster.projections.chargeback import ROW_NUMBERS
from muster.projections.ledger import HOUR

T0 = 1_735_689_600  # 2025-01-01T00:00:00Z
LABEL = "nvidia.com/gpu.product"


def small_log() -> list[Event]:
    """Three queues, two GPU models, twelve jobs of varied size, utilization and fate over a day."""
    events: list[Event] = [
        QueueConfigured(at=T0, name="vision", nominal={"gpu": 8}),
        QueueConfigured(at=T0, name="speech", nominal={"gpu": 4}),
        QueueConfigured(at=T0, name="research", nominal={"gpu": 4}),
        NodeAdded(at=T0, node="a", labels={LABEL: "A100"}, capacity={"gpu": 8}),
        NodeAdded(at=T0, node="h", labels={LABEL: "H100"}, capacity={"gpu": 8}),
    ]
    queues = ["vision", "speech", "research"]
    for i in range(12):
        job, queue, node = f"job-{i:02}", queues[i % 3], "ah"[i % 2]
        start = T0 + i * 5400 + 137 * i
        gpus = 1 + i % 4
        events += [
            JobSubmitted(
                at=start,
                job=job,
                queue=queue,
                priority_class="scavenger" if i % 5 == 0 else None,
                podsets=[PodSet(name="w", count=1, requests={"gpu": gpus, "cpu": 4000, "memory": 16 << 30})],
            ),
            JobAdmitted(at=start, job=job, queue=queue, placement={"w-0": node}, borrowed={"gpu": i % 2}),
            GpuUtilizationSampled(at=start + 300, job=job, gpu=0.1 * (i % 10)),
        ]
        end = start + 3000 + 997 * i
        if i % 4 == 3:
            events.append(
                JobPreempted(at=end, job=job, preemptor=None, reason="FairSharing", lost_gpu_seconds=gpus * 700)
            )
        else:
            events.append(JobFinished(at=end, job=job))
    events.sort(key=lambda e: e.at)
    return events


@pytest.fixture
def ledger_url(tmp_path: Path) -> str:
    """A SQLite ledger holding the small log, written the way the subscriber writes it."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    state = fold_billing(enumerate(small_log(), start=1))
    with LedgerDB.open(url) as db:
        db.load()
        db.commit(state.ledger, state.tracker)
    return url


@pytest.fixture
def rates(tmp_path: Path) -> str:
    """A two-version rate card with a team mapping."""
    path = tmp_path / "rates.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "currency": "EUR",
                "teams": {"vision": "perception", "speech": "perception"},
                "versions": [
                    {
                        "version": "2025-01",
                        "effective_from": "2025-01-01",
                        "gpu_hour": {"default": 1.5, "A100": 2.1, "H100": 3.7},
                        "cpu_core_hour": 0.031,
                        "memory_gib_hour": 0.0043,
                        "borrowed_premium": 1.25,
                        "priority_discounts": {"scavenger": 0.6},
                    },
                    {
                        "version": "2025-01-b",
                        "effective_from": "2025-01-01T09:00:00Z",
                        "gpu_hour": {"default": 1.5, "A100": 1.9, "H100": 3.3},
                        "cpu_core_hour": 0.029,
                        "borrowed_premium": 1.3,
                    },
                ],
            }
        )
    )
    return str(path)


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main(["billing", "report", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


@pytest.mark.parametrize("by", ["queue", "job", "team"])
@pytest.mark.parametrize("share", ["nominal", "usage"])
def test_csv_columns_sum_to_the_json_totals(
    capsys: pytest.CaptureFixture[str], ledger_url: str, rates: str, by: str, share: str
) -> None:
    """Every additive CSV column adds up exactly to the JSON total, and the rows are the same rows."""
    common = ("--db", ledger_url, "--rates", rates, "--by", by, "--share-idle", share)
    rows = list(csv.DictReader(io.StringIO(_run(capsys, *common, "--format", "csv"))))
    doc = json.loads(_run(capsys, *common, "--format", "json"), parse_float=Decimal)
    assert [r["key"] for r in rows] == [r["key"] for r in doc["rows"]]
    assert len(rows) == {"queue": 3, "job": 12, "team": 2}[by]
    for name in ROW_NUMBERS:
        assert sum((Decimal(r[name]) for r in rows), Decimal(0)) == Decimal(doc["totals"][name]), name
    assert Decimal(doc["totals"]["cost"]) > 0
    assert Decimal(doc["totals"]["idle_share_cost"]) == Decimal(doc["idle_capacity"]["cost"])
    assert doc["rate_versions"] == ["2025-01", "2025-01-b"]


def test_iso_dates_and_epoch_seconds_select_the_same_window(
    capsys: pytest.CaptureFixture[str], ledger_url: str, rates: str
) -> None:
    """`--from 2025-01-01T06:00:00Z` and `--from <epoch>` are one window, and it is narrower than the whole ledger."""
    iso = _run(capsys, "--db", ledger_url, "--rates", rates, "--format", "json", "--from", "2025-01-01T06:00:00Z")
    epoch = _run(capsys, "--db", ledger_url, "--rates", rates, "--format", "json", "--from", str(T0 + 6 * HOUR))
    whole = _run(capsys, "--db", ledger_url, "--rates", rates, "--format", "json")
    assert iso == epoch
    assert json.loads(iso)["totals"]["allocated_gpu_hours"] < json.loads(whole)["totals"]["allocated_gpu_hours"]


def test_table_shows_queues_totals_and_idle_capacity(
    capsys: pytest.CaptureFixture[str], ledger_url: str, rates: str
) -> None:
    """The human table lists each queue, a total line and the idle capacity nobody held."""
    out = _run(capsys, "--db", ledger_url, "--rates", rates, "--share-idle", "nominal")
    for word in ("vision", "speech", "research", "total", "nobody held", "EUR"):
        assert word in out


def test_the_per_job_table_puts_the_idlest_jobs_first(
    capsys: pytest.CaptureFixture[str], ledger_url: str, rates: str
) -> None:
    """`--by job` lists jobs by idle GPU-hours, most first (the README's promise); the JSON keeps its key order."""
    doc = json.loads(_run(capsys, "--db", ledger_url, "--by", "job", "--format", "json"), parse_float=Decimal)
    idlest = [r["key"] for r in sorted(doc["rows"], key=lambda r: (-r["idle_gpu_hours"], r["key"]))]
    assert idlest != [r["key"] for r in doc["rows"]]
    out = _run(capsys, "--db", ledger_url, "--by", "job")
    shown = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│ job-")]
    assert shown == idlest
    assert "most idle GPU-hours first" in out


def test_a_report_without_a_rate_card_says_so_not_that_hours_predate_the_card(
    capsys: pytest.CaptureFixture[str], ledger_url: str, rates: str
) -> None:
    """Without --rates the table says no rate card was given (it said every GPU-hour came before the card's
    first version); with a card that covers the ledger, neither note."""
    out = " ".join(_run(capsys, "--db", ledger_url).split())
    assert "no rate card given (--rates): costs are zero" in out
    assert "before the first rate card version" not in out
    assert "; shared: none)" in out and " ;" not in out
    priced = _run(capsys, "--db", ledger_url, "--rates", rates)
    assert "no rate card given" not in priced and "before the first rate card version" not in priced


def test_gpu_models_the_rate_card_does_not_name_are_pointed_out(
    capsys: pytest.CaptureFixture[str], ledger_url: str, tmp_path: Path
) -> None:
    """A card naming models the ledger does not book (H100 under another name) prices them at its default,
    0 here: the report says which models and which version, instead of a quiet bill of 0."""
    card = tmp_path / "flavors.yaml"
    card.write_text("versions: [{version: v1, effective_from: 2025-01-01, gpu_hour: {h100: 4.0, a100: 2.0}}]\n")
    doc = json.loads(_run(capsys, "--db", ledger_url, "--rates", str(card), "--format", "json"))
    assert doc["unnamed_models"] == {"v1": ["A100", "H100"]}
    out = " ".join(_run(capsys, "--db", ledger_url, "--rates", str(card)).split())
    assert "rate card version v1 names no GPU model A100, H100 in gpu_hour: priced at its `default`" in out


def test_a_window_inside_an_hour_says_it_counts_the_whole_hour(
    capsys: pytest.CaptureFixture[str], ledger_url: str
) -> None:
    """`--from 06:15 --to 06:45` counts the hour 06:00-07:00 (rows are hours): the report says so in its window
    and a note, instead of titling the whole hour's GPU-hours "06:15 to 06:45"."""
    window = ("--from", "2025-01-01T06:15:00Z", "--to", "2025-01-01T06:45:00Z")
    doc = json.loads(_run(capsys, "--db", ledger_url, *window, "--format", "json"))
    assert (doc["start"], doc["end"]) == (T0 + 6 * HOUR, T0 + 7 * HOUR)
    out = " ".join(_run(capsys, "--db", ledger_url, *window).split())
    assert "2025-01-01 06:00 to 2025-01-01 07:00" in out
    assert "the window asked for, 2025-01-01 06:15 to 2025-01-01 06:45, is counted as the hours it touches" in out
    whole = _run(capsys, "--db", ledger_url, "--from", "2025-01-01T06:00:00Z", "--to", "2025-01-01T07:00:00Z")
    assert "the window asked for" not in whole


def test_a_rate_card_team_naming_no_queue_of_the_ledger_is_pointed_out(
    capsys: pytest.CaptureFixture[str], ledger_url: str, tmp_path: Path
) -> None:
    """`teams: {visoin: perception}` (a typo) leaves vision its own team: the report names the unknown queue."""
    card = tmp_path / "teams.yaml"
    card.write_text(
        "teams: {visoin: perception, speech: perception}\n"
        "versions: [{version: v1, effective_from: 2025-01-01, gpu_hour: {default: 1}}]\n"
    )
    doc = json.loads(_run(capsys, "--db", ledger_url, "--rates", str(card), "--by", "team", "--format", "json"))
    assert doc["unknown_team_queues"] == ["visoin"]
    assert {r["key"] for r in doc["rows"]} == {"perception", "vision", "research"}
    out = " ".join(_run(capsys, "--db", ledger_url, "--rates", str(card), "--by", "team").split())
    assert "the rate card's teams name queues the ledger never saw: visoin" in out


def test_plot_is_written_as_png(capsys: pytest.CaptureFixture[str], ledger_url: str, tmp_path: Path) -> None:
    """`--plot FILE.png` draws the stacked and the allocated-vs-used charts into a PNG file."""
    png = tmp_path / "billing.png"
    _run(capsys, "--db", ledger_url, "--plot", str(png))
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000


def test_plot_by_flavor_stacks_and_draws_each_flavor_apart(
    capsys: pytest.CaptureFixture[str], ledger_url: str, tmp_path: Path
) -> None:
    """`--by flavor --plot` stacks GPU-hours per flavor (GPU model) and draws each one's allocated, used and
    capacity apart; per hour the flavors add up to the queues' totals and the cluster's capacity."""
    from muster.daemon.billing_report import render_plot
    from muster.projections.chargeback import hourly_series

    png = tmp_path / "flavors.png"
    _run(capsys, "--db", ledger_url, "--by", "flavor", "--plot", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with LedgerDB.open(ledger_url, create=False) as db:
        usage, capacity, _ = db.read_window(T0, T0 + 2 * 86400)
    series = hourly_series(usage, capacity, start=T0, end=T0 + 2 * 86400)
    assert render_plot(series, tmp_path / "again.png", title="t", by="flavor") == ["A100", "H100"]
    assert render_plot(series, tmp_path / "queues.png", title="t") == ["research", "speech", "vision"]
    for p in series:
        assert sum(p.allocated_by_flavor.values()) == sum(p.allocated_by_queue.values())
        assert sum(p.capacity_by_flavor.values()) == p.capacity_gpu_s
        assert sum(p.used_by_flavor.values()) == p.used_mgpu_s
    assert any(len(p.allocated_by_flavor) == 2 for p in series)


def test_missing_ledger_and_bad_rate_card_are_clear_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, ledger_url: str
) -> None:
    """A ledger that does not exist, or a rate card with a bad price, exit 2 with a sentence, not a traceback."""
    assert main(["billing", "report", "--db", f"sqlite:///{tmp_path / 'nope.db'}"]) == 2
    assert "no ledger" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("versions: [{version: x, effective_from: 2025-01-01, gpu_hour: {A100: cheap}}]\n")
    assert main(["billing", "report", "--db", ledger_url, "--rates", str(bad)]) == 2
    assert "gpu_hour.A100" in capsys.readouterr().err


def test_postgresql_url_without_driver_says_what_to_install(capsys: pytest.CaptureFixture[str]) -> None:
    """A postgresql:// ledger without the optional psycopg driver fails with install instructions."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("psycopg is installed here")
    assert main(["billing", "report", "--db", "postgresql://u@localhost/billing"]) == 2
    assert "psycopg" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        pytest.param(["--from", "2099-01-01"], "--from (2099-01-01 00:00) is at or after the ledger's end", id="from"),
        pytest.param(["--to", "2000-01-01"], "--to (2000-01-01 00:00) is at or before the ledger's start (", id="to"),
    ],
)
def test_one_bound_outside_the_ledger_names_the_ledgers_end_not_a_flag_never_given(
    capsys, ledger_url: str, flags: list[str], said: str
) -> None:
    """`--from` past the ledger (no `--to`) exits 2 naming the ledger's end, not "--to (...) must be after --from"."""
    assert main(["billing", "report", "--db", ledger_url, *flags]) == 2
    err = capsys.readouterr().err
    assert said in err and "must be after" not in err, err


def test_a_postgresql_ledger_that_does_not_answer_is_a_runtime_failure_told_on_one_line(capsys) -> None:
    """A PostgreSQL server that refuses the connection exits 1 (runtime, as NATS not answering), in one line."""
    pytest.importorskip("psycopg")
    from muster.events.embedded import free_port

    url = f"postgresql://u@127.0.0.1:{free_port()}/billing"
    assert main(["billing", "report", "--db", url]) == 1
    err = capsys.readouterr().err
    assert "cannot connect to the PostgreSQL ledger" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    ("name", "words"),
    [
        pytest.param("/nonexistent/x.png", "folder /nonexistent does not exist", id="missing-folder"),
        pytest.param("x.txt", "must end in an image type", id="not-an-image-type"),
    ],
)
def test_a_plot_that_cannot_be_written_exits_2_before_the_report(
    capsys: pytest.CaptureFixture[str], ledger_url: str, tmp_path: Path, name: str, words: str
) -> None:
    """`--plot` to a missing folder or a non-image name exits 2 with a sentence, not a traceback, and prints nothing."""
    path = name if name.startswith("/") else str(tmp_path / name)
    assert main(["billing", "report", "--db", ledger_url, "--plot", path]) == 2
    out, err = capsys.readouterr()
    assert words in err and "Traceback" not in err and out == ""


def test_an_empty_ledger_says_there_is_nothing_to_report(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A ledger that has billed no usage yet says so (exit 0), not "--to (0) must be after --from (0)"."""
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    with LedgerDB.open(url) as db:
        db.load()
    assert main(["billing", "report", "--db", url]) == 0
    err = capsys.readouterr().err
    assert "holds no GPU usage or capacity yet" in err and "--to" not in err
