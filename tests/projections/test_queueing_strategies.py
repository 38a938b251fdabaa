"""Queueing strategies per queue (spec/scenario.md, Queueing): `best_effort_fifo` lets smaller jobs pass a
waiting head, `strict_fifo` makes the head of a queue block the rest of that queue, and only that queue,
`shortest_limit_first` orders a queue's jobs of equal priority by declared limit."""

from __future__ import annotations

import pytest
from simkit import flat_nodes, queue, run, scenario, submit

from muster.replay.scenario import loads
from muster.replay.specreader import ScenarioError

TWO_NODES = flat_nodes(8, 8)  # 16 GPUs


@pytest.mark.parametrize(
    ("strategy", "timeline", "first_admissions"),
    [
        pytest.param(
            "best_effort_fifo",
            [submit("run", "qa", 8, runtime=100), submit("big", "qa", 16, at=1), submit("small", "qa", 8, at=2)],
            {"run": 0, "small": 2, "big": 3602},
            id="best-effort-small-job-passes-the-waiting-head",
        ),
        pytest.param(
            "strict_fifo",
            [submit("run", "qa", 8, runtime=100), submit("big", "qa", 16, at=1), submit("small", "qa", 8, at=2)],
            {"run": 0, "big": 100, "small": 3700},
            id="strict-head-blocks-the-job-behind-it",
        ),
        pytest.param(
            "strict_fifo",
            [
                submit("run", "qa", 8, runtime=100),
                submit("big", "qa", 16, at=1),
                submit("urgent", "qa", 8, at=2, prio="high"),
            ],
            {"run": 0, "urgent": 2, "big": 3602},
            id="strict-higher-priority-job-is-the-new-head",
        ),
        pytest.param(
            "strict_fifo",
            [submit("a", "qa", 8, runtime=100), submit("b", "qa", 8), submit("c", "qa", 8, runtime=50)],
            {"a": 0, "b": 0, "c": 100},
            id="strict-admits-in-order-while-jobs-fit",
        ),
    ],
)
def test_the_head_of_a_queue_blocks_only_under_strict_fifo(
    strategy: str, timeline: list[str], first_admissions: dict[str, int]
) -> None:
    """Under strict_fifo no job behind a waiting head is admitted; under best_effort_fifo a job that fits goes."""
    out = run(scenario(TWO_NODES, [queue("qa", 16, strategy=strategy)], timeline))
    assert {job: out.admitted(job).at for job in first_admissions} == first_admissions


def test_a_strict_queue_blocks_only_itself() -> None:
    """Another queue's jobs are admitted while a strict queue's head waits; the strict queue's follower is not."""
    queues = [queue("qa", 8, "org", strategy="strict_fifo"), queue("qb", 8, "org")]
    timeline = [
        submit("a-run", "qa", 8, runtime=100),
        submit("a-big", "qa", 16, at=1),
        submit("a-small", "qa", 8, at=2),
        submit("b-run", "qb", 8, at=3, runtime=10),
        submit("b-next", "qb", 8, at=4, runtime=10),
    ]
    out = run(scenario(TWO_NODES, queues, timeline, cohorts=["org"]))
    assert out.admitted("b-run").at == 3 and out.admitted("b-next").at == 13
    assert out.admitted("a-big").at == 100
    assert out.admitted("a-small").at > out.admitted("a-big").at


def test_a_job_held_behind_a_strict_head_says_why_from_its_first_cycle() -> None:
    """A job never judged that waits behind its strict_fifo head is told so; the head's own reason is its own."""
    timeline = [submit("run", "qa", 8, runtime=100), submit("big", "qa", 16, at=1), submit("small", "qa", 8, at=2)]
    out = run(scenario(TWO_NODES, [queue("qa", 16, strategy="strict_fifo")], timeline))
    held = "waits behind the head of queue qa (strict_fifo: while its head waits, no job behind it goes)"
    assert out.reasons("small")[0] == held
    assert out.reasons("big") and "behind the head" not in out.reasons("big")[0]
    pending_at_2 = [e.job for e in out.inadmissible_at(2)]
    assert pending_at_2 == ["small"]


def test_an_unknown_strategy_is_refused_with_its_line() -> None:
    """`queueing_strategy` takes best_effort_fifo, strict_fifo or shortest_limit_first; anything else is a scenario
    error naming the line."""
    text = scenario(TWO_NODES, [queue("qa", 16, strategy="StrictFIFO")], [submit("a", "qa")])
    with pytest.raises(ScenarioError) as err:
        loads(text, "s.yaml")
    assert "queueing_strategy must be one of best_effort_fifo, strict_fifo, shortest_limit_first" in str(err.value)
    assert err.value.line is not None


def one_at_a_time(strategy: str, urgent: str | None = None) -> dict[str, int]:
    """`run` fills both nodes until 100; then `a` (limit 900), `b` (300), `c` (none; priority `urgent`) and `d`
    (300), submitted in that order, each take the whole cluster for 100 s: when each was first admitted."""
    timeline = [
        submit("run", "qa", 16, runtime=100),
        submit("a", "qa", 16, at=1, runtime=100, limit=900),
        submit("b", "qa", 16, at=2, runtime=100, limit=300),
        submit("c", "qa", 16, at=3, runtime=100, prio=urgent),
        submit("d", "qa", 16, at=4, runtime=100, limit=300),
    ]
    out = run(scenario(TWO_NODES, [queue("qa", 16, strategy=strategy)], timeline))
    return {job: out.admitted(job).at for job in "abcd"}


@pytest.mark.parametrize(
    ("strategy", "urgent", "admitted"),
    [
        pytest.param("best_effort_fifo", None, {"a": 100, "b": 200, "c": 300, "d": 400}, id="fifo-by-submission"),
        pytest.param(
            "shortest_limit_first", None, {"b": 100, "d": 200, "a": 300, "c": 400}, id="shortest-limit-then-no-limit"
        ),
        pytest.param(
            "shortest_limit_first", "high", {"c": 100, "b": 200, "d": 300, "a": 400}, id="priority-before-limit"
        ),
    ],
)
def test_shortest_limit_first_orders_equal_priorities_by_declared_limit(
    strategy: str, urgent: str | None, admitted: dict[str, int]
) -> None:
    """Under shortest_limit_first the job with the shortest declared limit goes first among equal priorities (equal
    limits by submission, jobs without a limit last); a higher priority still goes before any limit."""
    assert one_at_a_time(strategy, urgent) == admitted


def test_shortest_limit_first_orders_only_its_own_queue() -> None:
    """A best_effort_fifo queue beside a shortest_limit_first one keeps submission order for its own jobs."""
    queues = [queue("qa", 8, "org", strategy="shortest_limit_first"), queue("qb", 8, "org")]
    timeline = [submit("run", "qa", 16, runtime=100)]
    timeline += [submit(f"{q}-long", q, 16, at=1, runtime=100, limit=900) for q in ("qa", "qb")]
    timeline += [submit(f"{q}-short", q, 16, at=2, runtime=100, limit=200) for q in ("qa", "qb")]
    out = run(scenario(TWO_NODES, queues, timeline, cohorts=["org"]))
    assert out.admitted("qa-short").at < out.admitted("qa-long").at
    assert out.admitted("qb-long").at < out.admitted("qb-short").at
