"""Queueing delay of a run: how long each job waited for its first admission, summed up per queue and gang size.

A job's wait is its first admission time less its submission time. A job
still pending when the run ends counts with what it had waited by then (a
lower bound; `waiting` says how many such jobs a figure includes), so a
starved gang shows in the maximum instead of vanishing from it. Jobs rejected
or cancelled before they ran have no wait. Percentiles are nearest-rank over
whole seconds: the same run prints the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

SIZE_CLASSES: tuple[tuple[str, int], ...] = (("1", 1), ("2-8", 8), ("9-32", 32), ("33-128", 128), ("129+", 2**62))
"""Gang size classes by total GPUs: (name, largest size in the class)."""


@dataclass(frozen=True)
class Wait:
    """One job's queueing delay; `admitted` False when it was still waiting at the end."""

    queue: str
    gpus: int
    seconds: int
    admitted: bool


@dataclass(frozen=True)
class WaitStats:
    """Average, p50, p99 and maximum wait over `jobs` jobs, `waiting` of them never admitted."""

    jobs: int
    waiting: int
    avg: float
    p50: int
    p99: int
    max: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "waiting": self.waiting,
            "avg": round(self.avg, 1),
            "p50": self.p50,
            "p99": self.p99,
            "max": self.max,
        }


def size_class(gpus: int) -> str:
    """The name of the size class of a gang of `gpus` GPUs (0 GPUs count with 1)."""
    for name, upto in SIZE_CLASSES:
        if gpus <= upto:
            return name
    return SIZE_CLASSES[-1][0]


def percentile(ordered: Sequence[int], q: int) -> int:
    """Nearest-rank q-th percentile of sorted values (0 for none)."""
    if not ordered:
        return 0
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[rank - 1]


def stats(waits: Iterable[Wait]) -> WaitStats:
    """The figures of a set of waits."""
    ws = list(waits)
    ordered = sorted(w.seconds for w in ws)
    return WaitStats(
        jobs=len(ordered),
        waiting=sum(1 for w in ws if not w.admitted),
        avg=sum(ordered) / len(ordered) if ordered else 0.0,
        p50=percentile(ordered, 50),
        p99=percentile(ordered, 99),
        max=ordered[-1] if ordered else 0,
    )


def grouped(waits: Iterable[Wait], key: str) -> dict[str, WaitStats]:
    """Figures per `queue` or per `size` class, in name order (size classes in size order)."""
    groups: dict[str, list[Wait]] = {}
    for w in waits:
        groups.setdefault(w.queue if key == "queue" else size_class(w.gpus), []).append(w)
    if key == "size":
        return {name: stats(groups[name]) for name, _ in SIZE_CLASSES if name in groups}
    return {name: stats(groups[name]) for name in sorted(groups)}


def run_waits(result: Any) -> list[Wait]:
    """The waits of a `simulator.SimResult`, in job id order."""
    out: list[Wait] = []
    for job_id, js in sorted(result.accounting.jobs.items()):
        job = result.state.jobs.get(job_id)
        if job is None:
            continue
        if js.admitted is not None:
            out.append(Wait(job.queue, job.gpus, js.admitted - js.submitted, True))
        elif js.status == "pending":
            out.append(Wait(job.queue, job.gpus, max(0, result.end - js.submitted), False))
    return out


def summary(result: Any) -> dict[str, Any]:
    """The `queueing` part of `muster sim`'s Summary: all jobs, per queue and per size class."""
    waits = run_waits(result)
    return {
        "all": stats(waits).as_dict(),
        "queues": {k: v.as_dict() for k, v in grouped(waits, "queue").items()},
        "sizes": {k: v.as_dict() for k, v in grouped(waits, "size").items()},
    }
