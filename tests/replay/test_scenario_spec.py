"""Statements of the scenario contract (docs/spec/scenario.md) found untested by walking it line by line.

Each test names the sentence it checks; the scenarios are as small as the sentence allows.
"""

from __future__ import annotations

import re
from pathlib import Path

from replaykit import memory_log, sim

from muster.events.types import JobAdmitted, JobCancelled, JobInadmissible, JobPreempted
from muster.replay.explain import explain
from muster.replay.points import END

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


def _small_jobs_then_a_256_gpu_gang() -> str:
    """Two blocks of 4 racks of 8 nodes of 8 GPUs; 40 small jobs of 1 to 16 GPUs over 400 s, then at t=500 a
    256-GPU gang that must stay in one block."""
    lines = [
        "topology: {levels: [block, rack]}",
        "nodes:",
        '  - generate: {count: 8, name: "{block}-{rack}-n{i}", labels: {block: [b0, b1], rack: [r0, r1, r2, r3]},'
        " capacity: {gpu: 8}}",
        "queues: [{name: q, nominal: {gpu: 512}}]",
        "timeline:",
    ]
    for i in range(40):
        gpus = [1, 2, 4, 8, 16][i % 5]
        count, per_pod = (1, gpus) if gpus <= 8 else (gpus // 8, 8)
        lines.append(
            f"  - {{at: {i * 10}, submit: {{job: s{i}, queue: q, podsets: [{{count: {count}, "
            f"requests: {{gpu: {per_pod}}}}}], runtime: {3000 + (i * 37) % 500}}}}}"
        )
    lines.append(
        "  - {at: 500, submit: {job: big, queue: q, podsets: [{count: 32, requests: {gpu: 8},"
        " topology: {required: block}}], runtime: 3600}}"
    )
    return "\n".join(lines) + "\n"


async def test_small_jobs_pack_into_one_block_so_a_256_gpu_gang_gets_a_whole_block_at_once() -> None:
    """ "Among domains that fit, take the tightest ... so small gangs do not fragment the large domains that big
    gangs need": the 40 small jobs (184 GPUs) all land in b0, and the 256-GPU gang runs in b1 on arrival;
    its story says so."""
    events = sim(_small_jobs_then_a_256_gpu_gang()).events
    admitted = {e.job: e for e in events if isinstance(e, JobAdmitted)}
    assert len(admitted) == 41
    assert {n.split("-")[0] for e in admitted.values() if e.job != "big" for n in e.placement.values()} == {"b0"}
    big = admitted["big"]
    assert big.at == 500 and {n.split("-")[0] for n in big.placement.values()} == {"b1"}
    story, _ = await explain(memory_log(events), "big", END)
    (line,) = (ln for ln in story.lines if ln.kind == "admitted")
    assert "in block b1 (racks b1/r0, b1/r1, b1/r2, b1/r3)" in line.text


SPEC = Path(__file__).resolve().parents[2] / "docs" / "spec" / "scenario.md"


def test_the_contract_s_own_example_is_a_valid_scenario_that_runs() -> None:
    """The spec's first YAML block loads and runs: its job is admitted at t=0 inside one block and cancelled at
    t=900 (its flavors named labels no node carried, so copying the example gave exit 2)."""
    example = re.search(r"```yaml\n(.*?)```", SPEC.read_text(), re.S)
    assert example is not None
    events = sim(example.group(1)).events
    (admitted,) = [e for e in events if isinstance(e, JobAdmitted)]
    assert admitted.job == "train-1" and admitted.at == 0
    assert len({n.split("-")[0] for n in admitted.placement.values()}) == 1
    assert [(e.at, e.job) for e in events if isinstance(e, JobCancelled)] == [(900, "train-1")]
