"""`muster whatif`: a log's jobs run again under another queue configuration, compared with reality.

The identity check (the log's own configuration reproduces what happened,
also when runtimes must be derived from admission to finish), a doubled
quota that lowers the waits of the queue that got it, windows, the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from replaykit import STORY, memory_log, sim, write_jsonl

from muster.cli import main
from muster.events.store import EventStore
from muster.events.types import JobSubmitted
from muster.replay.points import Point
from muster.replay.source import NatsLog
from muster.replay.whatif import whatif
from muster.replay.whatifconfig import WhatIfError

BUSY = (
    """\
nodes:
  - generate:
      count: 4
      name: "n{i}"
      capacity: {gpu: 8}
queues:
  - {name: qa, nominal: {gpu: 8}}
  - {name: qb, nominal: {gpu: 8}}
timeline:
"""
    + "".join(
        f"  - {{at: {i * 10}, submit: {{job: a{i}, queue: qa, podsets: [{{count: 1, requests: {{gpu: 8}}}}], "
        f"runtime: {300 + 50 * (i % 3)}}}}}\n"
        for i in range(8)
    )
    + "".join(
        f"  - {{at: {i * 40}, submit: {{job: b{i}, queue: qb, podsets: [{{count: 1, requests: {{gpu: 4}}}}], "
        "runtime: 200}}\n"
        for i in range(3)
    )
)

BUSY_DOUBLED = """\
queues:
  - {name: qa, nominal: {gpu: 16}}
  - {name: qb, nominal: {gpu: 8}}
"""

STORY_CONFIG = """\
queues:
  - name: team-a
    cohort: org
    nominal: {gpu: 16}
    preemption: {within_queue: LowerPriority, reclaim_within_cohort: Any}
  - name: team-b
    cohort: org
    nominal: {gpu: 16}
"""


def _queues(result: object) -> dict[str, dict]:
    return {q["queue"]: q for q in result.queue_rows()}  # type: ignore[attr-defined]


async def test_the_logs_own_configuration_reproduces_reality() -> None:
    """Run again with the configuration it had, the log's jobs wait, get preempted and use GPUs exactly as they did."""
    result = await whatif(memory_log(sim(STORY).events), STORY_CONFIG)
    for job in result.job_rows():
        real, alt = job["real"], job["whatif"]
        assert (alt["wait"], alt["preemptions"], alt["gpu_seconds"], alt["finished"]) == (
            real["wait"],
            real["preemptions"],
            real["gpu_seconds"],
            real["finished"],
        ), job["job"]
    assert _queues(result)["team-b"]["real"]["preemptions"] == 1
    cluster = result.cluster()
    assert cluster["real"] == cluster["whatif"]


async def test_runtimes_are_derived_from_admission_to_finish() -> None:
    """Without declared runtimes, each job runs as long as it really worked (preemption and checkpoints included)."""
    events = [msgspec.structs.replace(e, runtime=None) if isinstance(e, JobSubmitted) else e for e in sim(STORY).events]
    result = await whatif(memory_log(events), STORY_CONFIG)
    rows = {j["job"]: j for j in result.job_rows()}
    assert rows["b-big"]["whatif"]["finished"] == rows["b-big"]["real"]["finished"] == 1540
    assert all(j["whatif"]["gpu_seconds"] == j["real"]["gpu_seconds"] for j in rows.values())


async def test_observed_work_beats_a_declared_runtime_the_jobs_did_not_take() -> None:
    """Jobs that declared 4x the time they ran (`muster demo --speed 4`) run again as long as they really did."""
    events = [
        msgspec.structs.replace(e, runtime=e.runtime * 4) if isinstance(e, JobSubmitted) and e.runtime else e
        for e in sim(STORY).events
    ]
    result = await whatif(memory_log(events), STORY_CONFIG)
    for job in result.job_rows():
        real, alt = job["real"], job["whatif"]
        assert (alt["wait"], alt["gpu_seconds"], alt["finished"]) == (
            real["wait"],
            real["gpu_seconds"],
            real["finished"],
        )


async def test_a_queue_the_configuration_leaves_out_keeps_the_logs() -> None:
    """A file naming only qa changes qa; qb runs as it did (not rejected), and a note says qb was kept."""
    only_qa = "queues:\n  - {name: qa, nominal: {gpu: 16}}\n"
    result = await whatif(memory_log(sim(BUSY).events), only_qa)
    full = await whatif(memory_log(sim(BUSY).events), BUSY_DOUBLED)
    assert result.job_rows() == full.job_rows() and result.queue_rows() == full.queue_rows()
    assert result.notes == ["queues the configuration does not name keep the log's configuration: qb"]


async def test_a_doubled_quota_lowers_the_waits_of_its_queue() -> None:
    """Doubling qa's quota admits its queued jobs sooner; qb, unchanged and without a cohort, waits as before."""
    result = await whatif(memory_log(sim(BUSY).events), BUSY_DOUBLED)
    q = _queues(result)
    assert q["qa"]["changed"] and not q["qb"]["changed"]
    assert q["qa"]["whatif"]["wait_mean"] < q["qa"]["real"]["wait_mean"]
    assert q["qa"]["whatif"]["wait_max"] < q["qa"]["real"]["wait_max"]
    assert q["qb"]["whatif"]["wait_mean"] == q["qb"]["real"]["wait_mean"]
    for job in result.job_rows():
        assert job["whatif"]["wait"] <= job["real"]["wait"], job["job"]
    # the same work is done either way
    assert q["qa"]["whatif"]["gpu_seconds"] == q["qa"]["real"]["gpu_seconds"]
    cluster = result.cluster()
    assert cluster["whatif"]["seconds"] < cluster["real"]["seconds"]
    assert cluster["whatif"]["utilization"] > cluster["real"]["utilization"]


async def test_queue_utilization_of_the_cluster_and_of_its_own_quota() -> None:
    """Per queue, both sides show the share of the cluster used and the use of its nominal quota (new quota counted)."""
    result = await whatif(memory_log(sim(BUSY).events), BUSY_DOUBLED)
    q, cluster = _queues(result), result.cluster()
    for side in ("real", "whatif"):
        qa, qb = q["qa"][side], q["qb"][side]
        total = qa["gpu_seconds"] + qb["gpu_seconds"]
        assert qa["cluster_share"] + qb["cluster_share"] == pytest.approx(total / cluster[side]["gpu_seconds_capacity"])
        assert qb["of_nominal"] == pytest.approx(qb["gpu_seconds"] / (8 * cluster[side]["seconds"]), rel=1e-3)
    # qa does the same work in less time under a quota twice as large: measured against 16 GPUs, not 8
    real_qa, alt_qa = q["qa"]["real"], q["qa"]["whatif"]
    assert real_qa["of_nominal"] == pytest.approx(real_qa["gpu_seconds"] / (8 * cluster["real"]["seconds"]), rel=1e-3)
    assert alt_qa["of_nominal"] == pytest.approx(alt_qa["gpu_seconds"] / (16 * cluster["whatif"]["seconds"]), rel=1e-3)


def test_a_rejected_job_has_no_wait_to_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job rejected on both sides shows no wait and is not listed among the jobs whose wait changed."""
    text = BUSY + "  - {at: 5, submit: {job: broken, queue: nowhere, podsets: [{count: 1, requests: {gpu: 8}}]}}\n"
    config = tmp_path / "q.yaml"
    config.write_text(BUSY_DOUBLED)
    log = write_jsonl(tmp_path / "log.jsonl", sim(text).events)
    assert main(["whatif", "--log", str(log), "--queues", str(config), "--output", "json"]) == 0
    [broken] = [j for j in json.loads(capsys.readouterr().out)["jobs"] if j["job"] == "broken"]
    assert broken["real"]["status"] == broken["whatif"]["status"] == "rejected"
    assert broken["real"]["waiting"] is None and broken["whatif"]["waiting"] is None
    assert main(["whatif", "--log", str(log), "--queues", str(config), "--jobs", "50"]) == 0
    out = capsys.readouterr().out
    jobs_table = out[out.index("Jobs whose wait changed most") :]
    assert "│ a7 " in jobs_table and "│ broken " not in jobs_table


async def test_a_window_replays_only_its_submissions() -> None:
    """--from/--to: jobs submitted in the window are compared; work already queued at the start is carried in."""
    events = sim(BUSY).events
    result = await whatif(memory_log(events), BUSY_DOUBLED, start=Point(time=35), end=Point(time=5000))
    jobs = {j["job"] for j in result.job_rows()}
    submitted = {e.job: e.at for e in events if isinstance(e, JobSubmitted)}
    assert jobs == {j for j, at in submitted.items() if 35 <= at <= 5000}
    assert result.t0 == 35


async def test_whatif_reads_the_embedded_nats(store: EventStore) -> None:
    """A log on JetStream runs the same what-if as the same log in memory."""
    events = sim(BUSY).events
    await store.append(events)
    on_nats = await whatif(NatsLog(store), BUSY_DOUBLED)
    in_memory = await whatif(memory_log(events), BUSY_DOUBLED)
    assert on_nats.queue_rows() == in_memory.queue_rows()


async def test_a_configuration_it_cannot_use_names_file_and_line() -> None:
    """An unknown section or an invalid queue is a WhatIfError naming the file and line."""
    log = memory_log(sim(STORY).events)
    with pytest.raises(WhatIfError, match="unknown section 'nodes'"):
        await whatif(log, "queues: []\nnodes: []\n", "q.yaml")
    with pytest.raises(WhatIfError, match=r"q.yaml:2: .*cohort 'nowhere' is not defined"):
        await whatif(log, "queues:\n  - {name: qa, cohort: nowhere, nominal: {gpu: 1}}\n", "q.yaml")


def test_whatif_cli_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI prints queues real -> what-if and the jobs whose wait changed most; JSON has every job."""
    log = write_jsonl(tmp_path / "log.jsonl", sim(BUSY).events)
    config = tmp_path / "q.yaml"
    config.write_text(BUSY_DOUBLED)
    assert main(["whatif", "--log", str(log), "--queues", str(config)]) == 0
    out = capsys.readouterr().out
    assert "qa *" in out and "->" in out and "Jobs whose wait changed most" in out and "utilization" in out
    assert main(["whatif", "--log", str(log), "--queues", str(config), "--output", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {j["job"] for j in doc["jobs"]} == {f"a{i}" for i in range(8)} | {f"b{i}" for i in range(3)}
    assert doc["queues_changed"] == ["qa"]
    config.write_text("queues:\n  - {name: qa}\n")
    assert main(["whatif", "--log", str(log), "--queues", str(config)]) == 2
    assert "missing field 'nominal'" in capsys.readouterr().err


def test_whatif_cli_refuses_a_negative_number_of_jobs_to_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--jobs -3` is a usage error (exit 2, saying so), not a table that shows no job."""
    log = write_jsonl(tmp_path / "log.jsonl", sim(BUSY).events)
    config = tmp_path / "q.yaml"
    config.write_text(BUSY_DOUBLED)
    assert main(["whatif", "--log", str(log), "--queues", str(config), "--jobs", "-3"]) == 2
    assert "--jobs -3" in capsys.readouterr().err


FLAVORS_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "flavors.yaml"

INTERNS_GET_A100 = """\
queues:
  - name: interns
    cohort: org
    resource_groups:
      - covered: [gpu]
        flavors:
          - {name: a100, nominal: {gpu: 16}}
          - {name: l4, nominal: {gpu: 4}}
"""


def _flavored_log() -> list:
    from muster.replay.scenario import load
    from muster.replay.simulator import simulate

    return list(simulate(load(FLAVORS_EXAMPLE)).events)


async def test_flavored_log_reproduces_itself_and_shows_the_per_flavor_difference() -> None:
    """With the log's own flavors and quotas, a flavored log runs again as it ran; giving interns A100 quota
    of their own moves GPU-hours between flavors and teams, per flavor."""
    events = _flavored_log()
    same = await whatif(memory_log(events), "queues: []\n")
    assert same.queues_changed == []
    for q in same.queue_rows():
        assert q["whatif"]["flavor_gpu_seconds"] == q["real"]["flavor_gpu_seconds"], q["queue"]
    assert _queues(same)["research"]["real"]["flavor_gpu_seconds"] == {"a100": 16 * 1800, "h100": 24 * 3600}
    moved = await whatif(memory_log(events), INTERNS_GET_A100)
    q = _queues(moved)
    assert moved.queues_changed == ["interns"]
    assert q["interns"]["real"]["preemptions"] == 1 and q["interns"]["whatif"]["preemptions"] == 0
    assert q["training"]["whatif"]["flavor_gpu_seconds"]["h100"] > 0  # its evaluation spills onto H100


def test_whatif_cli_shows_gpu_hours_per_flavor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's queue table has a row per flavor of a flavored queue, real -> what-if."""
    log = write_jsonl(tmp_path / "log.jsonl", _flavored_log())
    config = tmp_path / "interns.yaml"
    config.write_text(INTERNS_GET_A100)
    assert main(["whatif", "--log", str(log), "--queues", str(config)]) == 0
    out = capsys.readouterr().out
    assert "  on h100" in out and "  on a100" in out
