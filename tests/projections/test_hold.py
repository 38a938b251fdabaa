"""Held jobs (`JobHeld`/`JobReleased`): the scheduler skips a held job and tries it again once released.

The rule lives in the scheduler's index (a held job is never one to try), so
the daemon, `muster audit` and a replay of the log reach the same decisions.
"""

from __future__ import annotations

import anyio
from logkit import Log, job

from muster.events.types import Event, JobAdmitted, JobCancelled, JobHeld, JobReleased
from muster.replay.audit import audit
from muster.replay.source import MemoryLog


def _admitted(events: list[Event]) -> list[str]:
    return [e.job for e in events if isinstance(e, JobAdmitted)]


def test_a_held_job_waits_and_the_next_one_takes_the_room() -> None:
    """A held job is not admitted though it is first in its queue; the job behind it runs instead."""
    log = Log()
    log.add(job("first", 8, 1), JobHeld(at=1, job="first"), job("second", 8, 2))
    assert _admitted(log.cycle(2)) == ["second"]
    assert log.state.jobs["first"].status == "pending" and log.state.jobs["first"].held


def test_a_released_job_is_admitted_in_its_place() -> None:
    """Released, a held job is tried again and admitted when there is room."""
    log = Log()
    log.add(job("j", 4, 1), JobHeld(at=1, job="j"))
    assert _admitted(log.cycle(1)) == []
    log.add(JobReleased(at=5, job="j"))
    assert _admitted(log.cycle(5)) == ["j"]


def test_a_job_parked_as_inadmissible_stays_out_while_held() -> None:
    """A job parked for want of room, then held, is not woken by a release of room until it is released."""
    log = Log()
    log.add(job("big", 8, 1))
    assert _admitted(log.cycle(1)) == ["big"]
    log.add(job("waits", 8, 2))
    assert _admitted(log.cycle(2)) == []
    log.add(JobHeld(at=3, job="waits"), JobCancelled(at=4, job="big"))
    assert _admitted(log.cycle(4)) == []
    log.add(JobReleased(at=6, job="waits"))
    assert _admitted(log.cycle(6)) == ["waits"]


def test_hold_applies_to_pending_jobs_only() -> None:
    """Holding a running or unknown job, or releasing a job not held, changes nothing and is counted as skipped."""
    log = Log()
    log.add(job("runs", 8, 1))
    log.cycle(1)
    skipped = log.state.skipped
    log.add(JobHeld(at=2, job="runs"), JobHeld(at=2, job="nobody"), JobReleased(at=2, job="runs"))
    assert log.state.skipped == skipped + 3 and not log.state.jobs["runs"].held


def test_a_log_with_holds_audits_identically() -> None:
    """`muster audit` re-derives every decision of a log with holds and releases: 0 differences."""
    log = Log()
    log.add(job("a", 8, 1), JobHeld(at=1, job="a"), job("b", 4, 1))
    log.cycle(1)
    log.add(job("c", 4, 2))
    log.cycle(2)
    log.add(JobReleased(at=3, job="a"), JobCancelled(at=3, job="b"), JobCancelled(at=3, job="c"))
    log.cycle(3)
    assert _admitted(log.events) == ["b", "c", "a"]
    report = anyio.run(lambda: audit(MemoryLog.from_events(log.events)))
    assert report.ok and report.identical >= 3, report.headline()
