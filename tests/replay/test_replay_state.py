"""`muster replay`: the state at a point of the log equals the state the simulator held then.

Fold equality on `muster sim` logs read from a JSONL file, from memory and
from the embedded NATS; points as sequences, event times and ISO datetimes;
the CLI's table and JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from replaykit import FLAVORED_QUEUES, STORY, memory_log, mixed, sim, sim_until, write_jsonl

from muster.cli import main
from muster.events.store import EventStore
from muster.projections.cluster import fold
from muster.replay.points import END, Point, PointError, parse_point
from muster.replay.rebuild import state_at
from muster.replay.source import FileLog, NatsLog

SCENARIOS = [
    pytest.param(STORY, id="preempted-then-finished"),
    pytest.param(mixed(1), id="cohorts-topology-nodes"),
    pytest.param(mixed(4, idle=True), id="idle-reclaim"),
]


def _times(events: list, n: int = 6) -> list[int]:
    """A few event times spread over the run, including the first and the last."""
    times = sorted({e.at for e in events})
    step = max(1, len(times) // n)
    return sorted(set(times[::step]) | {times[-1]})


@pytest.mark.parametrize("text", SCENARIOS)
async def test_replay_at_a_time_equals_the_simulators_state_then(text: str) -> None:
    """Replaying a sim log to time T gives exactly the state the simulator held at T."""
    full = sim(text)
    log = memory_log(full.events)
    for t in _times(full.events):
        replayed = await state_at(log, Point(time=t))
        assert replayed.state == sim_until(text, t).state, f"state differs at t={t}"
        assert all(full.events[i].at <= t for i in range(replayed.seq))
        assert replayed.seq == len(full.events) or full.events[replayed.seq].at > t


async def test_replay_at_a_sequence_from_a_file(tmp_path: Path) -> None:
    """Line N of a JSONL log is sequence N: the state at N is the fold of the first N events."""
    events = sim(mixed(2)).events
    log = FileLog(write_jsonl(tmp_path / "log.jsonl", events))
    for n in (1, 11, len(events) // 2, len(events) - 1, len(events)):
        replayed = await state_at(log, Point(seq=n))
        assert replayed.seq == n
        assert replayed.state == fold(events[:n])
    end = await state_at(log, END)
    assert end.seq == len(events) and end.state == fold(events)


async def test_replay_from_the_embedded_nats_equals_the_simulators_state(store: EventStore) -> None:
    """The same log appended to a JetStream stream replays to the simulator's states."""
    full = sim(STORY)
    seqs = await store.append(full.events)
    assert seqs == list(range(1, len(full.events) + 1))
    log = NatsLog(store)
    for t in (0, 100, 150, 600, 1540):
        replayed = await state_at(log, Point(time=t))
        assert replayed.state == sim_until(STORY, t).state
    assert (await state_at(log, Point(seq=16))).state == fold(full.events[:16])


async def test_bad_lines_are_reported_with_their_sequence_and_skipped(tmp_path: Path) -> None:
    """A line that is not an event is reported with its line number and skipped; the rest replays."""
    events = sim(STORY).events
    path = write_jsonl(tmp_path / "log.jsonl", events)
    lines = path.read_bytes().split(b"\n")
    lines.insert(12, b'{"type": "NoSuchEvent", "at": 3}')
    lines.insert(5, b"not json at all")
    path.write_bytes(b"\n".join(lines))
    bad: list[int] = []
    log = FileLog(path, on_bad=lambda b: bad.append(b.seq))
    replayed = await state_at(log, END)
    assert bad == [6, 14]
    assert replayed.state.jobs.keys() == fold(events).jobs.keys()
    assert replayed.state == fold(events)


def test_points_parse_sequences_times_and_local_datetimes() -> None:
    """--at takes a sequence, @seconds (with units) or a local ISO datetime; anything else is an error."""
    assert parse_point("1234") == Point(seq=1234, text="1234")
    assert parse_point("@3600").time == 3600
    assert parse_point("@1h30m").time == 5400
    assert parse_point("end").is_end
    local = parse_point("2024-05-01T03:12:00")
    import datetime as dt

    assert local.time == int(dt.datetime(2024, 5, 1, 3, 12).astimezone().timestamp())
    assert parse_point("2024-05-01T03:12:00+00:00").time == 1714533120
    with pytest.raises(PointError):
        parse_point("yesterday")


@pytest.mark.parametrize("text", ["@", "@-5", "@soon"])
def test_an_at_sign_without_seconds_is_refused_as_an_event_time_not_a_duration(text: str) -> None:
    """`--at @` with no seconds after it says an event time is @ and seconds (it said "not a duration")."""
    with pytest.raises(PointError, match=r"is not an event time: give @ and seconds \(@1714531920"):
        parse_point(text)


def test_replay_cli_table_reads_well(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The table shows queues with borrowed and lent GPUs, free GPUs per rack and pending jobs with reasons."""
    path = write_jsonl(tmp_path / "log.jsonl", sim(STORY).events)
    assert main(["replay", "--log", str(path), "--at", "@150"]) == 0
    out = capsys.readouterr().out
    assert "Cluster at seq 19 of 23" in out and "t=150" in out  # 100's last cycle judged b-big: a CycleSettled
    assert "b0/r0" in out and "b0/r1" in out
    assert "Pending jobs" in out and "b-big" in out and "no room for gpu=32" in out
    assert "{" not in out


def test_replay_cli_json_has_queues_domains_and_pending(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--output json: queue usage, borrowed and lent, free GPUs per domain, pending jobs in order."""
    path = write_jsonl(tmp_path / "log.jsonl", sim(STORY).events)
    assert main(["replay", "--log", str(path), "--at", "@150", "--output", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    queues = {q["queue"]: q for q in doc["queues"]}
    # a-1 (16, team-a) and b-small (8, team-b) run; b-big waits
    assert queues["team-a"]["used"] == {"gpu": 16} and queues["team-b"]["used"] == {"gpu": 8}
    assert queues["team-a"]["borrowed"] == {} and queues["team-b"]["lent"] == {}
    domains = {d["domain"]: d for d in doc["domains"]}
    assert domains["b0/r0"]["free"] == 0 and domains["b0/r1"]["free"] == 8
    assert [(p["queue"], p["position"], p["job"]) for p in doc["pending"]] == [("team-b", 1, "b-big")]
    assert doc["seq"] == 19 and doc["at"] == 150


def test_replay_cli_lent_and_borrowed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """While b-big borrows team-a's unused 16 GPUs, team-b shows 16 borrowed and team-a 16 lent."""
    path = write_jsonl(tmp_path / "log.jsonl", sim(STORY).events)
    assert main(["replay", "--log", str(path), "--at", "12", "--output", "json"]) == 0
    queues = {q["queue"]: q for q in json.loads(capsys.readouterr().out)["queues"]}
    assert queues["team-b"]["borrowed"] == {"gpu": 16} and queues["team-a"]["lent"] == {"gpu": 16}


async def test_replay_cli_on_the_embedded_nats(
    store: EventStore, nats_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`muster replay --nats URL --stream NAME` reads the stream."""
    import anyio

    await store.append(sim(STORY).events)
    code = await anyio.to_thread.run_sync(
        main, ["replay", "--nats", nats_url, "--stream", store.stream, "--at", "@150", "--output", "json"]
    )
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["seq"] == 19 and [p["job"] for p in doc["pending"]] == ["b-big"]


def test_replay_cli_bad_point_and_missing_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad --at or a missing log file is a one-line error with exit status 2."""
    path = write_jsonl(tmp_path / "log.jsonl", sim(STORY).events)
    assert main(["replay", "--log", str(path), "--at", "soon"]) == 2
    assert "--at" in capsys.readouterr().err
    assert main(["replay", "--log", str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        pytest.param(["replay", "--at", "999"], "--at 999 is past the end of", id="replay-seq-past-the-end"),
        pytest.param(["replay", "--at", "0"], "--at 0 is before the start of", id="replay-seq-before-the-start"),
        pytest.param(["replay", "--at", "@99h"], "is past the end of", id="replay-time-past-the-end"),
        pytest.param(["explain", "x", "--at", "999"], "--at 999 is past the end of", id="explain-past-the-end"),
        pytest.param(["audit", "--from", "30", "--to", "10"], "--from 30 comes after --to 10", id="audit-reversed"),
        pytest.param(["audit", "--from", "3000"], "--from 3000 is past the end of", id="audit-from-past-the-end"),
    ],
)
def test_a_point_outside_the_log_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    """A point past the end or before the start of the log, or a reversed window, exits 2 saying where the log ends."""
    path = write_jsonl(tmp_path / "log.jsonl", sim(STORY).events)
    assert main([*argv, "--log", str(path)]) == 2
    out, err = capsys.readouterr()
    assert words in err and out == ""


def test_a_scenario_given_as_the_log_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`replay --log scenario.yaml` exits 2 saying it is no event log and how to make one."""
    path = tmp_path / "scenario.yaml"
    path.write_text("queues:\n  - {name: q, nominal: {gpu: 8}}\nnodes:\n  - {name: n0, capacity: {gpu: 8}}\n")
    assert main(["replay", "--log", str(path)]) == 2
    err = capsys.readouterr().err
    assert "is not a JSONL event log" in err and "muster sim" in err


def test_replay_cli_gives_a_flavored_queues_gpus_per_flavor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A queue with quota per flavor shows its GPUs and each flavor's (they were "-": only plain `gpu` was read)."""
    path = write_jsonl(tmp_path / "log.jsonl", sim(FLAVORED_QUEUES).events)
    assert main(["replay", "--log", str(path), "--at", "@100", "--running"]) == 0
    rows = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    # big takes a100's 8 and borrows the idle queue's 8 a100 GPUs
    assert any(r.startswith("│ q │ org │ 16 (a100 8, h100 8) │ 16 (a100 16) │ 8 (a100 8) │") for r in rows), rows
    assert any(r.startswith("│ idle │ org │ 8 (a100 8) │ 0 │ - │ 8 (a100 8) │") for r in rows), rows
