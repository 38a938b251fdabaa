"""Scenario fixtures for the scheduler tests: small YAML pieces named by shape, and a run's outcome.

Scheduler tests are written as `muster sim` scenarios (spec/scenario.md): a
cluster, queues and a timeline in inline YAML, run through the real
`scenario.loads` + `simulator.simulate`, then asserted on the decision events.
Decisions are compared in a compact tuple form so a table row reads like the
spec:

- `("admit", job)`
- `("preempt", victim, preemptor, reason)`
- `("pending", job)` for a `JobInadmissible`
- `("reject", job)`
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

from muster.events.types import (
    Event,
    JobAdmitted,
    JobFinished,
    JobInadmissible,
    JobPreempted,
    JobRejected,
)
from muster.projections.state import ClusterState
from muster.replay.scenario import loads
from muster.replay.simcli import summary
from muster.replay.simulator import SimResult, simulate

PRIORITIES = """\
priority_classes:
  - {name: urgent, value: 2000}
  - {name: inference, value: 1000, preemptible: false}
  - {name: high, value: 500}
  - {name: training, value: 100}
  - {name: low, value: 50}
  - {name: scavenger, value: 0}
"""


def nodes_8gpu(blocks: int = 1, racks: int = 1, per_rack: int = 4, gpu: int = 8) -> str:
    """The `topology` and `nodes` sections: `blocks` x `racks` x `per_rack` nodes of `gpu` GPUs.

    Names are `b{B}-r{R}-n{I}`; labels `block: b{B}`, `rack: r{R}` (rack names repeat across blocks).
    """
    bs = ", ".join(f"b{b}" for b in range(blocks))
    rs = ", ".join(f"r{r}" for r in range(racks))
    return (
        "topology:\n"
        "  levels: [block, rack]\n"
        "nodes:\n"
        "  - generate:\n"
        f"      count: {per_rack}\n"
        '      name: "{block}-{rack}-n{i}"\n'
        f"      labels: {{block: [{bs}], rack: [{rs}]}}\n"
        f"      capacity: {{gpu: {gpu}}}\n"
    )


def flat_nodes(*gpus: int) -> str:
    """Nodes `n0, n1, ...` with the given GPU counts in one block and rack."""
    lines = ["topology:", "  levels: [block, rack]", "nodes:"]
    for i, g in enumerate(gpus):
        lines.append(f"  - {{name: n{i}, labels: {{block: b0, rack: r0}}, capacity: {{gpu: {g}}}}}")
    return "\n".join(lines) + "\n"


def queue(
    name: str,
    gpu: int,
    cohort: str | None = None,
    *,
    borrowing_limit: int | None = None,
    lending_limit: int | None = None,
    weight: float | None = None,
    within: str | None = None,
    reclaim: str | None = None,
    borrow: str | None = None,
    threshold: int | None = None,
    strategy: str | None = None,
    reserve_after: int | None = None,
) -> str:
    """One `queues` entry in flow style (GPU quotas only)."""
    parts = [f"name: {name}", f"nominal: {{gpu: {gpu}}}"]
    if strategy is not None:
        parts.append(f"queueing_strategy: {strategy}")
    if reserve_after is not None:
        parts.append(f"reserve_after: {reserve_after}")
    if cohort is not None:
        parts.append(f"cohort: {cohort}")
    if borrowing_limit is not None:
        parts.append(f"borrowing_limit: {{gpu: {borrowing_limit}}}")
    if lending_limit is not None:
        parts.append(f"lending_limit: {{gpu: {lending_limit}}}")
    if weight is not None:
        parts.append(f"weight: {weight}")
    policy = []
    if within is not None:
        policy.append(f"within_queue: {within}")
    if reclaim is not None:
        policy.append(f"reclaim_within_cohort: {reclaim}")
    if borrow is not None:
        b = f"policy: {borrow}"
        if threshold is not None:
            b += f", max_priority_threshold: {threshold}"
        policy.append(f"borrow_within_cohort: {{{b}}}")
    if policy:
        parts.append(f"preemption: {{{', '.join(policy)}}}")
    return "  - {" + ", ".join(parts) + "}\n"


def submit(
    job: str,
    q: str,
    gpus: int = 8,
    *,
    at: int = 0,
    per_pod: int = 8,
    prio: str | None = None,
    runtime: int | None = 3600,
    checkpoint: int | None = None,
    required: str | None = None,
    preferred: str | None = None,
    limit: int | None = None,
) -> str:
    """One timeline `submit` entry: a gang of `gpus / per_pod` pods of `per_pod` GPUs (`limit`: its max_runtime)."""
    count = max(1, gpus // per_pod)
    per = min(gpus, per_pod)
    podset = f"name: w, count: {count}, requests: {{gpu: {per}}}"
    if required is not None:
        podset += f", topology: {{required: {required}}}"
    if preferred is not None:
        podset += f", topology: {{preferred: {preferred}}}"
    parts = [f"job: {job}", f"queue: {q}", f"podsets: [{{{podset}}}]"]
    if prio is not None:
        parts.append(f"priority_class: {prio}")
    if runtime is not None:
        parts.append(f"runtime: {runtime}")
    if checkpoint is not None:
        parts.append(f"checkpoint_every: {checkpoint}")
    if limit is not None:
        parts.append(f"max_runtime: {limit}")
    return f"  - {{at: {at}, submit: {{{', '.join(parts)}}}}}\n"


def scenario(
    nodes: str,
    queues: list[str] | str,
    timeline: list[str] | str,
    *,
    cohorts: list[str] | tuple[str, ...] = (),
    extra: str = "",
    priorities: str = PRIORITIES,
) -> str:
    """A whole scenario file from its pieces; cohorts are `name` or `name:parent`."""
    text = nodes + priorities
    if cohorts:
        text += "cohorts:\n"
        for c in cohorts:
            name, _, parent = c.partition(":")
            text += f"  - {{name: {name}{', parent: ' + parent if parent else ''}}}\n"
    text += "queues:\n" + ("".join(queues) if isinstance(queues, list) else queues)
    text += "timeline:\n" + ("".join(timeline) if isinstance(timeline, list) else timeline)
    if extra:
        text += textwrap.dedent(extra)
    return text


@dataclass
class Outcome:
    """A finished run: its event log, final state and summary, with compact views of the decisions."""

    result: SimResult

    @property
    def events(self) -> list[Event]:
        return self.result.events

    @property
    def state(self) -> ClusterState:
        return self.result.state

    def summary(self) -> dict[str, Any]:
        return summary(self.result)

    def decisions(self, at: int | None = None, *, pending: bool = True) -> list[tuple[Any, ...]]:
        """Decision events (at one instant, if given) in log order, in the compact tuple form."""
        out: list[tuple[Any, ...]] = []
        for ev in self.events:
            if at is not None and ev.at != at:
                continue
            if isinstance(ev, JobAdmitted):
                out.append(("admit", ev.job))
            elif isinstance(ev, JobPreempted):
                out.append(("preempt", ev.job, ev.preemptor, ev.reason))
            elif isinstance(ev, JobInadmissible) and pending:
                out.append(("pending", ev.job))
            elif isinstance(ev, JobRejected):
                out.append(("reject", ev.job))
        return out

    def admissions(self, job: str) -> list[JobAdmitted]:
        return [e for e in self.events if isinstance(e, JobAdmitted) and e.job == job]

    def admitted(self, job: str) -> JobAdmitted:
        """The job's first admission (fails the test if it never ran)."""
        found = self.admissions(job)
        assert found, f"{job} was never admitted; decisions: {self.decisions()}"
        return found[0]

    def admissions_at(self, at: int) -> list[JobAdmitted]:
        return [e for e in self.events if isinstance(e, JobAdmitted) and e.at == at]

    def inadmissible_at(self, at: int) -> list[JobInadmissible]:
        return [e for e in self.events if isinstance(e, JobInadmissible) and e.at == at]

    def preemptions(self, job: str | None = None) -> list[JobPreempted]:
        return [e for e in self.events if isinstance(e, JobPreempted) and (job is None or e.job == job)]

    def reasons(self, job: str) -> list[str]:
        """Every JobInadmissible reason written for the job, in order."""
        return [e.reason for e in self.events if isinstance(e, JobInadmissible) and e.job == job]

    def rejection(self, job: str) -> str:
        found = [e.reason for e in self.events if isinstance(e, JobRejected) and e.job == job]
        assert found, f"{job} was not rejected"
        return found[0]

    def finished_at(self, job: str) -> int | None:
        for e in self.events:
            if isinstance(e, JobFinished) and e.job == job:
                return e.at
        return None

    def nodes_of(self, job: str, nth: int = 0) -> set[str]:
        return set(self.admissions(job)[nth].placement.values())


def run(text: str) -> Outcome:
    """Load a scenario from YAML text and simulate it to its end."""
    return Outcome(simulate(loads(text, "test.yaml")))


def racks_of(nodes: set[str]) -> set[str]:
    """`b0-r1` for every node named `b0-r1-nX`."""
    return {n.rsplit("-", 1)[0] for n in nodes}


def blocks_of(nodes: set[str]) -> set[str]:
    return {n.split("-", 1)[0] for n in nodes}
