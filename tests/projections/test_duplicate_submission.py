"""A second submission of a job id the log holds is refused by the core (`SubmissionRejected`), never silently.

The job that holds the id is left as it is (still running, still in its queue's
quota); the refusal names it, and an audit re-derives the refusal.
"""

from __future__ import annotations

import anyio
from logkit import Log, job

from muster.events.types import JobAdmitted, JobFinished, SubmissionRejected
from muster.replay.audit import audit
from muster.replay.source import MemoryLog


def test_a_second_submission_of_a_running_job_is_rejected_naming_it() -> None:
    """Two adapters submit `train` twice: the second gets a SubmissionRejected naming the running job."""
    log = Log()
    log.add(job("train", 8, 1))
    assert [type(e) for e in log.cycle(1)] == [JobAdmitted]
    log.add(job("train", 2, 5, queue="other"))
    (refusal,) = log.cycle(5)
    assert isinstance(refusal, SubmissionRejected)
    assert (refusal.job, refusal.queue) == ("train", "other")
    assert "job id 'train' is taken by the job on the log (queue q, admitted)" in refusal.reason
    running = log.state.jobs["train"]
    assert running.status == "admitted" and log.state.queues["q"].usage["gpu"] == 8
    assert log.state.refused == [] and log.cycle(6) == []


def test_each_duplicate_is_answered_once_in_log_order() -> None:
    """Three submissions of one id that has ended: two refusals, in order, and nothing more once folded."""
    log = Log()
    log.add(job("eval", 8, 1))
    log.cycle(1)
    log.add(JobFinished(at=2, job="eval"), job("eval", 1, 3, queue="a"), job("eval", 1, 3, queue="b"))
    refusals = log.cycle(3)
    assert [(e.queue, "(queue q, finished)" in e.reason) for e in refusals] == [("a", True), ("b", True)]
    assert log.cycle(4) == []


def test_refusals_audit_identically() -> None:
    """`muster audit` re-derives the core's refusals from the log: 0 differences."""
    log = Log()
    log.add(job("x", 4, 1))
    log.cycle(1)
    log.add(job("x", 4, 2))
    log.cycle(2)
    report = anyio.run(lambda: audit(MemoryLog.from_events(log.events)))
    assert report.ok and report.identical == 2, report.headline()
