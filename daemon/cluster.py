"""What the scheduler loop needs from a cluster, and the Kubernetes implementation of it.

The loop talks to a cluster through `Cluster`: `run(sink)` pushes the facts it
observes (nodes, gangs, pods started and ended) to `sink` until cancelled,
reporting started once its initial view is in the sink; `apply(decision)`
makes one decision true (bindings, evictions) and is idempotent; `ready(decision)`
waits, bounded, until the cluster can apply it (an admission's pods exist) and
is awaited before `apply` holding no slot of the applier's limit; `holds(job)`
says whether pods of `job` still occupy nodes (a preemptor is bound only once
its victims' pods are gone).

A cluster may also find work of its own for a decision already applied (the Kubernetes
adapter: the pods a Job creates after others succeeded take those pods' slots of the
admitted gang, and are bound where the log placed them). Such a cluster is `Reapplying`:
the applier hands it `submit`, and the work (a `Reapply`) goes through the applier like a
decision of the log, so it too waits for the lease and for the job's earlier decisions.

A cluster is made per leadership term (`ClusterFactory`), with a view of the
log, so that its first push writes only what the log lacks. What a term's
cluster starts from may be kept warm for the replica's whole life, leading or
not (`KubeClusters.standby`, run by the loop as a standby service).

Implementations: `KubeCluster` (the Kubernetes adapter, `daemon/k8s`) and
`simcluster.SimulatedCluster` (in-process, for tests, benchmarks and
`muster daemon --simulated-cluster`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import anyio
from anyio.abc import TaskStatus

from muster.events.types import Event
from muster.projections.state import ClusterState

__all__ = ["Cluster", "ClusterFactory", "KubeCluster", "KubeClusters", "Reapply", "Reapplying", "Sink"]

Sink = Callable[[list[Event]], Awaitable[None]]


class Applied(Protocol):
    """What applying one decision did (`k8s.ApplyResult` fits)."""

    @property
    def ok(self) -> bool: ...

    @property
    def outcome(self) -> str: ...


class Cluster(Protocol):
    async def run(self, sink: Sink, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None: ...

    async def ready(self, event: Event) -> None: ...

    async def apply(self, event: Event) -> Applied: ...

    def holds(self, job: str) -> bool: ...


@dataclass(frozen=True)
class Reapply:
    """Work a cluster found for `job`'s decision already applied, e.g. binding its gang's successor pods."""

    job: str
    kind: str
    """What it is, for logs and the `muster_applied_decisions` metric (e.g. `Successors`)."""
    run: Callable[[], Awaitable[Applied]]


@runtime_checkable
class Reapplying(Protocol):
    """A cluster that finds work of its own for applied decisions; it hands it to `submit` (the applier)."""

    def reapply_through(self, submit: Callable[[Reapply], None]) -> None: ...


@runtime_checkable
class FlavorAware(Protocol):
    """A cluster whose nodes' schedulability depends on the log's flavors (the taints their pods tolerate)."""

    def flavors_changed(self) -> None: ...


ClusterFactory = Callable[[Callable[[], ClusterState]], Cluster]
"""Makes a cluster for one leadership term, given the fold of the log."""


class KubeCluster:
    """The Kubernetes adapter as a `Cluster`."""

    def __init__(self, api_client: Any, state: Callable[[], ClusterState], **adapter_options: Any) -> None:
        from muster.daemon.k8s import KubernetesAdapter

        self.adapter = KubernetesAdapter(api_client, state=state, **adapter_options)

    async def run(self, sink: Sink, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        await self.adapter.run(sink, task_status=task_status)

    async def ready(self, event: Event) -> None:
        await self.adapter.ready(event)

    async def apply(self, event: Event) -> Applied:
        result: Applied = await self.adapter.apply(event)
        return result

    def reapply_through(self, submit: Callable[[Reapply], None]) -> None:
        self.adapter.reapply = submit

    def flavors_changed(self) -> None:
        self.adapter.flavors_changed()

    def holds(self, job: str) -> bool:
        """Whether a pod of `job` that the kubelet has not let go of is still bound to a node."""
        from muster.daemon.k8s.gangs import TERMINATED
        from muster.events.types import JobId

        pods = self.adapter.translator.gangs.pods_of(JobId(job))
        if not pods:
            return False
        return any(p.node and p.phase not in TERMINATED for p in pods.values())

    def pod_keys(self, job: str) -> list[str] | None:
        """The `namespace/name` of the job's current pods (replacements after a preemption included)."""
        from muster.events.types import JobId

        pods = self.adapter.translator.gangs.pods_of(JobId(job))
        if not pods:
            return None
        return [p.key for p in pods.values()]

    @staticmethod
    def factory(api_client: Any, **adapter_options: Any) -> KubeClusters:
        return KubeClusters(api_client, **adapter_options)


class KubeClusters:
    """Makes each term's `KubeCluster`; `standby` keeps the replica's watch of the cluster warm in between.

    With `standby` running (every replica, leading or not), a new term's adapter starts from the
    objects it holds instead of listing the cluster (`k8s.mirroring`): a takeover decides sooner.
    """

    def __init__(self, api_client: Any, **adapter_options: Any) -> None:
        from muster.daemon.k8s.client import KubeClient
        from muster.daemon.k8s.mirroring import Mirror

        self.api_client = api_client
        self.adapter_options = adapter_options
        watch = {k: adapter_options[k] for k in ("backoff", "watch_seconds", "page_size") if k in adapter_options}
        client = KubeClient(api_client, request_seconds=adapter_options.get("request_seconds", 30.0))
        self.mirror = Mirror(client, **watch)

    def __call__(self, state: Callable[[], ClusterState]) -> Cluster:
        return KubeCluster(self.api_client, state, mirror=self.mirror, **self.adapter_options)

    async def standby(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch the cluster for the replica's whole life (until cancelled)."""
        await self.mirror.run(task_status=task_status)
