"""Replay decodes every event version ever written: a log with JobSubmitted v1 (flat pods/gpus) replays and audits.

v1 submissions are written as an old muster wrote them (with `"v": 1`, or
with no `v` at all, which means version 1), mixed with current events.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from replaykit import memory_log, sim, write_jsonl

from muster.cli import main
from muster.events.codec import encode
from muster.events.store import EventStore, subject_for, subject_token
from muster.events.types import Event, JobSubmitted
from muster.projections.cluster import fold
from muster.replay.audit import audit
from muster.replay.points import END
from muster.replay.rebuild import state_at
from muster.replay.source import MemoryLog, NatsLog

OLD_SHAPES = """\
nodes:
  - generate:
      count: 4
      name: "n{i}"
      capacity: {gpu: 8}
priority_classes:
  - {name: high, value: 500}
  - {name: low, value: 10}
queues:
  - {name: q, nominal: {gpu: 32}, preemption: {within_queue: LowerPriority}}
timeline:
  - {at: 0, submit: {job: big, queue: q, priority_class: low, podsets: [{count: 3, requests: {gpu: 8}}],
     runtime: 500, checkpoint_every: 100}}
  - {at: 0, submit: {job: small, queue: q, priority_class: low, podsets: [{count: 1, requests: {gpu: 4}}],
     runtime: 300}}
  - {at: 50, submit: {job: urgent, queue: q, priority_class: high, podsets: [{count: 2, requests: {gpu: 8}}],
     runtime: 100}}
"""


def _v1(ev: JobSubmitted, with_v: bool) -> bytes:
    """The v1 form: one podset flattened to `pods` x `gpus` per pod."""
    (ps,) = ev.podsets
    old = {
        "type": "JobSubmitted",
        "at": ev.at,
        "job": ev.job,
        "queue": ev.queue,
        "priority_class": ev.priority_class,
        "pods": ps.count,
        "gpus": ps.requests["gpu"],
        "runtime": ev.runtime,
        "checkpoint_every": ev.checkpoint_every,
    }
    if with_v:
        old["v"] = 1
    return json.dumps(old).encode()


def _old_log(events: list[Event]) -> list[bytes]:
    raws = []
    n = 0
    for e in events:
        if isinstance(e, JobSubmitted):
            raws.append(_v1(e, with_v=n % 2 == 0))
            n += 1
        else:
            raws.append(encode(e))
    return raws


async def test_a_log_with_v1_submissions_replays_to_the_same_state() -> None:
    """v1 submissions are upcast: the state, and every decision's re-derivation, are those of the current log."""
    events = sim(OLD_SHAPES).events
    raws = _old_log(events)
    assert sum(b'"pods": ' in r for r in raws) == 3
    log = MemoryLog(raws)
    replayed = await state_at(log, END)
    assert replayed.state == fold(events)
    assert replayed.state.jobs["big"].podsets[0].count == 3
    report = await audit(log)
    assert report.differ == 0 and report.identical > 0
    assert report.identical == (await audit(memory_log(events))).identical


async def test_v1_submissions_replay_from_the_stream(store: EventStore) -> None:
    """Old bytes stored on JetStream (as an old muster published them) replay too."""
    events = sim(OLD_SHAPES).events
    for event, raw in zip(events, _old_log(events), strict=True):
        # an old muster wrote submissions under job.<job> too (they have submit.<queue>.<job> now)
        subject = subject_for(event, store.prefix)
        if isinstance(event, JobSubmitted):
            subject = f"{store.prefix}.job.{subject_token(event.job)}"
        await store.js.publish(subject, raw)
    replayed = await state_at(NatsLog(store), END)
    assert replayed.seq == len(events)
    assert replayed.state == fold(events)


def test_explain_tells_the_story_of_a_v1_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`muster explain` reads an old submission like a new one."""
    path = tmp_path / "old.jsonl"
    path.write_bytes(b"".join(r + b"\n" for r in _old_log(sim(OLD_SHAPES).events)))
    assert main(["explain", "big", "--log", str(path), "--output", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    kinds = [s["kind"] for s in doc["story"]]
    assert kinds[0] == "submitted" and "24 GPUs (3x8)" in doc["story"][0]["text"]
    assert "preempted" in kinds and kinds[-1] == "finished"
    write_jsonl(tmp_path / "new.jsonl", sim(OLD_SHAPES).events)
    assert main(["explain", "big", "--log", str(tmp_path / "new.jsonl"), "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["story"] == doc["story"]
