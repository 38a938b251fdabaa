"""`muster queues apply` and `muster submit`: what they append to the log, and how they refuse bad input."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest

from muster.cli import main
from muster.events.store import EventStore
from muster.events.types import (
    CohortConfigured,
    JobSubmitted,
    PriorityClassConfigured,
    QueueConfigured,
    SchedulerConfigured,
)

QUEUES = """\
topology: {levels: [topology.kubernetes.io/zone, example.com/rack]}
fair_sharing: false
priority_classes: [{name: training, value: 100}, {name: inference, value: 1000, preemptible: false}]
cohorts: [{name: org}]
queues:
  - name: team-a
    cohort: org
    nominal: {gpu: 64}
    borrowing_limit: {gpu: 32}
    lending_limit: {gpu: 16}
    weight: 1
    preemption:
      within_queue: LowerPriority
      reclaim_within_cohort: Any
      borrow_within_cohort: {policy: LowerPriority, max_priority_threshold: 100}
idle_reclaim: {threshold: 0.05, after: 1800, only_borrowing: true}
"""


@pytest.fixture
def log(nats_url: str) -> Any:
    """A fresh (stream, prefix) on the session server, the flags that point a command at it, and a reader."""
    tag = uuid.uuid4().hex[:12]
    stream, prefix = f"T{tag}", f"t{tag}"

    class Log:
        flags = ["--nats", nats_url, "--stream", stream, "--subject-prefix", prefix]

        @staticmethod
        def events() -> list[Any]:
            async def read() -> list[Any]:
                store = await EventStore.connect(nats_url, stream=stream, prefix=prefix)
                try:
                    return [s.event for s in await store.read()]
                finally:
                    await store.close()

            return anyio.run(read)

    yield Log
    anyio.run(_delete, nats_url, stream, prefix)


async def _delete(url: str, stream: str, prefix: str) -> None:
    store = await EventStore.connect(url, stream=stream, prefix=prefix)
    await store.delete_stream()
    await store.close()


def test_queues_apply_appends_the_configuration_events_of_the_file(tmp_path, log, capsys):
    """The chart's queues.yaml becomes one SchedulerConfigured, then classes, cohorts and queues, field for field."""
    path = tmp_path / "queues.yaml"
    path.write_text(QUEUES)
    assert main(["queues", "apply", str(path), *log.flags]) == 0
    assert "appended 5 events" in capsys.readouterr().out
    events = log.events()
    assert [type(e) for e in events] == [
        SchedulerConfigured,
        PriorityClassConfigured,
        PriorityClassConfigured,
        CohortConfigured,
        QueueConfigured,
    ]
    scheduler, _, inference, _, queue = events
    assert scheduler.levels == ["topology.kubernetes.io/zone", "example.com/rack"]
    assert scheduler.idle_reclaim is not None and scheduler.idle_reclaim.after == 1800
    assert (inference.name, inference.value, inference.preemptible) == ("inference", 1000, False)
    assert (queue.name, queue.cohort, queue.nominal, queue.borrowing_limit, queue.lending_limit) == (
        "team-a",
        "org",
        {"gpu": 64},
        {"gpu": 32},
        {"gpu": 16},
    )
    assert queue.preemption.borrow_within_cohort.max_priority_threshold == 100
    assert len({e.at for e in events}) == 1 and events[0].at > 0


def _apply(path, log, *extra: str) -> int:
    return main(["queues", "apply", str(path), *extra, *log.flags])


def test_queues_apply_of_a_partial_file_keeps_what_it_does_not_mention(tmp_path, log, capsys):
    """A file adding one queue appends that queue only: levels, fair sharing and idle reclaim stay."""
    from muster.projections.cluster import fold

    (tmp_path / "all.yaml").write_text(QUEUES.replace("fair_sharing: false", "fair_sharing: true"))
    (tmp_path / "more.yaml").write_text("queues:\n  - {name: team-b, cohort: org, nominal: {gpu: 8}}\n")
    assert _apply(tmp_path / "all.yaml", log) == 0
    assert _apply(tmp_path / "more.yaml", log) == 0  # its cohort is defined on the log, not in the file
    out = capsys.readouterr().out
    assert "+ queue team-b" in out and "appended 1 events" in out
    events = log.events()
    assert isinstance(events[-1], QueueConfigured) and len(events) == 6
    state = fold(events)
    assert state.levels == ["topology.kubernetes.io/zone", "example.com/rack"]
    assert state.fair_sharing and state.idle_reclaim is not None and state.idle_reclaim.after == 1800
    assert sorted(state.queues) == ["team-a", "team-b"]


def test_queues_apply_switches_a_queue_to_strict_fifo(tmp_path, log, capsys):
    """A queue's `queueing_strategy` change is a difference apply writes, and the fold takes it."""
    from muster.projections.cluster import fold

    (tmp_path / "a.yaml").write_text("queues:\n  - {name: team-b, nominal: {gpu: 8}}\n")
    (tmp_path / "b.yaml").write_text("queues:\n  - {name: team-b, nominal: {gpu: 8}, queueing_strategy: strict_fifo}\n")
    assert _apply(tmp_path / "a.yaml", log) == 0
    assert fold(log.events()).queues["team-b"].queueing_strategy == "best_effort_fifo"
    assert _apply(tmp_path / "b.yaml", log) == 0
    assert "queueing_strategy" in capsys.readouterr().out
    assert fold(log.events()).queues["team-b"].queueing_strategy == "strict_fifo"


def test_queues_apply_twice_appends_nothing_the_second_time(tmp_path, log, capsys):
    """Re-applying the same file finds nothing that differs from the log and appends nothing."""
    path = tmp_path / "queues.yaml"
    path.write_text(QUEUES)
    assert _apply(path, log) == 0
    before = log.events()
    capsys.readouterr()
    assert _apply(path, log) == 0
    assert "nothing to apply" in capsys.readouterr().out
    assert log.events() == before


def test_queues_apply_dry_run_prints_the_differences_and_appends_nothing(tmp_path, log, capsys):
    """`--dry-run` lists the changed fields, new objects and the count it would append; the log is unchanged."""
    path = tmp_path / "queues.yaml"
    path.write_text(QUEUES)
    assert _apply(path, log) == 0
    before = log.events()
    changed = QUEUES.replace("nominal: {gpu: 64}", "nominal: {gpu: 32}")
    path.write_text(changed.replace("idle_reclaim:", "  - {name: team-c, nominal: {}}\nidle_reclaim:"))
    capsys.readouterr()
    assert _apply(path, log, "--dry-run") == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        '~ queue team-a: nominal: {"gpu": 64} -> {"gpu": 32}',
        "+ queue team-c",
        f"dry run: 2 events would be appended to {log.flags[3]}",
    ]
    assert log.events() == before


def test_queues_apply_prune_resets_settings_the_file_leaves_out(tmp_path, log, capsys):
    """`--prune` puts unmentioned scheduler settings back to their defaults and says queues cannot be removed."""
    from muster.projections.cluster import fold

    (tmp_path / "all.yaml").write_text(QUEUES)
    (tmp_path / "one.yaml").write_text("queues:\n  - {name: team-b, nominal: {gpu: 8}}\n")
    assert _apply(tmp_path / "all.yaml", log) == 0
    assert _apply(tmp_path / "one.yaml", log, "--prune") == 0
    assert "queue team-a is kept: the log has no event that removes a queue" in capsys.readouterr().err
    state = fold(log.events())
    assert (state.levels, state.idle_reclaim) == ([], None)
    assert sorted(state.queues) == ["team-a", "team-b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("queues:\n  - name: a\n    nominal: {gpu: 8}\n    colour: red\n", ":4: ", id="unknown-field"),
        pytest.param("queues:\n  - {name: a, nominal: {gpu: 8}, cohort: nowhere}\n", "not defined", id="no-cohort"),
        pytest.param("nodes:\n  - {name: n0, capacity: {gpu: 8}}\n", "scenario", id="scenario-only-key"),
        pytest.param(
            "queues:\n  - {name: a, nominal: {gpu: 99999999999999999999}}\n",
            "gpu=99999999999999999999 is more than muster accepts",
            id="quota-past-the-bound",
        ),
    ],
)
def test_queues_apply_refuses_a_bad_file_with_its_line_and_appends_nothing(tmp_path, log, capsys, text, message):
    """A wrong file exits 2 with a message naming the file (and line), and the log stays empty."""
    path = tmp_path / "queues.yaml"
    path.write_text(text)
    assert main(["queues", "apply", str(path), *log.flags]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and message in err
    assert log.events() == []


def test_submit_from_flags_appends_one_gang(log, capsys):
    """Flags describe a gang of N pods; the JobSubmitted carries them, its queue, class and topology."""
    flags = ["--queue", "team-a", "--job", "train-7", "--pods", "4", "--gpus", "8", "--cpu", "16", "--memory", "64Gi"]
    flags += ["--priority-class", "training", "--runtime", "3600", "--topology", "required:rack"]
    anyio.run(_create, log)
    assert main(["submit", *flags, *log.flags]) == 0
    assert "submitted train-7 to queue team-a" in capsys.readouterr().out
    [sub] = log.events()
    assert isinstance(sub, JobSubmitted)
    assert (sub.job, sub.queue, sub.priority_class, sub.runtime) == ("train-7", "team-a", "training", 3600)
    [ps] = sub.podsets
    assert (ps.count, ps.requests) == (4, {"gpu": 8, "cpu": 16_000, "memory": 64 * 2**30})
    assert ps.topology is not None and ps.topology.required == "rack"


def test_submit_from_a_file_uses_the_scenario_submit_form(tmp_path, log):
    """A YAML list of jobs in the `submit` form of spec/scenario.md: each becomes one JobSubmitted."""
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "- {job: a, queue: q, podsets: [{name: worker, count: 2, requests: {gpu: 4}}], runtime: 60}\n"
        "- {job: b, queue: q, priority_class: inference, podsets: [{count: 1, requests: {nvidia.com/gpu: 1}}]}\n"
    )
    anyio.run(_create, log)
    assert main(["submit", "-f", str(path), *log.flags]) == 0
    a, b = log.events()
    assert (a.job, a.podsets[0].count, a.podsets[0].requests, a.runtime) == ("a", 2, {"gpu": 4}, 60)
    assert (b.job, b.priority_class, b.podsets[0].requests) == ("b", "inference", {"gpu": 1})


@pytest.mark.parametrize("text", ["", "[]\n"], ids=["empty-file", "empty-list"])
def test_submit_of_a_file_without_a_job_exits_2_and_appends_nothing(tmp_path, log, capsys, text):
    """A jobs file that holds no job is a mistake: exit 2 naming the file, not a silent success."""
    path = tmp_path / "jobs.yaml"
    path.write_text(text)
    anyio.run(_create, log)
    assert main(["submit", "-f", str(path), *log.flags]) == 2
    assert f"{path}: no job in the file" in capsys.readouterr().err
    assert log.events() == []


def test_submit_declares_a_time_limit(log):
    """`--max-runtime SECONDS` is the job's declared limit on the log."""
    anyio.run(_create, log)
    assert main(["submit", "--queue", "team-a", "--job", "lim", "--max-runtime", "900", *log.flags]) == 0
    [sub] = log.events()
    assert isinstance(sub, JobSubmitted) and sub.max_runtime == 900


@pytest.mark.parametrize("value", ["0", "-60"])
def test_submit_refuses_a_limit_that_is_not_positive(log, capsys, value):
    """A zero or negative `--max-runtime` exits 2 saying why, and appends nothing."""
    anyio.run(_create, log)
    assert main(["submit", "--queue", "team-a", "--job", "lim", "--max-runtime", value, *log.flags]) == 2
    assert f"max_runtime {value} must be a positive number of seconds" in capsys.readouterr().err
    assert log.events() == []


def test_submit_refuses_bad_flags_before_touching_the_log(log, capsys):
    """A missing queue or a fractional GPU count exits 2 with the reason."""
    assert main(["submit", "--pods", "2", *log.flags]) == 2
    assert "--queue is required" in capsys.readouterr().err
    assert main(["submit", "--queue", "q", "--gpus", "0.5", *log.flags]) == 2
    assert "gpu" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(["--gpus", "99999999999999999999"], id="gpus"),
        pytest.param(["--memory", "2Ti", "--pods", "1000"], id="gang-total"),
        pytest.param(["--runtime", "99999999999999999999"], id="runtime"),
    ],
)
def test_submit_refuses_a_number_past_the_bound_and_appends_nothing(log, capsys, flags):
    """A quantity past MAX_QUANTITY exits 2 naming it, before billing or snapshots could choke on it."""
    anyio.run(_create, log)
    assert main(["submit", "--queue", "team-a", "--job", "huge", *flags, *log.flags]) == 2
    assert "is more than muster accepts" in capsys.readouterr().err
    assert log.events() == []


def test_submit_refuses_a_job_id_the_log_holds_naming_its_queue_and_state(log, capsys):
    """A reused --job exits 2 naming the live job's queue and state, in any queue, and appends nothing."""
    from muster.events.types import JobAdmitted

    anyio.run(_create, log)
    assert main(["submit", "--queue", "team-a", "--job", "train-1", *log.flags]) == 0
    admitted = JobAdmitted(at=1, job="train-1", queue="team-a", placement={"worker-0": "n0"})
    anyio.run(_append, log, admitted)
    before = log.events()
    capsys.readouterr()
    for queue in ("team-a", "team-b"):
        assert main(["submit", "--queue", queue, "--job", "train-1", *log.flags]) == 2
        err = capsys.readouterr().err
        assert "job id 'train-1' is taken: submitted to queue team-a at sequence 1 (admitted)" in err
    assert log.events() == before


def test_submit_refuses_a_file_giving_one_id_twice(tmp_path, log, capsys):
    """Two jobs of one file with the same id exit 2 before anything is appended."""
    path = tmp_path / "jobs.yaml"
    path.write_text("- {job: a, queue: q, podsets: [{count: 1}]}\n- {job: a, queue: q, podsets: [{count: 2}]}\n")
    anyio.run(_create, log)
    assert main(["submit", "-f", str(path), *log.flags]) == 2
    assert "job a appears twice" in capsys.readouterr().err
    assert log.events() == []


def test_queues_apply_calls_a_mistyped_key_a_queues_file_error_and_lists_only_what_one_may_give(tmp_path, log, capsys):
    """A misspelt top-level key names the queues file's line and the keys a queues file takes, not a scenario's."""
    path = tmp_path / "queues.yaml"
    path.write_text("cohorts: [{name: org}]\nqueus:\n  - {name: a, nominal: {gpu: 8}}\n")
    assert main(["queues", "apply", str(path), *log.flags]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: queues file: unknown field 'queus' (allowed: " in err
    assert "queues" in err.split("allowed: ")[1] and "timeline" not in err and "nodes" not in err
    path.write_text("queues:\n  - {name: a, nominal: {gpu: 8}}\ntimeline: []\n")
    assert main(["queues", "apply", str(path), *log.flags]) == 2
    assert f"{path}:3: timeline belongs in a `muster sim` scenario" in capsys.readouterr().err
    assert log.events() == []


def test_queues_apply_of_a_second_stream_on_a_taken_prefix_says_to_give_a_prefix_of_its_own(tmp_path, log, capsys):
    """A new stream whose subjects another stream holds exits 1 naming the prefix and `--subject-prefix`."""
    path = tmp_path / "queues.yaml"
    path.write_text(QUEUES)
    assert main(["queues", "apply", str(path), *log.flags]) == 0
    capsys.readouterr()
    flags = dict(zip(log.flags[::2], log.flags[1::2], strict=True))
    other = [
        "--nats",
        flags["--nats"],
        "--stream",
        f"{flags['--stream']}X",
        "--subject-prefix",
        flags["--subject-prefix"],
    ]
    assert main(["queues", "apply", str(path), *other]) == 1
    err = capsys.readouterr().err
    assert f"another stream of this server holds {flags['--subject-prefix']}.>" in err and "--subject-prefix" in err


def test_submit_says_why_when_nats_cannot_be_reached(tmp_path, capsys):
    """An unreachable NATS exits 1 with a sentence, not a traceback."""
    from muster.events.embedded import free_port

    url = f"nats://127.0.0.1:{free_port()}"
    code = main(["submit", "--queue", "q", "--nats", url, "--connect-timeout", "3"])
    assert code == 1
    assert "cannot use NATS" in capsys.readouterr().err


async def _create(log: Any) -> None:
    """Make the stream (submitters may not create it; the daemon or `queues apply` does)."""
    flags = dict(zip(log.flags[::2], log.flags[1::2], strict=True))
    store = await EventStore.connect(flags["--nats"], stream=flags["--stream"], prefix=flags["--subject-prefix"])
    await store.close()


async def _append(log: Any, event: Any) -> None:
    """Append one event as the daemon would."""
    flags = dict(zip(log.flags[::2], log.flags[1::2], strict=True))
    store = await EventStore.connect(flags["--nats"], stream=flags["--stream"], prefix=flags["--subject-prefix"])
    try:
        await store.append([event])
    finally:
        await store.close()


def test_submit_and_apply_print_records_with_o_json_and_jsonl(tmp_path, log, capsys):
    """`-o jsonl` prints one record per thing appended (with its sequence); `-o json` one list of them."""
    import json

    path = tmp_path / "queues.yaml"
    path.write_text(QUEUES)
    anyio.run(_create, log)
    capsys.readouterr()  # the test's own connection logs
    assert _apply(path, log, "--dry-run", "-o", "json") == 0
    differences = json.loads(capsys.readouterr().out)
    assert differences and all(d["appended"] is False and d["difference"] for d in differences)
    assert _apply(path, log, "-o", "jsonl") == 0
    assert all(json.loads(line)["appended"] for line in capsys.readouterr().out.splitlines())
    assert main(["submit", "--queue", "team-a", "--job", "j-1", "-o", "jsonl", *log.flags]) == 0
    (record,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (record["job"], record["queue"]) == ("j-1", "team-a") and record["seq"] == len(log.events())


def test_queues_apply_honours_the_flags_given_before_it_and_refuses_the_views(tmp_path, log, capsys):
    """`muster queues --nats U --stream S -o jsonl apply FILE` uses those flags; `queues --at N apply` is refused."""
    import json

    path = tmp_path / "queues.yaml"
    path.write_text(QUEUES)
    url, stream, prefix = log.flags[1], log.flags[3], log.flags[5]
    capsys.readouterr()
    assert main(["queues", "--at", "5", "--watch", "apply", str(path), *log.flags]) == 2
    assert "--at, --watch go with showing the queues, not with apply" in capsys.readouterr().err
    before = ["queues", "--nats", url, "--stream", stream, "-o", "jsonl"]
    assert main([*before, "apply", str(path), "--subject-prefix", prefix]) == 0
    assert all(json.loads(line)["appended"] for line in capsys.readouterr().out.splitlines())
    assert len(log.events()) == 5


FLAVORED = """\
flavors:
  - {name: h100, node_labels: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}, taints: [{key: gpu, value: h100}]}
  - {name: a100, node_labels: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB}}
queues:
  - name: team-f
    resource_groups:
      - covered: [gpu]
        flavors: [{name: h100, nominal: {gpu: 16}}, {name: a100, nominal: {gpu: 32}}]
    flavor_fungibility: {when_can_borrow: TryNextFlavor}
"""


def test_queues_apply_takes_flavors_and_the_grouped_form(tmp_path, log, capsys):
    """Flavors and a queue's quota per flavor are applied; a later file may name flavors already on the log."""
    from muster.events.types import FlavorConfigured
    from muster.projections.cluster import fold

    (tmp_path / "f.yaml").write_text(FLAVORED)
    assert _apply(tmp_path / "f.yaml", log) == 0
    assert "+ flavor h100" in capsys.readouterr().out
    state = fold(log.events())
    assert [type(e) for e in log.events()] == [FlavorConfigured, FlavorConfigured, QueueConfigured]
    assert state.flavors["h100"].taints[0].value == "h100"
    assert state.queues["team-f"].nominal == {"gpu@h100": 16, "gpu@a100": 32}
    assert state.queues["team-f"].fungibility.when_can_borrow == "TryNextFlavor"
    (tmp_path / "g.yaml").write_text(FLAVORED.split("queues:\n")[1].join(["queues:\n", ""]).replace("16", "24"))
    assert _apply(tmp_path / "g.yaml", log) == 0  # its flavors are defined on the log, not in the file
    assert fold(log.events()).queues["team-f"].nominal == {"gpu@h100": 24, "gpu@a100": 32}
    assert _apply(tmp_path / "f.yaml", log) == 0
    assert _apply(tmp_path / "f.yaml", log) == 0
    assert "nothing to apply" in capsys.readouterr().out
    (tmp_path / "bad.yaml").write_text(FLAVORED.split("queues:\n")[1].join(["queues:\n", ""]).replace("a100", "l4"))
    assert _apply(tmp_path / "bad.yaml", log) == 2
    assert "flavor 'l4' is not defined" in capsys.readouterr().err
