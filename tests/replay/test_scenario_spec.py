"""Statements of the scenario contract (docs/spec/scenario.md) found untested by walking it line by line.

Each test names the sentence it checks; the scenarios are as small as the sentence allows.
"""

from __future__ import annotations

from replaykit import sim

from muster.events.types import JobAdmitted, JobInadmissible, JobPreempted

# "priority_class: training   # default: the lowest class": the lowest class here is not preemptible
ONLY_SERVING = """\
nodes:
  - {name: n0, capacity: {gpu: 8}}
  - {name: n1, capacity: {gpu: 8}}
priority_classes:
  - {name: serving, value: 1000, preemptible: false}
cohorts: [{name: org}]
queues:
  - {name: qa, cohort: org, nominal: {gpu: 8}}
  - {name: qb, cohort: org, nominal: {gpu: 8}, preemption: {reclaim_within_cohort: Any}}
timeline:
  - {at: 0, submit: {job: classless-1, queue: qa, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 1000}}
  - {at: 0, submit: {job: classless-2, queue: qa, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 1000}}
  - {at: 10, submit: {job: b, queue: qb, priority_class: serving, podsets: [{count: 1, requests: {gpu: 8}}],
     runtime: 100}}
"""


def test_a_job_without_a_class_is_of_the_lowest_class_and_so_not_preemptible_when_it_is_not() -> None:
    """With one class, non-preemptible, a classless job is of it: it never borrows, so qb's job runs unevicting."""
    events = sim(ONLY_SERVING).events
    admitted = [(e.at, e.job, e.borrowed) for e in events if isinstance(e, JobAdmitted)]
    assert admitted[:2] == [(0, "classless-1", {}), (10, "b", {})]
    (waits, *_) = [e for e in events if isinstance(e, JobInadmissible) and e.job == "classless-2"]
    assert waits.at == 0 and "never borrows" in waits.reason
    assert not [e for e in events if isinstance(e, JobPreempted)]
