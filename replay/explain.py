"""A job's story from the log, and, for a waiting job, what would have to change for it to run.

Role: fold the log once and write one line per event that concerns the job
(its own events, preemptions it caused, failures and cordons of its nodes,
changes of its queue while it waits), each read against the state just
before that event, so the numbers are those the scheduler saw:
- inadmissible: the recorded reason plus the quota and capacity numbers then;
- admitted: nodes and topology domains, and whose unused quota it borrowed;
- preempted: by whom, the policy and why it allowed it, the work lost, and
  where the job was requeued;
- finished: work, total wait, preemptions.

For a job still pending at the end, `blockers` computes from the state: its
position in its queue and the jobs ahead, the quota shortfall in numbers,
the free GPUs in the best topology domain, and whether preemption could
make room (the core's own `find_victims` on a throwaway cycle).

`Storyteller` is pure (events and states in, lines out; no clock); `explain` feeds it from a log,
in an archived log from the state sealed before the job's submission (`replay.sealedstate`).
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
from muster.projections.cluster import (
    DEFAULT_IDLE_THRESHOLD,
    ClusterState,
    JobState,
    Reservation,
    evolve,
    foreign_control,
)
from muster.projections.queueing import STRICT_FIFO
from muster.projections.resources import fmt
from muster.replay.points import Point, duration
from muster.replay.rebuild import state_at
from muster.replay.sealedstate import Sealed, nearest_sealed
from muster.replay.snapshotcodec import no_gc
from muster.replay.source import ArchivedLog, LogSource
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


# ---------------------------------------------------------------- numbers the scheduler saw


def quota_numbers(state: ClusterState, job: JobState) -> dict[str, Any]:
    """Per quota-limited resource of the job: queue usage, nominal, what the cohort could give, the shortfall."""
    from muster.projections.quota import QuotaTree

    out: dict[str, Any] = {}
    queue = state.queues.get(job.queue)
    if queue is None:
        return out
    tree = QuotaTree(state)
    node = tree.queues.get(job.queue)
    if node is None:
        return out
    allow_borrow = state.preemptible(job)
    for r in sorted(job.requests):
        need = job.requests[r]
        if need <= 0 or r not in queue.nominal:
            continue
        used = queue.usage.get(r, 0)
        available = tree.available(node, r)
        if not allow_borrow:
            available = min(available, queue.nominal[r] - used)
        out[r] = {
            "requested": need,
            "used": used,
            "nominal": queue.nominal[r],
            "available": max(0, available),
            "short": max(0, need - max(0, available)),
            "borrowing_limit": (queue.borrowing_limit or {}).get(r),
        }
    return out


def capacity_numbers(state: ClusterState, job: JobState) -> list[dict[str, Any]]:
    """Per podset: the topology level it must (or would like to) fit in, and the best domain there."""
    from muster.projections.topology import TopologyIndex

    topo = TopologyIndex(state)
    out = []
    for ps in job.podsets:
        level = None
        required = False
        if ps.topology is not None and ps.topology.required:
            level, required = ps.topology.required, True
        elif ps.topology is not None and ps.topology.preferred:
            level = ps.topology.preferred
        depth = topo.level_depth(level) if level is not None else None
        gpu = ps.requests.get("gpu", 0)
        item: dict[str, Any] = {"podset": ps.name, "pods": ps.count, "per_pod": dict(ps.requests)}
        total = sum(topo.slots(d, ps.requests, ps.count) for d in topo.by_level[0]) if topo.by_level[0] else 0
        item["cluster_free_gpus"] = max(0, topo.root.free.get("gpu", 0))
        item["cluster_room_pods"] = min(total, ps.count) if ps.count else 0
        if required and depth is not None:
            doms = topo.by_level[depth - 1]
            best = None
            best_key: tuple[int, int] | None = None
            for d in doms:
                key = (topo.slots(d, ps.requests, ps.count), d.free.get("gpu", 0))
                if best_key is None or key > best_key:
                    best, best_key = d, key
            item["level"] = level
            if best is not None and best_key is not None:
                item["best_domain"] = "/".join(best.path)
                item["best_room_pods"] = best_key[0]
                item["best_free_gpus"] = max(0, best_key[1])
                missing = max(0, ps.count - best_key[0])
                item["missing_gpus"] = missing * gpu
        else:
            item["level"] = level
            item["missing_gpus"] = max(0, ps.count - item["cluster_room_pods"]) * gpu
        out.append(item)
    return out


def numbers_text(state: ClusterState, job: JobState) -> str:
    """A short account of what blocks a job now: quota and capacity in numbers."""
    parts = []
    for r, q in quota_numbers(state, job).items():
        text = f"queue {job.queue} uses {q['used']:,} of {q['nominal']:,} nominal {r}"
        if q["short"]:
            text += f", {q['available']:,} more available to it, {q['requested']:,} asked: short by {q['short']:,}"
        parts.append(text)
    for c in capacity_numbers(state, job):
        if c.get("best_domain") is not None:
            parts.append(
                f"best {c['level']} {c['best_domain']} has {c['best_free_gpus']:,} free GPUs "
                f"(room for {c['best_room_pods']} of {c['pods']} pods)"
            )
        else:
            parts.append(
                f"{c['cluster_free_gpus']:,} GPUs free in the cluster (room for {c['cluster_room_pods']} of "
                f"{c['pods']} pods)"
            )
    return "; ".join(parts)


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
    levels = state.levels
    if not levels:
        return ""
    doms = sorted({"/".join(state.nodes[n].labels.get(lv, "?") for lv in levels) for n in nodes if n in state.nodes})
    label = levels[-1] + ("s" if len(doms) != 1 else "")
    return f"{label} {', '.join(doms)}"


def _preemption_why(state: ClusterState, ev: JobPreempted, victim: JobState) -> str:
    pre = state.jobs.get(ev.preemptor) if ev.preemptor else None
    if ev.reason == "NodeFailure":
        return "a node it ran on failed or left the cluster"
    if ev.reason == "IdleReclaim":
        policy = state.idle_reclaim
        threshold = policy.threshold if policy is not None else DEFAULT_IDLE_THRESHOLD
        since = f" since {victim.idle_since}" if victim.idle_since is not None else ""
        return f"idle (GPU utilization at or under {threshold:.0%}{since}) while a pending job could use its room"
    reason: str = ev.reason
    if pre is None:
        return reason
    pq = pre.queue
    if reason == "WithinQueue":
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


# ---------------------------------------------------------------- the story


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
        state = self.state
        at = ev.at
        if isinstance(ev, JobSubmitted) and ev.job == self.job_id:
            extras = []
            if ev.runtime is not None:
                extras.append(f"runtime {duration(ev.runtime)}")
            if ev.checkpoint_every:
                extras.append(f"checkpoint every {duration(ev.checkpoint_every)}")
            requests: dict[str, int] = {}
            for ps in ev.podsets:
                for k, v in ps.requests.items():
                    requests[k] = requests.get(k, 0) + v * ps.count
            prio = state.priority_classes.get(ev.priority_class or "")
            pl = f"{ev.priority_class} ({prio.value})" if prio else (ev.priority_class or "the lowest priority")
            shape = "+".join(f"{ps.count}x{ps.requests.get('gpu', 0)}" for ps in ev.podsets) or "no pods"
            topo = [
                f"{'required' if ps.topology.required else 'preferred'} {ps.topology.required or ps.topology.preferred}"
                for ps in ev.podsets
                if ps.topology is not None and (ps.topology.required or ps.topology.preferred)
            ]
            text = f"submitted to queue {ev.queue}: {requests.get('gpu', 0)} GPUs ({shape}), priority {pl}"
            if topo:
                text += f", topology {', '.join(topo)}"
            if extras:
                text += f", {', '.join(extras)}"
            if job is not None:
                text += " (a second submission of this id: the core refuses it, the job stays as it is)"
            self._add(seq, at, "submitted", text, queue=ev.queue, gpus=requests.get("gpu", 0))
            self.waiting_since = at
            self.story.queue = ev.queue
            return
        if job is None:
            return
        if isinstance(ev, (JobCancelled, JobHeld, JobReleased)) and ev.job == self.job_id:
            refused = foreign_control(state, ev)
            if refused is not None:
                self._add(seq, at, "ignored", f"ignored: {refused}", queue=ev.queue)
                return
        if isinstance(ev, JobInadmissible):
            numbers = numbers_text(state, job)
            text = f"waits: {ev.reason}"
            if numbers:
                text += f" [{numbers}]"
            self._add(
                seq,
                at,
                "inadmissible",
                text,
                reason=ev.reason,
                quota=quota_numbers(state, job),
                capacity=capacity_numbers(state, job),
            )
        elif isinstance(ev, JobRejected):
            self._add(seq, at, "rejected", f"rejected: {ev.reason}", reason=ev.reason)
        elif isinstance(ev, JobAdmitted) and ev.job == self.job_id:
            nodes = sorted(set(ev.placement.values()))
            shown = ", ".join(nodes[:8]) + (f" and {len(nodes) - 8} more" if len(nodes) > 8 else "")
            where = _domains(state, nodes)
            waited = f" after waiting {duration(at - self.waiting_since)}" if self.waiting_since is not None else ""
            if ev.borrowed:
                lenders = _lenders(state, job.queue, ev.borrowed)
                cohort = state.queues[job.queue].cohort if job.queue in state.queues else None
                quota = f"borrowing {fmt(ev.borrowed)} from cohort {cohort}"
                if lenders:
                    quota += f" (unused quota of {', '.join(lenders)})"
            else:
                quota = "within its queue's nominal quota"
            text = f"admitted{waited} on {len(nodes)} node{'s' if len(nodes) != 1 else ''} {shown}"
            if where:
                text += f" in {where}"
            text += f"; {quota} (cycle {ev.cycle})"
            self._add(seq, at, "admitted", text, nodes=nodes, borrowed=dict(ev.borrowed), placement=dict(ev.placement))
            self.waiting_since = None
        elif isinstance(ev, JobPreempted) and ev.job == self.job_id:
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
            self._add(
                seq,
                at,
                "preempted",
                text,
                preemptor=ev.preemptor,
                reason=ev.reason,
                lost_gpu_seconds=lost,
            )
        elif isinstance(ev, JobPreempted) and ev.preemptor == self.job_id:
            victim = state.jobs.get(ev.job)
            vdesc = f"{victim.queue}, {priority_label(state, victim)}, {victim.gpus} GPUs" if victim else "unknown"
            self._add(
                seq,
                at,
                "evicted",
                f"evicted {ev.job} ({vdesc}) to make room: {ev.reason}",
                victim=ev.job,
                reason=ev.reason,
            )
        elif isinstance(ev, JobStarted):
            self._add(seq, at, "started", "every pod of the gang is running")
        elif isinstance(ev, JobHeld):
            why = f": {ev.reason}" if ev.reason else ""
            self._add(seq, at, "held", f"held by a user{why}; it keeps its place and is not tried until released")
        elif isinstance(ev, JobReleased):
            self._add(seq, at, "released", "released by a user: it is tried again in its place")
        elif isinstance(ev, ReservationMade):
            held = Reservation(
                job=ev.job,
                queue=ev.queue,
                nodes=list(ev.nodes),
                domain=ev.domain,
                since=at,
                expected_start=ev.expected_start,
                waits_for=list(ev.waits_for),
                reason=ev.reason,
            )
            self._add(seq, at, "reserved", f"{reservation_text(held, at)} ({ev.reason})", **reservation_data(held))
        elif isinstance(ev, ReservationReleased):
            self._add(seq, at, "unreserved", f"its reservation released: {ev.reason}", reason=ev.reason)
        elif isinstance(ev, SubmissionRejected):
            self._add(seq, at, "refused", f"a second submission of this id (queue {ev.queue}) refused: {ev.reason}")
        elif isinstance(ev, (JobFinished, JobFailed, JobCancelled)):
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
        elif isinstance(ev, GpuUtilizationSampled):
            pass  # judged after the fold (idle transitions only)
        elif isinstance(ev, (NodeUpdated, NodeRemoved)):
            down = isinstance(ev, NodeRemoved) or not ev.ready
            if down:
                self._add(seq, at, "node", f"node {ev.node}, which runs part of it, failed or left the cluster")
        elif isinstance(ev, NodeCordoned):
            what = "cordoned (it keeps running there)" if ev.cordoned else "uncordoned"
            self._add(seq, at, "node", f"node {ev.node}, which runs part of it, was {what}")
        elif isinstance(ev, QueueConfigured):
            text = f"queue {ev.name} reconfigured: nominal {fmt(ev.nominal)}"
            if ev.borrowing_limit is not None:
                text += f", borrowing limit {fmt(ev.borrowing_limit)}"
            self._add(seq, at, "queue", text)

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
            "lost_gpu_seconds": self.lost,
            "gpus": job.gpus,
            "shape": job_shape(job),
            "priority": state.priority_of(job),
            "priority_class": job.priority_class,
        }
        if job.status == "pending":
            story.pending = blockers(state, job)
        return story


async def explain(source: LogSource, job: str, point: Point) -> tuple[Story, int]:
    """Fold the log up to `point`, telling `job`'s story; returns (story, time of the last event folded)."""
    last = await source.last_seq()
    end = point.seq if point.seq is not None else last
    start = await _before_submission(source, job, end, point.time) if isinstance(source, ArchivedLog) else None
    teller = Storyteller(job, start.state if start is not None else None)
    teller.story.told_from = start.seq if start is not None else 0
    with no_gc():
        async for batch in source.batches(teller.story.told_from + 1, end, until=point.time):
            for seq, ev in batch:
                teller.step(seq, ev)
    return teller.finish(), teller.state.now


async def _before_submission(log: ArchivedLog, job: str, end: int, until: int | None) -> Sealed | None:
    """The state sealed in the archive before `job` was submitted (its story starts after it), or None.

    Every event of the job's story comes at or after its submission, whose time the state at the
    point holds: a state sealed at an earlier time precedes all of them.
    """
    at_point = await state_at(log, Point(seq=end, time=until))
    found = at_point.state.jobs.get(job)
    if found is None:
        return None
    sealed = await nearest_sealed(log, max_seq=end, max_time=found.submitted_at - 1)
    return sealed if sealed.seq else None


def blockers(state: ClusterState, job: JobState) -> dict[str, Any]:
    """Why a pending job waits now, in numbers, and what would have to change for it to run."""
    order = queue_order(state, job.queue)
    pos = next((i for i, j in enumerate(order, start=1) if j.id == job.id), None)
    ahead = [{"job": j.id, "gpus": j.gpus, "priority": state.priority_of(j)} for j in order[: (pos or 1) - 1]]
    quota = quota_numbers(state, job)
    capacity = capacity_numbers(state, job)
    changes: list[str] = []
    for r, q in quota.items():
        if not q["short"]:
            continue
        limit = q["nominal"] + q["borrowing_limit"] if q["borrowing_limit"] is not None else None
        if q["requested"] > q["nominal"] and not state.preemptible(job):
            changes.append(
                f"quota: a non-preemptible job never borrows; {job.queue}'s nominal {r} must grow from "
                f"{q['nominal']:,} to at least {q['used'] + q['requested']:,}"
            )
        elif limit is not None and q["requested"] > limit:
            changes.append(
                f"quota: it asks {q['requested']:,} {r}, more than {job.queue} may ever use ({limit:,}); "
                "the queue's nominal quota or borrowing limit must grow"
            )
        else:
            changes.append(
                f"quota: {q['short']:,} more {r} must be free for {job.queue} (it uses {q['used']:,} of "
                f"{q['nominal']:,} nominal; {q['available']:,} available to it now, {q['requested']:,} needed): "
                "jobs of its queue or cohort must finish, or its quota grow"
            )
    for c in capacity:
        if not c.get("missing_gpus"):
            continue
        if c.get("best_domain") is not None:
            changes.append(
                f"capacity: no {c['level']} has room for {c['pods']} pods of {fmt(c['per_pod'])}; the best, "
                f"{c['best_domain']}, has {c['best_free_gpus']:,} free GPUs (room for {c['best_room_pods']}): "
                f"{c['missing_gpus']:,} more GPUs must be free there"
            )
        else:
            changes.append(
                f"capacity: the cluster has room for {c['cluster_room_pods']} of {c['pods']} pods of "
                f"{fmt(c['per_pod'])}: {c['missing_gpus']:,} more GPUs must be free on schedulable nodes"
            )
    queue_state = state.queues.get(job.queue)
    if queue_state is not None and queue_state.queueing_strategy == STRICT_FIFO and pos is not None and pos > 1:
        changes.insert(
            0,
            f"strict_fifo: {order[0].id}, the head of {job.queue}, must be admitted first "
            "(no job behind it is admitted while it waits)",
        )
    reservation = state.reservations.get(job.id)
    if reservation is not None:
        changes.insert(0, f"{reservation_text(reservation, state.now)}: no job that would delay it is placed there")
    others = [o for o in sorted(state.reservations.values(), key=lambda o: o.job) if o.job != job.id]
    for other in others:
        if job.max_runtime is None:
            verdict = "a job without a limit never backfills"
        elif other.expected_start is not None and state.now + job.max_runtime <= other.expected_start:
            verdict = "its limit ends in time to use it"
        else:
            verdict = "its limit ends too late to use it"
        changes.append(f"reserved room: {', '.join(other.nodes)} held for {other.job}; {verdict}")
    victims = _victims(state, job)
    if victims.get("victims"):
        changes.append(
            "preemption: evicting "
            + ", ".join(v["job"] for v in victims["victims"])
            + " would make room; the next scheduling cycle does so"
        )
    elif victims.get("policy") == "Never":
        changes.append(f"preemption: {job.queue}'s policy lets it evict nothing (within_queue and cohort: Never)")
    elif victims.get("candidate_gpus") is not None and (quota or capacity) and changes:
        changes.append(
            f"preemption cannot help: the jobs its policy may evict hold {victims['candidate_gpus']:,} GPUs, "
            "not enough to make room"
        )
    if not changes:
        changes.append(
            "nothing visible blocks it now: it should be admitted by the next scheduling cycle "
            f"(last reason: {job.reason or 'none recorded'})"
        )
    return {
        "position": pos,
        "queue_length": len(order),
        "ahead": ahead,
        "reason": job.reason,
        "quota": quota,
        "capacity": capacity,
        "preemption": victims,
        "reservation": reservation_data(reservation) if reservation is not None else None,
        "what_would_have_to_change": changes,
    }


def reservation_text(r: Reservation, now: int) -> str:
    """`reserved b1/r3 since 1h 02m; waiting for 3 jobs to end, expected in 1h 08m`."""
    where = r.domain or ", ".join(r.nodes[:6]) + (f" +{len(r.nodes) - 6} more" if len(r.nodes) > 6 else "")
    text = f"reserved {where}"
    if now > r.since:
        text += f" since {duration(now - r.since)} ago"
    n = len(r.waits_for)
    if not n:
        return text + "; its room is free (it waits for quota)"
    ends = [f"{w.job} {_end_text(w.end, now)}" for w in r.waits_for[:5]]
    more = f" +{n - 5} more" if n > 5 else ""
    text += f"; waiting for {n} job{'s' if n != 1 else ''} to end ({', '.join(ends)}{more})"
    if r.expected_start is None:
        return text + ", one without a declared limit (start unknown)"
    if r.expected_start <= now:
        return text + f", expected {duration(now - r.expected_start)} ago"
    return text + f", expected in {duration(r.expected_start - now)}"


def _end_text(end: int | None, now: int) -> str:
    if end is None:
        return "with no limit"
    return f"in {duration(end - now)}" if end > now else "now"


def reservation_data(r: Reservation) -> dict[str, Any]:
    return {
        "nodes": list(r.nodes),
        "domain": r.domain,
        "since": r.since,
        "expected_start": r.expected_start,
        "waits_for": [{"job": w.job, "expected_end": w.end} for w in r.waits_for],
    }


def _victims(state: ClusterState, job: JobState) -> dict[str, Any]:
    """What the core's own victim search finds for the job now (on a cycle that is undone)."""
    from muster.projections.eviction import evicts_nothing

    queue = state.queues.get(job.queue)
    if queue is None:
        return {}
    if evicts_nothing(queue.preemption) and not state.fair_sharing:
        return {"policy": "Never"}
    from muster.projections.index import index_of
    from muster.projections.preemption import find_victims
    from muster.projections.scheduler import Cycle

    try:
        idx = index_of(state)
        cycle = Cycle(state, idx, state.now)
        try:
            result = find_victims(cycle, job, state.preemptible(job))
        finally:
            cycle.finish()
    except Exception as exc:  # explaining must not fail on a state the core finds odd
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "victims": [{"job": v.job.id, "queue": v.job.queue, "reason": v.reason} for v in result.victims],
        "candidate_gpus": result.candidate_gpus,
    }
