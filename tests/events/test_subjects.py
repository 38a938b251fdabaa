"""Subjects: any name becomes one safe token; each event has its own subjects, and is taken only from them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from muster.events.store import EventStore, StoreError, SubjectRule, subject_for, subject_problem, subject_token
from muster.events.types import (
    JobAdmitted,
    JobCancelled,
    JobFinished,
    JobHeld,
    JobReleased,
    JobSubmitted,
    LeaderElected,
    NodeCordoned,
    PodSet,
    QueueConfigured,
    SchedulerConfigured,
)

FORBIDDEN = set(".*> \t\r\n")


@given(st.text())
def test_any_name_becomes_one_safe_ascii_token(name: str) -> None:
    """The token is non-empty printable ASCII without `.`, `*`, `>` or whitespace, and the same every time."""
    token = subject_token(name)
    assert token
    assert token.isascii() and token.isprintable()
    assert not FORBIDDEN & set(token)
    assert token == subject_token(name)
    assert len(token) <= 128


@given(st.text(), st.text())
def test_distinct_names_get_distinct_tokens(a: str, b: str) -> None:
    """Two different names never share a token, so one subject never mixes two entities."""
    if a != b:
        assert subject_token(a) != subject_token(b)


def test_readable_names_pass_through_and_others_are_escaped() -> None:
    """Kubernetes-style names stay readable; dots, wildcards, spaces and non-ASCII are %-escaped."""
    assert subject_token("team-a/train_1") == "team-a/train_1"
    assert subject_token("a.b*c>d e") == "a%2Eb%2Ac%3Ed%20e"
    assert subject_token("é") == "%C3%A9"
    assert subject_token("") == "%"
    assert subject_token("x" * 300).startswith("x" * 100 + "~")


def test_subject_kind_comes_from_the_event_type() -> None:
    """Events are filed under their kind: jobs, nodes, the scheduler config and leader elections."""
    assert subject_for(JobFinished(at=1, job="j.1")) == "muster.job.j%2E1"
    assert subject_for(NodeCordoned(at=1, node="n1"), prefix="t1") == "t1.node.n1"
    assert subject_for(SchedulerConfigured(at=1)) == "muster.scheduler.config"
    assert subject_for(LeaderElected(at=1, epoch=2, holder="muster-0")) == "muster.leader.muster-0"


def _submission(job: str, queue: str) -> JobSubmitted:
    return JobSubmitted(at=1, job=job, queue=queue, podsets=[PodSet(name="w", count=1, requests={"gpu": 1})])


def test_a_submission_goes_to_its_queues_submit_subject() -> None:
    """A team's submission lands on submit.<queue>.<job>, which NATS permissions can grant per queue."""
    assert subject_for(_submission("train.1", "team-a")) == "muster.submit.team-a.train%2E1"
    assert subject_for(JobCancelled(at=1, job="train-1")) == "muster.job.train-1"


@given(st.text(min_size=1), st.text(min_size=1))
def test_every_event_is_taken_from_its_own_subject(job: str, queue: str) -> None:
    """What the store writes, the readers take: each event passes the subject check on its own subject."""
    events = [
        _submission(job, queue),
        JobFinished(at=1, job=job),
        NodeCordoned(at=1, node=job),
        QueueConfigured(at=1, name=queue),
        SchedulerConfigured(at=1),
        LeaderElected(at=1, epoch=2, holder=job),
        JobCancelled(at=1, job=job, queue=queue),
        JobHeld(at=1, job=job, queue=queue),
        JobReleased(at=1, job=job),
    ]
    for event in events:
        assert subject_problem(subject_for(event, "a.b").encode(), event) is None


def test_events_off_their_subjects_are_refused_with_a_reason() -> None:
    """Another queue's job on a team's subject, a decision on a submit subject, config on a job subject are bad."""
    job = _submission("j", "team-b")
    admitted = JobAdmitted(at=1, job="j", queue="team-a", placement={"w-0": "n"})
    problem = subject_problem(b"muster.submit.team-a.j", job)
    assert problem is not None and "'team-b'" in problem and "muster.submit.team-a.j" in problem
    assert subject_problem(b"muster.submit.team-b.other", job) is not None  # another job's subject
    assert "JobAdmitted" in (subject_problem(b"muster.submit.team-a.j", admitted) or "")
    assert subject_problem(b"muster.submit.job.j", admitted) is not None  # a queue named "job" is no way around
    assert subject_problem(b"muster.queue.team-a", admitted) is not None
    assert subject_problem(b"muster.job.j", QueueConfigured(at=1, name="q")) is not None
    assert subject_problem(b"garbage", admitted) is not None


_TOKENS = st.sampled_from(
    ["muster", "a", "job", "submit", "control", "queue", "node", "leader", "team-a", "team-b", "j", ""]
)


@given(
    st.lists(
        st.tuples(st.lists(_TOKENS, max_size=5).map(".".join), st.sampled_from(range(7))),
        max_size=30,
    )
)
def test_the_readers_remembered_rule_answers_as_subject_problem(reads: list[tuple[str, int]]) -> None:
    """SubjectRule, which remembers good subject slots, accepts and refuses exactly what subject_problem does."""
    events = [
        _submission("j", "team-a"),
        JobAdmitted(at=1, job="j", queue="team-a", placement={"w-0": "n"}),
        QueueConfigured(at=1, name="team-a"),
        LeaderElected(at=1, epoch=1, holder="a"),
        NodeCordoned(at=1, node="job"),
        JobCancelled(at=1, job="j", queue="team-a"),
        JobCancelled(at=1, job="j"),
    ]
    rule = SubjectRule()
    for subject, which in reads * 2:  # the second pass answers from what the first remembered
        event = events[which]
        assert rule.problem(subject.encode(), event) == subject_problem(subject.encode(), event)


def test_submissions_of_old_logs_stay_readable_on_job_subjects() -> None:
    """Logs written before submissions had their own subjects (job.<job>, the daemon's) still replay."""
    assert subject_problem(b"muster.job.j", _submission("j", "team-b")) is None


@pytest.mark.parametrize("last", ["submit", "control", "job"])
def test_a_prefix_ending_in_a_queue_scoped_kind_is_refused(last: str) -> None:
    """The kind is counted from the right, so a prefix ending in `submit`, `control` or `job` would be ambiguous."""
    import anyio

    async def connect() -> None:
        await EventStore.connect("nats://127.0.0.1:1", prefix=f"org.{last}", connect_attempts=1)

    with pytest.raises(StoreError, match="prefix"):
        anyio.run(connect)


def test_a_users_job_control_goes_to_its_queues_control_subject() -> None:
    """`muster cancel|hold|release` events name the job's queue and land on control.<queue>.<job>."""
    assert subject_for(JobCancelled(at=1, job="train.1", queue="team-a")) == "muster.control.team-a.train%2E1"
    assert subject_for(JobHeld(at=1, job="j", queue="team-a"), prefix="t1") == "t1.control.team-a.j"
    assert subject_for(JobReleased(at=1, job="j", queue="team-b")) == "muster.control.team-b.j"


def test_a_users_job_control_counts_only_on_its_own_queues_and_jobs_control_subject() -> None:
    """A control event naming team-b on team-a's subject, another job's subject or a job.* subject is bad."""
    cancel = JobCancelled(at=1, job="j", queue="team-b")
    problem = subject_problem(b"muster.control.team-a.j", cancel)
    assert problem is not None and "'team-b'" in problem and "muster.control.team-a.j" in problem
    assert subject_problem(b"muster.control.team-b.other", cancel) is not None
    assert subject_problem(b"muster.job.j", cancel) is not None
    assert subject_problem(b"muster.job.team-b.j", cancel) is not None
    assert subject_problem(b"muster.control.team-b.j", cancel) is None
    # the control subjects carry a user's control events and nothing else
    assert subject_problem(b"muster.control.team-a.j", JobCancelled(at=1, job="j")) is not None
    admitted = JobAdmitted(at=1, job="j", queue="team-a", placement={"w-0": "n"})
    assert "JobAdmitted" in (subject_problem(b"muster.control.team-a.j", admitted) or "")
    assert subject_problem(b"muster.control.team-a.j", _submission("j", "team-a")) is not None


def test_the_daemons_job_events_may_name_the_queue_in_their_subject() -> None:
    """A job event goes on job.<queue>.<job> when the writer gives its queue, on job.<job> otherwise; both count."""
    finished = JobFinished(at=1, job="train.1")
    assert subject_for(finished, queue="team-a") == "muster.job.team-a.train%2E1"
    assert subject_for(JobCancelled(at=1, job="j"), queue="team-a") == "muster.job.team-a.j"
    assert subject_problem(b"muster.job.team-a.train%2E1", finished) is None
    assert subject_problem(b"muster.job.train%2E1", finished) is None
    assert subject_problem(b"muster.job.team-a.q", QueueConfigured(at=1, name="q")) is not None
