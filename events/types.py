"""The event types of muster: one tagged union of frozen msgspec Structs.

Invariants:
- Every event has `type` (its tag), `at` (event time, integer seconds: epoch
  seconds in the daemon, virtual seconds in `muster sim`) and `v` (schema
  version of that type).
- Schemas evolve additively: new fields go last and have defaults. A breaking
  change bumps `v` and adds a pure upcaster in `codec.py`.
- Quantities are integers in base units: whole GPUs, milli-CPU, bytes.
- Decision events (admissions, preemptions, inadmissible, rejections, reservations) carry the
  leader `epoch` and the scheduling `cycle` that produced them.
"""

from __future__ import annotations

from typing import Literal, NewType

import msgspec
from msgspec import UNSET, UnsetType

JobId = NewType("JobId", str)
QueueName = NewType("QueueName", str)
NodeName = NewType("NodeName", str)
CohortName = NewType("CohortName", str)

Resources = dict[str, int]
"""Resource name (`gpu`, `cpu`, `memory`, ...) to an integer amount in base units."""

PreemptionReason = Literal[
    "WithinQueue",
    "ReclaimWithinCohort",
    "BorrowPolicy",
    "BorrowWithinCohort",
    "FairSharing",
    "NodeFailure",
    "IdleReclaim",
]
WithinQueuePolicy = Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"]
ReclaimPolicy = Literal["Never", "LowerPriority", "Any"]
BorrowPolicy = Literal["Never", "LowerPriority"]
QueueingStrategy = Literal["best_effort_fifo", "strict_fifo", "shortest_limit_first"]


class Topology(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """Where a podset's pods may go: inside one domain of `required`, or preferably of `preferred`."""

    required: str | None = None
    preferred: str | None = None


class PodSet(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """`count` identical pods, each requesting `requests`."""

    name: str
    count: int
    requests: Resources
    topology: Topology | None = None
    flavors: list[str] = []
    """The flavors its pods may use (empty: any of its queue's); Kueue's node selector on a podset."""


class BorrowWithinCohort(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    policy: BorrowPolicy = "Never"
    max_priority_threshold: int | None = None


class PreemptionPolicy(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    within_queue: WithinQueuePolicy = "Never"
    reclaim_within_cohort: ReclaimPolicy = "Never"
    borrow_within_cohort: BorrowWithinCohort = BorrowWithinCohort()


class IdleReclaimPolicy(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    threshold: float = 0.05
    after: int = 1800
    only_borrowing: bool = True


class Taint(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """A node taint a flavor's pods tolerate (Kubernetes' `key=value:effect`)."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"


class FlavorQuota(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """One flavor of a resource group: its quota per covered resource."""

    name: str
    nominal: Resources = {}
    borrowing_limit: Resources | None = None
    lending_limit: Resources | None = None


class ResourceGroup(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Resources whose quota a podset takes from one flavor, tried in order (Kueue's resourceGroups)."""

    covered: list[str]
    flavors: list[FlavorQuota]


WhenCanBorrow = Literal["Borrow", "TryNextFlavor"]
WhenCanPreempt = Literal["Preempt", "TryNextFlavor"]


class FlavorFungibility(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Whether a podset stops at a flavor where it must borrow or preempt (Kueue's defaults)."""

    when_can_borrow: WhenCanBorrow = "Borrow"
    when_can_preempt: WhenCanPreempt = "TryNextFlavor"


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", gc=False):
    """Base of every event. `at` is the event time in integer seconds.

    Events (and the structs inside them) are values that never refer back to
    anything, so they can form no reference cycle: `gc=False` keeps them out
    of the cyclic collector, which otherwise scans every decoded event of a
    replay several times (a third of a replay's CPU on a large log).
    """

    at: int
    v: int = 1


# ---------------------------------------------------------------- configuration


class SchedulerConfigured(Event, frozen=True, kw_only=True, tag="SchedulerConfigured"):
    """Cluster-wide scheduler settings: topology levels (outermost first), fair sharing, idle reclaim."""

    levels: list[str] = []
    fair_sharing: bool = False
    idle_reclaim: IdleReclaimPolicy | None = None


class PriorityClassConfigured(Event, frozen=True, kw_only=True, tag="PriorityClassConfigured"):
    name: str
    value: int
    preemptible: bool = True


class CohortConfigured(Event, frozen=True, kw_only=True, tag="CohortConfigured"):
    name: CohortName
    parent: CohortName | None = None


class QueueConfigured(Event, frozen=True, kw_only=True, tag="QueueConfigured"):
    """A queue's whole configuration; a later event for the same name replaces it."""

    name: QueueName
    cohort: CohortName | None = None
    nominal: Resources = {}
    borrowing_limit: Resources | None = None
    lending_limit: Resources | None = None
    weight: float = 1.0
    preemption: PreemptionPolicy = PreemptionPolicy()
    queueing_strategy: QueueingStrategy = "best_effort_fifo"
    """`strict_fifo`: the job at the head of the queue holds back every job behind it (Kueue's StrictFIFO);
    `shortest_limit_first`: jobs of equal priority go by declared limit, shortest first, those without one last."""
    resource_groups: list[ResourceGroup] | UnsetType = UNSET
    """Quota per flavor (Kueue's resourceGroups); unset: `nominal` and the limits hold over every node.
    UNSET, not `[]`, so a queue without flavors is stored exactly as before they existed."""
    flavor_fungibility: FlavorFungibility | UnsetType = UNSET
    reserve_after: int | None = None
    """Seconds a job may wait before the core reserves room for it (`projections.reservations`);
    None: the queue makes no reservations."""


# ---------------------------------------------------------------- nodes


class NodeAdded(Event, frozen=True, kw_only=True, tag="NodeAdded"):
    """A node joined. `reserved` is capacity held by pods muster does not schedule."""

    node: NodeName
    labels: dict[str, str] = {}
    capacity: Resources = {}
    ready: bool = True
    unschedulable: bool = False
    reserved: Resources = {}


class NodeUpdated(Event, frozen=True, kw_only=True, tag="NodeUpdated"):
    """A node's whole description changed; a node that stops being ready evicts its jobs."""

    node: NodeName
    labels: dict[str, str] = {}
    capacity: Resources = {}
    ready: bool = True
    unschedulable: bool = False
    reserved: Resources = {}


class NodeRemoved(Event, frozen=True, kw_only=True, tag="NodeRemoved"):
    node: NodeName


class NodeCordoned(Event, frozen=True, kw_only=True, tag="NodeCordoned"):
    """`cordoned=False` lifts the cordon."""

    node: NodeName
    cordoned: bool = True


# ---------------------------------------------------------------- jobs: inputs


class ControllerRef(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The object that makes a labelled pod group's pods (an operator's Trainer, a Deployment...): the
    ownerReference with `controller: true` its pods name, with their namespace.

    On the log so that what a controller's pods are does not depend on who watched them: a new leader
    judges a job whose pods are gone by its controller, and knows a controller whose job a user
    cancelled (`daemon.k8s.controllers`)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str


class JobSubmitted(Event, frozen=True, kw_only=True, tag="JobSubmitted"):
    """A gang: every pod of every podset runs together or not at all.

    v2 replaced v1's flat `gpus`/`pods` with `podsets` (see codec.upcast_job_submitted_v1).
    `pods` maps the gang pod name `PODSET-INDEX` to the Kubernetes pod `namespace/name`
    when the gang came from a cluster. `max_runtime` is the time limit its user declared
    (seconds per run, counted from each admission): the cluster ends a run that reaches it.
    `controller`: for a labelled pod group whose pods name a controller, that controller; unset
    otherwise (and in logs older than it), so other submissions are stored exactly as before.
    """

    job: JobId
    queue: QueueName
    priority_class: str | None = None
    podsets: list[PodSet] = []
    runtime: int | None = None
    checkpoint_every: int | None = None
    pods: dict[str, str] = {}
    source: str = ""
    v: int = 2
    max_runtime: int | None = None
    controller: ControllerRef | UnsetType = UNSET


class JobCancelled(Event, frozen=True, kw_only=True, tag="JobCancelled"):
    """The job will not run (any more): withdrawn by its user, or its workload is gone from the cluster.

    `reason` (added later, so last and defaulted) says which, e.g. `WorkloadDeleted: ...`.
    `queue` is set by a user's `muster cancel` (the job's queue, on that queue's control subject,
    which the queue's own identity may publish to); None from the daemon and in older logs.
    """

    job: JobId
    reason: str = ""
    queue: QueueName | None = None


class JobHeld(Event, frozen=True, kw_only=True, tag="JobHeld"):
    """A user held a pending job (`muster hold`): the scheduler does not try it until a `JobReleased`.

    It keeps its place in its queue (its submission order) while held. `queue`: as `JobCancelled`'s.
    """

    job: JobId
    reason: str = ""
    queue: QueueName | None = None


class JobReleased(Event, frozen=True, kw_only=True, tag="JobReleased"):
    """A held job may run again (`muster release`). `queue`: as `JobCancelled`'s."""

    job: JobId
    queue: QueueName | None = None


class JobStarted(Event, frozen=True, kw_only=True, tag="JobStarted"):
    """Every pod of the gang is running."""

    job: JobId
    run: int = 0
    """Which of the job's runs started: how many times the job was preempted before it (0: its first run).
    It names the run in the fact's msg id (`daemon.msgids.fact_id`), so that a run starting in the same
    second as the one before it is not taken for a repeat of that start."""


class JobFinished(Event, frozen=True, kw_only=True, tag="JobFinished"):
    job: JobId


class JobFailed(Event, frozen=True, kw_only=True, tag="JobFailed"):
    job: JobId
    reason: str = ""


class GpuUtilizationSampled(Event, frozen=True, kw_only=True, tag="GpuUtilizationSampled"):
    """Measured GPU utilization of a job, 0..1 (mean over its GPUs)."""

    job: JobId
    gpu: float


# ---------------------------------------------------------------- leadership


class LeaderElected(Event, frozen=True, kw_only=True, tag="LeaderElected"):
    """A daemon became leader; decisions of lower epochs are ignored from here on."""

    epoch: int
    holder: str


# ---------------------------------------------------------------- decisions


class JobAdmitted(Event, frozen=True, kw_only=True, tag="JobAdmitted"):
    """The whole gang is placed: `placement` maps every pod `PODSET-INDEX` to a node."""

    job: JobId
    queue: QueueName
    placement: dict[str, NodeName]
    borrowed: Resources = {}
    cycle: int = 0
    epoch: int = 0
    policy_version: str = ""
    explanation: str = ""
    flavors: dict[str, dict[str, str]] | UnsetType = UNSET
    """Per podset, the flavor of each resource its quota was taken from (unset: no flavors)."""


class JobPreempted(Event, frozen=True, kw_only=True, tag="JobPreempted"):
    """`job` is the victim; it is requeued with its work since the last checkpoint lost."""

    job: JobId
    preemptor: JobId | None
    reason: PreemptionReason
    lost_gpu_seconds: int = 0
    cycle: int = 0
    epoch: int = 0


class JobInadmissible(Event, frozen=True, kw_only=True, tag="JobInadmissible"):
    """Why a pending job still waits; written when the reason changes."""

    job: JobId
    reason: str
    cycle: int = 0
    epoch: int = 0


class JobRejected(Event, frozen=True, kw_only=True, tag="JobRejected"):
    """The job's spec is invalid; it will never run."""

    job: JobId
    reason: str
    cycle: int = 0
    epoch: int = 0


class FlavorConfigured(Event, frozen=True, kw_only=True, tag="FlavorConfigured"):
    """A resource flavor: the nodes carrying all of `node_labels`; its pods tolerate `taints`.

    A later event of the same name replaces it (Kueue's ResourceFlavor)."""

    name: str
    node_labels: dict[str, str] = {}
    taints: list[Taint] = []


class SubmissionRejected(Event, frozen=True, kw_only=True, tag="SubmissionRejected"):
    """A submission refused because its job id is taken by a job already on the log (`reason`
    names that job's queue and state); that job is left as it is. Decided by the core, so a
    replay, an audit and a new leader refuse the same submissions."""

    job: JobId
    queue: QueueName
    reason: str
    cycle: int = 0
    epoch: int = 0


class ExpectedEnd(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A running job a reservation waits for, and when its declared limit ends it (None: no limit)."""

    job: JobId
    end: int | None = None


class ReservationMade(Event, frozen=True, kw_only=True, tag="ReservationMade"):
    """Room held for a pending job: only jobs whose declared limit ends by `expected_start` may be
    placed on `nodes` until it is released (`projections.reservations`)."""

    job: JobId
    queue: QueueName
    nodes: list[NodeName]
    domain: str = ""
    """The topology domain the nodes lie in (`b1/r3`), "" when the job needs none."""
    expected_start: int | None = None
    """When the jobs it waits for end by their limits (None: one of them declared none)."""
    waits_for: list[ExpectedEnd] = []
    reason: str = ""
    cycle: int = 0
    epoch: int = 0
    needs: dict[NodeName, Resources] = {}
    """What the job's pods take on each node: no more than this is held back there ({}: all that is free)."""


class ReservationReleased(Event, frozen=True, kw_only=True, tag="ReservationReleased"):
    """A job's reservation ends: `admitted`, `cancelled` (it left or was held), `replaced` (its room
    changed: a new `ReservationMade` follows)."""

    job: JobId
    reason: str
    cycle: int = 0
    epoch: int = 0


class CycleSettled(Event, frozen=True, kw_only=True, tag="CycleSettled"):
    """A cycle that decided nothing, but judged `judged` pending jobs: each still waits for the reason it
    has. Folded, their verdicts stand (`projections.parking`), so the next cycle does not judge them again.

    A decision like the others (fenced, audited), but one that changes no job: it does not end the
    instant's settling (`projections.settling`) and takes no cycle number of its own (the next cycle
    that decides has this `cycle` too); `serial` tells the records apart.
    """

    judged: int
    """Jobs the cycle judged and set aside (the members of its parks)."""
    serial: int
    """How many `CycleSettled` the log holds up to this one (the fold counts them: `ClusterState.settles`)."""
    cycle: int = 0
    epoch: int = 0


AnyEvent = (
    SchedulerConfigured
    | PriorityClassConfigured
    | CohortConfigured
    | QueueConfigured
    | NodeAdded
    | NodeUpdated
    | NodeRemoved
    | NodeCordoned
    | JobSubmitted
    | JobCancelled
    | JobHeld
    | JobReleased
    | JobStarted
    | JobFinished
    | JobFailed
    | GpuUtilizationSampled
    | LeaderElected
    | JobAdmitted
    | JobPreempted
    | JobInadmissible
    | JobRejected
    | SubmissionRejected
    | FlavorConfigured
    | ReservationMade
    | ReservationReleased
    | CycleSettled
)

EVENT_TYPES: tuple[type[Event], ...] = (
    SchedulerConfigured,
    PriorityClassConfigured,
    CohortConfigured,
    QueueConfigured,
    NodeAdded,
    NodeUpdated,
    NodeRemoved,
    NodeCordoned,
    JobSubmitted,
    JobCancelled,
    JobHeld,
    JobReleased,
    JobStarted,
    JobFinished,
    JobFailed,
    GpuUtilizationSampled,
    LeaderElected,
    JobAdmitted,
    JobPreempted,
    JobInadmissible,
    JobRejected,
    SubmissionRejected,
    FlavorConfigured,
    ReservationMade,
    ReservationReleased,
    CycleSettled,
)

# not annotated as `tuple[type[Event], ...]`: an isinstance test against it narrows to these types
# (all carry `cycle` and `epoch`)
DECISION_TYPES = (
    JobAdmitted,
    JobPreempted,
    JobInadmissible,
    JobRejected,
    SubmissionRejected,
    ReservationMade,
    ReservationReleased,
    CycleSettled,
)

__all__ = [
    "DECISION_TYPES",
    "EVENT_TYPES",
    "AnyEvent",
    "BorrowWithinCohort",
    "CohortConfigured",
    "CohortName",
    "ControllerRef",
    "CycleSettled",
    "Event",
    "ExpectedEnd",
    "FlavorConfigured",
    "FlavorFungibility",
    "FlavorQuota",
    "GpuUtilizationSampled",
    "IdleReclaimPolicy",
    "JobAdmitted",
    "JobCancelled",
    "JobFailed",
    "JobFinished",
    "JobHeld",
    "JobId",
    "JobInadmissible",
    "JobPreempted",
    "JobRejected",
    "JobReleased",
    "JobStarted",
    "JobSubmitted",
    "LeaderElected",
    "NodeAdded",
    "NodeCordoned",
    "NodeName",
    "NodeRemoved",
    "NodeUpdated",
    "PodSet",
    "PreemptionPolicy",
    "PreemptionReason",
    "PriorityClassConfigured",
    "QueueConfigured",
    "QueueName",
    "QueueingStrategy",
    "ReclaimPolicy",
    "ReservationMade",
    "ReservationReleased",
    "ResourceGroup",
    "Resources",
    "SchedulerConfigured",
    "SubmissionRejected",
    "Taint",
    "Topology",
    "WhenCanBorrow",
    "WhenCanPreempt",
    "WithinQueuePolicy",
    "event_tag",
]


def event_tag(cls: type[Event]) -> str:
    """The `type` tag of an event class."""
    tag = cls.__struct_config__.tag
    assert isinstance(tag, str)
    return tag
