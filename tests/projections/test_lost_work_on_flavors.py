"""A job admitted on resource flavors loses (and is charged) the work done since its last checkpoint,
and victims on flavors are chosen to lose the least (its requests are keyed `gpu@FLAVOR`)."""

from __future__ import annotations

from muster.events.types import JobPreempted
from muster.replay.scenario import loads
from muster.replay.simulator import simulate

FLAVORED = """\
nodes:
  - {name: h0, labels: {model: H100}, capacity: {gpu: 8}}
  - {name: h1, labels: {model: H100}, capacity: {gpu: 8}}
flavors:
  - {name: h100, node_labels: {model: H100}}
priority_classes:
  - {name: high, value: 500}
  - {name: low, value: 50}
queues:
  - name: q
    resource_groups: [{covered: [gpu], flavors: [{name: h100, nominal: {gpu: 16}}]}]
    preemption: {within_queue: LowerPriority}
timeline:
  - {at: 0, submit: {job: saved, queue: q, priority_class: low, podsets: [{count: 1, requests: {gpu: 8}}],
     runtime: 1000, checkpoint_every: 100}}
  - {at: 10, submit: {job: unsaved, queue: q, priority_class: low, podsets: [{count: 1, requests: {gpu: 8}}],
     runtime: 1000}}
  - {at: 150, submit: {job: urgent, queue: q, priority_class: high, podsets: [{count: 1, requests: {gpu: 8}}],
     runtime: 100}}
"""


def _preemptions(text: str) -> list[JobPreempted]:
    return [e for e in simulate(loads(text)).events if isinstance(e, JobPreempted)]


def test_a_flavored_job_preempted_loses_its_work_since_its_checkpoint() -> None:
    """`saved` ran 150 s with a checkpoint at 100 s on 8 GPUs: its preemption loses 50 s x 8 = 400 GPU-seconds."""
    (pre,) = _preemptions(FLAVORED)
    assert (pre.job, pre.lost_gpu_seconds) == ("saved", 400)


def test_the_victim_on_flavors_is_the_job_that_loses_the_least_work() -> None:
    """`unsaved` would lose 140 s x 8 GPUs, `saved` 50 s x 8: `saved` is evicted, as on a plain queue."""
    assert [p.job for p in _preemptions(FLAVORED)] == ["saved"]
    plain = FLAVORED.replace(
        "resource_groups: [{covered: [gpu], flavors: [{name: h100, nominal: {gpu: 16}}]}]", "nominal: {gpu: 16}"
    )
    assert [(p.job, p.lost_gpu_seconds) for p in _preemptions(plain)] == [("saved", 400)]
