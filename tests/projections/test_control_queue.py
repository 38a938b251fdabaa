"""A user's job control counts only for its own queue's jobs; older logs' control events fold as they always did.

`muster cancel|hold|release` events name the job's queue (and go on that queue's
control subject, which the queue's identity may publish to). NATS permissions stop
a team publishing on another queue's subjects; the fold stops the rest: a control
event from team-a's subjects naming team-b's job is ignored, and `explain` says so.
"""

from __future__ import annotations

import json

import anyio
import msgspec
from logkit import Log, job

from muster.events.codec import decode, encode
from muster.events.types import Event, JobCancelled, JobHeld, JobReleased, QueueConfigured
from muster.projections.cluster import fold
from muster.replay.explain import explain
from muster.replay.points import Point
from muster.replay.source import MemoryLog


def _two_queues() -> Log:
    log = Log()
    log.add(QueueConfigured(at=0, name="team-b", nominal={"gpu": 8}))
    log.add(job("a-1", 8, 1, queue="q"), job("b-1", 4, 1, queue="team-b"), job("b-2", 4, 1, queue="team-b"))
    return log


def test_a_queues_control_events_act_on_its_own_jobs() -> None:
    """Cancel, hold and release naming the job's own queue do what they say."""
    log = _two_queues()
    log.add(JobHeld(at=2, job="b-1", queue="team-b"), JobCancelled(at=2, job="a-1", queue="q"))
    assert log.state.jobs["b-1"].held and log.state.jobs["a-1"].status == "cancelled"
    log.add(JobReleased(at=3, job="b-1", queue="team-b"))
    assert not log.state.jobs["b-1"].held


def test_control_events_naming_another_queue_are_ignored_and_counted() -> None:
    """Team q's cancel, hold and release of team-b's jobs change nothing; each is counted as skipped."""
    log = _two_queues()
    log.add(JobHeld(at=2, job="b-2", queue="team-b"))
    skipped = log.state.skipped
    log.add(
        JobCancelled(at=3, job="b-1", queue="q"),
        JobHeld(at=3, job="b-1", queue="q"),
        JobReleased(at=3, job="b-2", queue="q"),
    )
    assert log.state.skipped == skipped + 3
    assert log.state.jobs["b-1"].status == "pending" and not log.state.jobs["b-1"].held
    assert log.state.jobs["b-2"].held


def test_explain_shows_a_foreign_control_event_as_ignored_with_why() -> None:
    """The refused cancel is a line of the job's story, naming both queues, and the job goes on."""
    log = _two_queues()
    log.add(JobCancelled(at=3, job="b-1", queue="q", reason="Cancelled: oops"))
    story, _ = anyio.run(explain, MemoryLog.from_events(log.events), "b-1", Point())
    [line] = [ln for ln in story.lines if ln.kind == "ignored"]
    assert "queue q" in line.text and "queue team-b" in line.text
    assert story.status == "pending"


def _old_bytes(event: Event) -> bytes:
    """A control event as muster wrote it before control events named their queue (no `queue` field)."""
    doc = json.loads(encode(event))
    assert doc.pop("queue") is None
    return json.dumps(doc, separators=(",", ":")).encode()


def test_old_logs_control_events_decode_and_fold_as_before() -> None:
    """Control events without a queue (the daemon's, and every one of older logs) decode and fold unchanged."""
    log = _two_queues()
    old = [
        JobHeld(at=2, job="b-1", reason="wait"),
        JobReleased(at=3, job="b-1"),
        JobCancelled(at=4, job="a-1", reason="WorkloadDeleted: gone"),
        JobHeld(at=4, job="b-2"),
    ]
    raws = [_old_bytes(e) for e in old]
    assert b"queue" not in b"".join(raws)
    decoded = [decode(r) for r in raws]
    assert decoded == old
    state = fold([*log.events, *decoded])
    assert state.jobs["a-1"].status == "cancelled" and state.jobs["a-1"].reason == "WorkloadDeleted: gone"
    assert not state.jobs["b-1"].held and state.jobs["b-2"].held
    assert msgspec.json.encode(state) == msgspec.json.encode(fold([*log.events, *old]))
