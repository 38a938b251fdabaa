"""Queueing delay figures of `muster sim` (replay/waits.py): per queue and gang size, censored waits counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.replay.scenario import load, loads
from muster.replay.simcli import summary
from muster.replay.simulator import simulate
from muster.replay.waits import Wait, percentile, size_class, stats

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        pytest.param([], 50, 0, id="none"),
        pytest.param([7], 99, 7, id="one"),
        pytest.param([1, 2, 3, 4], 50, 2, id="p50-nearest-rank"),
        pytest.param(list(range(1, 101)), 99, 99, id="p99-of-100"),
        pytest.param(list(range(1, 11)), 99, 10, id="p99-of-10-is-the-max"),
    ],
)
def test_percentiles_are_nearest_rank(values: list[int], q: int, expected: int) -> None:
    """The q-th percentile is the value at rank ceil(q% of n) of the sorted waits."""
    assert percentile(values, q) == expected


@pytest.mark.parametrize(
    ("gpus", "name"), [(0, "1"), (1, "1"), (8, "2-8"), (32, "9-32"), (64, "33-128"), (256, "129+")]
)
def test_size_classes(gpus: int, name: str) -> None:
    """Gangs fall into size classes by total GPUs."""
    assert size_class(gpus) == name


def test_a_job_still_waiting_counts_with_what_it_waited_so_far() -> None:
    """A starved job shows in the maximum (as a lower bound) and in `waiting`."""
    s = stats([Wait("q", 8, 10, True), Wait("q", 64, 500, False)])
    assert (s.jobs, s.waiting, s.avg, s.max) == (2, 1, 255.0, 500)


def test_sim_summary_has_queueing_per_queue_and_size() -> None:
    """`muster sim`'s Summary gives avg/p50/p99/max queueing per queue and per size class (the example's numbers)."""
    q = summary(simulate(load(ROOT / "examples" / "strict_fifo.yaml")))["queueing"]
    assert q["all"] == {"jobs": 4, "waiting": 0, "avg": 1035.0, "p50": 590, "p99": 1780, "max": 1780}
    assert list(q["sizes"]) == ["2-8", "9-32"] and q["sizes"]["9-32"]["max"] == 590
    assert list(q["queues"]) == ["team-a"]


def test_a_never_admitted_gang_is_reported_waiting_until_the_end() -> None:
    """A gang bigger than its queue may ever use waits to `until`: it counts as waiting, with that wait."""
    text = (
        "nodes:\n  - {name: n0, capacity: {gpu: 8}}\nqueues:\n  - {name: q, nominal: {gpu: 8}}\n"
        "timeline:\n  - {at: 5, submit: {job: big, queue: q, podsets: [{count: 2, requests: {gpu: 8}}]}}\n"
        "until: 105\n"
    )
    q = summary(simulate(loads(text, "s.yaml")))["queueing"]
    assert q["queues"]["q"] == {"jobs": 1, "waiting": 1, "avg": 100.0, "p50": 100, "p99": 100, "max": 100}
