"""The folded cluster state: the types `cluster.evolve` builds and the scheduler reads.

Each type records what the log says about one thing (a node, a queue, a flavor,
a priority class, a job, a reservation); `ClusterState` holds them all. Methods
only read: every change goes through `cluster.evolve`, so equal logs give equal
states.

The `dirty_*` sets and `structure` counter of `ClusterState` are bookkeeping
for the scheduler's derived indexes (`scheduler.index`). They live in the
instance dict, so they take no part in equality or encoding.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from muster.events.types import (
    ControllerRef,
    ExpectedEnd,
    FlavorFungibility,
    IdleReclaimPolicy,
    PodSet,
    PreemptionPolicy,
    ReservationMade,
    ResourceGroup,
    Taint,
)
from muster.projections import jobfacts

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


def podset_of(pod: str) -> str:
    """The podset a gang's pod belongs to: pods are named `PODSET-INDEX` (`JobState.placement`)."""
    return pod.rsplit("-", 1)[0]


class JobState(msgspec.Struct, kw_only=True):
    id: str
    queue: str
    priority_class: str | None
    podsets: list[PodSet]
    runtime: int | None
    checkpoint_every: int | None
    seq: int
    """Submission order: the job's identity in every tie (its place in the queue is `order_seq`)."""
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
    idle_reclaimed_at: int | None = None
    """When it was last reclaimed for idleness, until it runs again: while it borrows it evicts no one
    (`eviction.Preemptor.idle_borrowing`); it gave its room to waiting work, and taking room back from
    busy jobs would trade them for a job that sat idle (spec, Idle reclamation)."""
    held: bool = False
    """Held by a user (`JobHeld`) while pending: the scheduler's index leaves it out until released."""
    max_runtime: int | None = None
    """Its declared time limit (seconds per run), `JobSubmitted.max_runtime`."""
    flavors: dict[str, dict[str, str]] = {}
    """While admitted with flavors: per podset, resource -> flavor (`JobAdmitted.flavors`); its
    `requests` are then keyed `resource@flavor`, as its queue's quota is (plain again once its queue
    turns into one plain pool, re-keyed when its pools or nodes change: `configuration.repool`)."""
    order_seq: int = 0
    """Its place in the admission order (`index.order_key`): its submission's place in the log, or its
    last idle reclaim's, since a job reclaimed for idleness waits behind the jobs then waiting (spec,
    Idle reclamation); other preemptions keep it. 0 (a state written before it existed): `seq`."""
    controller: ControllerRef | None = None
    """A labelled pod group's controller (`JobSubmitted.controller`): the Kubernetes adapter judges the job
    by it and knows its new pods by it (`daemon.k8s.controllers`); None for every other job."""

    def __post_init__(self) -> None:
        if not self.order_seq:
            self.order_seq = self.seq

    @property
    def gpus(self) -> int:
        """`jobfacts.gpus`."""
        return jobfacts.gpus(self)

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
        """Seconds of work done by `now`, counting the current run (`jobfacts.progress`)."""
        return jobfacts.progress(self, now)

    def saved_progress(self, now: int) -> int:
        """Work that would survive a preemption at `now` (last checkpoint)."""
        done = self.progress(now)
        if self.runtime is not None:
            done = min(done, self.runtime)
        if not self.checkpoint_every:
            return 0
        return (done // self.checkpoint_every) * self.checkpoint_every

    def lost_gpu_seconds(self, now: int) -> int:
        """GPU-seconds of work a preemption at `now` would destroy (`jobfacts.lost_gpu_seconds`)."""
        return jobfacts.lost_gpu_seconds(self, now)

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


def reservation_of(ev: ReservationMade) -> Reservation:
    """The reservation a `ReservationMade` holds (the fold, the core's plans and a job's story read it alike)."""
    return Reservation(
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
    settles: int = 0
    """`CycleSettled` records applied: the last one's `serial` (cycles that decided nothing but judged jobs)."""
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
    places: int = 0
    """Places given in the admission order (`JobState.order_seq`): one per submission and per idle
    reclaim (a state written before it existed gave only submissions theirs: `submitted`)."""

    def __post_init__(self) -> None:
        self.places = max(self.places, self.submitted)
        self.reset_bookkeeping()

    def reset_bookkeeping(self) -> None:
        self.dirty_nodes: set[str] = set(self.nodes)
        self.dirty_queues: set[str] = set(self.queues)
        self.dirty_jobs: set[str] = {j.id for j in self.jobs.values() if j.status not in TERMINAL}
        self.structure = 0
        """Bumped when nodes, queues, cohorts, classes or levels change shape, and when a new leader is
        elected (the scheduler index, with its parking memo, is rebuilt: `cluster`)."""
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
        nodes = self.nodes
        self.departed: set[str] = {
            n for j in self.jobs.values() if j.status == "admitted" for n in j.placement.values() if n not in nodes
        }
        """Removed nodes that admitted jobs were placed on when they left: one that comes back holds
        their pods again (`cluster._on_node`); derived from the jobs, so a decoded state has it too."""

    def priority_of(self, job: JobState) -> int:
        """The job's priority value (`jobfacts.priority_of`)."""
        return jobfacts.priority_of(self, job)

    def preemptible(self, job: JobState) -> bool:
        """Whether the job's class lets it be preempted (`jobfacts.preemptible`)."""
        return jobfacts.preemptible(self, job)

    def lowest_priority(self) -> int:
        """The lowest class's value (0 without classes)."""
        return self._lowest()[0]

    def lowest_preemptible(self) -> bool:
        """Whether the lowest class is preemptible (True without classes)."""
        return self._lowest()[1]

    def _lowest(self) -> tuple[int, bool]:
        """The lowest class's value and whether it is preemptible (0 and True without classes; of several
        classes of that value, preemptible unless none is); kept per `structure`, which every class
        change bumps."""
        known: tuple[int, int, bool] | None = self.__dict__.get("_lowest_class")
        if known is not None and known[0] == self.structure:
            return known[1], known[2]
        value = min((pc.value for pc in self.priority_classes.values()), default=0)
        preemptible = not self.priority_classes or any(
            pc.preemptible for pc in self.priority_classes.values() if pc.value == value
        )
        self.__dict__["_lowest_class"] = (self.structure, value, preemptible)
        return value, preemptible

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


def skip(state: ClusterState) -> ClusterState:
    """Count an event the state cannot take (it is left as it was): `state.skipped`."""
    state.skipped += 1
    return state
