"""The scheduling policy: `decide(state, now) -> events`, pure and deterministic.

One call is one scheduling cycle. It reads like Kueue's `schedule()`:

1. sync the derived index (topology, quota tree, queues) with the state;
2. reject jobs whose spec is invalid (`JobRejected`);
3. evict jobs that lost a node (`JobPreempted`, reason NodeFailure);
4. heads: the first job to try of every queue, in admission order: jobs that
   fit within their queue's nominal quota first (judged when tried), then the
   lowest fair share (with fair sharing), then higher priority, then FIFO;
5. for each head: admit the whole gang if quota and placement allow; else
   find a minimal set of victims the policies allow (`JobPreempted`; the
   preemptor is admitted by a later cycle at the same instant); else explain
   why it waits (`JobInadmissible`, only when the reason changed) and park it;
6. reclaim jobs idle for long enough when a pending job could use their room;
7. undo every tentative change: the state is left exactly as it was found.

The caller folds the returned events and calls again while a cycle admits or
preempts something (`muster sim` and the daemon do so).

Nothing here reads a clock: time is `now`. Iteration is over sorted keys.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from muster.events.types import Event, JobAdmitted, JobInadmissible, JobPreempted, JobRejected
from muster.projections.cluster import ClusterState, JobState
from muster.projections.index import SchedulerIndex, index_of, take_new_jobs
from muster.projections.preemption import Victim, find_victims
from muster.projections.resources import fmt
from muster.projections.topology import Transaction

POLICY_VERSION = "muster/1"


class Cycle:
    """One scheduling cycle's tentative view: the index plus undo logs."""

    def __init__(self, state: ClusterState, idx: SchedulerIndex, now: int) -> None:
        self.state = state
        self.idx = idx
        self.now = now
        self.number = state.cycle + 1
        self.epoch = state.epoch
        self.topo = Transaction(idx.topology)
        self.quota_mark = idx.quota.mark()
        self.tried: set[str] = set()
        self.removed: set[str] = set()
        """Jobs evicted (tentatively) in this cycle."""
        self.placed: dict[str, dict[str, str]] = {}
        """Jobs admitted or reserved (tentatively) in this cycle, with their placement."""
        self.tentative = False
        """Whether the view differs from the state (something was taken or given back)."""
        self.parked_on_tentative: list[str] = []
        """Jobs parked after a tentative change: their verdict may not hold for the state."""
        self.events: list[Event] = []

    # ------------------------------------------------------------ tentative changes

    def remove(self, job: JobState) -> None:
        """Evict a running job tentatively: give back its node and quota usage."""
        per_podset = {ps.name: ps.requests for ps in job.podsets}
        for pod, node in job.placement.items():
            self.topo.give(node, per_podset[pod.rsplit("-", 1)[0]])
        self.idx.quota.add(job.queue, job.requests, -1)
        self.removed.add(job.id)
        self.tentative = True

    def restore(self, job: JobState) -> None:
        """Undo `remove` (used while minimising a victim set)."""
        per_podset = {ps.name: ps.requests for ps in job.podsets}
        for pod, node in job.placement.items():
            self.topo.take(node, per_podset[pod.rsplit("-", 1)[0]])
        self.idx.quota.add(job.queue, job.requests, 1)
        self.removed.discard(job.id)

    def place(self, job: JobState) -> tuple[dict[str, str] | None, str]:
        """Place every podset (taking the capacity); on failure take nothing and say why."""
        mark = self.topo.mark()
        placement: dict[str, str] = {}
        topology = self.idx.topology
        for ps in job.podsets:
            t = ps.topology
            nodes, why = topology.place(
                ps.count, ps.requests, t.required if t is not None else None, t.preferred if t is not None else None
            )
            if nodes is None:
                self.topo.rollback(mark)
                prefix = f"podset {ps.name}: " if len(job.podsets) > 1 else ""
                return None, f"{prefix}{why}"
            for i, node in enumerate(nodes):
                self.topo.take(node, ps.requests)
                placement[f"{ps.name}-{i}"] = node
        return placement, ""

    def fits(self, job: JobState, allow_borrow: bool) -> bool:
        """Whether the job fits quota and nodes now (leaves nothing taken)."""
        if not self.idx.quota.fits(job.queue, job.requests, allow_borrow):
            return False
        if not self.could_place(job):
            return False
        mark = self.topo.mark()
        placement, _ = self.place(job)
        self.topo.rollback(mark)
        return placement is not None

    def could_place(self, job: JobState) -> bool:
        """A cheap necessary condition for placement: enough free GPUs in the whole cluster."""
        free: int = self.idx.topology.gpu_free_total
        need: int = job.gpus
        return need <= free

    def take(self, job: JobState, placement: Mapping[str, str]) -> None:
        """Account a job's quota usage (its nodes were taken by `place`)."""
        self.idx.quota.add(job.queue, job.requests, 1)
        self.placed[job.id] = dict(placement)
        self.tentative = True

    def finish(self) -> None:
        """Undo every tentative change; jobs judged on the changed view are tried again next time.

        Jobs parked before any change were judged on the state itself, so their
        verdict stands whether or not the caller folds this cycle's events.
        """
        self.topo.rollback()
        self.idx.quota.rollback(self.quota_mark)
        for job_id in self.parked_on_tentative:
            self.idx.unpark(job_id, state=self.state)

    # ------------------------------------------------------------ events

    def preempt(self, victim: Victim, preemptor: str | None) -> None:
        job = victim.job
        self.events.append(
            JobPreempted(
                at=self.now,
                job=job.id,
                preemptor=preemptor,
                reason=victim.reason,
                lost_gpu_seconds=job.lost_gpu_seconds(self.now),
                cycle=self.number,
                epoch=self.epoch,
            )
        )
        self.remove(job)


def _lowest_key(cycle: Cycle, job: JobState) -> tuple[int, int, int, int]:
    """Admission order: within nominal first, then fair share, then priority, then FIFO."""
    quota = cycle.idx.quota
    borrows = 0 if quota.within_nominal(job.queue, job.requests) else 1
    share = quota.share(job.queue, job.requests) if cycle.state.fair_sharing else 0
    return (borrows, share, -cycle.state.priority_of(job), job.seq)


def _try(cycle: Cycle, job: JobState) -> str:
    """Admit, preempt for, or park one job. Returns what happened."""
    state, idx = cycle.state, cycle.idx
    preemptible = state.preemptible(job)
    # non-preemptible work never borrows, so no guarantee depends on evicting it
    allow_borrow = preemptible
    quota_reason = idx.quota.blocking(job.queue, job.requests, allow_borrow)
    reason = quota_reason or ""
    if quota_reason is None:
        if cycle.could_place(job):
            borrowed = idx.quota.borrowed_by(job.queue, job.requests)
            placement, reason = cycle.place(job)
            if placement is not None:
                cycle.take(job, placement)
                explanation = "within nominal quota" if not borrowed else f"borrowing {fmt(borrowed)} from the cohort"
                cycle.events.append(
                    JobAdmitted(
                        at=cycle.now,
                        job=job.id,
                        queue=job.queue,
                        placement=placement,
                        borrowed=borrowed,
                        cycle=cycle.number,
                        epoch=cycle.epoch,
                        policy_version=POLICY_VERSION,
                        explanation=explanation,
                    )
                )
                return "admitted"
        else:
            reason = _capacity_reason(job)
    result = find_victims(cycle, job, allow_borrow)
    if result.victims:
        for victim in result.victims:
            cycle.preempt(victim, job.id)
        placement, _ = cycle.place(job)
        if placement is not None:
            cycle.take(job, placement)
        return "preempting"
    if reason != job.reason:
        cycle.events.append(
            JobInadmissible(at=cycle.now, job=job.id, reason=reason, cycle=cycle.number, epoch=cycle.epoch)
        )
    kind = "quota" if quota_reason is not None and not result.quota_possible else "capacity"
    idx.park(state, job, kind, job.gpus - result.candidate_gpus)
    if cycle.tentative:
        cycle.parked_on_tentative.append(job.id)
    return "parked"


def _capacity_reason(job: JobState) -> str:
    """What `place` says when the cluster's free GPUs cannot hold the job (same words)."""
    if len(job.podsets) > 1:
        return f"the gang's {job.gpus} GPUs do not fit on the schedulable nodes"
    ps = job.podsets[0]
    what = f"{ps.count} pod{'s' if ps.count != 1 else ''} of {fmt(ps.requests)}"
    if ps.topology is not None and ps.topology.required is not None:
        return f"no {ps.topology.required} has room for {what}"
    return f"{what} do not fit on the schedulable nodes"


def decide(state: ClusterState, now: int) -> list[Event]:
    """One scheduling cycle at time `now`: the decisions to append, in order."""
    # 1. sync the derived index
    idx = index_of(state)
    cycle = Cycle(state, idx, now)
    try:
        # 2. reject invalid specs
        for job, why in take_new_jobs(state, idx):
            cycle.events.append(JobRejected(at=now, job=job.id, reason=why, cycle=cycle.number, epoch=cycle.epoch))
        # 3. evict jobs from failed or removed nodes
        _evict_lost_nodes(cycle)
        # 4-5. heads in admission order; admit, preempt or park
        _admit(cycle)
        # 6. idle reclaim
        _reclaim_idle(cycle)
    finally:
        # 7. leave the state as found
        cycle.finish()
    return cycle.events


def _evict_lost_nodes(cycle: Cycle) -> None:
    state, idx = cycle.state, cycle.idx
    doomed: set[str] = set(idx.orphans)
    for name in sorted(idx.down_nodes):
        node = state.nodes.get(name)
        if node is not None:
            doomed.update(node.jobs)
    for job_id in sorted(doomed, key=lambda j: state.jobs[j].seq):
        job = state.jobs[job_id]
        if job.status == "admitted" and job_id not in cycle.removed:
            cycle.preempt(Victim(job, "NodeFailure"), None)


def _admit(cycle: Cycle) -> None:
    state, idx = cycle.state, cycle.idx
    # preemptors whose victims were evicted go first, so the room they made is theirs
    nominated = sorted(
        (state.jobs[key[2]] for lst in idx.active.values() for key in lst if state.jobs[key[2]].nominated),
        key=lambda j: j.seq,
    )
    for job in nominated:
        cycle.tried.add(job.id)
        _try(cycle, job)
    heap: list[tuple[tuple[int, int, int, int], str, int]] = []
    for queue in sorted(idx.active):
        lst = idx.active[queue]
        if lst:
            job = state.jobs[lst[0][2]]
            heap.append((_lowest_key(cycle, job), queue, 0))
    heapq.heapify(heap)
    # snapshot each queue's list: parking removes entries while we walk
    lists = {q: list(idx.active[q]) for q in idx.active if idx.active[q]}
    while heap:
        key, queue, pos = heapq.heappop(heap)
        lst = lists[queue]
        job = state.jobs[lst[pos][2]]
        fresh = _lowest_key(cycle, job)
        if fresh != key and heap and fresh > heap[0][0]:
            heapq.heappush(heap, (fresh, queue, pos))
            continue
        if job.id not in cycle.tried:
            cycle.tried.add(job.id)
            _try(cycle, job)
        if pos + 1 < len(lst):
            nxt = state.jobs[lst[pos + 1][2]]
            heapq.heappush(heap, (_lowest_key(cycle, nxt), queue, pos + 1))


def _reclaim_idle(cycle: Cycle) -> None:
    state, idx = cycle.state, cycle.idx
    policy = state.idle_reclaim
    if policy is None:
        return
    now = cycle.now
    idle: list[JobState] = []
    for queue in sorted(idx.running):
        for job_id in idx.running[queue]:
            job = state.jobs[job_id]
            if job.idle_since is None or now - job.idle_since < policy.after or job_id in cycle.removed:
                continue
            if not state.preemptible(job):
                continue
            if policy.only_borrowing and not (job.borrowed and idx.quota.is_borrowing(job.queue)):
                continue
            idle.append(job)
    if not idle:
        return
    idle.sort(key=lambda j: (j.idle_since or 0, j.seq))
    candidates = (set(idx.keys) | set(idx.parked)) - set(cycle.placed)
    waiting = sorted((state.jobs[j] for j in candidates), key=lambda j: (-state.priority_of(j), j.seq))
    for job in idle:
        cycle.remove(job)
        useful = any(cycle.fits(p, state.preemptible(p)) for p in waiting)
        cycle.restore(job)
        if useful:
            cycle.preempt(Victim(job, "IdleReclaim"), None)


def next_wakeup(state: ClusterState, now: int) -> int | None:
    """The next time a cycle is due without any new event: an idle job's reclaim deadline."""
    policy = state.idle_reclaim
    if policy is None:
        return None
    best: int | None = None
    for job in state.jobs.values():
        if job.status == "admitted" and job.idle_since is not None:
            due = job.idle_since + policy.after
            if due > now and (best is None or due < best):
                best = due
    return best
