"""`muster sim` end to end through `muster.cli.main` (spec/scenario.md: input, output, exit status)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from muster.cli import main
from muster.events.types import JobInadmissible
from muster.replay.scenario import loads
from muster.replay.simulator import simulate
from muster.replay.specreader import ScenarioError

CLUSTER = """\
topology:
  levels: [block, rack]
nodes:
  - generate:
      count: 2
      name: "{block}-{rack}-n{i}"
      labels: {block: [b0], rack: [r0, r1]}
      capacity: {gpu: 8, cpu: 32, memory: 256Gi}
priority_classes:
  - {name: inference, value: 1000, preemptible: false}
  - {name: training, value: 100}
cohorts:
  - {name: org}
queues:
  - name: team-a
    cohort: org
    nominal: {gpu: 16}
    preemption: {within_queue: LowerPriority, reclaim_within_cohort: Any}
  - name: team-b
    cohort: org
    nominal: {gpu: 16}
"""

RUN = (
    CLUSTER
    + """\
timeline:
  - at: 0
    submit:
      job: b-big
      queue: team-b
      priority_class: training
      podsets: [{name: worker, count: 4, requests: {gpu: 8, cpu: "4", memory: 64Gi}}]
      runtime: 1000
      checkpoint_every: 300
  - at: 100
    submit:
      job: a-1
      queue: team-a
      priority_class: training
      podsets: [{name: worker, count: 2, requests: {gpu: 8}, topology: {required: rack}}]
      runtime: 500
  - {at: 700, utilization: {job: a-1, gpu: 0.5}}
"""
)


def _write(tmp_path: Path, text: str, name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _jsonl(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    code = main(["sim", *args, "--output", "jsonl"])
    out = capsys.readouterr().out
    assert code == 0
    return [json.loads(line) for line in out.splitlines()]


# ---------------------------------------------------------------- output


def test_table_output_lists_jobs_and_queues(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The default output is a human table of jobs and queues with cluster utilization."""
    code = main(["sim", str(_write(tmp_path, RUN))])
    out = capsys.readouterr().out
    assert code == 0
    for word in ("b-big", "a-1", "team-a", "team-b", "finished", "Jobs", "Queues", "cluster GPU utilization"):
        assert word in out
    assert "{" not in out


def test_table_output_gives_a_pending_job_s_whole_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The table's `why` column holds the whole reason a job waits (it was cut at 60 characters, mid-sentence)."""
    text = (
        CLUSTER
        + "timeline:\n  - {at: 0, submit: {job: huge, queue: team-b, podsets: [{count: 5, requests: {gpu: 8}}]}}\n"
    )
    (reason,) = [e.reason for e in simulate(loads(text, "t.yaml")).events if isinstance(e, JobInadmissible)]
    assert len(reason) > 60
    assert main(["sim", str(_write(tmp_path, text))]) == 0
    rows = [ln.split("│") for ln in capsys.readouterr().out.splitlines() if ln.startswith("│")]
    why = " ".join(row[-2].strip() for row in rows if len(row) == 12)
    assert " ".join(reason.split()) in " ".join(why.split())


def test_table_output_summarises_many_jobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With many jobs the table gives counts by status and admission waits instead of one row per job."""
    rows = "".join(f"j{i},{i},team-a,8,8,100\n" for i in range(80))
    _write(tmp_path, "job,submit,queue,gpus,gpus_per_pod,runtime\n" + rows, "trace.csv")
    assert main(["sim", str(_write(tmp_path, CLUSTER + "timeline_csv: trace.csv\n"))]) == 0
    out = capsys.readouterr().out
    assert "80 jobs: 80 finished; admission wait p50" in out
    assert "j79" not in out


def test_jsonl_every_event_has_type_and_at(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--output jsonl prints every event of the run, one JSON object per line, each with type and at."""
    lines = _jsonl(capsys, str(_write(tmp_path, RUN)))
    assert all(isinstance(o, dict) and isinstance(o["type"], str) and isinstance(o["at"], int) for o in lines)
    types = [o["type"] for o in lines]
    assert types[0] == "SchedulerConfigured"
    assert "Summary" not in types
    decisions = [(o["type"], o["job"]) for o in lines if o["type"].startswith("Job") and o["type"] != "JobSubmitted"]
    assert decisions == [
        ("JobAdmitted", "b-big"),
        ("JobPreempted", "b-big"),
        ("JobAdmitted", "a-1"),
        ("JobInadmissible", "b-big"),
        ("JobFinished", "a-1"),
        ("JobAdmitted", "b-big"),
        ("JobFinished", "b-big"),
    ]
    ats = [o["at"] for o in lines]
    assert ats == sorted(ats)


def test_jsonl_decision_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Decision events carry the fields of the contract: placement, borrowed, preemptor, reason, lost work."""
    lines = _jsonl(capsys, str(_write(tmp_path, RUN)))
    first = next(o for o in lines if o["type"] == "JobAdmitted")
    assert first["job"] == "b-big" and first["queue"] == "team-b"
    assert sorted(first["placement"]) == ["worker-0", "worker-1", "worker-2", "worker-3"]
    assert first["borrowed"] == {"gpu": 16}
    (pre,) = [o for o in lines if o["type"] == "JobPreempted"]
    # at t=100, b-big has 100 s of work since its start (no checkpoint yet) on 32 GPUs
    assert (pre["job"], pre["preemptor"], pre["reason"], pre["lost_gpu_seconds"]) == (
        "b-big",
        "a-1",
        "ReclaimWithinCohort",
        3200,
    )
    a1 = next(o for o in lines if o["type"] == "JobAdmitted" and o["job"] == "a-1")
    assert a1["borrowed"] == {} and len(set(a1["placement"].values())) == 2
    (why,) = [o for o in lines if o["type"] == "JobInadmissible"]
    assert why["job"] == "b-big" and why["reason"]


def test_summary_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--summary ends the output with a Summary of jobs, queues and cluster utilization."""
    lines = _jsonl(capsys, str(_write(tmp_path, RUN)), "--summary")
    summary = lines[-1]
    assert summary["type"] == "Summary" and summary["at"] == 1600
    assert summary["jobs"]["b-big"] == {
        "submitted": 0,
        "admitted": 0,
        "finished": 1600,
        "preemptions": 1,
        "status": "finished",
    }
    assert summary["jobs"]["a-1"]["admitted"] == 100 and summary["jobs"]["a-1"]["finished"] == 600
    # b-big: 32 GPUs for 100 s (16 borrowed), then again from 600 to 1600; a-1: 16 GPUs for 500 s
    assert summary["queues"]["team-b"] == {"gpu_seconds": 32 * 100 + 32 * 1000, "borrowed_gpu_seconds": 16 * 1100}
    assert summary["queues"]["team-a"] == {"gpu_seconds": 16 * 500, "borrowed_gpu_seconds": 0}
    cluster = summary["cluster"]
    assert cluster["gpu_seconds_capacity"] == 32 * 1600
    assert cluster["gpu_seconds_used"] == 32 * 100 + 16 * 500 + 32 * 1000
    assert cluster["gpu_utilization"] == pytest.approx(cluster["gpu_seconds_used"] / cluster["gpu_seconds_capacity"])


def test_until_ends_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`until` stops virtual time: later events never happen and the summary counts up to it."""
    lines = _jsonl(capsys, str(_write(tmp_path, RUN + "until: 300\n")), "--summary")
    assert max(o["at"] for o in lines) == 300
    assert "JobFinished" not in {o["type"] for o in lines}
    summary = lines[-1]
    assert summary["at"] == 300
    assert summary["jobs"]["a-1"] == {
        "submitted": 100,
        "admitted": 100,
        "finished": None,
        "preemptions": 0,
        "status": "running",
    }
    assert summary["cluster"]["gpu_seconds_capacity"] == 32 * 300
    assert summary["cluster"]["gpu_seconds_used"] == 32 * 100 + 16 * 200


def test_two_runs_are_byte_identical(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same scenario file gives byte-identical output."""
    path = str(_write(tmp_path, RUN))
    outputs = []
    for _ in range(2):
        assert main(["sim", path, "--output", "jsonl", "--summary"]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]
    assert main(["sim", path]) == 0
    table = capsys.readouterr().out
    assert main(["sim", path]) == 0
    assert capsys.readouterr().out == table


# ---------------------------------------------------------------- invalid scenarios

GOOD_QUEUES = "queues:\n  - {name: q, nominal: {gpu: 8}}\n"

INVALID = [
    pytest.param("queues:\n  - {name: q, nominal: {gpu: 8}\n", 3, "malformed YAML", id="malformed-yaml"),
    pytest.param("queues:\n\t- {name: q}\n", 2, "malformed YAML", id="tab-indentation"),
    pytest.param(GOOD_QUEUES + "colour: red\n", 3, "unknown field 'colour'", id="unknown-top-level-field"),
    pytest.param(
        "queues:\n  - {name: q, nominal: {gpu: 8}, colour: red}\n",
        2,
        "unknown field 'colour'",
        id="unknown-queue-field",
    ),
    pytest.param(
        GOOD_QUEUES + "timeline:\n  - {at: 0, submit: {job: a, queue: q, gpus: 8}}\n",
        4,
        "unknown field 'gpus'",
        id="unknown-submit-field",
    ),
    pytest.param(
        GOOD_QUEUES + "timeline:\n  - {at: 0, submit: {job: a, queue: q, podsets: [{count: 1, gpu: 8}]}}\n",
        4,
        "unknown field 'gpu'",
        id="unknown-podset-field",
    ),
    pytest.param(
        GOOD_QUEUES + "timeline:\n  - {at: 0, explode: n0}\n", 4, "unknown field 'explode'", id="unknown-timeline-kind"
    ),
    pytest.param(
        "nodes:\n  - {name: n0, capacity: {gpu: -8}}\n" + GOOD_QUEUES, 2, "-8 is negative", id="negative-capacity"
    ),
    pytest.param("queues:\n  - {name: q, nominal: {gpu: -8}}\n", 2, "-8 is negative", id="negative-nominal"),
    pytest.param(
        "cohorts: [{name: org}]\nqueues:\n  - {name: q, cohort: org, nominal: {gpu: 8}, borrowing_limit: {gpu: -1}}\n",
        3,
        "-1 is negative",
        id="negative-borrowing-limit",
    ),
    pytest.param(
        "queues:\n  - {name: q, cohort: nowhere, nominal: {gpu: 8}}\n",
        2,
        "cohort 'nowhere' is not defined",
        id="unknown-cohort",
    ),
    pytest.param(
        "cohorts:\n  - {name: a, parent: b}\n  - {name: b, parent: a}\n" + GOOD_QUEUES,
        2,
        "cohorts form a cycle",
        id="cyclic-cohorts",
    ),
    pytest.param(
        "cohorts:\n  - {name: a, parent: a}\n" + GOOD_QUEUES, 2, "cohorts form a cycle", id="self-parent-cohort"
    ),
    pytest.param(
        'nodes:\n  - generate: {count: 1, name: "n{rack}", labels: {block: [b0]}}\n',
        2,
        "cannot fill {rack}",
        id="generate-name-unknown-label",
    ),
    pytest.param(
        'nodes:\n  - generate: {count: 1, name: "n{i.real}"}\n', 2, "cannot fill {i.real}", id="generate-name-attribute"
    ),
    pytest.param(
        "cohorts:\n  - {name: a, parent: zz}\n" + GOOD_QUEUES,
        2,
        "parent cohort 'zz' is not defined",
        id="unknown-parent-cohort",
    ),
    pytest.param(
        GOOD_QUEUES + "timeline:\n  - {at: 0, node_down: n9}\n", 4, "node 'n9' is not defined", id="unknown-node"
    ),
    pytest.param(GOOD_QUEUES + "timeline:\n  - {at: -5, cancel: a}\n", 4, "at must be at least 0", id="negative-time"),
    pytest.param(
        GOOD_QUEUES
        + "timeline:\n"
        + "  - {at: 0, submit: {job: a, queue: q, podsets: [{count: 1, requests: {gpu: 1}}]}}\n"
        + "  - {at: 1, submit: {job: a, queue: q, podsets: [{count: 1, requests: {gpu: 1}}]}}\n",
        5,
        "job 'a' is submitted twice",
        id="duplicate-job",
    ),
    pytest.param("nodes:\n  - {name: n0}\n  - {name: n0}\n", 3, "node 'n0' is defined twice", id="duplicate-node"),
    pytest.param(
        GOOD_QUEUES + "  - {name: q, nominal: {gpu: 1}}\n", 3, "queue 'q' is defined twice", id="duplicate-queue"
    ),
    pytest.param(
        "queues:\n  - {name: q, nominal: {gpu: 8}, preemption: {within_queue: Sometimes}}\n",
        2,
        "within_queue must be one of Never, LowerPriority, LowerOrNewerEqualPriority, not 'Sometimes'",
        id="unknown-policy",
    ),
    pytest.param(
        "queues:\n  - {name: q, nominal: {gpu: 8}, weight: -1}\n",
        2,
        "weight must be at least 0, not -1",
        id="bad-weight",
    ),
    pytest.param("queues:\n  - {name: q, nominal: {gpu: 1.5}}\n", 2, "not a whole number", id="fractional-quota"),
    pytest.param(
        "queues:\n  - {name: q, nominal: {gpu: 100000000000000000000000}}\n",
        2,
        "gpu=100000000000000000000000 is more than muster accepts",
        id="quota-past-the-bound",
    ),
    pytest.param(
        "nodes:\n  - {name: n0, capacity: {memory: 2048Pi}}\n" + GOOD_QUEUES,
        2,
        "memory=2305843009213693952 is more than muster accepts",
        id="capacity-past-the-bound",
    ),
    pytest.param(
        GOOD_QUEUES + "timeline:\n  - {at: 1.0e+23, cancel: a}\n", 4, "at must be at most", id="time-past-the-bound"
    ),
    pytest.param(
        GOOD_QUEUES + "timeline:\n  - {at: 0, utilization: {job: a, gpu: 1.5}}\n",
        4,
        "utilization.gpu must be between 0 and 1, not 1.5",
        id="utilization-above-one",
    ),
    pytest.param(
        "topology:\n  levels: [rack, rack]\n", 2, "topology level 'rack' is repeated or reserved", id="repeated-level"
    ),
    pytest.param(
        GOOD_QUEUES + "timeline:\n  - {at: 0, queue_update: {name: nope, nominal: {gpu: 1}}}\n",
        4,
        "queue 'nope' is not defined",
        id="update-unknown-queue",
    ),
    pytest.param(
        GOOD_QUEUES
        + "timeline:\n"
        + "  - {at: 0, submit: {job: train, queue: q, podsets: [{count: 1, requests: {gpu: 1}}]}}\n"
        + "  - {at: 5, cancel: trian}\n",
        5,
        "cancel: job 'trian' is not submitted in this scenario",
        id="cancel-of-a-job-never-submitted",
    ),
    pytest.param(
        GOOD_QUEUES + "timeline:\n  - {at: 0, utilization: {job: a, gpu: 0.5}}\n",
        4,
        "utilization: job 'a' is not submitted in this scenario",
        id="utilization-of-a-job-never-submitted",
    ),
]


@pytest.mark.parametrize(("text", "line", "message"), INVALID)
def test_invalid_scenario_exits_2_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, line: int, message: str
) -> None:
    """An invalid scenario exits 2 with the file, the line and what is wrong, and no traceback."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    code = main(["sim", str(path), "--output", "jsonl"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert f"{path}:{line}: " in captured.err
    assert message in captured.err
    assert "Traceback" not in captured.err


@pytest.mark.parametrize("output", ["table", "json"])
def test_summary_without_jsonl_is_refused_not_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], output: str
) -> None:
    """`--summary` with the table or `-o json` (the summary already) exits 2 saying it goes with jsonl."""
    code = main(["sim", str(_write(tmp_path, RUN)), "--summary", "-o", output])
    captured = capsys.readouterr()
    assert (code, captured.out) == (2, "")
    assert "--summary goes with -o jsonl" in captured.err and "Traceback" not in captured.err


def test_key_without_value_is_an_error_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A flow mapping key with no value (`{gpu}`) is reported with its line."""
    path = tmp_path / "bad.yaml"
    path.write_text("nodes:\n  - {name: n0, capacity: {gpu}}\n" + GOOD_QUEUES)
    assert main(["sim", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: " in err and "is not a quantity" in err and "Traceback" not in err


def test_absurd_node_count_fails_fast(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A generate count far beyond any cluster is an error, not an attempt to build it."""
    path = tmp_path / "bad.yaml"
    path.write_text('nodes:\n  - generate: {count: 2222222222, name: "n{i}"}\n')
    assert main(["sim", str(path)]) == 2
    assert "too many" in capsys.readouterr().err


MUTATION = st.sampled_from(
    [*":-{}[], \n#'\"!&*|>0123456789abzx.", "  ", "- ", ": ", "\t", "gpu", "-1", "1e9", "null", "~", "true"]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, len(RUN)), st.integers(0, 3), st.lists(MUTATION, max_size=3)), min_size=1, max_size=5
    )
)
def test_mangled_scenario_is_reported_or_runs(edits: list[tuple[int, int, list[str]]]) -> None:
    """Any edit of a valid scenario either runs or is a ScenarioError naming the file: never another exception."""
    text = RUN + "until: 2000\n"
    for pos, cut, insert in edits:
        text = text[:pos] + "".join(insert) + text[pos + cut :]
    try:
        scenario = loads(text, "mangled.yaml")
    except ScenarioError as exc:
        assert str(exc).startswith("mangled.yaml")
        return
    simulate(scenario)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(None, "cannot read", id="missing-file"),
        pytest.param("", "the scenario is empty", id="empty-file"),
    ],
)
def test_unreadable_scenario_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | None, message: str
) -> None:
    """A missing or empty scenario file exits 2 naming the file."""
    path = tmp_path / "scenario.yaml"
    if text is not None:
        path.write_text(text)
    assert main(["sim", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and message in err and "Traceback" not in err


# ---------------------------------------------------------------- invalid jobs

INVALID_JOBS = [
    pytest.param("queue: nope, podsets: [{count: 1, requests: {gpu: 1}}]", "queue 'nope' does not exist", id="queue"),
    pytest.param(
        "queue: q, priority_class: gold, podsets: [{count: 1, requests: {gpu: 1}}]",
        "priority class 'gold' does not exist",
        id="priority-class",
    ),
    pytest.param("queue: q, podsets: []", "no pods", id="no-pods"),
    pytest.param("queue: q, podsets: [{count: 0, requests: {gpu: 1}}]", "count 0", id="zero-count"),
    pytest.param("queue: q, podsets: [{count: 1.5, requests: {gpu: 1}}]", "whole number", id="fractional-count"),
    pytest.param("queue: q, podsets: [{count: 1, requests: {gpu: -1}}]", "negative", id="negative-gpus"),
    pytest.param("queue: q, podsets: [{count: 1, requests: {gpu: 0.5}}]", "whole number", id="fractional-gpus"),
    pytest.param(
        "queue: q, podsets: [{count: 1, requests: {gpu: 1}, topology: {required: zone}}]",
        "topology level 'zone' does not exist",
        id="topology-level",
    ),
]


@pytest.mark.parametrize(("spec", "reason"), INVALID_JOBS)
def test_invalid_job_is_rejected_and_the_run_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str, reason: str
) -> None:
    """An invalid job becomes a JobRejected with its reason; the jobs after it still run."""
    text = (
        "topology: {levels: [rack]}\n"
        "nodes:\n  - {name: n0, labels: {rack: r0}, capacity: {gpu: 8}}\n"
        + GOOD_QUEUES
        + "priority_classes: [{name: training, value: 1}]\n"
        + "timeline:\n"
        + f"  - {{at: 0, submit: {{job: bad, {spec}}}}}\n"
        + "  - {at: 1, submit: {job: good, queue: q, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 10}}\n"
    )
    lines = _jsonl(capsys, str(_write(tmp_path, text)))
    (rejected,) = [o for o in lines if o["type"] == "JobRejected"]
    assert rejected["job"] == "bad" and reason in rejected["reason"]
    assert [o["job"] for o in lines if o["type"] == "JobFinished"] == ["good"]
    assert not [o for o in lines if o["type"] == "JobAdmitted" and o["job"] == "bad"]


# ---------------------------------------------------------------- timeline_csv

CSV_SCENARIO = (
    CLUSTER
    + """\
timeline_csv: trace.csv
timeline:
  - at: 10
    submit:
      job: yaml-job
      queue: team-a
      podsets: [{name: worker, count: 2, requests: {gpu: 8}}]
      runtime: 100
"""
)


def test_timeline_csv_rows_become_jobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """CSV rows are gangs of gpus/gpus_per_pod pods; at equal times timeline entries come before CSV rows."""
    _write(
        tmp_path,
        "job,submit,queue,gpus,gpus_per_pod,runtime,priority_class,checkpoint_every,topology\n"
        "csv-early,5,team-b,16,8,50,,,\n"
        "csv-same,10,team-a,16,8,100,training,30,required:rack\n"
        "csv-small,20,team-b,4,8,10,,,preferred:rack\n",
        "trace.csv",
    )
    lines = _jsonl(capsys, str(_write(tmp_path, CSV_SCENARIO)))
    submitted = [(o["at"], o["job"]) for o in lines if o["type"] == "JobSubmitted"]
    assert submitted == [(5, "csv-early"), (10, "yaml-job"), (10, "csv-same"), (20, "csv-small")]
    subs = {o["job"]: o for o in lines if o["type"] == "JobSubmitted"}
    assert subs["csv-same"]["podsets"] == [
        {"name": "worker", "count": 2, "requests": {"gpu": 8}, "topology": {"required": "rack"}}
    ]
    assert subs["csv-same"]["priority_class"] == "training" and subs["csv-same"]["checkpoint_every"] == 30
    # fewer GPUs than gpus_per_pod: one pod of that many GPUs
    assert subs["csv-small"]["podsets"][0]["count"] == 1
    assert subs["csv-small"]["podsets"][0]["requests"] == {"gpu": 4}
    # at t=10 the timeline's job (first in order) gets team-a's room; the CSV row waits for it
    admitted = [(o["at"], o["job"]) for o in lines if o["type"] == "JobAdmitted"]
    assert (10, "yaml-job") in admitted
    assert next(at for at, job in admitted if job == "csv-same") > 10


@pytest.mark.parametrize(
    ("rows", "reason"),
    [
        pytest.param("bad,0,team-a,12,8,10\n", "not a multiple of gpus_per_pod", id="not-a-multiple"),
        pytest.param("bad,0,team-a,-8,8,10\n", "negative", id="negative-gpus"),
        pytest.param("bad,0,team-a,8,0,10\n", "gpus_per_pod 0 must be positive", id="zero-per-pod"),
        pytest.param("bad,0,team-a,1.5,8,10\n", "whole number", id="fractional-gpus"),
        pytest.param("bad,0,nope,8,8,10\n", "queue 'nope' does not exist", id="unknown-queue"),
        pytest.param("bad,0,team-a,8,8,10,gold\n", "priority class 'gold' does not exist", id="unknown-class"),
        pytest.param("bad,0,team-a,8,8,10,,,required:zone\n", "'zone' does not exist", id="unknown-level"),
    ],
)
def test_invalid_csv_job_is_rejected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: str, reason: str
) -> None:
    """A CSV row with an invalid job spec becomes JobRejected; the rest of the trace runs."""
    header = "job,submit,queue,gpus,gpus_per_pod,runtime,priority_class,checkpoint_every,topology\n"
    row = rows.rstrip("\n") + "," * (8 - rows.count(",")) + "\n"  # pad the optional columns
    _write(tmp_path, header + row + "ok,1,team-a,8,8,10,,,\n", "trace.csv")
    lines = _jsonl(capsys, str(_write(tmp_path, CLUSTER + "timeline_csv: trace.csv\n")))
    (rejected,) = [o for o in lines if o["type"] == "JobRejected"]
    assert rejected["job"] == "bad" and reason in rejected["reason"]
    assert [o["job"] for o in lines if o["type"] == "JobFinished"] == ["ok"]


@pytest.mark.parametrize(
    ("csv", "line", "message"),
    [
        pytest.param("job,submit,queue,gpus,runtime\n", 1, "missing column 'gpus_per_pod'", id="missing-column"),
        pytest.param(
            "job,submit,queue,gpus,gpus_per_pod,runtime,colour\n", 1, "unknown column 'colour'", id="unknown-column"
        ),
        pytest.param("", 1, "empty CSV", id="empty"),
        pytest.param(
            "job,submit,queue,gpus,gpus_per_pod,runtime\na,0,q,8,8\n", 2, "expected 6 columns, found 5", id="short-row"
        ),
        pytest.param("job,submit,queue,gpus,gpus_per_pod,runtime\na,soon,q,8,8,10\n", 2, "not a number", id="bad-time"),
        pytest.param(
            "job,submit,queue,gpus,gpus_per_pod,runtime,topology\na,0,q,8,8,10,rack\n",
            2,
            "is not required:LEVEL or preferred:LEVEL",
            id="bad-topology",
        ),
        pytest.param(
            "job,submit,queue,gpus,gpus_per_pod,runtime\na,0,q,8,8,10\na,1,q,8,8,10\n",
            3,
            "job 'a' is submitted twice",
            id="duplicate-job",
        ),
    ],
)
def test_bad_csv_exits_2_naming_csv_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], csv: str, line: int, message: str
) -> None:
    """A malformed trace exits 2 naming the CSV file, the line and the problem."""
    trace = _write(tmp_path, csv, "trace.csv")
    code = main(["sim", str(_write(tmp_path, CLUSTER + "timeline_csv: trace.csv\n"))])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{trace}:{line}: " in err and message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("content", "line", "message"),
    [
        pytest.param(b"job,submit,queue,gpus,gpus_per_pod,runtime\na\xff,0,q,8,8,10\n", 2, "not UTF-8", id="not-utf8"),
        pytest.param(
            b'job,submit,queue,gpus,gpus_per_pod,runtime\n"' + b"x" * 200_000 + b'",0,q,8,8,10\n',
            2,
            "malformed CSV",
            id="huge-field",
        ),
    ],
)
def test_unreadable_csv_rows_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, line: int, message: str
) -> None:
    """A trace that is not UTF-8 or not parseable as CSV exits 2 with its line, never a traceback."""
    trace = tmp_path / "trace.csv"
    trace.write_bytes(content)
    assert main(["sim", str(_write(tmp_path, CLUSTER + "timeline_csv: trace.csv\n"))]) == 2
    err = capsys.readouterr().err
    assert f"{trace}:{line}: " in err and message in err and "Traceback" not in err


def test_missing_csv_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A timeline_csv that does not exist exits 2 naming it."""
    assert main(["sim", str(_write(tmp_path, CLUSTER + "timeline_csv: nowhere.csv\n"))]) == 2
    err = capsys.readouterr().err
    assert "nowhere.csv" in err and "cannot read" in err
