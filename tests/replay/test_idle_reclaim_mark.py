"""A job reclaimed for idleness evicts no one while it borrows: a mark of the log (replay, snapshot, audit, explain).

RECLAIMED: 32 GPUs, four queues of 8 in one cohort; qa's `lent` borrows, sits idle and is reclaimed at
t=1900 for qb's `w`; requeued, it may not evict qc's busy borrowing scavenger `s2`, and runs when `s2`
ends at t=5000.
"""

from __future__ import annotations

import pytest
from replaykit import memory_log, sim

from muster.events.types import JobPreempted
from muster.replay.audit import audit
from muster.replay.explain import explain
from muster.replay.points import Point
from muster.replay.rebuild import state_at
from muster.replay.snapshotcodec import FORMATS, decode_state, encode_state

RECLAIMED = """\
nodes: [{name: n0, capacity: {gpu: 8}}, {name: n1, capacity: {gpu: 8}},
        {name: n2, capacity: {gpu: 8}}, {name: n3, capacity: {gpu: 8}}]
priority_classes: [{name: training, value: 100}, {name: scavenger, value: 0}]
cohorts: [{name: org}]
queues:
  - {name: qa, cohort: org, nominal: {gpu: 8},
     preemption: {reclaim_within_cohort: Any, borrow_within_cohort: {policy: LowerPriority}}}
  - {name: qb, cohort: org, nominal: {gpu: 8}}
  - {name: qc, cohort: org, nominal: {gpu: 8}}
  - {name: qd, cohort: org, nominal: {gpu: 8}}
idle_reclaim: {threshold: 0.05, after: 1800}
timeline:
  - {at: 0, submit: {job: own, queue: qa, priority_class: training, podsets: [{count: 1, requests: {gpu: 8}}],
     runtime: 100000}}
  - {at: 0, submit: {job: lent, queue: qa, priority_class: training, podsets: [{count: 1, requests: {gpu: 8}}],
     runtime: 100000}}
  - {at: 0, submit: {job: s1, queue: qc, priority_class: scavenger, podsets: [{count: 1, requests: {gpu: 8}}],
     runtime: 100000}}
  - {at: 0, submit: {job: s2, queue: qc, priority_class: scavenger, podsets: [{count: 1, requests: {gpu: 8}}],
     runtime: 5000}}
  - {at: 100, utilization: {job: lent, gpu: 0.0}}
  - {at: 200, submit: {job: w, queue: qb, priority_class: training, podsets: [{count: 1, requests: {gpu: 8}}],
     runtime: 100000}}
until: 20000
"""


@pytest.mark.parametrize("fmt", FORMATS)
async def test_the_mark_is_rebuilt_by_replay_and_kept_by_a_snapshot(fmt: str) -> None:
    """Replayed to t=3000, `lent` is marked reclaimed at 1900, and a snapshot of that state keeps the mark."""
    log = memory_log(sim(RECLAIMED).events)
    replayed = (await state_at(log, Point(time=3000))).state
    assert replayed.jobs["lent"].status == "pending"
    assert replayed.jobs["lent"].idle_reclaimed_at == 1900
    restored = decode_state(encode_state(replayed, fmt), fmt)
    assert restored.jobs["lent"].idle_reclaimed_at == 1900
    assert (await state_at(log, Point(time=6000))).state.jobs["lent"].idle_reclaimed_at is None


async def test_audit_re_derives_the_wait_of_a_reclaimed_borrower() -> None:
    """Every decision of the log is re-derived identically, and the reclaimed job evicted no one."""
    events = sim(RECLAIMED).events
    preempted = [(e.at, e.job, e.preemptor, e.reason) for e in events if isinstance(e, JobPreempted)]
    assert preempted == [(1900, "lent", None, "IdleReclaim")]
    report = await audit(memory_log(events))
    assert report.differ == 0 and report.unrecorded == []
    assert report.cycles == report.cycles_identical > 0


async def test_explain_says_the_reclaimed_borrower_evicts_no_one() -> None:
    """`explain` of the waiting reclaimed job says it was reclaimed for idleness and evicts no one while it borrows."""
    story, _ = await explain(memory_log(sim(RECLAIMED).events), "lent", Point(time=3000))
    assert story.pending is not None
    changes = story.pending["what_would_have_to_change"]
    assert any("reclaimed for idleness at 1900" in c and "evicts no one while it borrows" in c for c in changes)


# RECLAIMED with every queue's quota on one flavor, h100: the reclaimed job borrows `gpu@h100`.
RECLAIMED_ON_FLAVOR = RECLAIMED.replace(
    "nodes: [{name: n0, capacity: {gpu: 8}}, {name: n1, capacity: {gpu: 8}},\n"
    "        {name: n2, capacity: {gpu: 8}}, {name: n3, capacity: {gpu: 8}}]",
    "nodes: [{generate: {count: 4, name: 'n{i}', labels: {model: H100}, capacity: {gpu: 8}}}]\n"
    "flavors: [{name: h100, node_labels: {model: H100}}]",
).replace("nominal: {gpu: 8}", "resource_groups: [{covered: [gpu], flavors: [{name: h100, nominal: {gpu: 8}}]}]")


async def test_explain_says_a_reclaimed_borrower_on_a_flavor_evicts_no_one() -> None:
    """On a flavor too, `explain` says the reclaimed job evicts no one while it borrows (its quota is `gpu@h100`)."""
    events = sim(RECLAIMED_ON_FLAVOR).events
    preempted = [(e.at, e.job, e.reason) for e in events if isinstance(e, JobPreempted)]
    assert preempted == [(1900, "lent", "IdleReclaim")]
    story, _ = await explain(memory_log(events), "lent", Point(time=3000))
    assert story.pending is not None
    changes = story.pending["what_would_have_to_change"]
    assert any("reclaimed for idleness at 1900" in c and "evicts no one while it borrows" in c for c in changes)
    assert not any(c.startswith("preemption cannot help") for c in changes)
