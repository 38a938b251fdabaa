"""The parking memo is exact: every scenario we hold and the bench shapes decide the same bytes with it switched off."""

from __future__ import annotations

from pathlib import Path

import pytest
from corpus import bench, scenarios
from replaykit import mixed

from muster.events.codec import encode
from muster.events.types import CycleSettled
from muster.projections import parking
from muster.replay.scenario import Scenario, load, loads
from muster.replay.simulator import simulate


def _log(scenario: Scenario) -> list[bytes]:
    """The run's log, but its `CycleSettled` records: they say which verdicts the memo keeps, so a run
    without the memo writes none; every other event must be the same, in the same order."""
    return [encode(e) for e in simulate(scenario).events if not isinstance(e, CycleSettled)]


def _settled(scenario: Scenario) -> int:
    return sum(isinstance(e, CycleSettled) for e in simulate(scenario, keep_events=True).events)


# 16.5 CPU seconds (43 runs, twice), 66 s of wall time at load 12 on the 2 cores: the suite's 120 s
# per-test timeout would fail it at load 25 without any hang (each run ends: `simulate`'s cycle guard)
@pytest.mark.timeout(900)
def test_every_scenario_and_bench_shape_decides_the_same_bytes_with_the_memo_off(tmp_path: Path) -> None:
    """Examples, findings, the replay kit's scenarios and small bench shapes: the same log with and without parking."""
    on = {name: _log(sc) for name, sc in scenarios(tmp_path)}
    assert len(on) >= 14 and all(on.values())
    assert sum(b"ReservationMade" in e for log in on.values() for e in log) > 20, "reservations lost their point"
    idle_any = [e for name, log in on.items() if name.startswith("mixed-idle-any") for e in log]
    assert sum(b'"IdleReclaim"' in e for e in idle_any) >= 4, "the idle shapes reclaim nothing"
    parking.PARKING = False
    try:
        off = {name: _log(sc) for name, sc in scenarios(tmp_path)}
    finally:
        parking.PARKING = True
    for name in on:
        assert off[name] == on[name], f"{name}: the memo changed a decision"
    # the memo's settling cycles are recorded (what keeps their verdicts), and the memo off records none
    assert _settled(loads(mixed(0, jobs=60), "m.yaml")) > 0
    parking.PARKING = False
    try:
        assert _settled(loads(mixed(0, jobs=60), "m.yaml")) == 0
    finally:
        parking.PARKING = True


def test_a_job_woken_mid_cycle_beside_its_group_in_the_heap(tmp_path: Path) -> None:
    """Bench shape (a) at 6,000 jobs runs to its end: there a woken job sits in the heap twice with one key."""
    result = simulate(load(bench().case_a(tmp_path, 0.4)), keep_events=False)
    assert result.cycles > 10_000 and all(j.status == "finished" for j in result.state.jobs.values())
