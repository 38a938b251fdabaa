"""The chargeback ledger's types: what `billing.evolve_billing` folds the log into.

`BillingState` has two halves: `Tracker`, the working memory the fold needs
to go on (small, msgspec-encodable, stored by the subscriber as a snapshot in
the same transaction as the ledger rows: `encode_tracker`), and `Ledger`,
additive accumulators a shell may `drain()` after a batch and add to a running
total (`merge_into`, the in-memory twin of the database upsert) or a database.
What each `Usage` quantity counts is said in `billing`.
"""

from __future__ import annotations

import msgspec

HOUR = 3600
MIB = 1 << 20
DEFAULT_GPU_LABEL = "nvidia.com/gpu.product"

UsageKey = tuple[str, int, str]
"""(job, hour start in seconds, GPU model)."""
CapacityKey = tuple[int, str]
"""(hour start in seconds, GPU model)."""


class Usage(msgspec.Struct, kw_only=True, gc=False):
    """One ledger row: what one job held in one hour on one GPU model."""

    queue: str
    priority_class: str = ""
    alloc_gpu_s: int = 0
    sampled_gpu_s: int = 0
    used_mgpu_s: int = 0
    """Milli-GPU-seconds: allocated x utilization x 1000."""
    borrowed_gpu_s: int = 0
    lost_gpu_s: int = 0
    cpu_mcore_s: int = 0
    mem_mib_s: int = 0

    @property
    def idle_mgpu_s(self) -> int:
        return self.sampled_gpu_s * 1000 - self.used_mgpu_s

    def add(self, other: Usage) -> None:
        self.alloc_gpu_s += other.alloc_gpu_s
        self.sampled_gpu_s += other.sampled_gpu_s
        self.used_mgpu_s += other.used_mgpu_s
        self.borrowed_gpu_s += other.borrowed_gpu_s
        self.lost_gpu_s += other.lost_gpu_s
        self.cpu_mcore_s += other.cpu_mcore_s
        self.mem_mib_s += other.mem_mib_s


USAGE_METRICS: tuple[str, ...] = tuple(f.name for f in msgspec.structs.fields(Usage))[2:]
"""The additive columns of a ledger row (every Usage field after queue and priority_class)."""


class JobRecord(msgspec.Struct, kw_only=True):
    """A job's description in the ledger (its dimension row)."""

    job: str
    queue: str
    priority_class: str = ""
    gpus: int = 0
    submitted_at: int = 0
    first_admitted_at: int | None = None
    ended_at: int | None = None
    status: str = "pending"
    preemptions: int = 0


class QueueRecord(msgspec.Struct, kw_only=True):
    """A queue as last configured: its nominal GPUs weigh idle-capacity sharing."""

    queue: str
    cohort: str = ""
    nominal_gpu: int = 0


class Slice(msgspec.Struct, array_like=True):
    """The part of a run on one GPU model (tracker-internal, hence array_like)."""

    model: str
    gpus: int
    borrowed: int
    cpu_milli: int
    mem_mib: int


class Run(msgspec.Struct, kw_only=True):
    """An allocation in progress, accrued up to `since`."""

    since: int
    slices: list[Slice]
    util_pm: int = -1
    """Last sampled utilization in per mille; -1 before the run's first sample."""


class PodSetReq(msgspec.Struct, array_like=True):
    name: str
    count: int
    requests: dict[str, int]


class ActiveJob(msgspec.Struct, kw_only=True):
    record: JobRecord
    podsets: list[PodSetReq]
    run: Run | None = None


class NodeInfo(msgspec.Struct, array_like=True):
    model: str
    gpus: int
    """Allocatable GPUs counted as capacity (0 while not ready)."""
    labels: dict[str, str] = {}
    """Its labels, to find its flavor again when flavors change (kept only while flavors exist)."""


class Tracker(msgspec.Struct, kw_only=True):
    """The fold's working memory; encodable, so a shell can snapshot it."""

    gpu_label: str = DEFAULT_GPU_LABEL
    seq: int = 0
    """Last stream sequence applied (or skipped)."""
    clock: int | None = None
    """Latest event time seen."""
    epoch: int = 0
    nodes: dict[str, NodeInfo] = {}
    jobs: dict[str, ActiveJob] = {}
    capacity: dict[str, int] = {}
    """GPU model -> GPUs of ready nodes now."""
    flavors: dict[str, dict[str, str]] = {}
    """Resource flavor -> the node labels it stands for."""
    cap_since: int | None = None
    applied: int = 0
    """Events folded (each sequence once)."""
    ignored: int = 0
    """Well-formed events that did not fit the state (unknown job, fenced decision...)."""
    skipped: int = 0
    """Malformed events (the shell could not decode them, or the fold failed on them)."""


class Ledger(msgspec.Struct, kw_only=True):
    """Additive accumulators since the last `drain()` (or since the start)."""

    usage: dict[UsageKey, Usage] = {}
    capacity: dict[CapacityKey, int] = {}
    jobs: dict[str, JobRecord] = {}
    queues: dict[str, QueueRecord] = {}
    skipped: list[tuple[int, str]] = []
    """(sequence, reason) of malformed events."""


class BillingState(msgspec.Struct, kw_only=True):
    tracker: Tracker = msgspec.field(default_factory=Tracker)
    ledger: Ledger = msgspec.field(default_factory=Ledger)


def new_billing_state(gpu_label: str = DEFAULT_GPU_LABEL) -> BillingState:
    return BillingState(tracker=Tracker(gpu_label=gpu_label))


def drain(state: BillingState) -> Ledger:
    """Take the accumulated rows out of the state (to add them to a database)."""
    out = state.ledger
    state.ledger = Ledger()
    return out


_tracker_encoder = msgspec.msgpack.Encoder()
_tracker_decoder = msgspec.msgpack.Decoder(Tracker)


def encode_tracker(tracker: Tracker) -> bytes:
    return _tracker_encoder.encode(tracker)


def decode_tracker(raw: bytes) -> Tracker:
    return _tracker_decoder.decode(raw)


def merge_into(total: Ledger, delta: Ledger) -> None:
    """Add a drained delta to a running total (the in-memory twin of the database upsert)."""
    for key, row in delta.usage.items():
        have = total.usage.get(key)
        if have is None:
            total.usage[key] = msgspec.structs.replace(row)
        else:
            have.add(row)
    for ckey, gpu_s in delta.capacity.items():
        total.capacity[ckey] = total.capacity.get(ckey, 0) + gpu_s
    for name, rec in delta.jobs.items():
        total.jobs[name] = msgspec.structs.replace(rec)
    total.queues.update(delta.queues)
    total.skipped.extend(delta.skipped)
