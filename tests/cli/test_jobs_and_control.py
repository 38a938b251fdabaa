"""`muster jobs`, `muster queues`, `cancel`, `hold` and `release` against a log on a real nats-server."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from pipekit import run_into_closed_pipe

from muster.cli import main
from muster.events.store import EventStore
from muster.events.types import (
    CohortConfigured,
    Event,
    JobAdmitted,
    JobCancelled,
    JobHeld,
    JobReleased,
    JobSubmitted,
    LeaderElected,
    NodeAdded,
    PodSet,
    QueueConfigured,
)

RUNS = "team-a/job/train-1a2b3c4d"
WAITS = "team-a/job/eval-5e6f7a8b"
OTHER = "team-b/pytorchjob/bert-0011aa22"


def _job(job: str, queue: str, gpus: int, at: int) -> JobSubmitted:
    kind, ns, name = job.split("/")[1], job.split("/")[0], job.split("/")[2].rsplit("-", 1)[0]
    return JobSubmitted(
        at=at,
        job=job,
        queue=queue,
        podsets=[PodSet(name="w", count=1, requests={"gpu": gpus})],
        source=f"{kind.title()}/{ns}/{name}",
    )


START = 1_764_000_000
HISTORY: list[Event] = [
    LeaderElected(at=START, epoch=1, holder="d"),
    CohortConfigured(at=START, name="org"),
    QueueConfigured(at=START, name="qa", cohort="org", nominal={"gpu": 4}),
    QueueConfigured(at=START, name="qb", cohort="org", nominal={"gpu": 8}),
    NodeAdded(at=START, node="n0", capacity={"gpu": 8}),
    _job(RUNS, "qa", 6, START + 1),
    JobAdmitted(at=START + 1, job=RUNS, queue="qa", placement={"w-0": "n0"}, borrowed={"gpu": 2}, cycle=1, epoch=1),
    _job(WAITS, "qa", 4, START + 2),
    _job(OTHER, "qb", 8, START + 3),
]


@pytest.fixture
def log(nats_url: str) -> Any:
    """A fresh stream holding HISTORY, the flags that point a command at it, and a reader of its events."""
    tag = uuid.uuid4().hex[:12]
    stream, prefix = f"T{tag}", f"t{tag}"

    async def connect() -> EventStore:
        return await EventStore.connect(nats_url, stream=stream, prefix=prefix)

    class Log:
        flags = ["--nats", nats_url, "--stream", stream]
        admin = [*flags, "--subject-prefix", prefix]

        @staticmethod
        def append(*events: Event) -> None:
            async def go() -> None:
                store = await connect()
                try:
                    await store.append(list(events))
                finally:
                    await store.close()

            anyio.run(go)

        @staticmethod
        def events() -> list[Any]:
            async def read() -> list[Any]:
                store = await connect()
                try:
                    return [s.event for s in await store.read()]
                finally:
                    await store.close()

            return anyio.run(read)

    Log.append(*HISTORY)
    yield Log

    async def delete() -> None:
        store = await connect()
        await store.delete_stream()
        await store.close()

    anyio.run(delete)


def _json(capsys: Any, *argv: str) -> Any:
    assert main(list(argv)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_jobs_lists_live_jobs_with_state_position_and_reason(log, capsys) -> None:
    """`muster jobs` shows running and pending jobs, each pending one with its queue position and reason."""
    rows = {r["job"]: r for r in _json(capsys, "jobs", *log.flags, "-o", "json")["jobs"]}
    assert rows.keys() == {RUNS, WAITS, OTHER}
    assert (rows[RUNS]["state"], rows[RUNS]["nodes"], rows[RUNS]["position"]) == ("running", ["n0"], None)
    assert (rows[WAITS]["state"], rows[WAITS]["position"], rows[WAITS]["reason"]) == ("pending", 1, "not judged yet")
    assert rows[OTHER]["namespace"] == "team-b" and rows[OTHER]["name"] == "bert"
    assert rows[WAITS]["age"] > 0


@pytest.mark.parametrize("command", [["jobs"], ["queues"], ["replay"], ["explain", RUNS]], ids=lambda c: c[0])
def test_a_view_of_a_stream_whose_reader_closed_the_pipe_exits_quietly(log, command: list[str]) -> None:
    """A command reading NATS (its own connection and tasks) into a pipe whose reader has gone ends silently with
    141, as on a file log (`tests/cli/test_conventions.py`)."""
    from muster.cli import SIGPIPE_STATUS

    done = run_into_closed_pipe([*command, *log.flags])
    assert (done.returncode, done.stderr) == (SIGPIPE_STATUS, "")


def test_jobs_at_a_past_point_gives_ages_as_they_were_then(log, capsys) -> None:
    """`jobs --at SEQ` measures a job's age at that point of the log, not from today's clock."""
    doc = _json(capsys, "jobs", *log.flags, "--at", str(len(HISTORY)), "-o", "json")
    rows = {r["job"]: r for r in doc["jobs"]}
    # the last event is at START + 3: the jobs submitted at START + 1, + 2 and + 3 were 2, 1 and 0 s old
    assert (rows[RUNS]["age"], rows[WAITS]["age"], rows[OTHER]["age"]) == (2, 1, 0)
    assert doc["now"] == START + 3


def _sim_log(tmp_path: Path, scenario_text: str) -> Path:
    """A `muster sim` run of the scenario, written as a JSONL log for `--log`."""
    from muster.events.codec import encode
    from muster.replay.scenario import loads
    from muster.replay.simulator import simulate

    path = tmp_path / "log.jsonl"
    events = simulate(loads(scenario_text, "t.yaml")).events
    path.write_bytes(b"".join(encode(e) + b"\n" for e in events))
    return path


ONE_RUNS_ONE_WAITS = (
    "nodes: [{name: n0, capacity: {gpu: 8}}]\nqueues: [{name: q, nominal: {gpu: 8}}]\ntimeline:\n"
    "  - {at: 0, submit: {job: a, queue: q, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 1000}}\n"
    "  - {at: 200, submit: {job: b, queue: q, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 10}}\n"
)
"""A sim log whose events stop at t=200 until t=1000: a runs from 0, b waits from 200."""


def test_jobs_at_a_time_in_a_sim_log_gives_ages_at_that_time(tmp_path: Path, capsys) -> None:
    """`jobs --at @300` of a sim log whose last event before it is at t=200 gives ages at t=300, not t=200."""
    path = _sim_log(tmp_path, ONE_RUNS_ONE_WAITS)
    doc = _json(capsys, "jobs", "--log", str(path), "--at", "@300", "-o", "json")
    assert {r["job"]: r["age"] for r in doc["jobs"]} == {"a": 300, "b": 100}
    assert doc["now"] == 300


@pytest.mark.parametrize("at", ["2026-12-03T10:00", "@1714531920"])
def test_a_date_on_a_sim_log_is_refused_saying_its_times_are_seconds(tmp_path: Path, capsys, at: str) -> None:
    """`--at` a date on a sim log (times from t=0) exits 2 saying so and what to give, not "past the end"."""
    path = _sim_log(tmp_path, ONE_RUNS_ONE_WAITS)
    assert main(["replay", "--log", str(path), "--at", at]) == 2
    err = capsys.readouterr().err
    assert f"--at {at} is a date and time, but {path} is a sim log" in err and "give @SECONDS" in err


LONG_ID = "team-a/pytorchjob/llama-70b-pretraining-ablation-lr3e-4-1a2b3c4d"


def test_jobs_wide_prints_each_id_whole_on_its_row_however_long_the_reason(tmp_path: Path, capsys) -> None:
    """`-o wide` into a pipe keeps a long id on one line (kubectl's wide), so it can be copied back or grepped."""
    path = _sim_log(
        tmp_path,
        "nodes: [{name: n0, capacity: {gpu: 8}}]\nqueues: [{name: q, nominal: {gpu: 8}}]\ntimeline:\n"
        "  - {at: 0, submit: {job: a, queue: q, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 1000}}\n"
        f"  - {{at: 1, submit: {{job: {LONG_ID}, queue: q, podsets: [{{count: 2, requests: {{gpu: 8}}}}]}}}}\n",
    )
    assert main(["jobs", "--log", str(path), "-o", "wide"]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("llama")]
    assert LONG_ID in row and "quota" in row


@pytest.mark.parametrize("command", ["jobs", "queues", "replay"])
def test_a_view_at_a_time_says_it_is_the_state_at_that_time(tmp_path: Path, capsys, command: str) -> None:
    """`COMMAND --at @300 -o json` of a log whose last event before t=300 is at t=200 says `at` 300, not 200."""
    path = _sim_log(tmp_path, ONE_RUNS_ONE_WAITS)
    assert _json(capsys, command, "--log", str(path), "--at", "@300", "-o", "json")["at"] == 300
    assert _json(capsys, command, "--log", str(path), "--at", "3", "-o", "json")["at"] == 0  # a sequence: its event's


def test_replay_at_a_time_tells_waits_and_runs_up_to_that_time(tmp_path: Path, capsys) -> None:
    """`replay --at @300 --running`: the running job has run 5m (from 0) and the pending one waited 1m 40s
    (from 200), not up to the last event before t=300."""
    path = _sim_log(tmp_path, ONE_RUNS_ONE_WAITS)
    assert main(["replay", "--log", str(path), "--at", "@300", "--running"]) == 0
    out = capsys.readouterr().out
    assert "t=300 (5m 00s)" in out and "(for 5m 00s)" in out
    pending = [line.split("│") for line in out.splitlines() if "│ 1 │ b " in line]  # queue, #, job, ..., waiting
    assert [cells[6].strip() for cells in pending] == ["1m 40s"]


def test_queues_shows_the_share_of_a_borrowing_queue_of_weight_zero_as_inf(tmp_path: Path, capsys) -> None:
    """Fair sharing gives a borrowing queue of weight 0 an unbounded share: `muster queues` prints `inf`, not
    the core's sentinel (4611686018427388.000)."""
    path = _sim_log(
        tmp_path,
        "nodes: [{name: n0, capacity: {gpu: 8}}, {name: n1, capacity: {gpu: 8}}]\ncohorts: [{name: org}]\n"
        "fair_sharing: true\nqueues:\n  - {name: a, cohort: org, nominal: {gpu: 8}, weight: 0}\n"
        "  - {name: b, cohort: org, nominal: {gpu: 8}}\ntimeline:\n"
        "  - {at: 0, submit: {job: j, queue: a, podsets: [{count: 2, requests: {gpu: 8}}], runtime: 100}}\n",
    )
    assert main(["queues", "--log", str(path), "--at", "@50"]) == 0
    rows = {
        ln.split()[0]: ln.split() for ln in capsys.readouterr().out.splitlines() if ln.split()[:1] in (["a"], ["b"])
    }
    assert rows["a"][-1] == "inf" and rows["b"][-1] == "0.000"


@pytest.mark.parametrize(
    ("flags", "jobs"),
    [
        pytest.param(["--queue", "qb"], {OTHER}, id="queue"),
        pytest.param(["--state", "running"], {RUNS}, id="state"),
        pytest.param(["-n", "team-a"], {RUNS, WAITS}, id="namespace"),
        pytest.param(["-q", "qa", "-t", "pending"], {WAITS}, id="queue-and-state"),
    ],
)
def test_jobs_filters_by_queue_state_and_namespace(log, capsys, flags, jobs) -> None:
    """Each filter keeps only the jobs it names; filters combine."""
    rows = _json(capsys, "jobs", *log.flags, "-o", "json", *flags)["jobs"]
    assert {r["job"] for r in rows} == jobs


def test_jobs_refuses_an_unknown_queue_or_state(log, capsys) -> None:
    """A queue the log has not configured, or a state that does not exist, is a usage error naming what exists."""
    assert main(["jobs", *log.flags, "--queue", "nope"]) == 2
    assert "no such queue on the log (queues: qa, qb)" in capsys.readouterr().err
    assert main(["jobs", *log.flags, "--state", "sleeping"]) == 2
    assert "--state sleeping: not a state" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "flags", "said"),
    [
        pytest.param(
            "jobs",
            ["-n", "team-z"],
            "--namespace team-z: no such namespace on the log (namespaces: team-a, team-b)",
            id="jobs-namespace",
        ),
        pytest.param(
            "jobs", ["-n", "team-a,team-z"], "--namespace team-z: no such namespace", id="jobs-one-namespace-of-two"
        ),
        pytest.param(
            "jobs", ["-q", "qa", "-q", "qz"], "--queue qz: no such queue on the log (queues: qa, qb)", id="jobs-queue"
        ),
        pytest.param("jobs", ["--scope", "qz"], "--scope qz: no such queue on the log", id="jobs-scope"),
        pytest.param("queues", ["--scope", "qz"], "--scope qz: no such queue on the log", id="queues-scope"),
    ],
)
def test_a_filter_naming_what_the_log_never_saw_is_a_usage_error(log, capsys, command, flags, said) -> None:
    """Every filter that takes a name refuses one the log never saw (exit 2, naming what it has) rather than
    printing nothing with exit 0, which reads as "no jobs there" for a typo (`-n` did)."""
    assert main([command, *log.flags, *flags]) == 2
    err = capsys.readouterr().err
    assert said in err


def test_scope_reads_a_stream_of_another_subject_prefix_given_subject_prefix(log, capsys) -> None:
    """`--scope` reads one queue's subjects, which carry the log's subject prefix: `--subject-prefix` (as `queues
    apply` and the daemon take it) finds them on a stream of another prefix than muster's."""
    rows = _json(capsys, "jobs", *log.admin, "--scope", "qa", "-o", "json")["jobs"]
    assert {r["job"] for r in rows} == {RUNS, WAITS}
    assert main(["jobs", *log.flags, "--scope", "qa"]) == 2  # muster's own prefix: not this log's subjects
    assert "--scope qa: no such queue on the log (queues: none); --scope reads the subjects of one prefix" in (
        capsys.readouterr().err
    )


def test_jobs_table_shows_names_that_can_be_typed_back(log, capsys) -> None:
    """The table names each job by its short name (unique here), uncut, and `-o wide` adds the full id."""
    assert main(["jobs", *log.flags, "-o", "wide"]) == 0
    out = capsys.readouterr().out
    for job in (RUNS, WAITS, OTHER):
        assert job in out
    assert "train" in out and "eval" in out and "bert" in out


def test_queues_shows_quota_borrowing_work_and_fair_share(log, capsys) -> None:
    """`muster queues` has per queue its used, borrowed, lent, gangs and GPUs, and per cohort their sums."""
    doc = _json(capsys, "queues", *log.flags, "-o", "json")
    qa, qb = doc["queues"]
    assert (qa["queue"], qa["used"], qa["borrowed"], qa["running_jobs"], qa["pending_gpus"]) == ("qa", 6, 2, 1, 4)
    assert qa["fair_share"] > 0 and qb["fair_share"] == 0
    assert (qb["lent"], qb["pending_jobs"], qb["pending_gpus"]) == (2, 1, 8)
    (org,) = doc["cohorts"]
    assert (org["queues"], org["nominal"], org["used"], org["pending_jobs"]) == (["qa", "qb"], 12, 6, 2)


def test_cancel_by_short_name_appends_job_cancelled_and_frees_the_quota(log, capsys) -> None:
    """`muster cancel train` says which job it chose, appends JobCancelled, and the queue's usage is freed."""
    assert main(["cancel", "train", *log.admin, "--reason", "wrong data"]) == 0
    out = capsys.readouterr()
    assert f"'train' is job {RUNS} (by short name)" in out.err and f"cancelled {RUNS}" in out.out
    last = log.events()[-1]
    assert isinstance(last, JobCancelled) and last.job == RUNS and last.reason == "Cancelled: wrong data"
    qa = _json(capsys, "queues", *log.flags, "-o", "json")["queues"][0]
    assert (qa["used"], qa["running_jobs"]) == (0, 0)
    rows = _json(capsys, "jobs", *log.flags, "-o", "json", "--state", "cancelled")["jobs"]
    assert [r["job"] for r in rows] == [RUNS]


def test_cancel_of_an_ended_or_unknown_job_appends_nothing(log, capsys) -> None:
    """An ambiguous prefix lists the candidates, a typo or an ended job is refused: exit 2, the log unchanged."""
    before = len(log.events())
    assert main(["cancel", "team-a/", *log.admin]) == 2
    err = capsys.readouterr().err
    assert "ambiguous" in err and RUNS in err and WAITS in err
    assert main(["cancel", "bret", "eval", *log.admin]) == 2
    assert "no job 'bret'" in capsys.readouterr().err
    log.append(JobCancelled(at=START + 5, job=OTHER))
    assert main(["cancel", "bert", *log.admin]) == 2
    assert f"job {OTHER} is cancelled: it already ended" in capsys.readouterr().err
    assert len(log.events()) == before + 1


def test_hold_and_release_a_pending_job(log, capsys) -> None:
    """`hold` marks a pending job held (no position, not tried), `release` puts it back in its place."""
    assert main(["hold", "eval", *log.admin]) == 0
    assert isinstance(log.events()[-1], JobHeld)
    capsys.readouterr()
    (row,) = _json(capsys, "jobs", *log.flags, "-o", "json", "-q", "qa", "-t", "held")["jobs"]
    assert (row["job"], row["position"]) == (WAITS, None)
    assert _json(capsys, "queues", *log.flags, "-o", "json")["queues"][0]["held_jobs"] == 1
    assert main(["hold", "eval", *log.admin]) == 2
    assert "only a pending job can be held" in capsys.readouterr().err
    assert main(["release", "eval", *log.admin, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["action"] == "released"
    assert isinstance(log.events()[-1], JobReleased)
    (row,) = _json(capsys, "jobs", *log.flags, "-o", "json", "-q", "qa", "-t", "pending")["jobs"]
    assert row["position"] == 1


def test_jobs_watch_prints_the_rows_that_change(log) -> None:
    """`muster jobs --watch -o jsonl` prints every row, then only a changed row, and a removed one as removed."""
    cmd = [sys.executable, "-m", "muster.cli", "jobs", *log.flags, "--watch", "--interval", "0.1", "-o", "jsonl"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        try:
            assert proc.stdout is not None
            first = {r["job"]: r for r in (json.loads(proc.stdout.readline()) for _ in range(3))}
            assert first.keys() == {RUNS, WAITS, OTHER}
            log.append(JobHeld(at=START + 9, job=WAITS), JobCancelled(at=START + 9, job=OTHER))
            changed = [json.loads(proc.stdout.readline()) for _ in range(2)]
        finally:
            proc.terminate()
    held = {**first[WAITS], "state": "held", "position": None, "reason": changed[0]["reason"], "age": changed[0]["age"]}
    assert changed == [held, {"job": OTHER, "removed": True}]


def test_jobs_and_queues_connect_with_the_daemons_config_file(log, tmp_path, capsys) -> None:
    """`--config` gives the URL and stream (the daemon's `nats` block); a config that cannot be read exits 2."""
    import yaml

    url, stream = log.flags[1], log.flags[3]
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"nats": {"url": url, "stream": stream}}))
    rows = _json(capsys, "jobs", "--config", str(config), "-o", "json")["jobs"]
    assert {r["job"] for r in rows} == {RUNS, WAITS, OTHER}
    assert main(["queues", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err
    assert main(["jobs", "--config", str(config), "--creds", str(tmp_path / "nope.creds")]) == 2
    assert "--creds" in capsys.readouterr().err


def test_a_narrow_table_wraps_an_id_and_never_cuts_it() -> None:
    """On a 50-column terminal a long id is folded over lines, every character kept (no ellipsis)."""
    import io

    from rich.console import Console

    from muster.replay.jobscli import render

    long_id = "team-a/job/a-very-long-training-job-name-1a2b3c4d"
    row = {"name": long_id, "queue": "q", "state": "pending", "position": 1, "gpus": 8, "age": 5, "reason": "quota"}
    out = io.StringIO()
    Console(file=out, width=50).print(render({"seq": 1, "jobs": [row]}))
    column = "".join(line.split()[0] for line in out.getvalue().splitlines()[2:] if line.strip())
    assert "…" not in out.getvalue() and column.startswith(long_id)


def test_a_table_of_thousands_of_jobs_is_plain_aligned_text_with_every_id_whole(tmp_path, capsys) -> None:
    """Past PLAIN_ROWS jobs the table is aligned columns, ids and reasons uncut, printed as is (not by rich)."""
    from muster.replay.cliutil import PLAIN_ROWS
    from muster.replay.jobscli import render
    from muster.replay.watching import Printer

    def row(i: int) -> dict[str, object]:
        name = f"team-a/job/train-{i}" + ("-with-a-long-name-that-a-terminal-would-wrap" * (i % 7 == 0))
        return {"name": name, "queue": "q", "state": "pending", "position": i, "gpus": 8, "age": i, "reason": "ré"}

    doc = {"seq": 9, "jobs": [row(i) for i in range(1, PLAIN_ROWS + 2)]}
    with (tmp_path / "out.txt").open("w") as out, Printer("table", False, key="job", out=out) as printer:
        printer.show(doc, doc["jobs"], render)
    lines = (tmp_path / "out.txt").read_text().splitlines()
    header = ["JOB", "QUEUE", "STATE", "POS", "GPUS", "AGE", "REASON"]
    assert lines[0] == f"{PLAIN_ROWS + 1} jobs at seq 9" and lines[1].split() == header
    assert [ln.split()[0] for ln in lines[2:]] == [r["name"] for r in doc["jobs"]]
    assert len({ln.index(" q ") for ln in lines[2:]}) == 1  # one column for the queue, whatever the name's length
    assert all(ln.endswith("ré") for ln in lines[2:])
