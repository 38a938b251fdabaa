"""What if the queues had been configured otherwise? A real log's jobs, run again through the core.

Role: take the submissions, cancellations and node changes of a window of a
real log and run them through the scheduler core in virtual time
(`simulator.simulate`, the code `muster sim` runs) with another queue
configuration, then compare per queue and per job with what really happened.

How the log becomes a scenario:
- time is rebased to the window start `t0` (sim time 0);
- the cluster at `t0` (nodes, cordons) is the scenario's cluster; jobs that
  were pending or running at `t0` are submitted at 0, in their submission
  order, with the work they still had to do;
- `JobSubmitted` in the window -> a submission at its time. Its runtime is
  the work it really did up to its `JobFinished`/`JobFailed` (admission to
  finish, plus work saved at checkpoints before a preemption), anywhere later
  in the log; else `JobSubmitted.runtime` when set (a declared runtime is an
  estimate, and `muster demo` runs jobs `--speed` times faster than they
  declare); a job that did neither runs until the end;
- `JobCancelled` -> a cancellation; node events -> the same node events;
  configuration events of a kind the new configuration does not replace ->
  the same events; cycle-0 rejections (input translation) -> the same;
- decisions, utilization samples (a property of the real run, so idle
  reclaim is not replayed) and leader changes are dropped.

The configuration it runs under is read by `whatifconfig`; both runs are measured the
same way and compared by `whatiftally`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from muster.events.types import (
    CohortConfigured,
    Event,
    FlavorConfigured,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobRejected,
    JobSubmitted,
    NodeAdded,
    NodeCordoned,
    NodeName,
    NodeRemoved,
    NodeUpdated,
    PriorityClassConfigured,
    QueueConfigured,
    SchedulerConfigured,
)
from muster.projections.cluster import evolve
from muster.projections.state import ClusterState
from muster.replay.heap import no_gc
from muster.replay.points import Point
from muster.replay.rebuild import state_before
from muster.replay.scenario import Scenario
from muster.replay.simulator import simulate
from muster.replay.snapshots import Snapshots
from muster.replay.source import LogSource
from muster.replay.timelinespec import Input
from muster.replay.whatifconfig import changed_queues, load_config, named_queues, queues_of
from muster.replay.whatiftally import JobTally, Side, Tally, WhatIf


def _node_events(state: ClusterState) -> list[Event]:
    out: list[Event] = []
    for name in sorted(state.nodes):
        n = state.nodes[name]
        out.append(
            NodeAdded(
                at=0,
                node=NodeName(name),
                labels=dict(n.labels),
                capacity=dict(n.capacity),
                reserved=dict(n.reserved),
                ready=n.ready,
                unschedulable=n.unschedulable,
            )
        )
    return out


async def whatif(
    source: LogSource,
    config_text: str,
    config_name: str = "<config>",
    *,
    start: Point | None = None,
    end: Point | None = None,
    snapshots: Snapshots | None = None,
) -> WhatIf:
    """Run the window [start, end] of the log again under the configuration; compare with reality."""
    last = await source.last_seq()
    before = await state_before(source, start, snapshots)
    state, from_seq = before.state, before.from_seq
    # read the rest of the log: the window, and beyond it the runtimes of jobs that end later
    window: list[tuple[int, Event]] = []
    later_ends: list[tuple[int, Event]] = []
    end_seq = last if end is None or end.seq is None else min(end.seq, last)
    end_time = end.time if end is not None else None
    async for batch in source.batches(from_seq, None):
        with no_gc():  # not across the read (see `no_gc`)
            for seq, read in batch:
                if seq <= end_seq and (end_time is None or read.at <= end_time):
                    window.append((seq, read))
                elif isinstance(read, (JobFinished, JobFailed, JobAdmitted, JobPreempted)):
                    later_ends.append((seq, read))
    if start is not None and start.time is not None:
        t0 = start.time
    else:
        t0 = window[0][1].at if window else state.now
    t1 = end_time if end_time is not None else (window[-1][1].at if window else t0)
    bounded = end is not None and not end.is_end

    start_state = msgspec.msgpack.decode(msgspec.msgpack.encode(state), type=ClusterState)

    # reality: fold the window, measuring; note each job's runtime when it ends (also after the window)
    real = Tally(t0)
    real.seed(state)
    runtimes: dict[str, int] = {}
    for _, ev in window:
        real.advance(max(ev.at, t0))
        evolve(state, ev)
        if isinstance(ev, (JobFinished, JobFailed)) and ev.job in state.jobs:
            runtimes[ev.job] = state.jobs[ev.job].work_done
        real.feed(ev)
    real.advance(t1)
    for _, ev in later_ends:
        evolve(state, ev)
        if isinstance(ev, (JobFinished, JobFailed)) and ev.job in state.jobs:
            runtimes.setdefault(ev.job, state.jobs[ev.job].work_done)

    # sections the file leaves out come from the log as configured at the window's end
    config, replaced = load_config(config_text, config_name, state)
    scenario = _scenario(config, start_state, window, runtimes, replaced, t0, (t1 - t0) if bounded else None)
    alt = Tally(0)
    for job in sorted(start_state.jobs.values(), key=lambda j: j.seq):
        if job.status in ("pending", "admitted"):
            alt.jobs[job.id] = JobTally(job.queue, job.gpus, 0, in_window=False)

    def on_event(ev: Event) -> None:
        alt.advance(ev.at)
        if isinstance(ev, JobSubmitted) and ev.job in alt.jobs and not alt.jobs[ev.job].in_window:
            return
        alt.feed(ev)

    result = simulate(scenario, on_event=on_event, keep_events=False)
    alt.advance(result.end)
    notes = []
    kept = sorted(set(state.queues) - named_queues(config_text))
    if kept:
        notes.append(f"queues the configuration does not name keep the log's configuration: {', '.join(kept)}")
    if not runtimes and any(isinstance(ev, JobSubmitted) and ev.runtime is None for _, ev in window):
        notes.append("no job finished in the log: jobs without a declared runtime run until the end")
    changed = changed_queues(state, config)
    return WhatIf(
        real=Side(real, t0, t1 if bounded else max(t1, real.last)),
        alt=Side(alt, 0, result.end),
        t0=t0,
        from_seq=from_seq,
        to_seq=window[-1][0] if window else from_seq - 1,
        queues_changed=changed,
        notes=notes,
    )


def _scenario(
    config: list[Event],
    state: ClusterState,
    window: list[tuple[int, Event]],
    runtimes: dict[str, int],
    replaced: set[str],
    t0: int,
    until: int | None,
) -> Scenario:
    inputs: list[Input] = []
    order = 0

    def add(at: int, kind: str, data: dict[str, Any]) -> None:
        nonlocal order
        inputs.append(Input(max(0, at - t0), order, kind, data))
        order += 1

    # the cluster's nodes as they were at t0; cordons as inputs at 0
    config = [*config, *_node_events(state)]
    for name in sorted(state.nodes):
        if state.nodes[name].cordoned:
            add(t0, "event", {"event": NodeCordoned(at=0, node=NodeName(name), cordoned=True)})
    # work in flight at t0, in submission order
    for job in sorted(state.jobs.values(), key=lambda j: j.seq):
        if job.status not in ("pending", "admitted"):
            continue
        total = runtimes.get(job.id, job.runtime)
        remaining = None if total is None else max(1, total - job.progress(t0))
        add(
            t0,
            "submit",
            _submit(
                job.id, job.queue, job.priority_class, job.podsets, remaining, job.checkpoint_every, job.max_runtime
            ),
        )
    for _, ev in window:
        if isinstance(ev, JobSubmitted):
            runtime = runtimes.get(ev.job, ev.runtime)
            add(
                ev.at,
                "submit",
                _submit(ev.job, ev.queue, ev.priority_class, ev.podsets, runtime, ev.checkpoint_every, ev.max_runtime),
            )
        elif isinstance(ev, JobCancelled):
            add(ev.at, "cancel", {"name": ev.job})
        elif (
            isinstance(ev, (NodeAdded, NodeUpdated, NodeRemoved, NodeCordoned))
            or (isinstance(ev, JobRejected) and ev.cycle == 0)
            or (
                isinstance(
                    ev,
                    (QueueConfigured, CohortConfigured, PriorityClassConfigured, FlavorConfigured, SchedulerConfigured),
                )
                and type(ev).__name__ not in replaced
            )
        ):
            add(ev.at, "event", {"event": ev})
    inputs.sort(key=lambda i: (i.at, i.order))
    queues: dict[str, QueueConfigured] = {q.name: q for q in queues_of(config)}
    nodes: dict[str, NodeAdded] = {e.node: e for e in config if isinstance(e, NodeAdded)}
    return Scenario("whatif", config, inputs, until, list(state.levels), queues, nodes)


def _submit(
    job: str,
    queue: str,
    priority_class: str | None,
    podsets: Any,
    runtime: int | None,
    checkpoint_every: int | None,
    max_runtime: int | None,
) -> dict[str, Any]:
    return {
        "job": job,
        "queue": queue,
        "priority_class": priority_class,
        "podsets": list(podsets),
        "runtime": runtime,
        "checkpoint_every": checkpoint_every,
        "max_runtime": max_runtime,
    }
