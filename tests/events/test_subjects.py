"""Subject tokens: any job, node or queue name becomes one safe, deterministic, distinct NATS subject token."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from muster.events.store import subject_for, subject_token
from muster.events.types import JobFinished, LeaderElected, NodeCordoned, SchedulerConfigured

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
