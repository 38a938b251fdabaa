"""`muster audit`: every recorded cycle is re-derived by `decide`; honest logs match, tampered ones do not.

Honest logs come from `muster sim` over scenarios that exercise preemption,
cohorts with limits, topology, idle reclaim, fair sharing and node events;
tampering changes a placement, a victim, or deletes a decision. Fenced
decisions of a deposed leader and cycle-0 rejections are not differences.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import msgspec
import pytest
from replaykit import IDLE, STORY, memory_log, mixed, sim, write_jsonl

from muster.cli import main
from muster.events.store import EventStore
from muster.events.types import (
    DECISION_TYPES,
    CycleSettled,
    Event,
    JobAdmitted,
    JobPreempted,
    LeaderElected,
    NodeAdded,
    NodeUpdated,
    ReservationMade,
    ReservationReleased,
)
from muster.replay.audit import audit
from muster.replay.points import Point
from muster.replay.source import NatsLog

INVALID_JOBS = """\
nodes:
  - {name: n0, capacity: {gpu: 8}}
queues:
  - {name: q, nominal: {gpu: 8}}
timeline:
  - {at: 0, submit: {job: half, queue: q, podsets: [{count: 1, requests: {gpu: 0.5}}], runtime: 10}}
  - {at: 0, submit: {job: lost, queue: nowhere, podsets: [{count: 1, requests: {gpu: 1}}], runtime: 10}}
  - {at: 5, submit: {job: ok, queue: q, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 10}}
"""

RESERVING = mixed(11, jobs=60).replace("  - {name: q", "  - {reserve_after: 200, name: q")
"""Every queue reserves room for its head (at once within nominal quota, else after 200 s)."""

FINDINGS = Path(__file__).parent / "findings"
HOLDER_BEHIND_CLASS_MATE = (FINDINGS / "reservation_holder_behind_class_mate.yaml").read_text()
"""A holder tried on its own verdict behind a class-mate that a node failure made pending after it."""

HONEST = [
    pytest.param(STORY, {"ReclaimWithinCohort"}, id="reclaim-preempted-then-finished"),
    pytest.param(mixed(1), {"WithinQueue", "ReclaimWithinCohort", "NodeFailure"}, id="cohorts-limits-nodes"),
    pytest.param(mixed(2), {"WithinQueue", "BorrowWithinCohort"}, id="topology-required-preferred"),
    pytest.param(mixed(1, fair=True), {"FairSharing"}, id="fair-sharing"),
    pytest.param(IDLE, {"IdleReclaim"}, id="idle-reclaim"),
    pytest.param(IDLE + "fair_sharing: true\n", {"IdleReclaim"}, id="idle-reclaim-under-fair-sharing"),
    pytest.param(mixed(0, fair=True, idle=True), {"FairSharing"}, id="fair-sharing-idle-samples"),
    pytest.param(mixed(9, jobs=60), {"WithinQueue"}, id="sixty-jobs"),
    pytest.param(INVALID_JOBS, set(), id="rejections"),
    pytest.param(RESERVING, set(), id="reservations"),
    pytest.param(RESERVING.replace("runtime: ", "max_runtime: 700, runtime: "), set(), id="reservations-backfill"),
    pytest.param(HOLDER_BEHIND_CLASS_MATE, {"NodeFailure"}, id="reservation-holder-behind-a-class-mate"),
]


@pytest.mark.parametrize(("text", "reasons"), HONEST)
async def test_an_honest_log_re_derives_identically(text: str, reasons: set[str]) -> None:
    """Every decision of an honest sim log is re-derived byte for byte (and the scenario has what it claims)."""
    events = sim(text).events
    seen = {e.reason for e in events if isinstance(e, JobPreempted)}
    assert reasons <= seen, f"scenario lost its point: preemption reasons {seen}"
    report = await audit(memory_log(events))
    assert report.differ == 0, [(b.first_seq, b.recorded, b.derived) for b in report.differences[:2]]
    assert report.unrecorded == []
    decisions = sum(1 for e in events if isinstance(e, (JobAdmitted, JobPreempted)))
    assert report.identical >= decisions > 0
    assert report.cycles == report.cycles_identical > 0


def test_the_reservation_scenario_makes_and_releases_reservations() -> None:
    """The `reservations` case above has its point: reservations made, and one released (a reserved node left)."""
    events = sim(RESERVING).events
    assert sum(isinstance(e, ReservationMade) for e in events) >= 2
    assert any(isinstance(e, ReservationReleased) and e.reason == "replaced" for e in events)


async def test_rejections_of_input_translation_are_inputs_not_audited() -> None:
    """A cycle-0 JobRejected (a quantity the input cannot express) is an input; the core's own ones are checked."""
    events = sim(INVALID_JOBS).events
    rejected = {e.job: e.cycle for e in events if type(e).__name__ == "JobRejected"}
    assert rejected["half"] == 0 and rejected["lost"] > 0
    report = await audit(memory_log(events))
    assert report.inputs == 1 and report.differ == 0


async def test_an_honest_log_on_the_embedded_nats(store: EventStore) -> None:
    """The audit reads the log from JetStream as well."""
    await store.append(sim(mixed(1)).events)
    report = await audit(NatsLog(store))
    assert report.differ == 0 and report.identical > 50


def _tamper(events: list[Event], index: int, **changes: object) -> list[Event]:
    out = list(events)
    out[index] = msgspec.structs.replace(out[index], **changes)
    return out


async def test_a_changed_placement_node_is_found() -> None:
    """Moving one pod of an admission to another node is reported at that sequence, recorded vs re-derived."""
    events = sim(STORY).events
    i = next(i for i, e in enumerate(events) if isinstance(e, JobAdmitted) and e.job == "a-1")
    placement = dict(events[i].placement)
    placement["worker-1"] = "b0-r1-n1"
    report = await audit(memory_log(_tamper(events, i, placement=placement)))
    assert report.differ >= 1
    first = report.differences[0]
    assert first.seqs[0] == i + 1
    assert first.recorded[0].placement["worker-1"] == "b0-r1-n1"
    assert first.derived[0].placement["worker-1"] == "b0-r0-n1"


async def test_a_changed_victim_is_found() -> None:
    """Naming another running job as the victim of a preemption is a difference."""
    events = sim(mixed(1)).events
    i = next(i for i, e in enumerate(events) if isinstance(e, JobPreempted) and e.preemptor is not None)
    victim = events[i].job
    from muster.projections.cluster import fold

    state = fold(events[:i])
    other = next(j.id for j in state.jobs.values() if j.status == "admitted" and j.id != victim)
    report = await audit(memory_log(_tamper(events, i, job=other)))
    assert report.differ >= 1
    b = report.differences[0]
    assert i + 1 in b.seqs
    assert victim in {getattr(e, "job", None) for e in b.derived}


async def test_a_deleted_admission_is_found() -> None:
    """A cycle whose admission was removed from the log no longer matches what the code decides."""
    events = sim(STORY).events
    i = next(i for i, e in enumerate(events) if isinstance(e, JobAdmitted) and e.job == "b-small")
    report = await audit(memory_log(events[:i] + events[i + 1 :]))
    assert report.differ >= 1 or report.unrecorded


def _with_epochs(events: list[Event], split: int, stale: int) -> list[Event]:
    """Leader 1 from the start, leader 2 from `split`; a copy of the decision at `stale` arrives late with epoch 1."""
    out: list[Event] = []
    epoch = 1
    for i, e in enumerate(events):
        if i == 0:
            out.append(e)
            out.append(LeaderElected(at=e.at, epoch=1, holder="muster-0"))
            continue
        if i == split:
            epoch = 2
            out.append(LeaderElected(at=e.at, epoch=2, holder="muster-1"))
            late = msgspec.structs.replace(events[stale], cycle=10_000, epoch=1, at=e.at)
            out.append(late)
        if isinstance(e, DECISION_TYPES):
            e = msgspec.structs.replace(e, epoch=epoch)
        out.append(e)
    return out


async def test_fenced_decisions_of_a_deposed_leader_are_reported_as_fenced() -> None:
    """A stale-epoch decision after a newer LeaderElected is ignored by the fold: counted as fenced, not differing."""
    events = sim(STORY).events
    split = next(i for i, e in enumerate(events) if e.at == 150)
    stale = next(i for i, e in enumerate(events) if isinstance(e, JobAdmitted))
    log = _with_epochs(events, split, stale)
    report = await audit(memory_log(log))
    assert report.differ == 0
    assert report.fenced == 1
    assert report.fenced_seqs == [split + 3]


async def test_a_window_audits_only_the_cycles_that_start_in_it() -> None:
    """--from/--to: the counts are those of the window; a tampered decision outside it is not looked at."""
    events = sim(mixed(1)).events
    whole = await audit(memory_log(events))
    mid = len(events) // 2
    i = next(i for i, e in enumerate(events) if isinstance(e, JobAdmitted))
    tampered = _tamper(events, i, placement={k: "b1-r1-n1" for k in events[i].placement})
    part = await audit(memory_log(tampered), start=Point(seq=mid), end=Point(seq=len(events)))
    assert part.differ == 0
    assert 0 < part.identical < whole.identical
    # a cycle that straddles the split is audited whole by the half it starts in, and skipped by the other
    first_half = await audit(memory_log(events), end=Point(seq=mid - 1))
    # a window's memo starts empty: the CycleSettled records of the writer's memo are only checked to decide
    # nothing else there (from the log's start, each is re-derived)
    assert whole.settled_unchecked == 0 and part.settled_unchecked > 0
    assert first_half.identical + part.identical + part.settled_unchecked == whole.identical


def test_audit_cli_reports_and_exits_non_zero_on_a_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI prints "N decisions re-derived identically, M differ", the sequence, recorded and re-derived; exit 1."""
    events = sim(STORY).events
    good = write_jsonl(tmp_path / "good.jsonl", events)
    assert main(["audit", "--log", str(good)]) == 0
    assert "7 decisions re-derived identically, 0 differ" in capsys.readouterr().out  # one a CycleSettled
    i = next(i for i, e in enumerate(events) if isinstance(e, JobAdmitted) and e.job == "a-1")
    placement = dict(events[i].placement)
    placement["worker-1"] = "b0-r1-n1"
    bad = write_jsonl(tmp_path / "bad.jsonl", _tamper(events, i, placement=placement))
    assert main(["audit", "--log", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "differ" in out and f"seq {i + 1}" in out
    assert "recorded:" in out and "re-derived:" in out and "worker-1->b0-r1-n1" in out
    assert main(["audit", "--log", str(bad), "--output", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["differ"] >= 1 and doc["differences"][0]["recorded"][0]["seq"] == i + 1
    counts = Counter(d["derived"][0]["type"] for d in doc["differences"] if d["derived"])
    assert counts["JobAdmitted"] >= 1


async def test_facts_between_a_cycle_and_the_next_one_at_that_instant_are_no_settling_difference() -> None:
    """A daemon folds same-instant facts before its next cycle: the audit does too, and reports no settling cycle."""
    events = sim(STORY).events
    i = next(k for k, e in enumerate(events) if isinstance(e, JobPreempted))
    while isinstance(events[i + 1], JobPreempted):
        i += 1
    node = next(e for e in events if isinstance(e, NodeAdded))
    # the kubelet reporting a node again (as when an evicted pod is gone), at the preemption's instant
    fact = NodeUpdated(at=events[i].at, node=node.node, labels=node.labels, capacity=node.capacity)
    assert isinstance(events[i + 1], JobAdmitted) and events[i + 1].at == fact.at  # the preemptor's cycle
    report = await audit(memory_log([*events[: i + 1], fact, *events[i + 1 :]]))
    assert report.differ == 0 and report.unrecorded == []


async def test_a_daemon_cycle_one_second_after_the_cycle_before_is_that_cycle() -> None:
    """The daemon's clock may tick between a preemption and the preemptor's cycle: no settling cycle is reported."""
    events = sim(STORY).events
    i = next(k for k, e in enumerate(events) if isinstance(e, JobPreempted))
    while isinstance(events[i + 1], JobPreempted):
        i += 1
    j = i + 1
    while j < len(events) and getattr(events[j], "cycle", None) == getattr(events[i + 1], "cycle", None):
        j += 1
    if isinstance(events[j], CycleSettled):
        j += 1  # and the record of the instant's last cycle, which judged again a job set aside in that one
    later = [msgspec.structs.replace(e, at=e.at + 1) for e in events[i + 1 : j]]
    report = await audit(memory_log([*events[: i + 1], *later]))
    assert report.differ == 0 and report.unrecorded == []
