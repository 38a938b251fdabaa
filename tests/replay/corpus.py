"""The scenarios the core's equivalence checks run: examples, findings, the replay kit's and small bench shapes.

Two checks decide each of them twice and compare the logs byte for byte: with the parking memo on and
off (test_memo_equivalence.py), and compiled and as Python (test_compiled_core.py).
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from replaykit import IDLE, STORY, mixed

from muster.replay.scenario import Scenario, load, loads

ROOT = Path(__file__).resolve().parents[2]


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_sim", ROOT / "bench" / "bench_sim.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_sim", mod)
    spec.loader.exec_module(mod)
    return mod


def scenarios(tmp: Path) -> Iterator[tuple[str, Scenario]]:
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        yield path.name, load(path)
    for path in sorted((ROOT / "tests" / "replay" / "findings").glob("*.yaml")):
        yield path.name, load(path)
    yield "story", loads(STORY, "story.yaml")
    yield "idle", loads(IDLE, "idle.yaml")
    for seed in range(4):
        yield f"mixed-{seed}", loads(mixed(seed, jobs=60), "m.yaml")
    for seed in range(4):
        yield f"mixed-fair-idle-{seed}", loads(mixed(seed, jobs=60, fair=True, idle=True), "m.yaml")
    for seed in range(4):  # idle reclaim of any job, every sample idle: reclaimed jobs requeued behind the waiting
        idle_any = mixed(seed, jobs=60, idle=True, fair=seed % 2 == 1).replace("gpu: 0.5}", "gpu: 0.01}")
        yield f"mixed-idle-any-{seed}", loads(idle_any.replace("after: 300, only_borrowing: true", _IDLE_ANY), "m.yaml")
    for seed in range(3):  # every queue strict_fifo (a held-back job is not parked), every job a 300 s limit
        strict = mixed(seed, jobs=60).replace("  - {name: q", "  - {queueing_strategy: strict_fifo, name: q")
        yield f"mixed-strict-{seed}", loads(strict.replace("runtime: ", "max_runtime: 300, runtime: "), "m.yaml")
    for seed in range(3):  # every queue shortest_limit_first, limits of 1x-3x the runtime, every third job none
        shortest = mixed(seed, jobs=60, fair=seed == 1).replace(
            "  - {name: q", "  - {queueing_strategy: shortest_limit_first, name: q"
        )
        yield f"mixed-shortest-{seed}", loads(_limits(shortest), "m.yaml")
        yield (
            f"mixed-shortest-reserve-{seed}",
            loads(_limits(shortest.replace("name: q", "reserve_after: 200, name: q")), "m.yaml"),
        )
    for seed in range(4):  # the same over two flavors (one block each), fungibility and fair sharing mixed
        yield f"mixed-flavors-{seed}", loads(_flavored(mixed(seed, jobs=60, fair=seed % 2 == 1, idle=True)), "m.yaml")
    for seed in (1, 5, 8, 11):  # every queue reserves (at once within nominal quota, else after 200 s)
        reserving = mixed(seed, jobs=60, fair=seed == 8, idle=seed == 8).replace(
            "  - {name: q", "  - {reserve_after: 200, name: q"
        )
        yield f"mixed-reserve-{seed}", loads(reserving, "m.yaml")
        # every job a 700 s limit: backfill, and the holder's own room, wake parked jobs
        yield (
            f"mixed-reserve-limits-{seed}",
            loads(reserving.replace("runtime: ", "max_runtime: 700, runtime: "), "m.yaml"),
        )
    bench_sim = bench()
    yield "bench-a", load(bench_sim.case_a(tmp, 0.05))
    yield "bench-kueue", load(bench_sim.case_kueue(tmp, 0.05))
    yield "bench-b", load(bench_sim.case_b(tmp, 0.01))
    yield "bench-c", load(bench_sim.case_c(tmp, 0.02, 1000))
    yield "bench-a3-flavors", load(bench_sim.case_flavors(tmp, 0.03))
    yield "bench-a3-over", load(bench_sim.case_flavors(tmp, 0.03, over=True))  # quota 1.5x each flavor's GPUs


def _limits(text: str) -> str:
    """A `mixed` scenario with declared limits of 1x to 3x each job's runtime, but every third job's."""
    count = itertools.count()

    def limit(m: re.Match[str]) -> str:
        i, runtime = next(count), int(m.group(1))
        return m.group(0) if i % 3 == 2 else f"max_runtime: {runtime * (1 + i % 3 + i % 2)}, {m.group(0)}"

    return re.sub(r"(?<!_)runtime: (\d+)", limit, text)


_IDLE_ANY = "after: 60, only_borrowing: false"


def _flavored(text: str) -> str:
    """A `mixed` scenario with each queue's GPU quota split over flavors x (block b0) and y (block b1)."""

    def groups(x: str, y: str, extra: str = "") -> str:
        fx, fy = f"{{name: x, nominal: {{gpu: 4}}{x}}}", f"{{name: y, nominal: {{gpu: 4}}{y}}}"
        return f"resource_groups: [{{covered: [gpu], flavors: [{fx}, {fy}]}}]{extra}"

    flavors = "flavors:\n  - {name: x, node_labels: {block: b0}}\n  - {name: y, node_labels: {block: b1}}\nqueues:"
    return (
        text.replace("queues:", flavors, 1)
        .replace(
            "name: qa, cohort: org, nominal: {gpu: 8}",
            "name: qa, cohort: org, " + groups("", "", ", flavor_fungibility: {when_can_borrow: TryNextFlavor}"),
        )
        .replace(
            "name: qb, cohort: lab, nominal: {gpu: 8}, borrowing_limit: {gpu: 16}",
            "name: qb, cohort: lab, " + groups(", borrowing_limit: {gpu: 8}", ", borrowing_limit: {gpu: 8}"),
        )
        .replace(
            "name: qc, cohort: lab, nominal: {gpu: 8}, lending_limit: {gpu: 4}",
            "name: qc, cohort: lab, "
            + groups(
                ", lending_limit: {gpu: 2}",
                ", lending_limit: {gpu: 2}",
                ", flavor_fungibility: {when_can_preempt: Preempt}",
            ),
        )
    )
