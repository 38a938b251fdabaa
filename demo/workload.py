"""The demo's users and controllers: a seeded stream of gangs, created as pods in the emulated cluster.

`Workload` plays the teams: it creates pod groups (`muster.dev/gang`,
`muster.dev/gang-size`, `muster.dev/queue`) with a runtime annotation the
simulated kubelet honours, at a Poisson rate, in four flavours: inference
(small, long, never preempted), large training gangs (whole racks or a
block), small training jobs and scavenger jobs (lowest priority, first to be
preempted). The teams submit unevenly, so some borrow and others reclaim.

Each gang also has a GPU utilization profile (`gpu_profile`), which the
demo's fake dcgm-exporter (`dcgm`) reports for its pods: training busy
70-95 %, scavengers 55-90 %, inference 20-45 %, and one small training job in
four allocated but idle (0-3 %: a hung job, a notebook left open, held
three times as long as drawn) - the allocated-versus-used gap billing reports
and idle reclaim acts on. The
profile is drawn from its own generator (seed and gang name), so the stream
of gangs is the same as without it.

It also plays the gangs' controller: its pods name it in ownerReferences (as
an operator's pods would), and a pod of a live gang that disappears (an
eviction) is replaced by a new pod with the same labels, so a preempted gang
comes back as a whole and is admitted again under the same job id (pods that
name no controller would end with JobFailed instead: nothing recreates them).

Deterministic for a seed, apart from timing.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskStatus

from muster.daemon.k8s import manifests
from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.watching import Synced, WatchEvent, watch_objects
from muster.events.types import (
    BorrowWithinCohort,
    CohortConfigured,
    CohortName,
    Event,
    FlavorConfigured,
    FlavorQuota,
    IdleReclaimPolicy,
    PreemptionPolicy,
    PriorityClassConfigured,
    QueueConfigured,
    QueueName,
    ResourceGroup,
    SchedulerConfigured,
)

__all__ = [
    "BLOCK",
    "FLAVORS",
    "GPU_MODEL",
    "RACK",
    "TEAMS",
    "GangSpec",
    "Workload",
    "demo_config",
    "demo_nodes",
    "gpu_profile",
]

BLOCK = "muster.dev/block"
RACK = "muster.dev/rack"
TEAMS = ("team-a", "team-b", "team-c", "team-d")
TEAM_WEIGHTS = (0.4, 0.3, 0.2, 0.1)
NOMINAL_GPUS = 128
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_MODEL = "NVIDIA-H100-80GB-HBM3"
"""The GPU model label of the first half of the demo's blocks (what gpu-feature-discovery sets)."""
FLAVORS = {"h100": GPU_MODEL, "a100": "NVIDIA-A100-SXM4-80GB"}
"""The demo's two GPU models as resource flavors (flavor -> model label): half of the blocks each;
billing books and prices GPUs by flavor."""
IDLE_SHARE = 0.25
"""Share of small training jobs that hold their GPUs without using them."""
IDLE_THRESHOLD = 0.05
IDLE_RUNTIME = 3
"""An idle job holds its GPUs this many times its drawn runtime: nobody watches it, it runs to its time limit."""
CONTROLLER = {"apiVersion": "demo.muster.dev/v1", "kind": "Trainer", "controller": True}
"""The ownerReference of every demo pod: the workload plays this controller and recreates evicted pods."""


def demo_nodes(blocks: int = 4, racks: int = 4, nodes: int = 4, gpus: int = 8) -> list[dict[str, Any]]:
    """Node objects of a blocks x racks x nodes cluster, labelled with their block, rack and GPU model
    (the first half of the blocks H100, the rest A100)."""
    out = []
    models = list(FLAVORS.values())
    for b in range(blocks):
        model = models[min(len(models) - 1, b * len(models) // blocks)]
        for r in range(racks):
            for n in range(nodes):
                labels = {BLOCK: f"b{b}", RACK: f"b{b}-r{r}", GPU_PRODUCT: model}
                out.append(manifests.node(f"b{b}-r{r}-n{n}", gpus=gpus, labels=labels))
    return out


def demo_config(at: int, *, idle_after: int | None = None, reserve_after: int | None = None) -> list[Event]:
    """Topology levels, priority classes, two GPU flavors, one cohort and four teams of 128 GPUs each:
    64 of each flavor, team-a and team-b trying H100 first, team-c and team-d A100 first.

    With `idle_after` (seconds), idle reclaim is on: a preemptible job whose GPUs stay at or below 5 %
    that long is preempted when a waiting gang could use its GPUs, borrowed or not (so that a short
    demo shows it; a cluster would rather keep `only_borrowing`, the default). With `reserve_after`
    (seconds) every team reserves room for its head (`projections.reservations`); reservations do not
    cover flavors yet, so each team's 128 GPUs are then one pool over both models.
    """
    idle = None
    if idle_after is not None:
        idle = IdleReclaimPolicy(threshold=IDLE_THRESHOLD, after=idle_after, only_borrowing=False)
    events: list[Event] = [
        SchedulerConfigured(at=at, levels=[BLOCK, RACK], idle_reclaim=idle),
        PriorityClassConfigured(at=at, name="inference", value=1000, preemptible=False),
        PriorityClassConfigured(at=at, name="training", value=100),
        PriorityClassConfigured(at=at, name="scavenger", value=0),
        CohortConfigured(at=at, name=CohortName("org")),
        *(FlavorConfigured(at=at, name=f, node_labels={GPU_PRODUCT: m}) for f, m in FLAVORS.items()),
    ]
    policy = PreemptionPolicy(
        within_queue="LowerPriority",
        reclaim_within_cohort="Any",
        borrow_within_cohort=BorrowWithinCohort(policy="LowerPriority", max_priority_threshold=0),
    )
    for i, team in enumerate(TEAMS):
        order = list(FLAVORS) if i < len(TEAMS) // 2 else list(reversed(FLAVORS))
        share = NOMINAL_GPUS // len(order)
        group = ResourceGroup(covered=["gpu"], flavors=[FlavorQuota(name=f, nominal={"gpu": share}) for f in order])
        quota: dict[str, Any] = (
            {"resource_groups": [group]} if reserve_after is None else {"nominal": {"gpu": NOMINAL_GPUS}}
        )
        events.append(
            QueueConfigured(
                at=at,
                name=QueueName(team),
                cohort=CohortName("org"),
                preemption=policy,
                reserve_after=reserve_after,
                **quota,
            )
        )
    return events


@dataclass(frozen=True)
class GangSpec:
    name: str
    queue: str
    kind: str
    pods: int
    gpus: int
    priority_class: str
    runtime: int
    required: str | None = None
    preferred: str | None = None

    @property
    def total_gpus(self) -> int:
        return self.pods * self.gpus


def next_gang(rng: random.Random, n: int) -> GangSpec:
    team = rng.choices(TEAMS, TEAM_WEIGHTS)[0]
    roll = rng.random()
    name = f"{team}-g{n:04d}"
    if roll < 0.10:
        pods, gpus = rng.choice((1, 2)), rng.choice((1, 2))
        return GangSpec(name, team, "inference", pods, gpus, "inference", rng.randint(60, 120))
    if roll < 0.30:
        pods = rng.choice((4, 4, 8, 16))
        required = RACK if pods == 4 else None
        preferred = BLOCK if pods > 4 else None
        return GangSpec(name, team, "large", pods, 8, "training", rng.randint(20, 50), required, preferred)
    if roll < 0.70:
        return GangSpec(name, team, "training", rng.choice((1, 2)), 8, "training", rng.randint(10, 30))
    return GangSpec(name, team, "scavenger", rng.randint(1, 4), rng.choice((1, 2, 4)), "scavenger", rng.randint(10, 40))


def gpu_profile(seed: int, spec: GangSpec) -> float:
    """The mean GPU utilization (0..1) of a gang's GPUs while it runs; the same for a seed and gang name."""
    rng = random.Random(f"{seed}/{spec.name}")
    if spec.kind == "inference":
        return round(rng.uniform(0.20, 0.45), 3)
    if spec.kind == "scavenger":
        return round(rng.uniform(0.55, 0.90), 3)
    if spec.kind == "training" and rng.random() < IDLE_SHARE:
        return round(rng.uniform(0.0, 0.03), 3)
    return round(rng.uniform(0.70, 0.95), 3)


class Workload:
    def __init__(
        self,
        emulator: Any,
        api_client: Any,
        *,
        seed: int = 1,
        rate: float = 1.5,
        on_submit: Callable[[GangSpec], None] | None = None,
    ) -> None:
        """`rate`: gangs per second (already multiplied by the demo's speed)."""
        self.emulator = emulator
        self.client = KubeClient(api_client)
        self.seed = seed
        self.rng = random.Random(seed)
        self.rate = rate
        self.on_submit = on_submit
        self.gangs: dict[str, GangSpec] = {}
        self.profiles: dict[str, float] = {}
        """Gang name -> its GPU utilization (`gpu_profile`)."""
        self._phase: dict[str, str] = {}
        """Pod key -> last phase seen."""
        self._replacements = 0
        self.replaced = 0

    def _create_pod(self, spec: GangSpec, index: int, suffix: str = "") -> None:
        annotations = {"muster.dev/runtime": str(spec.runtime)}
        if spec.required:
            annotations["muster.dev/topology-required"] = spec.required
        if spec.preferred:
            annotations["muster.dev/topology-preferred"] = spec.preferred
        pod = manifests.pod(
            f"{spec.name}-{index}{suffix}",
            spec.queue,
            gpus=spec.gpus,
            labels={
                "muster.dev/gang": spec.name,
                "muster.dev/gang-size": str(spec.pods),
                "muster.dev/queue": spec.queue,
                "demo/index": str(index),
            },
            annotations=annotations,
            owner=CONTROLLER | {"name": spec.name, "uid": f"demo-{spec.name}"},
            priority_class=spec.priority_class,
            grace_seconds=0,
        )
        self.emulator.put_object("v1/pods", pod)

    def submit(self, spec: GangSpec) -> None:
        profile = self.profiles[spec.name] = gpu_profile(self.seed, spec)
        if profile <= IDLE_THRESHOLD:
            spec = dataclasses.replace(spec, runtime=spec.runtime * IDLE_RUNTIME)
        self.gangs[spec.name] = spec
        for i in range(spec.pods):
            self._create_pod(spec, i)
        if self.on_submit is not None:
            self.on_submit(spec)

    def gpu_utilization(self, pod: dict[str, Any]) -> float | None:
        """What the GPUs of `pod` are doing: its gang's profile; None for a pod of no demo gang."""
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return self.profiles.get(str(labels.get("muster.dev/gang") or ""))

    async def run(self) -> None:
        """Submit gangs at `rate` per second (exponential gaps) until cancelled."""
        n = 0
        while True:
            self.submit(next_gang(self.rng, n))
            n += 1
            await anyio.sleep(self.rng.expovariate(self.rate))

    async def controller(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Replace the evicted pods of live gangs, as a Job controller would."""
        started = False
        async with aclosing(watch_objects(self.client, "pods")) as events:
            async for item in events:
                if isinstance(item, Synced):
                    if not started:
                        started = True
                        task_status.started()
                    continue
                if not isinstance(item, WatchEvent):
                    continue
                meta = item.obj.get("metadata") or {}
                labels = meta.get("labels") or {}
                key = f"{meta.get('namespace')}/{meta.get('name')}"
                gang = self.gangs.get(str(labels.get("muster.dev/gang") or ""))
                if gang is None:
                    continue
                if item.type != "DELETED":
                    self._phase[key] = str((item.obj.get("status") or {}).get("phase") or "Pending")
                    continue
                if self._phase.pop(key, "Pending") in ("Succeeded", "Failed"):
                    continue
                self._replacements += 1
                self.replaced += 1
                self._create_pod(gang, int(labels.get("demo/index", 0)), f"-r{self._replacements}")
