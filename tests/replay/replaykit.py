"""Logs for the replay tests: `muster sim` runs of small scenarios, as JSONL files, in memory or on NATS.

- `STORY`: the preempted-then-finished story (b-big borrows, a-1 reclaims, b-big
  runs again and finishes) that `explain` must tell;
- `IDLE`: a borrowed job goes idle and is reclaimed for a waiting job;
- `FLAVORED_QUEUES`: queue q has quota on two flavors and its gang borrows queue idle's a100 quota;
- `mixed(seed, ...)`: a seeded scenario over a 2-block x 2-rack cluster with
  cohorts, limits, priorities, topology, checkpoints, node failures, cordons,
  cancellations, queue updates, utilization samples and optional fair sharing
  and idle reclaim; the switches name the feature each audit case exercises;
- `sim(text)`: the run; `sim_until(text, t)`: the same scenario stopped at `t`
  (the state the simulator held then).
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

from muster.events.codec import encode
from muster.events.types import Event
from muster.replay.scenario import loads
from muster.replay.simulator import SimResult, simulate
from muster.replay.source import MemoryLog

STORY = """\
topology:
  levels: [block, rack]
nodes:
  - generate:
      count: 2
      name: "{block}-{rack}-n{i}"
      labels: {block: [b0], rack: [r0, r1]}
      capacity: {gpu: 8}
priority_classes:
  - {name: high, value: 500}
  - {name: training, value: 100}
cohorts:
  - {name: org}
queues:
  - name: team-a
    cohort: org
    nominal: {gpu: 16}
    preemption: {within_queue: LowerPriority, reclaim_within_cohort: Any}
  - name: team-b
    cohort: org
    nominal: {gpu: 16}
timeline:
  - at: 0
    submit:
      job: b-big
      queue: team-b
      priority_class: training
      podsets: [{name: worker, count: 4, requests: {gpu: 8}}]
      runtime: 1000
      checkpoint_every: 60
  - at: 100
    submit:
      job: a-1
      queue: team-a
      priority_class: training
      podsets: [{name: worker, count: 2, requests: {gpu: 8}, topology: {required: rack}}]
      runtime: 500
  - at: 150
    submit:
      job: b-small
      queue: team-b
      priority_class: training
      podsets: [{name: worker, count: 1, requests: {gpu: 8}}]
      runtime: 300
"""

IDLE = """\
nodes:
  - generate:
      count: 2
      name: "{block}-{rack}-n{i}"
      labels: {block: [b0], rack: [r0]}
      capacity: {gpu: 8}
topology:
  levels: [block, rack]
cohorts:
  - {name: org}
queues:
  - {name: qa, cohort: org, nominal: {gpu: 8}}
  - {name: qb, cohort: org, nominal: {gpu: 8}}
idle_reclaim: {threshold: 0.05, after: 600}
timeline:
  - {at: 0, submit: {job: own, queue: qa, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 5000}}
  - {at: 0, submit: {job: lent, queue: qa, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 5000}}
  - {at: 100, utilization: {job: lent, gpu: 0.01}}
  - {at: 100, utilization: {job: own, gpu: 0.9}}
  - {at: 200, submit: {job: b, queue: qb, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 300}}
  - {at: 300, submit: {job: b2, queue: qb, podsets: [{count: 1, requests: {gpu: 4}}], runtime: 300}}
"""

FLAVORED_QUEUES = """\
nodes:
  - {name: h0, labels: {model: H100}, capacity: {gpu: 8}}
  - {name: a0, labels: {model: A100}, capacity: {gpu: 8}}
  - {name: a1, labels: {model: A100}, capacity: {gpu: 8}}
flavors:
  - {name: h100, node_labels: {model: H100}}
  - {name: a100, node_labels: {model: A100}}
cohorts: [{name: org}]
queues:
  - name: q
    cohort: org
    resource_groups: [{covered: [gpu], flavors: [{name: a100, nominal: {gpu: 8}}, {name: h100, nominal: {gpu: 8}}]}]
  - name: idle
    cohort: org
    resource_groups: [{covered: [gpu], flavors: [{name: a100, nominal: {gpu: 8}}]}]
timeline:
  - {at: 0, submit: {job: big, queue: q, podsets: [{count: 2, requests: {gpu: 8}}], runtime: 1000}}
"""


def mixed(
    seed: int,
    *,
    jobs: int = 40,
    fair: bool = False,
    idle: bool = False,
    nodes_events: bool = True,
    topology: bool = True,
    preemption: bool = True,
    until: int | None = None,
) -> str:
    """A seeded scenario (see the module docstring); small enough to simulate in well under a second."""
    rng = random.Random(seed)
    lines = [
        "topology:",
        "  levels: [block, rack]",
        "nodes:",
        "  - generate:",
        "      count: 2",
        '      name: "{block}-{rack}-n{i}"',
        "      labels: {block: [b0, b1], rack: [r0, r1]}",
        "      capacity: {gpu: 8}",
        "priority_classes:",
        "  - {name: inference, value: 1000, preemptible: false}",
        "  - {name: high, value: 500}",
        "  - {name: training, value: 100}",
        "  - {name: scavenger, value: 0}",
        "cohorts:",
        "  - {name: org}",
        "  - {name: lab, parent: org}",
        f"fair_sharing: {'true' if fair else 'false'}",
    ]
    if idle:
        lines.append("idle_reclaim: {threshold: 0.05, after: 300, only_borrowing: true}")
    policy = (
        "{within_queue: LowerPriority, reclaim_within_cohort: Any, "
        "borrow_within_cohort: {policy: LowerPriority, max_priority_threshold: 100}}"
        if preemption
        else "{}"
    )
    lines += [
        "queues:",
        f"  - {{name: qa, cohort: org, nominal: {{gpu: 8}}, preemption: {policy}}}",
        f"  - {{name: qb, cohort: lab, nominal: {{gpu: 8}}, borrowing_limit: {{gpu: 16}}, weight: 2, "
        f"preemption: {policy}}}",
        "  - {name: qc, cohort: lab, nominal: {gpu: 8}, lending_limit: {gpu: 4}, "
        "preemption: {within_queue: LowerOrNewerEqualPriority, reclaim_within_cohort: LowerPriority}}",
        "  - {name: qd, nominal: {gpu: 8}}",
        "timeline:",
    ]
    classes = ["training", "training", "scavenger", "high", "inference"]
    t = 0
    names = []
    for i in range(jobs):
        t += rng.choice([0, 0, 5, 20, 60, 120])
        q = rng.choice(["qa", "qa", "qb", "qc", "qd"])
        per = rng.choice([1, 2, 4, 8, 8])
        count = rng.choice([1, 1, 2, 3, 4]) if per == 8 else rng.choice([1, 2])
        topo = ""
        if topology and per == 8 and count > 1:
            topo = rng.choice(["", ", topology: {required: rack}", ", topology: {preferred: block}"])
        podset = f"{{name: worker, count: {count}, requests: {{gpu: {per}}}{topo}}}"
        extra = f", checkpoint_every: {rng.choice([30, 100])}" if rng.random() < 0.4 else ""
        name = f"j{i}"
        names.append(name)
        lines.append(
            f"  - {{at: {t}, submit: {{job: {name}, queue: {q}, priority_class: {rng.choice(classes)}, "
            f"podsets: [{podset}], runtime: {rng.randint(50, 600)}{extra}}}}}"
        )
        if idle and rng.random() < 0.3:
            lines.append(f"  - {{at: {t + 10}, utilization: {{job: {name}, gpu: {rng.choice([0.01, 0.5])}}}}}")
    if nodes_events:
        lines += [
            f"  - {{at: {t // 3}, node_down: b0-r1-n0}}",
            f"  - {{at: {t // 3 + 90}, node_up: b0-r1-n0}}",
            f"  - {{at: {t // 2}, cordon: b1-r0-n1}}",
            f"  - {{at: {t // 2 + 200}, uncordon: b1-r0-n1}}",
            f"  - {{at: {t // 2}, cancel: {rng.choice(names)}}}",
            f"  - {{at: {t // 4}, queue_update: {{name: qd, nominal: {{gpu: 16}}}}}}",
        ]
    if until is not None:
        lines.append(f"until: {until}")
    return "\n".join(lines) + "\n"


def sim(text: str) -> SimResult:
    return simulate(loads(text, "test.yaml"))


def sim_until(text: str, t: int) -> SimResult:
    """The same scenario stopped after time `t`: its final state is the state the simulator held at `t`."""
    sc = loads(text, "test.yaml")
    return simulate(dataclasses.replace(sc, until=t))


def memory_log(events: list[Event]) -> MemoryLog:
    return MemoryLog.from_events(events, "test-log")


def write_jsonl(path: Path, events: list[Event]) -> Path:
    path.write_bytes(b"".join(encode(e) + b"\n" for e in events))
    return path
