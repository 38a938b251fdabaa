"""Every scenario in examples/ runs and shows what its comments promise."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from muster.events.types import (
    Event,
    JobAdmitted,
    JobFailed,
    JobInadmissible,
    JobPreempted,
    ReservationMade,
    ReservationReleased,
)
from muster.replay.scenario import load, loads
from muster.replay.simulator import simulate

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run(name: str) -> list[Event]:
    return list(simulate(load(str(EXAMPLES / name))).events)


def admissions(events: list[Event], job: str) -> list[JobAdmitted]:
    return [e for e in events if isinstance(e, JobAdmitted) and e.job == job]


def preemptions(events: list[Event]) -> list[tuple[str, str | None, str, int]]:
    return [(e.job, e.preemptor, e.reason, e.at) for e in events if isinstance(e, JobPreempted)]


def test_every_example_is_tested_here() -> None:
    """A new scenario in examples/ needs its own test below."""
    tested = {
        "deadlock",
        "quotas_and_borrowing",
        "preemption",
        "topology",
        "idle_reclaim",
        "trace_replay",
        "strict_fifo",
        "shortest_limit_first",
        "flavors",
        "reservations",
        "stacked_reservations",
    }
    assert {p.stem for p in EXAMPLES.glob("*.yaml")} == tested


def _comment_commands() -> list[tuple[str, str]]:
    """(example, command line) for each `#   muster ...` line of an example's opening comment."""
    found = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for line in path.read_text().splitlines():
            if m := re.match(r"#\s+(muster .+)$", line):
                found.append((path.stem, m.group(1).strip()))
    return found


@pytest.mark.parametrize(("example", "line"), _comment_commands(), ids=[f"{e}:{c}" for e, c in _comment_commands()])
def test_every_command_an_examples_comment_shows_runs_as_written(
    example: str, line: str, tmp_path, capsys, monkeypatch
) -> None:
    """Each `muster ...` line of an example's comment, run from the repository's root, exits 0 and prints what
    it pipes to grep (the `/tmp/` files it writes go to a folder of the test's own)."""
    from muster.cli import main

    monkeypatch.chdir(ROOT)
    for part in line.split("&&"):
        words = shlex.split(part.replace("/tmp/", f"{tmp_path}/"))
        grep = target = None
        if "|" in words:
            at = words.index("|")
            assert words[at + 1] == "grep", part
            grep, words = words[at + 2], words[:at]
        if ">" in words:
            at = words.index(">")
            target, words = words[at + 1], words[:at]
        assert words[0] == "muster", part
        code = main(words[1:])
        captured = capsys.readouterr()
        assert code == 0, f"{part}: {captured.err}"
        if target is not None:
            Path(target).write_text(captured.out)
        assert (grep or "") in captured.out and captured.out.strip(), part


def test_deadlock_one_gang_runs_the_other_waits_whole() -> None:
    """Two 64-GPU gangs on 96 GPUs: one runs, the other is admitted whole once it finishes."""
    events = run("deadlock.yaml")
    first, second = admissions(events, "big-1"), admissions(events, "big-2")
    assert first[0].at == 0 and second[0].at == 3600 and len(second[0].placement) == 8


def test_quotas_and_borrowing_team_b_reclaims_what_team_a_borrowed() -> None:
    """team-a borrows team-b's idle 16 GPUs; team-b's job reclaims them at t=600; team-a's job runs again later."""
    events = run("quotas_and_borrowing.yaml")
    assert admissions(events, "a-wide")[0].borrowed == {"gpu": 16}
    assert preemptions(events) == [("a-wide", "b-train", "ReclaimWithinCohort", 600)]
    assert admissions(events, "b-train")[0].at == 600
    assert admissions(events, "a-wide")[1].at == 1800


def test_preemption_evicts_the_scavenger_never_inference() -> None:
    """The training job evicts the scavenger (WithinQueue); the non-preemptible server keeps running."""
    events = run("preemption.yaml")
    assert preemptions(events) == [("scavenge", "train", "WithinQueue", 100)]
    assert admissions(events, "train")[0].at == 100 and len(admissions(events, "serve")) == 1
    assert admissions(events, "scavenge")[1].at == 1900


def test_topology_keeps_each_gang_in_one_rack_and_the_third_waits() -> None:
    """Each 32-GPU gang runs inside one rack; the third waits for a whole rack rather than spreading."""
    events = run("topology.yaml")
    for gang in ("gang-1", "gang-2", "gang-3"):
        (admitted,) = admissions(events, gang)
        assert len({node.split("-")[0] for node in admitted.placement.values()}) == 1, gang
    assert admissions(events, "gang-3")[0].at == 1210
    assert any(isinstance(e, JobInadmissible) and e.job == "gang-3" for e in events)


def test_idle_reclaim_takes_back_the_idle_borrowed_gpus() -> None:
    """The idle notebook is preempted (IdleReclaim) 600 s after its first idle sample; team-b's job then runs."""
    events = run("idle_reclaim.yaml")
    assert preemptions(events) == [("notebook", None, "IdleReclaim", 660)]
    assert admissions(events, "b-train")[0].at == 660
    assert len(admissions(events, "busy")) == 1


@pytest.mark.parametrize("job", [f"t-00{i}" for i in range(1, 9)])
def test_trace_replay_runs_every_job_of_the_trace(job: str) -> None:
    """Every row of trace.csv becomes a gang of gpus / gpus_per_pod pods that is admitted."""
    events = run("trace_replay.yaml")
    admitted = admissions(events, job)
    assert admitted, f"{job} never ran"
    rows = {r.split(",")[0]: r.split(",") for r in (EXAMPLES / "trace.csv").read_text().splitlines()[1:]}
    gpus, per_pod = int(rows[job][3]), int(rows[job][4])
    assert len(admitted[0].placement) == max(1, gpus // per_pod)


def test_strict_fifo_the_head_gang_starts_first_and_a_limit_ends_a_run() -> None:
    """The strict head (a 16-GPU gang) starts at t=600, before the small jobs behind it; small-2 ends at its limit."""
    events = run("strict_fifo.yaml")
    assert admissions(events, "gang")[0].at == 600
    assert all(a.at >= 600 for j in ("small-1", "small-2") for a in admissions(events, j))
    [failed] = [e for e in events if isinstance(e, JobFailed) and e.job == "small-2"]
    assert failed.reason.startswith("DeadlineExceeded")


@pytest.mark.parametrize(
    ("strategy", "starts"),
    [
        pytest.param(
            "shortest_limit_first", {"quick": 600, "medium": 800, "long": 1400, "unbounded": 2300}, id="by-limit"
        ),
        pytest.param("best_effort_fifo", {"unbounded": 600, "long": 1800, "medium": 2700, "quick": 3300}, id="fifo"),
    ],
)
def test_shortest_limit_first_starts_the_shortest_declared_limit_first(strategy: str, starts: dict[str, int]) -> None:
    """The example's waiting jobs start by declared limit (no limit last); the same file under best_effort_fifo
    starts them in submission order."""
    text = (EXAMPLES / "shortest_limit_first.yaml").read_text().replace("shortest_limit_first", strategy)
    events = list(simulate(loads(text, "shortest_limit_first.yaml")).events)
    assert {job: admissions(events, job)[0].at for job in starts} == starts


def test_flavors_three_models_four_teams() -> None:
    """Each team's jobs run on its flavors' nodes; training reclaims its A100 (Preempt) instead of spilling
    onto H100, which it takes with Kueue's default; the evaluation that fits no flavor says why for each."""
    events = run("flavors.yaml")
    on = {
        e.job: (e.flavors, {n.split("-")[0] for n in e.placement.values()})
        for e in reversed(events)
        if isinstance(e, JobAdmitted)
    }
    assert on["r-pretrain"] == ({"worker": {"gpu": "h100"}}, {"h100"})
    assert on["serve"] == ({"server": {"gpu": "l4"}}, {"l4"})
    assert on["t-eval"] == ({"worker": {"gpu": "a100"}}, {"a100"})
    assert preemptions(events) == [("i-sweep", "t-eval", "ReclaimWithinCohort", 300)]
    (wait,) = [e.reason for e in events if isinstance(e, JobInadmissible) and e.job == "r-eval"]
    assert wait.startswith("h100: quota (") and "; a100: quota (" in wait
    assert admissions(events, "r-eval")[0].at == 2100 and admissions(events, "i-sweep")[1].at == 3900
    text = (EXAMPLES / "flavors.yaml").read_text().replace("    flavor_fungibility: {when_can_preempt: Preempt}\n", "")
    default = list(simulate(loads(text, "flavors.yaml")).events)
    assert preemptions(default) == []
    assert admissions(default, "t-eval")[0].flavors == {"worker": {"gpu": "h100"}}


def test_reservations_the_gang_starts_when_expected_and_only_a_job_that_ends_in_time_backfills() -> None:
    """The nominal-quota gang reserves n0, n1 at once and starts at t=1800; dev-5 backfills, dev-6 waits."""
    events = run("reservations.yaml")
    made = [e for e in events if isinstance(e, ReservationMade)]
    assert [(e.job, e.at, e.nodes, e.expected_start) for e in made] == [("gang", 100, ["n0", "n1"], 1800)]
    assert [(w.job, w.end) for w in made[0].waits_for] == [("dev-1", 1200), ("dev-2", 1800)]
    assert admissions(events, "gang")[0].at == 1800
    released = [(e.job, e.reason, e.at) for e in events if isinstance(e, ReservationReleased)]
    assert released == [("gang", "admitted", 1800)]
    assert admissions(events, "dev-5")[0].at == 1200 and admissions(events, "dev-5")[0].placement == {"worker-0": "n0"}
    assert admissions(events, "dev-6")[0].at == 2800


def test_stacked_reservations_the_second_gang_is_reserved_for_behind_the_first() -> None:
    """gang-b is reserved for behind gang-a on the same nodes and starts when gang-a's limit ends; dev-3 waits."""
    events = run("stacked_reservations.yaml")
    made = [e for e in events if isinstance(e, ReservationMade)]
    assert [(e.job, e.at, e.nodes, e.expected_start) for e in made] == [
        ("gang-a", 10, ["n0", "n1"], 2000),
        ("gang-b", 20, ["n0", "n1"], 2500),
    ]
    assert [(w.job, w.end) for w in made[1].waits_for] == [("dev-1", 1000), ("dev-2", 2000), ("gang-a", 2500)]
    assert [admissions(events, j)[0].at for j in ("gang-a", "gang-b", "dev-3")] == [2000, 2500, 2600]
