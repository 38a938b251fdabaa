"""`muster explain JOB`: a job's story from the log, and what a waiting job needs.

The story of a preempted-then-finished job (STORY: b-big borrows team-a's
unused quota, a-1 reclaims it, b-big waits, runs again and finishes), the
preemptor's side, and the numbers given for a pending job: position, quota
shortfall, free GPUs in the best topology domain, preemption.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from replaykit import STORY, memory_log, sim, write_jsonl

from muster.cli import main
from muster.events.types import JobAdmitted, JobPreempted
from muster.replay.explain import explain
from muster.replay.points import END, Point

RACKS = """\
topology:
  levels: [block, rack]
nodes:
  - generate:
      count: 2
      name: "{block}-{rack}-n{i}"
      labels: {block: [b0], rack: [r0, r1]}
      capacity: {gpu: 8}
queues:
  - {name: q, nominal: {gpu: 64}}
timeline:
  - {at: 0, submit: {job: wide, queue: q, podsets: [{count: 3, requests: {gpu: 8}}], runtime: 1000}}
  - {at: 10, submit: {job: tight, queue: q, podsets: [{count: 2, requests: {gpu: 8}, topology: {required: rack}}],
     runtime: 100}}
  - {at: 20, submit: {job: after, queue: q, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 100}}
"""


async def test_the_story_of_a_preempted_then_finished_job() -> None:
    """Submitted, admitted on borrowed quota, preempted by a-1 with the work lost, requeued, waited, ran, finished."""
    events = sim(STORY).events
    story, now = await explain(memory_log(events), "b-big", END)
    assert story.status == "finished" and now == 1540
    assert [ln.kind for ln in story.lines] == [
        "submitted",
        "admitted",
        "preempted",
        "requeued",
        "inadmissible",
        "admitted",
        "finished",
    ]
    sub, adm, pre, req, wait, again, fin = story.lines
    assert "team-b" in sub.text and "32 GPUs (4x8)" in sub.text and "checkpoint every 1m 00s" in sub.text
    assert "borrowing gpu=16 from cohort org" in adm.text and "team-a (gpu=16 unused)" in adm.text
    assert "racks b0/r0, b0/r1" in adm.text
    (recorded,) = [e for e in events if isinstance(e, JobPreempted)]
    assert pre.seq == events.index(recorded) + 1 and pre.at == 100
    assert pre.data["preemptor"] == "a-1" and pre.data["reason"] == "ReclaimWithinCohort"
    # 100 s of work since admission, a checkpoint at 60 s: 40 s on 32 GPUs lost
    assert pre.data["lost_gpu_seconds"] == recorded.lost_gpu_seconds == 1280
    assert "by a-1 (team-a" in pre.text and "takes back its nominal quota" in pre.text
    assert "1,280 GPU-seconds" in pre.text
    assert "position 1 of 1" in req.text and "1m 00s of work saved" in req.text and "15m 40s left" in req.text
    assert "no room for gpu=32" in wait.text and "short by 16" in wait.text
    assert again.at == 600 and "after waiting 8m 20s" in again.text
    assert fin.at == 1540 and fin.data["work_seconds"] == 1000 and fin.data["waited_seconds"] == 500
    assert "preempted 1 time" in fin.text


async def test_the_preemptor_s_story_names_its_victim() -> None:
    """a-1's story says it evicted b-big to make room, then was admitted within its nominal quota."""
    story, _ = await explain(memory_log(sim(STORY).events), "a-1", END)
    kinds = [ln.kind for ln in story.lines]
    assert kinds == ["submitted", "evicted", "admitted", "finished"]
    assert "evicted b-big" in story.lines[1].text and "ReclaimWithinCohort" in story.lines[1].text
    assert "within its queue's nominal quota" in story.lines[2].text


async def test_a_pending_job_gets_its_position_and_quota_shortfall() -> None:
    """Pending at seq 16: first in team-b; 16 GPUs short of quota; its queue may evict nothing."""
    story, _ = await explain(memory_log(sim(STORY).events), "b-big", Point(seq=16))
    assert story.status == "pending"
    p = story.pending
    assert p is not None
    assert (p["position"], p["queue_length"], p["ahead"]) == (1, 1, [])
    assert p["quota"]["gpu"] == {
        "requested": 32,
        "used": 0,
        "nominal": 16,
        "available": 16,
        "short": 16,
        "borrowing_limit": None,
    }
    changes = p["what_would_have_to_change"]
    assert any(c.startswith("quota: 16 more gpu") for c in changes)
    assert any("lets it evict nothing" in c for c in changes)


STRICT_EXAMPLE = (Path(__file__).resolve().parents[2] / "examples" / "strict_fifo.yaml").read_text()


async def test_a_job_held_behind_its_strict_fifo_head_is_told_so() -> None:
    """In a strict_fifo queue, a job that would fit waits behind the head; explain names the head first."""
    result = sim(STRICT_EXAMPLE)
    story, _ = await explain(memory_log(result.events), "small-1", Point(time=100))
    assert story.status == "pending" and story.pending is not None
    changes = story.pending["what_would_have_to_change"]
    assert changes[0].startswith("strict_fifo: gang, the head of team-a, must be admitted first")


RESERVATIONS_EXAMPLE = (Path(__file__).resolve().parents[2] / "examples" / "reservations.yaml").read_text()


async def test_a_reserved_job_shows_its_reservation_and_the_jobs_it_waits_for() -> None:
    """The gang's story says where it is reserved and whom it waits for; a job held back is told why."""
    log = memory_log(sim(RESERVATIONS_EXAMPLE).events)
    story, _ = await explain(log, "gang", Point(time=600))
    [line] = [ln for ln in story.lines if ln.kind == "reserved"]
    assert line.at == 100 and line.text.startswith("reserved n0, n1; waiting for 2 jobs to end (dev-1 in 18m 20s")
    assert line.data["waits_for"] == [{"job": "dev-1", "expected_end": 1200}, {"job": "dev-2", "expected_end": 1800}]
    assert story.pending is not None and story.pending["reservation"]["expected_start"] == 1800
    changes = story.pending["what_would_have_to_change"]
    # as of the time asked, t=600 (not the last event before it, at t=200)
    assert changes[0].startswith("reserved n0, n1 since 8m 20s ago; waiting for 2 jobs to end")
    assert "(dev-1 in 10m 00s, dev-2 in 20m 00s), expected in 20m 00s" in changes[0]
    held, _ = await explain(log, "dev-6", Point(time=600))
    assert held.pending is not None
    assert (
        "reserved room: n0, n1 held for gang; a job without a limit never backfills"
        in (held.pending["what_would_have_to_change"])
    )
    done, _ = await explain(log, "gang", END)
    assert [ln.text for ln in done.lines if ln.kind == "unreserved"] == ["its reservation released: admitted"]


async def test_a_pending_job_blocked_by_topology_gets_the_best_domain() -> None:
    """A gang that needs one rack: the best rack's free GPUs and how many more it needs there."""
    story, _ = await explain(memory_log(sim(RACKS).events), "tight", Point(time=15))
    assert story.status == "pending"
    p = story.pending
    assert p is not None
    (cap,) = p["capacity"]
    assert cap["level"] == "rack" and cap["best_domain"] == "b0/r1"
    assert (cap["best_free_gpus"], cap["best_room_pods"], cap["missing_gpus"]) == (8, 1, 8)
    assert any(
        "no rack has room for 2 pods" in c and "8 more GPUs must be free there" in c
        for c in p["what_would_have_to_change"]
    )
    assert p["quota"]["gpu"]["short"] == 0
    wait = [ln for ln in story.lines if ln.kind == "inadmissible"]
    assert wait and "no rack has room" in wait[0].text and "best rack b0/r1 has 8 free GPUs" in wait[0].text


def test_explain_cli_table_json_and_unknown_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI prints one line per event with times and the story in JSON; an unknown job exits 2."""
    path = write_jsonl(tmp_path / "log.jsonl", sim(STORY).events)
    assert main(["explain", "b-big", "--log", str(path)]) == 0
    out = capsys.readouterr().out
    assert "b-big" in out and "finished" in out and "t=100" in out and "+1m 40s" in out
    assert "preempted by a-1" in out
    assert main(["explain", "b-big", "--log", str(path), "--at", "16"]) == 0
    out = capsys.readouterr().out
    assert "Pending" in out and "position 1 of 1 in team-b" in out and "What would have to change" in out
    assert main(["explain", "b-big", "--log", str(path), "--output", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "finished" and [s["kind"] for s in doc["story"]][:3] == [
        "submitted",
        "admitted",
        "preempted",
    ]
    assert main(["explain", "nobody", "--log", str(path)]) == 2
    assert "no job 'nobody'" in capsys.readouterr().err


def test_explain_takes_a_unique_prefix_and_says_which_job(tmp_path: Path, capsys) -> None:
    """`muster explain b-bi` tells b-big's story and says on stderr which job it chose."""
    log = write_jsonl(tmp_path / "log.jsonl", sim(STORY).events)
    assert main(["explain", "b-bi", "--log", str(log), "-o", "json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["job"] == "b-big" and "'b-bi' is job b-big (by prefix)" in out.err


def test_explain_of_an_ambiguous_prefix_lists_the_candidates(tmp_path: Path, capsys) -> None:
    """`muster explain b-` names two jobs: exit 2, both listed."""
    log = write_jsonl(tmp_path / "log.jsonl", sim(STORY).events)
    assert main(["explain", "b-", "--log", str(log)]) == 2
    err = capsys.readouterr().err
    assert "ambiguous" in err and "b-big" in err and "b-small" in err


async def test_the_story_tells_holds_releases_and_a_refused_second_submission() -> None:
    """A held, released and re-submitted job: each step is a line of its story, in log order."""
    from muster.events.types import JobHeld, JobReleased, JobSubmitted, PodSet, QueueConfigured, SubmissionRejected

    gang = [PodSet(name="w", count=1, requests={"gpu": 1})]
    events = [
        QueueConfigured(at=0, name="q", nominal={"gpu": 8}),
        JobSubmitted(at=1, job="j", queue="q", podsets=gang),
        JobHeld(at=2, job="j", reason="dataset not ready"),
        JobReleased(at=3, job="j"),
        JobSubmitted(at=4, job="j", queue="other", podsets=gang),
        SubmissionRejected(at=4, job="j", queue="other", reason="job id 'j' is taken", cycle=1),
    ]
    story, _ = await explain(memory_log(events), "j", END)
    kinds = [ln.kind for ln in story.lines]
    assert kinds == ["submitted", "held", "released", "submitted", "refused"]
    assert "dataset not ready" in story.lines[1].text and "second submission" in story.lines[3].text


TWO_MODELS = """\
nodes:
  - {name: h0, labels: {model: H100}, capacity: {gpu: 8}}
  - {name: a0, labels: {model: A100}, capacity: {gpu: 8}}
flavors:
  - {name: h100, node_labels: {model: H100}}
  - {name: a100, node_labels: {model: A100}}
"""
"""One H100 node and one A100 node, each its flavor."""

FLAVORED = (
    TWO_MODELS
    + """\
priority_classes:
  - {name: urgent, value: 2000}
  - {name: high, value: 500}
  - {name: low, value: 50}
queues:
  - name: q
    resource_groups: [{covered: [gpu], flavors: [{name: h100, nominal: {gpu: 16}}, {name: a100, nominal: {gpu: 16}}]}]
    preemption: {within_queue: LowerPriority}
timeline:
  - {at: 0, submit: {job: low, queue: q, priority_class: low, podsets: [{count: 1, requests: {gpu: 8}}]}}
  - {at: 1, submit: {job: top, queue: q, priority_class: urgent, podsets: [{count: 1, requests: {gpu: 8}}]}}
  - {at: 10, submit: {job: big, queue: q, priority_class: high, podsets: [{count: 2, requests: {gpu: 8}}]}}
"""
)


async def test_a_flavored_job_is_told_what_its_candidates_on_its_flavors_hold() -> None:
    """A gang too big for any flavor's nodes: explain gives its quota and room per flavor, and says the job it
    may evict (on h100) holds 8 GPUs, not enough: the same search the core makes, on the job's flavors."""
    story, _ = await explain(memory_log(sim(FLAVORED).events), "big", Point(time=20))
    assert story.status == "pending" and story.pending is not None
    p = story.pending
    assert {r: (q["requested"], q["used"], q["short"]) for r, q in p["quota"].items()} == {
        "gpu@a100": (16, 8, 8),
        "gpu@h100": (16, 8, 8),
    }
    assert [(c["flavor"], c["cluster_free_gpus"], c["missing_gpus"]) for c in p["capacity"]] == [
        ("h100", 0, 16),
        ("a100", 0, 16),
    ]
    assert p["preemption"] == {"victims": [], "candidate_gpus": 8}
    changes = p["what_would_have_to_change"]
    assert changes[0] == "flavors: it may run on any one of h100, a100: what one of them lacks below is enough"
    assert "preemption cannot help: the jobs its policy may evict hold 8 GPUs, not enough to make room" in changes
    assert any(c.startswith("capacity: there is room on flavor h100's nodes for 0 of 2 pods") for c in changes)


IDLE_ONE_QUEUE = """\
nodes:
  - {name: n0, capacity: {gpu: 8}}
queues:
  - {name: q, nominal: {gpu: 8}}
idle_reclaim: {threshold: 0.05, after: 600, only_borrowing: false}
timeline:
  - {at: 0, submit: {job: idle, queue: q, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 5000}}
  - {at: 100, utilization: {job: idle, gpu: 0.0}}
  - {at: 200, submit: {job: waiting, queue: q, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 300}}
"""


async def test_a_job_reclaimed_for_idleness_is_told_it_waits_behind_the_job_it_made_room_for() -> None:
    """The reclaimed job's story: reclaimed for a job before it, requeued at position 2 of 2, behind that job."""
    story, _ = await explain(memory_log(sim(IDLE_ONE_QUEUE).events), "idle", Point(time=700))
    pre, req = (ln for ln in story.lines if ln.kind in ("preempted", "requeued"))
    assert pre.at == 700 and "needed its room; it waits behind the jobs pending then" in pre.text
    assert req.data["position"] == 2 and "position 2 of 2" in req.text


async def test_an_idle_reclaim_says_how_long_the_job_was_idle() -> None:
    """The reclaim line says for how long the job sat idle (600 s here), not an event time that reads as a date."""
    story, _ = await explain(memory_log(sim(IDLE_ONE_QUEUE).events), "idle", Point(time=700))
    (pre,) = (ln for ln in story.lines if ln.kind == "preempted")
    assert "idle (GPU utilization at or under 5% for 10m 00s)" in pre.text


def test_a_requeued_job_waits_since_its_requeue_not_since_its_submission(tmp_path: Path, capsys) -> None:
    """`explain` of a job reclaimed at t=700 after running since t=0 says it has waited 0s, not 11m 40s."""
    path = write_jsonl(tmp_path / "log.jsonl", sim(IDLE_ONE_QUEUE).events)
    assert main(["explain", "idle", "--log", str(path), "--at", "@700"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Pending, waiting 0s since it was requeued (11m 40s since submission)" in out


def test_explain_at_a_point_before_the_submission_says_when_the_job_was_submitted(tmp_path: Path, capsys) -> None:
    """`explain b-small --at @100` (submitted at t=150) says it was not yet submitted and when it was, not "no job"."""
    path = write_jsonl(tmp_path / "log.jsonl", sim(STORY).events)
    for at in ("@100", "1"):
        assert main(["explain", "b-small", "--log", str(path), "--at", at]) == 2
        err = capsys.readouterr().err
        assert f"b-small was not yet submitted at {at}" in err and "it was submitted at t=150" in err
        assert "no job" not in err
    assert main(["explain", "b-smal", "--log", str(path), "--at", "@100"]) == 2
    assert "b-small was not yet submitted at @100" in capsys.readouterr().err
    assert main(["explain", "nobody", "--log", str(path), "--at", "@100"]) == 2
    assert "no job 'nobody'" in capsys.readouterr().err


TWO_GANGS_96_FREE = """\
topology:
  levels: [block, rack]
nodes:
  - generate: {count: 3, name: "{block}-{rack}-n{i}", labels: {block: [b0, b1], rack: [r0, r1]}, capacity: {gpu: 8}}
queues:
  - {name: q, nominal: {gpu: 128}}
timeline:
  - {at: 0, submit: {job: g1, queue: q, podsets: [{count: 8, requests: {gpu: 8}}], runtime: 1000}}
  - {at: 0, submit: {job: g2, queue: q, podsets: [{count: 8, requests: {gpu: 8}}], runtime: 1000}}
"""


def test_of_two_64_gpu_gangs_on_96_free_gpus_one_runs_whole_and_the_other_waits_whole(tmp_path: Path, capsys) -> None:
    """g1 gets all 8 pods, g2 none until g1 ends; `explain g2 --at @500` says room for 4 of 8 pods, waiting 8m 20s."""
    events = sim(TWO_GANGS_96_FREE).events
    admitted = [(e.at, e.job, len(e.placement)) for e in events if isinstance(e, JobAdmitted)]
    assert admitted == [(0, "g1", 8), (1000, "g2", 8)]
    path = write_jsonl(tmp_path / "log.jsonl", events)
    assert main(["explain", "g2", "--log", str(path), "--at", "@500"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "pending as of t=500" in out and "Pending, waiting 8m 20s: position 1 of 1 in q" in out
    assert "there is room in the cluster for 4 of 8 pods of gpu=8: 32 more GPUs must be free" in out


INFERENCE_RECLAIMS = """\
nodes:
  - generate: {count: 8, name: "n{i}", capacity: {gpu: 8}}
priority_classes:
  - {name: inference, value: 1000, preemptible: false}
  - {name: training, value: 100}
cohorts: [{name: org}]
queues:
  - {name: serve, cohort: org, nominal: {gpu: 32}, preemption: {reclaim_within_cohort: Any}}
  - {name: research, cohort: org, nominal: {gpu: 32}}
timeline:
  - {at: 0, submit: {job: a-ckpt600, queue: research, priority_class: training,
     podsets: [{count: 2, requests: {gpu: 8}}], runtime: 20000, checkpoint_every: 600}}
  - {at: 0, submit: {job: b-ckpt3000, queue: research, priority_class: training,
     podsets: [{count: 2, requests: {gpu: 8}}], runtime: 20000, checkpoint_every: 3000}}
  - {at: 0, submit: {job: c-nockpt, queue: research, priority_class: training,
     podsets: [{count: 2, requests: {gpu: 8}}], runtime: 20000}}
  - {at: 0, submit: {job: d-ckpt100, queue: research, priority_class: training,
     podsets: [{count: 2, requests: {gpu: 8}}], runtime: 20000, checkpoint_every: 100}}
  - {at: 1050, submit: {job: inf1, queue: serve, priority_class: inference,
     podsets: [{count: 2, requests: {gpu: 8}}], runtime: 3600}}
  - {at: 1050, submit: {job: inf2, queue: serve, priority_class: inference,
     podsets: [{count: 2, requests: {gpu: 8}}], runtime: 3600}}
  - {at: 1100, submit: {job: inf3, queue: serve, priority_class: inference,
     podsets: [{count: 4, requests: {gpu: 8}}], runtime: 3600}}
until: 8000
"""


async def test_inference_takes_back_its_quota_from_the_training_jobs_that_lose_the_least_work() -> None:
    """At t=1050 the two inference gangs evict d (800 GPU-s since its checkpoint) and a (7,200), not b or c
    (16,800 each); explain tells each victim its loss, and the inference gang past its nominal quota that
    only its own queue's jobs hold what it waits for (it never borrows)."""
    events = sim(INFERENCE_RECLAIMS).events
    preempted = [
        (e.at, e.job, e.preemptor, e.reason, e.lost_gpu_seconds) for e in events if isinstance(e, JobPreempted)
    ]
    assert preempted == [
        (1050, "d-ckpt100", "inf1", "ReclaimWithinCohort", 800),
        (1050, "a-ckpt600", "inf2", "ReclaimWithinCohort", 7200),
    ]
    log = memory_log(events)
    story, _ = await explain(log, "d-ckpt100", Point(time=1300))
    (pre,) = (ln for ln in story.lines if ln.kind == "preempted")
    assert "preempted by inf1 (serve, inference (1000), 16 GPUs) after running 17m 30s: ReclaimWithinCohort" in pre.text
    assert "lost 800 GPU-seconds (0.2 GPU-hours) of work since its last checkpoint" in pre.text
    (req,) = (ln for ln in story.lines if ln.kind == "requeued")
    assert "16m 40s of work saved" in req.text
    story, _ = await explain(log, "inf3", Point(time=1300))
    assert story.pending is not None
    (quota,) = (c for c in story.pending["what_would_have_to_change"] if c.startswith("quota:"))
    assert quota.endswith("jobs of its queue must finish, or its quota grow"), quota


async def test_the_submission_line_names_the_time_limit_and_a_missing_class() -> None:
    """small-2 of examples/strict_fifo.yaml: its story says its 10-minute limit and no class (so the lowest, 0),
    then its failure at that limit."""
    story, _ = await explain(memory_log(sim(STRICT_EXAMPLE).events), "small-2", END)
    sub = story.lines[0]
    assert "no priority class (so the lowest, 0)" in sub.text and "time limit 10m 00s per run" in sub.text
    assert story.lines[-1].kind == "failed" and story.lines[-1].text.endswith(": DeadlineExceeded")


CORDONED = """\
nodes:
  - {name: n0, capacity: {gpu: 8}}
  - {name: n1, capacity: {gpu: 8}}
queues: [{name: q, nominal: {gpu: 16}}]
timeline:
  - {at: 0, cordon: n0}
  - {at: 0, submit: {job: a, queue: q, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 1000}}
  - {at: 20, submit: {job: late, queue: q, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 100}}
"""


async def test_a_job_kept_off_a_cordoned_node_with_room_is_told_that_node_takes_no_pods() -> None:
    """`late` waits with 0 GPUs free on schedulable nodes; explain names n0, which has the room but is cordoned."""
    story, _ = await explain(memory_log(sim(CORDONED).events), "late", Point(time=30))
    assert story.pending is not None
    (capacity,) = (c for c in story.pending["what_would_have_to_change"] if c.startswith("capacity:"))
    assert capacity.endswith("on schedulable nodes; n0 (cordoned) would hold a pod but takes none now"), capacity


async def test_a_job_waiting_for_room_an_idle_job_holds_is_told_when_that_job_may_be_reclaimed() -> None:
    """At t=300 `waiting` is told that `idle` (idle since t=100, `after` 600 s) may be reclaimed in 6m 40s;
    it is, at t=700, and `waiting` runs in its room."""
    events = sim(IDLE_ONE_QUEUE).events
    story, _ = await explain(memory_log(events), "waiting", Point(time=300))
    assert story.pending is not None
    assert (
        "idle reclaim: idle (q, 8 GPUs) has been idle for 3m 20s; it may be reclaimed in 6m 40s, for a waiting job "
        "that comes before it and needs its room"
    ) in story.pending["what_would_have_to_change"]
    assert [(e.at, e.job) for e in events if isinstance(e, JobAdmitted)][1] == (700, "waiting")


# examples/idle_reclaim.yaml with every queue's quota on one flavor, h100: team-a's notebook borrows `gpu@h100`
IDLE_ON_FLAVOR = """\
nodes: [{generate: {count: 4, name: "n{i}", labels: {model: H100}, capacity: {gpu: 8}}}]
flavors: [{name: h100, node_labels: {model: H100}}]
cohorts: [{name: org}]
queues:
  - {name: team-a, cohort: org, resource_groups: [{covered: [gpu], flavors: [{name: h100, nominal: {gpu: 8}}]}]}
  - {name: team-b, cohort: org, resource_groups: [{covered: [gpu], flavors: [{name: h100, nominal: {gpu: 24}}]}]}
idle_reclaim: {threshold: 0.05, after: 600, only_borrowing: true}
timeline:
  - {at: 0, submit: {job: busy, queue: team-a, podsets: [{count: 2, requests: {gpu: 8}}], runtime: 7200}}
  - {at: 10, submit: {job: notebook, queue: team-a, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 7200}}
  - {at: 60, utilization: {job: busy, gpu: 0.85}}
  - {at: 60, utilization: {job: notebook, gpu: 0.01}}
  - {at: 300, submit: {job: b-train, queue: team-b, podsets: [{count: 2, requests: {gpu: 8}}], runtime: 1800}}
until: 3600
"""


def test_a_flavored_job_waiting_for_an_idle_borrower_s_room_is_told_when_it_may_be_reclaimed(
    tmp_path: Path, capsys
) -> None:
    """On flavor h100 (quota `gpu@h100`), `explain b-train --at @400` names the idle borrower `notebook`, which is
    reclaimed at t=660 for it, and the busy borrower not at all."""
    events = sim(IDLE_ON_FLAVOR).events
    assert [(e.at, e.job, e.reason) for e in events if isinstance(e, JobPreempted)] == [
        (660, "notebook", "IdleReclaim")
    ]
    path = write_jsonl(tmp_path / "log.jsonl", events)
    assert main(["explain", "b-train", "--log", str(path), "--at", "@400"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "idle reclaim: notebook (team-a, 8 GPUs) has been idle for 5m 40s; it may be reclaimed in 4m 20s, for a "
        "waiting job that comes before it and needs its room"
    ) in out
    assert "idle reclaim: busy" not in out


EQUAL_PRIORITY = """\
nodes: [{name: n0, capacity: {gpu: 8}}, {name: n1, capacity: {gpu: 8}}]
priority_classes: [{name: training, value: 100}]
queues: [{name: q, nominal: {gpu: 16}, preemption: {within_queue: LowerOrNewerEqualPriority}}]
timeline:
  - {at: 0, node_down: n1}
  - {at: 0, submit: {job: old, queue: q, priority_class: training, podsets: [{count: 2, requests: {gpu: 8}}],
     runtime: 1000}}
  - {at: 5, submit: {job: new, queue: q, priority_class: training, podsets: [{count: 1, requests: {gpu: 8}}],
     runtime: 1000}}
  - {at: 10, node_up: n1}
"""


async def test_an_eviction_of_an_equal_says_it_came_after_not_that_the_preemptor_ranks_above() -> None:
    """`old` evicts `new`, of the same priority, under LowerOrNewerEqualPriority: the story says why, and not
    that training (100) is above training (100)."""
    events = sim(EQUAL_PRIORITY).events
    assert [(e.at, e.job, e.preemptor) for e in events if isinstance(e, JobPreempted)] == [(10, "new", "old")]
    story, _ = await explain(memory_log(events), "new", END)
    (pre,) = (ln for ln in story.lines if ln.kind == "preempted")
    assert "above" not in pre.text
    assert "old, of the same priority (training (100)) in the same queue, comes before it" in pre.text


REGROUPED = (
    TWO_MODELS
    + """\
queues:
  - {name: q, resource_groups: [{covered: [gpu], flavors: [{name: h100, nominal: {gpu: 8}}]}]}
timeline:
  - {at: 0, submit: {job: a, queue: q, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 1000}}
  - {at: 0, submit: {job: b, queue: q, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 1000}}
  - {at: 100, queue_update: {name: q, resource_groups: [{covered: [gpu], flavors: [{name: h100, nominal: {gpu: 8}},
     {name: a100, nominal: {gpu: 8}}]}]}}
"""
)


async def test_a_flavored_queue_s_new_quota_and_the_flavor_a_job_runs_on_are_told() -> None:
    """`b` waits for h100 quota; the update that adds a100 is told per flavor (it said "nominal nothing"),
    and its admission names the flavor it runs on."""
    story, _ = await explain(memory_log(sim(REGROUPED).events), "b", END)
    (update,) = (ln for ln in story.lines if ln.kind == "queue")
    assert update.text == "queue q reconfigured: h100 nominal gpu=8; a100 nominal gpu=8"
    (admitted,) = (ln for ln in story.lines if ln.kind == "admitted")
    assert "on 1 node a0, on flavor a100;" in admitted.text


NESTED_COHORTS = """\
nodes:
  - generate: {count: 4, name: "n{i}", capacity: {gpu: 8}}
cohorts: [{name: org}, {name: lab, parent: org}]
queues:
  - {name: qa, cohort: org, nominal: {gpu: 16}}
  - {name: qb, cohort: lab, nominal: {gpu: 8}}
  - {name: qc, cohort: lab, nominal: {gpu: 8}}
timeline:
  - {at: 0, submit: {job: big, queue: qb, podsets: [{count: 3, requests: {gpu: 8}}], runtime: 100}}
"""


async def test_a_borrower_in_a_nested_cohort_is_told_it_borrows_from_the_tree_not_its_cohort_alone() -> None:
    """qb (in lab, under org) borrows 16 GPUs that qa (in org) and qc (in lab) leave unused: the story names the
    tree up to org, since qa is no queue of lab."""
    story, _ = await explain(memory_log(sim(NESTED_COHORTS).events), "big", END)
    (admitted,) = (ln for ln in story.lines if ln.kind == "admitted")
    assert "borrowing gpu=16 from cohort lab and its parents up to org (unused quota of qa (gpu=16 unused)" in (
        admitted.text
    )
