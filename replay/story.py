"""A job's story: one line per event that concerns it, read against the state just before that event.

Role: `Storyteller` folds every event in log order and writes the lines about
one job (its own events, preemptions it caused, failures and cordons of its
nodes, changes of its queue while it waits), so the numbers are those the
scheduler saw:
- inadmissible: the recorded reason plus the quota and capacity numbers then;
- admitted: nodes and topology domains, and whose unused quota it borrowed;
- preempted: by whom, the policy and why it allowed it, the work lost, and
  where the job was requeued;
- finished: work, total wait, preemptions.
For a job still pending at the end, the story closes with its `blockers`.

Pure: events and states in, lines out; no clock. `explain` feeds it from a log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from muster.events.types import (
    Event,
    GpuUtilizationSampled,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobHeld,
    JobInadmissible,
    JobPreempted,
    JobRejected,
    JobReleased,
    JobStarted,
    JobSubmitted,
    NodeCordoned,
    NodeRemoved,
    NodeUpdated,
    QueueConfigured,
    ReservationMade,
    ReservationReleased,
    SubmissionRejected,
)
from muster.projections.cluster import evolve, foreign_control
from muster.projections.resources import fmt
from muster.projections.state import DEFAULT_IDLE_THRESHOLD, ClusterState, JobState, reservation_of
from muster.replay.blockers import (
    blockers,
    capacity_numbers,
    numbers_text,
    quota_numbers,
    reservation_data,
    reservation_text,
)
from muster.replay.points import duration
from muster.replay.views import job_shape, priority_label, queue_order


@dataclass
class Line:
    """One step of the story."""

    seq: int
    at: int
    kind: str
    text: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Story:
    job: str
    lines: list[Line] = field(default_factory=list)
    status: str = "unknown"
    queue: str | None = None
    pending: dict[str, Any] | None = None
    """For a job pending at the end: position, blockers, what would have to change."""
    summary: dict[str, Any] = field(default_factory=dict)
    told_from: int = 0
    """The sequence whose state the story was folded on from (0: the start of the log)."""


def _lenders(state: ClusterState, queue: str, borrowed: dict[str, int]) -> list[str]:
    """Queues of the job's cohort tree with unused nominal quota of what it borrowed (before admission)."""
    root = state.cohort_root(queue)
    out = []
    for name in sorted(state.queues):
        if name == queue or state.cohort_root(name) != root:
            continue
        q = state.queues[name]
        spare = {}
        for r in borrowed:
            if r in q.nominal:
                s = q.nominal[r] - q.usage.get(r, 0)
                if q.lending_limit is not None and r in q.lending_limit:
                    s = min(s, q.lending_limit[r])
                if s > 0:
                    spare[r] = s
        if spare:
            out.append(f"{name} ({fmt(spare)} unused)")
    return out


def _domains(state: ClusterState, nodes: Sequence[str]) -> str:
    """`rack b0/r1`, `racks b0/r0, b0/r1`, or, when racks of one block, `block b0 (racks b0/r0, b0/r1)`:
    a gang that must stay in one block is seen to, at a glance."""
    levels = state.levels
    if not levels:
        return ""
    known = [state.nodes[n] for n in nodes if n in state.nodes]
    doms = sorted({"/".join(node.labels.get(lv, "?") for lv in levels) for node in known})
    label = levels[-1] + ("s" if len(doms) != 1 else "")
    inner = f"{label} {', '.join(doms)}"
    if len(doms) < 2:
        return inner
    # the innermost enclosing level whose one domain holds every node
    for depth in range(len(levels) - 1, 0, -1):
        outer = {"/".join(node.labels.get(lv, "?") for lv in levels[:depth]) for node in known}
        if len(outer) == 1:
            return f"{levels[depth - 1]} {outer.pop()} ({inner})"
    return inner


def _quota_text(ev: QueueConfigured) -> str:
    """A queue's quota as configured: `nominal gpu=64, borrowing limit gpu=32`, or per flavor of each
    resource group: `h100 nominal gpu=8; a100 nominal gpu=8, borrowing limit gpu=8`."""
    if not ev.resource_groups:
        text = f"nominal {fmt(ev.nominal)}"
        if ev.borrowing_limit is not None:
            text += f", borrowing limit {fmt(ev.borrowing_limit)}"
        return text
    parts = []
    for group in ev.resource_groups:
        for fq in group.flavors:
            part = f"{fq.name} nominal {fmt(fq.nominal)}"
            if fq.borrowing_limit is not None:
                part += f", borrowing limit {fmt(fq.borrowing_limit)}"
            parts.append(part)
    return "; ".join(parts)


def _preemption_why(state: ClusterState, ev: JobPreempted, victim: JobState) -> str:
    pre = state.jobs.get(ev.preemptor) if ev.preemptor else None
    if ev.reason == "NodeFailure":
        return "a node it ran on failed or left the cluster"
    if ev.reason == "IdleReclaim":
        policy = state.idle_reclaim
        threshold = policy.threshold if policy is not None else DEFAULT_IDLE_THRESHOLD
        # for how long, not since when: a raw event time reads as an epoch second in a cluster's log
        since = f" for {duration(ev.at - victim.idle_since)}" if victim.idle_since is not None else ""
        return (
            f"idle (GPU utilization at or under {threshold:.0%}{since}) while a pending job that comes before it "
            "needed its room; it waits behind the jobs pending then"
        )
    reason: str = ev.reason
    if pre is None:
        return reason
    pq = pre.queue
    if reason == "WithinQueue":
        if state.priority_of(pre) == state.priority_of(victim):
            # only LowerOrNewerEqualPriority evicts an equal: one that comes after the preemptor
            return (
                f"{pre.id}, of the same priority ({priority_label(state, pre)}) in the same queue, comes before "
                "it in the queue's order, and the queue's within_queue policy (LowerOrNewerEqualPriority) "
                "lets it evict an equal that comes after it"
            )
        return (
            f"{pre.id} has priority {priority_label(state, pre)} in the same queue, "
            f"above {priority_label(state, victim)}"
        )
    if ev.reason == "ReclaimWithinCohort":
        return f"queue {pq} takes back its nominal quota, which {victim.queue} was borrowing"
    if ev.reason == "BorrowWithinCohort":
        return f"{pq} borrows and may evict lower-priority borrowers ({priority_label(state, victim)})"
    if ev.reason == "FairSharing":
        return f"fair sharing: {victim.queue} used more than its share of the cohort, {pq} less"
    return reason


class Storyteller:
    """Feed every event in log order (`step`); it writes the lines about one job."""

    def __init__(self, job_id: str, state: ClusterState | None = None) -> None:
        self.job_id = job_id
        self.state = state if state is not None else ClusterState()
        self.story = Story(job_id)
        self.waiting_since: int | None = None
        self.lost = 0
        self.idle = False

    def _add(self, seq: int, at: int, kind: str, text: str, **data: Any) -> None:
        self.story.lines.append(Line(seq, at, kind, text, data))

    def step(self, seq: int, ev: Event) -> None:
        state, jid = self.state, self.job_id
        job = state.jobs.get(jid)
        mine = getattr(ev, "job", None) == jid
        if mine or (isinstance(ev, JobPreempted) and ev.preemptor == jid) or self._concerns(ev, job):
            self._before(seq, ev, job)
            evolve(state, ev)
            self._after(seq, ev, state.jobs.get(jid))
        else:
            evolve(state, ev)

    def _concerns(self, ev: Event, job: JobState | None) -> bool:
        if job is None:
            return False
        if isinstance(ev, (NodeUpdated, NodeRemoved, NodeCordoned)):
            return bool(job.status == "admitted" and ev.node in job.placement.values())
        if isinstance(ev, QueueConfigured):
            return bool(job.status == "pending" and ev.name == job.queue)
        return False

    def _before(self, seq: int, ev: Event, job: JobState | None) -> None:
        """The line an event adds, told on the state just before it (the numbers the scheduler saw)."""
        if isinstance(ev, JobSubmitted):
            self._submitted(seq, ev, job)
            return
        if job is None:
            return  # nothing but its submission concerns a job the log does not hold yet
        at = ev.at
        match ev:
            case JobCancelled() | JobHeld() | JobReleased() if (refused := foreign_control(self.state, ev)) is not None:
                self._add(seq, at, "ignored", f"ignored: {refused}", queue=ev.queue)
            case JobInadmissible():
                self._inadmissible(seq, ev, job)
            case JobRejected():
                self._add(seq, at, "rejected", f"rejected: {ev.reason}", reason=ev.reason)
            case JobAdmitted():
                self._admitted(seq, ev, job)
            case JobPreempted() if ev.job == self.job_id:
                self._preempted(seq, ev, job)
            case JobPreempted():  # this job is the preemptor
                self._evicted(seq, ev)
            case JobStarted():
                self._add(seq, at, "started", "every pod of the gang is running")
            case JobHeld():
                why = f": {ev.reason}" if ev.reason else ""
                self._add(seq, at, "held", f"held by a user{why}; it keeps its place and is not tried until released")
            case JobReleased():
                self._add(seq, at, "released", "released by a user: it is tried again in its place")
            case ReservationMade():
                self._reserved(seq, ev)
            case ReservationReleased():
                self._add(seq, at, "unreserved", f"its reservation released: {ev.reason}", reason=ev.reason)
            case SubmissionRejected():
                self._add(seq, at, "refused", f"a second submission of this id (queue {ev.queue}) refused: {ev.reason}")
            case JobFinished() | JobFailed() | JobCancelled():
                self._ended(seq, ev, job)
            case GpuUtilizationSampled():
                pass  # judged after the fold (idle transitions only)
            case NodeRemoved() | NodeUpdated(ready=False):
                self._add(seq, at, "node", f"node {ev.node}, which runs part of it, failed or left the cluster")
            case NodeCordoned():
                what = "cordoned (it keeps running there)" if ev.cordoned else "uncordoned"
                self._add(seq, at, "node", f"node {ev.node}, which runs part of it, was {what}")
            case QueueConfigured():
                self._add(seq, at, "queue", f"queue {ev.name} reconfigured: {_quota_text(ev)}")

    def _submitted(self, seq: int, ev: JobSubmitted, job: JobState | None) -> None:
        extras = []
        if ev.runtime is not None:
            extras.append(f"runtime {duration(ev.runtime)}")
        if ev.checkpoint_every:
            extras.append(f"checkpoint every {duration(ev.checkpoint_every)}")
        if ev.max_runtime is not None:
            extras.append(f"time limit {duration(ev.max_runtime)} per run")
        requests: dict[str, int] = {}
        for ps in ev.podsets:
            for k, v in ps.requests.items():
                requests[k] = requests.get(k, 0) + v * ps.count
        prio = self.state.priority_classes.get(ev.priority_class or "")
        if prio is not None:
            pl = f"priority {ev.priority_class} ({prio.value})"
        elif ev.priority_class is None:
            pl = f"no priority class (so the lowest, {self.state.lowest_priority()})"
        else:
            pl = f"priority {ev.priority_class}"
        shape = "+".join(f"{ps.count}x{ps.requests.get('gpu', 0)}" for ps in ev.podsets) or "no pods"
        topo = [
            f"{'required' if ps.topology.required else 'preferred'} {ps.topology.required or ps.topology.preferred}"
            for ps in ev.podsets
            if ps.topology is not None and (ps.topology.required or ps.topology.preferred)
        ]
        text = f"submitted to queue {ev.queue}: {requests.get('gpu', 0)} GPUs ({shape}), {pl}"
        if topo:
            text += f", topology {', '.join(topo)}"
        if extras:
            text += f", {', '.join(extras)}"
        if job is not None:
            text += " (a second submission of this id: the core refuses it, the job stays as it is)"
        self._add(seq, ev.at, "submitted", text, queue=ev.queue, gpus=requests.get("gpu", 0))
        self.waiting_since = ev.at
        self.story.queue = ev.queue

    def _inadmissible(self, seq: int, ev: JobInadmissible, job: JobState) -> None:
        state = self.state
        numbers = numbers_text(state, job)
        text = f"waits: {ev.reason}"
        if numbers:
            text += f" [{numbers}]"
        self._add(
            seq,
            ev.at,
            "inadmissible",
            text,
            reason=ev.reason,
            quota=quota_numbers(state, job),
            capacity=capacity_numbers(state, job),
        )

    def _admitted(self, seq: int, ev: JobAdmitted, job: JobState) -> None:
        state, at = self.state, ev.at
        nodes = sorted(set(ev.placement.values()))
        shown = ", ".join(nodes[:8]) + (f" and {len(nodes) - 8} more" if len(nodes) > 8 else "")
        where = _domains(state, nodes)
        waited = f" after waiting {duration(at - self.waiting_since)}" if self.waiting_since is not None else ""
        if ev.borrowed:
            lenders = _lenders(state, job.queue, ev.borrowed)
            cohort = state.queues[job.queue].cohort if job.queue in state.queues else None
            root = state.cohort_root(job.queue).removeprefix("cohort:")
            # the lenders are any of the tree's queues (`_lenders`), not only the queue's own cohort's
            tree = f" and its parents up to {root}" if cohort is not None and root != cohort else ""
            quota = f"borrowing {fmt(ev.borrowed)} from cohort {cohort}{tree}"
            if lenders:
                quota += f" (unused quota of {', '.join(lenders)})"
        else:
            quota = "within its queue's nominal quota"
        text = f"admitted{waited} on {len(nodes)} node{'s' if len(nodes) != 1 else ''} {shown}"
        if where:
            text += f" in {where}"
        on = sorted({f for chosen in (ev.flavors or {}).values() for f in chosen.values()})
        if on:
            text += f", on flavor{'s' if len(on) != 1 else ''} {', '.join(on)}"
        text += f"; {quota} (cycle {ev.cycle})"
        self._add(seq, at, "admitted", text, nodes=nodes, borrowed=dict(ev.borrowed), placement=dict(ev.placement))
        self.waiting_since = None

    def _preempted(self, seq: int, ev: JobPreempted, job: JobState) -> None:
        """This job is the victim: by whom, why the policy allowed it, and the work it lost."""
        state, at = self.state, ev.at
        why = _preemption_why(state, ev, job)
        by = ""
        if ev.preemptor:
            pre = state.jobs.get(ev.preemptor)
            pdesc = f"{pre.queue}, {priority_label(state, pre)}, {pre.gpus} GPUs" if pre is not None else "unknown"
            by = f" by {ev.preemptor} ({pdesc})"
        ran = f" after running {duration(at - job.admitted_at)}" if job.admitted_at is not None else ""
        lost = ev.lost_gpu_seconds
        self.lost += lost
        text = (
            f"preempted{by}{ran}: {ev.reason} — {why}; lost {lost:,} GPU-seconds "
            f"({lost / 3600:,.1f} GPU-hours) of work since its last checkpoint"
        )
        self._add(seq, at, "preempted", text, preemptor=ev.preemptor, reason=ev.reason, lost_gpu_seconds=lost)

    def _evicted(self, seq: int, ev: JobPreempted) -> None:
        """This job is the preemptor: whom it evicted."""
        state = self.state
        victim = state.jobs.get(ev.job)
        vdesc = f"{victim.queue}, {priority_label(state, victim)}, {victim.gpus} GPUs" if victim else "unknown"
        text = f"evicted {ev.job} ({vdesc}) to make room: {ev.reason}"
        self._add(seq, ev.at, "evicted", text, victim=ev.job, reason=ev.reason)

    def _reserved(self, seq: int, ev: ReservationMade) -> None:
        held = reservation_of(ev)
        self._add(seq, ev.at, "reserved", f"{reservation_text(held, ev.at)} ({ev.reason})", **reservation_data(held))

    def _ended(self, seq: int, ev: JobFinished | JobFailed | JobCancelled, job: JobState) -> None:
        """Finished, failed or cancelled: the work done, the whole wait, what preemptions cost."""
        at = ev.at
        kind = {JobFinished: "finished", JobFailed: "failed", JobCancelled: "cancelled"}[type(ev)]
        work = job.progress(at)
        if job.runtime is not None:
            work = min(work, job.runtime)
        total_wait = self._total_wait(at)
        text = f"{kind} after {duration(work)} of work"
        if job.first_admitted_at is not None:
            text += f", {duration(at - job.submitted_at)} after submission (waited {duration(total_wait)} in all)"
        if job.preemptions:
            text += f"; preempted {job.preemptions} time{'s' if job.preemptions != 1 else ''}"
            text += f", {self.lost:,} GPU-seconds lost"
        if isinstance(ev, JobFailed) and ev.reason:
            text += f": {ev.reason}"
        self._add(seq, at, kind, text, work_seconds=work, waited_seconds=total_wait)

    def _total_wait(self, at: int) -> int:
        """Seconds spent pending: submission to first admission, plus every requeue to readmission."""
        wait = 0
        since: int | None = None
        for line in self.story.lines:
            if line.kind in ("submitted", "requeued"):
                since = line.at
            elif line.kind == "admitted" and since is not None:
                wait += line.at - since
                since = None
        if since is not None:
            wait += at - since
        return wait

    def _after(self, seq: int, ev: Event, job: JobState | None) -> None:
        if job is None:
            return
        state = self.state
        if isinstance(ev, JobPreempted) and ev.job == self.job_id and job.status == "pending":
            order = queue_order(state, job.queue)
            pos = next((i for i, j in enumerate(order, start=1) if j.id == job.id), None)
            left = job.remaining()
            work = f"{duration(job.work_done)} of work saved" if job.work_done else "no work saved"
            if left is not None:
                work += f", {duration(left)} left"
            self._add(
                seq,
                ev.at,
                "requeued",
                f"requeued in {job.queue} at position {pos} of {len(order)}; {work}",
                position=pos,
                saved_seconds=job.work_done,
            )
            self.waiting_since = ev.at
        elif isinstance(ev, GpuUtilizationSampled) and ev.job == self.job_id:
            if job.idle_since is not None and not self.idle:
                self._add(seq, ev.at, "idle", f"GPU utilization {ev.gpu:.0%}: idle from now on")
                self.idle = True
            elif job.idle_since is None and self.idle:
                self._add(seq, ev.at, "busy", f"GPU utilization {ev.gpu:.0%}: busy again")
                self.idle = False
        if job.status != "admitted":
            self.idle = False

    def finish(self) -> Story:
        """Close the story: status, and for a pending job what it waits for."""
        state = self.state
        job = state.jobs.get(self.job_id)
        story = self.story
        if job is None:
            story.status = "unknown"
            return story
        story.status = job.status
        story.queue = job.queue
        story.summary = {
            "submitted_at": job.submitted_at,
            "first_admitted_at": job.first_admitted_at,
            "finished_at": job.finished_at,
            "preemptions": job.preemptions,
            "pending_since": job.pending_since() if job.status == "pending" else None,
            "lost_gpu_seconds": self.lost,
            "gpus": job.gpus,
            "shape": job_shape(job),
            "priority": state.priority_of(job),
            "priority_class": job.priority_class,
        }
        if job.status == "pending":
            story.pending = blockers(state, job)
        return story
