"""The demo's live view: what the log says, per queue and for the cluster, drawn with rich.

`DemoStats` counts from the events the daemon folds (its `on_fold` hook), so
the view shows exactly what is on the log; `render` draws the queues (quota,
use, borrowing, pending, admissions, preemptions), the cluster's GPU use, how
busy the allocated GPUs are (the jobs' latest `GpuUtilizationSampled`) and
the latest decisions.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from muster.events.types import (
    Event,
    JobAdmitted,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobRejected,
    JobSubmitted,
    LeaderElected,
)
from muster.projections.cluster import evolve
from muster.projections.resources import gpus_of, gpus_over
from muster.projections.state import ClusterState

__all__ = ["DemoStats", "Replayed", "render"]


@dataclass
class DemoStats:
    submitted: Counter[str] = field(default_factory=Counter)
    admitted: Counter[str] = field(default_factory=Counter)
    preempted: Counter[str] = field(default_factory=Counter)
    """Per victim's queue."""
    reasons: Counter[str] = field(default_factory=Counter)
    finished: Counter[str] = field(default_factory=Counter)
    failed: int = 0
    rejected: int = 0
    events: int = 0
    last_seq: int = 0
    leader: str = ""
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=8))

    def observe(self, state: ClusterState, seq: int, event: Event, accepted: bool) -> None:
        self.events += 1
        self.last_seq = seq
        if not accepted:
            return
        if isinstance(event, JobSubmitted):
            self.submitted[event.queue] += 1
        elif isinstance(event, JobAdmitted):
            self.admitted[event.queue] += 1
            nodes = len(set(event.placement.values()))
            gpus = state.jobs[event.job].gpus if event.job in state.jobs else 0
            lent = gpus_of(event.borrowed)  # `gpu`, or `gpu@FLAVOR` on flavors
            borrowed = f", borrowing {lent} GPUs" if lent else ""
            self.recent.append(f"[green]admitted[/] {_short(event.job)}: {gpus} GPUs on {nodes} node(s){borrowed}")
        elif isinstance(event, JobPreempted):
            job = state.jobs.get(event.job)
            self.preempted[job.queue if job is not None else "?"] += 1
            self.reasons[event.reason] += 1
            by = f" for {_short(event.preemptor)}" if event.preemptor else ""
            self.recent.append(f"[red]preempted[/] {_short(event.job)}{by} ({event.reason})")
        elif isinstance(event, JobFinished):
            job = state.jobs.get(event.job)
            self.finished[job.queue if job is not None else "?"] += 1
        elif isinstance(event, JobFailed):
            self.failed += 1
        elif isinstance(event, JobRejected):
            self.rejected += 1
        elif isinstance(event, LeaderElected):
            self.leader = f"{event.holder} (epoch {event.epoch})"


class Replayed:
    """The view's state and counts folded from the log itself, as the daemon's follower folds it (an event
    is accepted when the fold neither skipped nor fenced it): the demo's last frame, drawn from the whole log."""

    def __init__(self) -> None:
        self.state = ClusterState()
        self.stats = DemoStats()

    def step(self, seq: int, event: Event) -> None:
        state = self.state
        skipped, fenced = state.skipped, state.fenced
        try:
            evolve(state, event)
        except Exception:  # the daemon skips an event its fold raises on: so does its picture
            state.skipped += 1
        self.stats.observe(state, seq, event, state.skipped == skipped and state.fenced == fenced)


def _short(job: str | None) -> str:
    """`team-a/gang/team-a-g0012-1a2b3c4d` -> `team-a-g0012`."""
    if not job:
        return "-"
    name = job.rsplit("/", 1)[-1]
    head, _, tail = name.rpartition("-")
    return head if head and len(tail) == 8 else name


def _bar(used: int, total: int, width: int = 30) -> str:
    if total <= 0:
        return ""
    filled = round(width * min(used, total) / total)
    return "[cyan]" + "█" * filled + "[/]" + "·" * (width - filled)


def _utilization(busy: float, sampled: float) -> str:
    return f"{100 * busy / sampled:3.0f}%" if sampled else "  -"


def render(state: ClusterState, stats: DemoStats, *, elapsed: float, duration: float, speed: float) -> Any:
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table

    capacity = sum(n.capacity.get("gpu", 0) for n in state.nodes.values() if n.ready)
    # every GPU key: a queue on flavors holds `gpu@FLAVOR`, never plain `gpu`
    used = sum(gpus_of(q.usage) for q in state.queues.values())
    pending: Counter[str] = Counter()
    running: Counter[str] = Counter()
    sampled = busy = idle = 0.0
    idle_jobs = 0
    for job in state.jobs.values():
        if job.status == "pending":
            pending[job.queue] += 1
        elif job.status == "admitted":
            running[job.queue] += 1
            if job.utilization is not None:
                sampled += job.gpus
                busy += job.gpus * job.utilization
                if job.idle_since is not None:
                    idle_jobs += 1
                    idle += job.gpus

    table = Table(
        title="queues of cohort org",
        caption="GPUs: quota, used, borrowed; jobs: running, waiting, admitted, preempted, finished",
    )
    for col in ("queue", "quota", "used", "borrow", "run", "wait", "admit", "evict", "done"):
        table.add_column(col, justify="left" if col == "queue" else "right", no_wrap=True)
    for name, q in sorted(state.queues.items()):
        nominal = gpus_of(q.nominal)
        use = gpus_of(q.usage)
        borrowed = gpus_over(q.usage, q.nominal)
        table.add_row(
            name,
            str(nominal),
            str(use),
            f"[yellow]{borrowed}[/]" if borrowed else "0",
            str(running[name]),
            str(pending[name]),
            str(stats.admitted[name]),
            f"[red]{stats.preempted[name]}[/]" if stats.preempted[name] else "0",
            str(stats.finished[name]),
        )
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(stats.reasons.items())) or "none yet"
    header = (
        f"[bold]muster demo[/]  {elapsed:4.0f}/{duration:.0f} s  speed x{speed:g}  leader {stats.leader or '-'}\n"
        f"cluster  {used:4d}/{capacity} GPUs {_bar(used, capacity)}  nodes {len(state.nodes)}\n"
        f"DCGM     {_utilization(busy, sampled)} of the {sampled:.0f} measured allocated GPUs busy; "
        f"{idle_jobs} idle job(s) holding {idle:.0f} GPUs\n"
        f"log      {stats.last_seq} events  submitted {sum(stats.submitted.values())}  "
        f"admitted {sum(stats.admitted.values())}  finished {sum(stats.finished.values())}  "
        f"preemptions {sum(stats.reasons.values())} ({reasons})"
    )
    recent = "\n".join(stats.recent) or "(waiting for the first decision)"
    return Group(Panel(header), table, Panel(recent, title="latest decisions"))
