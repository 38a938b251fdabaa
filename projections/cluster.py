"""The cluster state the scheduler reads, and `evolve`, the fold that builds it.

`evolve(state, event) -> state` applies one event and holds no policy: it
records what the event says. Rules (who may run, who is preempted, which spec
is invalid) live in `scheduler.decide`. For speed the state is mutated in place
and returned; callers that need the old state keep a snapshot
(`snapshot.encode_state`).

Invariants:
- Deterministic: the same events in the same order give equal states.
- Robust: an event that does not fit the state (an unknown job or node, a
  decision of a deposed leader's epoch, a duplicate submission, a user's
  control event for another queue's job: `foreign_control`) leaves the state
  as it was and is counted in `state.skipped`.
- Usage per node and per queue is the sum of the requests of admitted jobs.

The `dirty_*` sets and `structure` counter are bookkeeping for the scheduler's
derived indexes (`scheduler.index`). They live in the instance dict, so they
take no part in equality or encoding.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import msgspec

from muster.events.types import (
    AnyEvent,
    CohortConfigured,
    Event,
    ExpectedEnd,
    FlavorConfigured,
    FlavorFungibility,
    GpuUtilizationSampled,
    IdleReclaimPolicy,
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
    LeaderElected,
    NodeAdded,
    NodeCordoned,
    NodeRemoved,
    NodeUpdated,
    PodSet,
    PreemptionPolicy,
    PriorityClassConfigured,
    QueueConfigured,
    ReservationMade,
    ReservationReleased,
    ResourceGroup,
    SchedulerConfigured,
    SubmissionRejected,
    Taint,
)
from muster.projections.fencing import fenced, newer_leader
from muster.projections.resources import flavored

JobStatus = Literal["pending", "admitted", "finished", "failed", "cancelled", "rejected"]
TERMINAL: frozenset[str] = frozenset({"finished", "failed", "cancelled", "rejected"})

DEFAULT_IDLE_THRESHOLD = 0.05


class NodeState(msgspec.Struct, kw_only=True):
    name: str
    labels: dict[str, str]
    capacity: dict[str, int]
    reserved: dict[str, int] = {}
    ready: bool = True
    unschedulable: bool = False
    cordoned: bool = False
    used: dict[str, int] = {}
    jobs: dict[str, int] = {}
    """Job id -> number of its pods on this node."""

    @property
    def schedulable(self) -> bool:
        return self.ready and not self.unschedulable and not self.cordoned

    def free(self) -> dict[str, int]:
        """Capacity left for new pods (zero where unschedulable)."""
        if not self.schedulable:
            return {k: 0 for k in self.capacity}
        used, reserved = self.used, self.reserved
        return {k: v - used.get(k, 0) - reserved.get(k, 0) for k, v in self.capacity.items()}


class QueueState(msgspec.Struct, kw_only=True):
    name: str
    cohort: str | None = None
    nominal: dict[str, int] = {}
    borrowing_limit: dict[str, int] | None = None
    lending_limit: dict[str, int] | None = None
    weight: float = 1.0
    preemption: PreemptionPolicy = PreemptionPolicy()
    usage: dict[str, int] = {}
    queueing_strategy: str = "best_effort_fifo"
    resource_groups: list[ResourceGroup] = []
    """Its quota per flavor; `nominal` and the limits then hold it flattened, keyed `resource@flavor`."""
    fungibility: FlavorFungibility = FlavorFungibility()
    reserve_after: int | None = None


class FlavorState(msgspec.Struct, kw_only=True):
    name: str
    node_labels: dict[str, str] = {}
    taints: list[Taint] = []


class PriorityClassState(msgspec.Struct, kw_only=True):
    name: str
    value: int
    preemptible: bool = True


class JobState(msgspec.Struct, kw_only=True):
    id: str
    queue: str
    priority_class: str | None
    podsets: list[PodSet]
    runtime: int | None
    checkpoint_every: int | None
    seq: int
    """Submission order: a job keeps its place in its queue across preemptions."""
    submitted_at: int
    pods: dict[str, str] = {}
    requests: dict[str, int] = {}
    """Total requests of the whole gang."""
    source: str = ""
    """Where a cluster's job came from (`Kind/namespace/name`, `JobSubmitted.source`); reconciliation reads it."""
    status: JobStatus = "pending"
    placement: dict[str, str] = {}
    borrowed: dict[str, int] = {}
    admitted_at: int | None = None
    first_admitted_at: int | None = None
    finished_at: int | None = None
    started_at: int | None = None
    work_done: int = 0
    """Seconds of work saved (at checkpoints) that survive preemption."""
    preemptions: int = 0
    reason: str = ""
    """Last reason the job was inadmissible or rejected."""
    utilization: float | None = None
    idle_since: int | None = None
    nominated: bool = False
    """Its victims were evicted for it: the next cycle tries it before anyone else."""
    preempted_at: int | None = None
    """When it was last preempted: it may not preempt anyone at that same instant."""
    evicted_by: str | None = None
    """The job that preempted it, until it runs again: it may not evict that job in return."""
    held: bool = False
    """Held by a user (`JobHeld`) while pending: the scheduler's index leaves it out until released."""
    max_runtime: int | None = None
    """Its declared time limit (seconds per run), `JobSubmitted.max_runtime`."""
    flavors: dict[str, dict[str, str]] = {}
    """While admitted with flavors: per podset, resource -> flavor (`JobAdmitted.flavors`); its
    `requests` are then keyed `resource@flavor`, as its queue's quota is."""

    @property
    def gpus(self) -> int:
        requests = self.requests
        if not self.flavors:
            return requests.get("gpu", 0)
        return sum(v * ps.count for ps in self.podsets for k, v in ps.requests.items() if k == "gpu")

    def chained_eviction(self, now: int) -> bool:
        """Evicted at `now` by another job's preemption: it does not evict others at that instant.

        Chains of evictions end within the instant instead of chasing each other. A job
        evicted by a node failure or idle reclaim is not held back: nothing evicted it to
        make room, so it may preempt at once like any pending job.
        """
        return self.preempted_at == now and self.evicted_by is not None

    def pending_since(self) -> int:
        """When a pending job last became pending: its last preemption, else its submission."""
        return self.preempted_at if self.preempted_at is not None else self.submitted_at

    def progress(self, now: int) -> int:
        """Seconds of work done by `now`, counting the current run."""
        if self.status == "admitted" and self.admitted_at is not None:
            return self.work_done + max(0, now - self.admitted_at)
        return self.work_done

    def saved_progress(self, now: int) -> int:
        """Work that would survive a preemption at `now` (last checkpoint)."""
        done = self.progress(now)
        if self.runtime is not None:
            done = min(done, self.runtime)
        if not self.checkpoint_every:
            return 0
        return (done // self.checkpoint_every) * self.checkpoint_every

    def lost_gpu_seconds(self, now: int) -> int:
        """GPU-seconds of work a preemption at `now` would destroy."""
        if self.status != "admitted":
            return 0
        # `saved_progress` inline: victim orders ask this of every candidate at every instant
        done = self.progress(now)
        if self.runtime is not None and self.runtime < done:
            done = self.runtime
        every = self.checkpoint_every
        return (done % every if every else done) * self.requests.get("gpu", 0)

    def remaining(self) -> int | None:
        if self.runtime is None:
            return None
        return max(0, self.runtime - self.work_done)


class Reservation(msgspec.Struct, kw_only=True):
    """Room held for a pending job, as its `ReservationMade` says (see `reservations`)."""

    job: str
    queue: str
    nodes: list[str]
    domain: str = ""
    since: int = 0
    expected_start: int | None = None
    waits_for: list[ExpectedEnd] = []
    reason: str = ""
    needs: dict[str, dict[str, int]] = {}
    """Node -> what the job's pods take there: the most held back on it ({}: all that is free)."""


class RefusedSubmission(msgspec.Struct, kw_only=True):
    """A submission of a job id the log already holds, until the core's `SubmissionRejected` answers it."""

    job: str
    queue: str
    at: int


class ClusterState(msgspec.Struct, kw_only=True, dict=True):
    levels: list[str] = []
    fair_sharing: bool = False
    idle_reclaim: IdleReclaimPolicy | None = None
    priority_classes: dict[str, PriorityClassState] = {}
    cohorts: dict[str, str | None] = {}
    """Cohort name -> parent cohort (or None)."""
    queues: dict[str, QueueState] = {}
    nodes: dict[str, NodeState] = {}
    jobs: dict[str, JobState] = {}
    epoch: int = 0
    leader: str = ""
    cycle: int = 0
    """Last scheduling cycle that wrote a decision."""
    cycle_decisions: int = 0
    """How many decisions of that cycle have been applied."""
    now: int = 0
    """Time of the latest event applied."""
    submitted: int = 0
    applied: int = 0
    skipped: int = 0
    fenced: int = 0
    """Decisions ignored because a newer leader epoch was already on the log."""
    refused: list[RefusedSubmission] = []
    """Submissions of a taken job id, in log order, waiting for their `SubmissionRejected`."""
    flavors: dict[str, FlavorState] = {}
    reservations: dict[str, Reservation] = {}
    """Job id -> the room held for it, until its `ReservationReleased`."""

    def __post_init__(self) -> None:
        self.reset_bookkeeping()

    def reset_bookkeeping(self) -> None:
        self.dirty_nodes: set[str] = set(self.nodes)
        self.dirty_queues: set[str] = set(self.queues)
        self.dirty_jobs: set[str] = {j.id for j in self.jobs.values() if j.status not in TERMINAL}
        self.structure = 0
        """Bumped when nodes, queues, cohorts, classes or levels change shape."""
        self.released = 0
        """Bumped whenever resources are given back (finish, preemption, node up...)."""
        self.queue_released: dict[str, dict[str, int]] = {}
        """Per queue and resource, all usage ever given back (an admission and a release
        between two looks at the state must not cancel out for whoever waits)."""
        self.queue_consumed: dict[str, dict[str, int]] = {}
        self.gpus_freed = 0
        """GPUs ever given back or added to the schedulable nodes, an upper bound of every rise
        of the free GPUs (it only grows, so whoever waits for N more GPUs need not look often)."""
        self.node_gpus_freed: dict[str, int] = {}
        """The same per node (a flavor's job waits for GPUs freed on its flavor's nodes)."""
        self.borrow_starts: dict[str, int] = {}
        """Per queue, how many times an admission took it over its nominal quota."""

    def priority_of(self, job: JobState) -> int:
        """The job's priority value; no class (or an unknown one) is the lowest class."""
        if job.priority_class is not None:
            pc = self.priority_classes.get(job.priority_class)
            if pc is not None:
                return pc.value
        return self.lowest_priority()

    def preemptible(self, job: JobState) -> bool:
        if job.priority_class is None:
            return True
        pc = self.priority_classes.get(job.priority_class)
        return pc is None or pc.preemptible

    def lowest_priority(self) -> int:
        if not self.priority_classes:
            return 0
        return min(pc.value for pc in self.priority_classes.values())

    def cohort_root(self, queue: str) -> str:
        """The root of a queue's cohort tree (`queue:NAME` for a queue without a cohort)."""
        q = self.queues.get(queue)
        if q is None or q.cohort is None:
            return f"queue:{queue}"
        name = q.cohort
        seen = {name}
        while True:
            parent = self.cohorts.get(name)
            if parent is None or parent in seen:
                return f"cohort:{name}"
            seen.add(parent)
            name = parent


# ---------------------------------------------------------------- evolve


def _skip(state: ClusterState) -> ClusterState:
    state.skipped += 1
    return state


def _podset_requests(podsets: list[PodSet]) -> dict[str, int]:
    out: dict[str, int] = {}
    for ps in podsets:
        for k, v in ps.requests.items():
            out[k] = out.get(k, 0) + v * ps.count
    return out


def flavored_requests(podsets: list[PodSet], flavors: Mapping[str, Mapping[str, str]]) -> dict[str, int]:
    """A gang's total requests keyed as its queue's quota is: `resource@flavor` where a flavor was chosen."""
    out: dict[str, int] = {}
    for ps in podsets:
        chosen = flavors.get(ps.name, {})
        for k, v in ps.requests.items():
            f = chosen.get(k)
            key = flavored(k, f) if f is not None else k
            out[key] = out.get(key, 0) + v * ps.count
    return out


def node_pods(podsets: list[PodSet], placement: Mapping[str, str]) -> list[tuple[str, int, dict[str, int]]]:
    """A placement grouped by node and podset, in order of first appearance: (node, pods, one pod's requests).

    A caller adds `pods * request` per group instead of one request per pod,
    inserting resource keys in the order a pod-by-pod sum would. A pod of no
    known podset requests nothing. The request dicts are the job's own: read only.
    """
    if len(podsets) == 1:
        req = podsets[0].requests
        counts: dict[str, int] = {}
        for node in placement.values():
            counts[node] = counts.get(node, 0) + 1
        return [(node, n, req) for node, n in counts.items()]
    per_podset = {ps.name: ps.requests for ps in podsets}
    groups: dict[tuple[str, str], int] = {}
    for pod, node in placement.items():
        key = (node, pod.rsplit("-", 1)[0])
        groups[key] = groups.get(key, 0) + 1
    return [(node, n, per_podset.get(name, {})) for (node, name), n in groups.items()]


def _placement_matches(podsets: list[PodSet], placement: Mapping[str, str]) -> bool:
    """Whether the placement names exactly the gang's pods `PODSET-INDEX`.

    Sizes are compared first, so the names are only listed once they are known to be
    no more than the placement holds: a gang claimed far larger (or smaller) than
    the one submitted, e.g. 2**40 pods, is refused without allocating per pod.
    """
    counts: dict[str, int] = {}
    for ps in podsets:
        counts[ps.name] = max(counts.get(ps.name, 0), ps.count)
    if len(placement) != sum(c for c in counts.values() if c > 0):
        return False
    # as many distinct keys as expected names: equal sets iff each name is there
    for name, count in counts.items():
        for i in range(count):
            if f"{name}-{i}" not in placement:
                return False
    return True


def _release(state: ClusterState, job: JobState) -> None:
    """Give back the job's node and queue usage."""
    nodes = state.nodes
    for node_name, pods, req in node_pods(job.podsets, job.placement):
        node = nodes.get(node_name)
        if node is None:
            continue
        used = node.used
        for k, v in req.items():
            used[k] = used.get(k, 0) - v * pods
        gpus = req.get("gpu", 0) * pods
        if gpus:
            state.node_gpus_freed[node_name] = state.node_gpus_freed.get(node_name, 0) + gpus
        n = node.jobs.get(job.id, 0) - pods
        if n > 0:
            node.jobs[job.id] = n
        else:
            node.jobs.pop(job.id, None)
        state.dirty_nodes.add(node_name)
    queue = state.queues.get(job.queue)
    if queue is not None:
        usage = queue.usage
        moved = state.queue_released.setdefault(job.queue, {})
        for k, v in job.requests.items():
            usage[k] = usage.get(k, 0) - v
            moved[k] = moved.get(k, 0) + v
        state.dirty_queues.add(job.queue)
    state.gpus_freed += job.gpus
    if job.flavors:
        job.flavors = {}
        job.requests = _podset_requests(job.podsets)
    job.placement = {}
    job.borrowed = {}
    job.utilization = None
    job.idle_since = None
    state.released += 1
    state.dirty_jobs.add(job.id)


def _reservation_moved(state: ClusterState, job_id: str) -> None:
    """A reservation's holder left (ended, held) or came back: what it holds back changes (see `reservations`)."""
    res = state.reservations.get(job_id)
    if res is not None:
        _room_opened(state, res)


def _room_opened(state: ClusterState, res: Reservation) -> None:
    """Room a reservation held back may be seen by every job again: the jobs parked on placement that it
    could serve are woken as by GPUs freed (at most what it held; waking early is harmless, late is not)."""
    held = 0
    for node in res.nodes:
        need = res.needs.get(node) if res.needs else None
        if need is None:
            n = state.nodes.get(node)
            need = n.capacity if n is not None else {}
        held += need.get("gpu", 0)
    state.gpus_freed += max(1, held)


def _borrowing(queue: QueueState) -> bool:
    return any(v > queue.nominal[r] for r, v in queue.usage.items() if r in queue.nominal)


def _count_decision(state: ClusterState, cycle: int) -> None:
    if cycle > state.cycle:
        state.cycle = cycle
        state.cycle_decisions = 1
    elif cycle == state.cycle:
        state.cycle_decisions += 1


def _fenced(state: ClusterState, epoch: int) -> bool:
    if fenced(epoch, state.epoch):
        state.fenced += 1
        return True
    return False


def _on_submitted(state: ClusterState, ev: JobSubmitted) -> ClusterState:
    if ev.job in state.jobs:
        # the job on the log stays as it is; the core answers the newcomer (`duplicates`)
        state.refused.append(RefusedSubmission(job=ev.job, queue=ev.queue, at=ev.at))
        return _skip(state)
    state.submitted += 1
    state.jobs[ev.job] = JobState(
        id=ev.job,
        queue=ev.queue,
        priority_class=ev.priority_class,
        podsets=ev.podsets,
        runtime=ev.runtime,
        checkpoint_every=ev.checkpoint_every,
        seq=state.submitted,
        submitted_at=ev.at,
        pods=ev.pods,
        requests=_podset_requests(ev.podsets),
        source=ev.source,
        max_runtime=ev.max_runtime,
    )
    state.dirty_jobs.add(ev.job)
    return state


def _on_admitted(state: ClusterState, ev: JobAdmitted) -> ClusterState:
    if _fenced(state, ev.epoch):
        return state
    job = state.jobs.get(ev.job)
    if job is None or job.status != "pending":
        return _skip(state)
    nodes = state.nodes
    # a placement that is not exactly the submitted gang is invalid, however large the claim
    if not _placement_matches(job.podsets, ev.placement):
        return _skip(state)
    groups = node_pods(job.podsets, ev.placement)
    if any(g[0] not in nodes for g in groups):
        return _skip(state)
    for node_name, pods, req in groups:
        node = nodes[node_name]
        used = node.used
        for k, v in req.items():
            used[k] = used.get(k, 0) + v * pods
        node.jobs[job.id] = node.jobs.get(job.id, 0) + pods
        state.dirty_nodes.add(node_name)
    if ev.flavors:
        job.flavors = {ps: dict(chosen) for ps, chosen in ev.flavors.items()}
        job.requests = flavored_requests(job.podsets, job.flavors)
    queue = state.queues.get(job.queue)
    if queue is not None:
        usage = queue.usage
        was_borrowing = _borrowing(queue)
        moved = state.queue_consumed.setdefault(job.queue, {})
        for k, v in job.requests.items():
            usage[k] = usage.get(k, 0) + v
            moved[k] = moved.get(k, 0) + v
        if not was_borrowing and _borrowing(queue):
            state.borrow_starts[job.queue] = state.borrow_starts.get(job.queue, 0) + 1
        state.dirty_queues.add(job.queue)
    job.status = "admitted"
    job.placement = dict(ev.placement)
    job.borrowed = dict(ev.borrowed)
    job.admitted_at = ev.at
    if job.first_admitted_at is None:
        job.first_admitted_at = ev.at
    job.reason = ""
    job.utilization = None
    job.idle_since = None
    job.nominated = False
    job.evicted_by = None
    _count_decision(state, ev.cycle)
    state.dirty_jobs.add(job.id)
    _reservation_moved(state, job.id)
    return state


def _on_preempted(state: ClusterState, ev: JobPreempted) -> ClusterState:
    if _fenced(state, ev.epoch):
        return state
    job = state.jobs.get(ev.job)
    if job is None or job.status != "admitted":
        return _skip(state)
    saved = job.saved_progress(ev.at)
    _release(state, job)
    job.work_done = saved
    job.status = "pending"
    job.admitted_at = None
    job.started_at = None
    job.preemptions += 1
    job.reason = ""
    job.evicted_by = ev.preemptor
    job.preempted_at = ev.at
    if ev.preemptor is not None:
        preemptor = state.jobs.get(ev.preemptor)
        if preemptor is not None and preemptor.status == "pending":
            preemptor.nominated = True
            # its next failure, if any, is written down even if the words are the same
            preemptor.reason = ""
            state.dirty_jobs.add(preemptor.id)
    _count_decision(state, ev.cycle)
    return state


def _end(state: ClusterState, job_id: str, at: int, status: JobStatus, reason: str = "") -> ClusterState:
    job = state.jobs.get(job_id)
    if job is None or job.status in TERMINAL:
        return _skip(state)
    if job.status == "admitted":
        if job.admitted_at is not None:
            job.work_done = job.progress(at) if job.runtime is None else min(job.runtime, job.progress(at))
        _release(state, job)
    _reservation_moved(state, job_id)
    job.status = status
    job.finished_at = at
    job.admitted_at = None
    if reason:
        job.reason = reason
    state.dirty_jobs.add(job_id)
    return state


def _node_from(ev: NodeAdded | NodeUpdated, old: NodeState | None) -> NodeState:
    return NodeState(
        name=ev.node,
        labels=dict(ev.labels),
        capacity=dict(ev.capacity),
        reserved=dict(ev.reserved),
        ready=ev.ready,
        unschedulable=ev.unschedulable,
        cordoned=old.cordoned if old is not None else False,
        used=old.used if old is not None else {},
        jobs=old.jobs if old is not None else {},
    )


def _freed_on(state: ClusterState, node: str, gpus: int) -> None:
    state.gpus_freed += gpus
    state.node_gpus_freed[node] = state.node_gpus_freed.get(node, 0) + gpus


def _on_node(state: ClusterState, ev: NodeAdded | NodeUpdated) -> ClusterState:
    old = state.nodes.get(ev.node)
    node = _node_from(ev, old)
    state.nodes[ev.node] = node
    state.dirty_nodes.add(ev.node)
    if old is None or old.labels != node.labels:
        state.structure += 1
    if (
        old is None
        or (node.schedulable and not old.schedulable)
        or node.capacity != old.capacity
        or any(v < old.reserved.get(k, 0) for k, v in node.reserved.items())
        or any(k not in node.reserved for k in old.reserved)
    ):
        # more room: a new node, one back in service, more capacity, or fewer
        # GPUs held by pods muster does not place (terminating or foreign pods)
        state.released += 1
        _freed_on(state, ev.node, node.capacity.get("gpu", 0))
    return state


def _on_node_removed(state: ClusterState, ev: NodeRemoved) -> ClusterState:
    if ev.node not in state.nodes:
        return _skip(state)
    del state.nodes[ev.node]
    state.dirty_nodes.add(ev.node)
    state.structure += 1
    return state


def _on_cordoned(state: ClusterState, ev: NodeCordoned) -> ClusterState:
    node = state.nodes.get(ev.node)
    if node is None:
        return _skip(state)
    if node.cordoned and not ev.cordoned:
        state.released += 1
        _freed_on(state, ev.node, node.capacity.get("gpu", 0))
    node.cordoned = ev.cordoned
    state.dirty_nodes.add(ev.node)
    return state


def _on_queue(state: ClusterState, ev: QueueConfigured) -> ClusterState:
    old = state.queues.get(ev.name)
    groups = ev.resource_groups if ev.resource_groups else []
    nominal, borrowing, lending = _flat_quota(ev, groups)
    state.queues[ev.name] = QueueState(
        name=ev.name,
        cohort=ev.cohort,
        nominal=nominal,
        borrowing_limit=borrowing,
        lending_limit=lending,
        weight=ev.weight,
        preemption=ev.preemption,
        usage=old.usage if old is not None else {},
        queueing_strategy=ev.queueing_strategy,
        resource_groups=list(groups),
        fungibility=ev.flavor_fungibility if ev.flavor_fungibility else FlavorFungibility(),
        reserve_after=ev.reserve_after,
    )
    state.dirty_queues.add(ev.name)
    state.structure += 1
    state.released += 1
    return state


def _flat_quota(
    ev: QueueConfigured, groups: list[ResourceGroup]
) -> tuple[dict[str, int], dict[str, int] | None, dict[str, int] | None]:
    """A queue's quota as the quota tree reads it: per flavor and resource (`gpu@h100`) when it has
    resource groups, else as configured. A limit a flavor leaves out is no limit there."""
    if not groups:
        return (
            dict(ev.nominal),
            dict(ev.borrowing_limit) if ev.borrowing_limit is not None else None,
            dict(ev.lending_limit) if ev.lending_limit is not None else None,
        )
    nominal: dict[str, int] = {}
    borrowing: dict[str, int] = {}
    lending: dict[str, int] = {}
    for group in groups:
        for fq in group.flavors:
            for r in group.covered:
                nominal[flavored(r, fq.name)] = fq.nominal.get(r, 0)
            for r, v in (fq.borrowing_limit or {}).items():
                borrowing[flavored(r, fq.name)] = v
            for r, v in (fq.lending_limit or {}).items():
                lending[flavored(r, fq.name)] = v
    return nominal, borrowing or None, lending or None


def _on_flavor(state: ClusterState, ev: FlavorConfigured) -> ClusterState:
    state.flavors[ev.name] = FlavorState(name=ev.name, node_labels=dict(ev.node_labels), taints=list(ev.taints))
    state.structure += 1
    state.released += 1
    return state


def _on_cohort(state: ClusterState, ev: CohortConfigured) -> ClusterState:
    state.cohorts[ev.name] = ev.parent
    state.structure += 1
    state.released += 1
    return state


def _on_priority_class(state: ClusterState, ev: PriorityClassConfigured) -> ClusterState:
    state.priority_classes[ev.name] = PriorityClassState(name=ev.name, value=ev.value, preemptible=ev.preemptible)
    state.structure += 1
    state.released += 1
    return state


def _on_scheduler(state: ClusterState, ev: SchedulerConfigured) -> ClusterState:
    state.levels = list(ev.levels)
    state.fair_sharing = ev.fair_sharing
    state.idle_reclaim = ev.idle_reclaim
    state.structure += 1
    state.released += 1
    return state


def _on_utilization(state: ClusterState, ev: GpuUtilizationSampled) -> ClusterState:
    job = state.jobs.get(ev.job)
    if job is None or job.status != "admitted":
        return _skip(state)
    threshold = state.idle_reclaim.threshold if state.idle_reclaim is not None else DEFAULT_IDLE_THRESHOLD
    job.utilization = ev.gpu
    if ev.gpu <= threshold:
        if job.idle_since is None:
            job.idle_since = ev.at
    else:
        job.idle_since = None
    return state


def _on_started(state: ClusterState, ev: JobStarted) -> ClusterState:
    job = state.jobs.get(ev.job)
    if job is None or job.status != "admitted":
        return _skip(state)
    job.started_at = ev.at
    return state


def _on_inadmissible(state: ClusterState, ev: JobInadmissible) -> ClusterState:
    if _fenced(state, ev.epoch):
        return state
    job = state.jobs.get(ev.job)
    if job is None or job.status != "pending":
        return _skip(state)
    job.reason = ev.reason
    job.nominated = False
    _count_decision(state, ev.cycle)
    return state


def _on_rejected(state: ClusterState, ev: JobRejected) -> ClusterState:
    if _fenced(state, ev.epoch):
        return state
    _count_decision(state, ev.cycle)
    return _end(state, ev.job, ev.at, "rejected", ev.reason)


def _on_submission_rejected(state: ClusterState, ev: SubmissionRejected) -> ClusterState:
    if _fenced(state, ev.epoch):
        return state
    for i, r in enumerate(state.refused):
        if r.job == ev.job and r.queue == ev.queue:
            del state.refused[i]
            _count_decision(state, ev.cycle)
            return state
    return _skip(state)


def _on_leader(state: ClusterState, ev: LeaderElected) -> ClusterState:
    if not newer_leader(ev.epoch, state.epoch):
        return _skip(state)
    state.epoch = ev.epoch
    state.leader = ev.holder
    return state


def _on_finished(state: ClusterState, ev: JobFinished) -> ClusterState:
    return _end(state, ev.job, ev.at, "finished")


def _on_failed(state: ClusterState, ev: JobFailed) -> ClusterState:
    return _end(state, ev.job, ev.at, "failed", ev.reason)


def foreign_control(state: ClusterState, ev: JobCancelled | JobHeld | JobReleased) -> str | None:
    """Why a user's control event does not count: it names a queue that is not its job's (None if it counts).

    A queue's identity may publish control events on its own queue's subjects
    only (`events.subjects`), naming any job; this is the other half of the
    rule, kept in the fold so replay, audit and every leader ignore the same
    events. The daemon's own cancellations and older logs name no queue.
    """
    if ev.queue is None:
        return None
    job = state.jobs.get(ev.job)
    if job is None or job.queue == ev.queue:
        return None
    return (
        f"{type(ev).__name__} from queue {ev.queue} for a job of queue {job.queue}: a queue controls its own jobs only"
    )


def _on_cancelled(state: ClusterState, ev: JobCancelled) -> ClusterState:
    if foreign_control(state, ev) is not None:
        return _skip(state)
    return _end(state, ev.job, ev.at, "cancelled", ev.reason)


def _on_held(state: ClusterState, ev: JobHeld) -> ClusterState:
    job = state.jobs.get(ev.job)
    if job is None or job.status != "pending" or job.held or foreign_control(state, ev) is not None:
        return _skip(state)
    job.held = True
    state.dirty_jobs.add(job.id)
    _reservation_moved(state, job.id)
    return state


def _on_released(state: ClusterState, ev: JobReleased) -> ClusterState:
    job = state.jobs.get(ev.job)
    if job is None or not job.held or foreign_control(state, ev) is not None:
        return _skip(state)
    job.held = False
    state.dirty_jobs.add(job.id)  # the index validates and tries it like a new submission
    _reservation_moved(state, job.id)
    return state


def _on_reservation_made(state: ClusterState, ev: ReservationMade) -> ClusterState:
    if _fenced(state, ev.epoch):
        return state
    job = state.jobs.get(ev.job)
    if job is None or job.status != "pending" or ev.job in state.reservations:
        return _skip(state)
    state.reservations[ev.job] = Reservation(
        job=ev.job,
        queue=ev.queue,
        nodes=list(ev.nodes),
        domain=ev.domain,
        since=ev.at,
        expected_start=ev.expected_start,
        waits_for=list(ev.waits_for),
        reason=ev.reason,
        needs={n: dict(r) for n, r in ev.needs.items()},
    )
    # no rebuild: held room only shrinks what others see, so every verdict parked before stands
    _count_decision(state, ev.cycle)
    return state


def _on_reservation_released(state: ClusterState, ev: ReservationReleased) -> ClusterState:
    if _fenced(state, ev.epoch):
        return state
    res = state.reservations.pop(ev.job, None)
    if res is None:
        return _skip(state)
    _room_opened(state, res)
    _count_decision(state, ev.cycle)
    return state


_HANDLERS: dict[type[Event], object] = {
    JobSubmitted: _on_submitted,
    JobAdmitted: _on_admitted,
    JobPreempted: _on_preempted,
    JobFinished: _on_finished,
    JobFailed: _on_failed,
    JobCancelled: _on_cancelled,
    JobHeld: _on_held,
    JobReleased: _on_released,
    JobStarted: _on_started,
    JobInadmissible: _on_inadmissible,
    JobRejected: _on_rejected,
    SubmissionRejected: _on_submission_rejected,
    ReservationMade: _on_reservation_made,
    ReservationReleased: _on_reservation_released,
    GpuUtilizationSampled: _on_utilization,
    NodeAdded: _on_node,
    NodeUpdated: _on_node,
    NodeRemoved: _on_node_removed,
    NodeCordoned: _on_cordoned,
    QueueConfigured: _on_queue,
    CohortConfigured: _on_cohort,
    PriorityClassConfigured: _on_priority_class,
    SchedulerConfigured: _on_scheduler,
    LeaderElected: _on_leader,
    FlavorConfigured: _on_flavor,
}


def evolve(state: ClusterState, event: AnyEvent | Event) -> ClusterState:
    """Apply one event to the state (in place) and return it."""
    handler = _HANDLERS.get(type(event))
    state.applied += 1
    if handler is None:
        return _skip(state)
    if event.at > state.now:
        state.now = event.at
    result: ClusterState = handler(state, event)  # type: ignore[operator]
    return result


def fold(events: list[AnyEvent] | list[Event], state: ClusterState | None = None) -> ClusterState:
    """Fold a sequence of events into a (new, unless given) state."""
    s = state if state is not None else ClusterState()
    for ev in events:
        evolve(s, ev)
    return s
