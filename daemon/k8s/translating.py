"""From Node and Pod changes to muster events (pure; the adapter does the I/O).

Feed it watch events (`on_node`, `on_pod`) and owner sizes (`on_owner_size`),
then `flush(at)` returns the events for everything that changed since the
last flush: node events first (sorted by node name), then job events in the
order they happened.

Invariants:
- A node event is written only when muster's view of the node changed
  (labels, allocatable, readiness, taints, cordon, reserved capacity), not for
  every status heartbeat; or when the log's flavors changed which of its taints
  muster tolerates (a flavor applied after its nodes were tainted makes them
  schedulable with no change to the nodes: `flush` judges them again).
- `reserved` on a node is the sum of the requests of the pods bound there by
  other schedulers (kube-scheduler, DaemonSets) that have not terminated, and
  of muster's own pods the log no longer counts but that still hold the node
  (evicted pods in their grace period, the survivors of a failed gang).
- A deleted node ends the jobs of the gangs it ran whose pods nothing recreates
  (bare pods, pod groups: JobFailed); gangs with a controller are left to the
  core, which evicts and requeues them.
- With a view of the log (`state`), the first flush writes only what differs
  from it: unchanged nodes are not re-added, nodes that vanished while no
  adapter ran are removed, known jobs are not resubmitted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from muster.daemon.k8s.controllers import ControllerJobs
from muster.daemon.k8s.gangs import Gangs
from muster.daemon.k8s.objects import DEFAULT_TOLERATED_TAINTS, NodeView, node_view, taints_block
from muster.daemon.k8s.owners import Sizing
from muster.daemon.k8s.pods import Owner, PodInfo, pod_info
from muster.daemon.k8s.watching import WatchEvent, object_key
from muster.events.types import (
    Event,
    JobId,
    NodeAdded,
    NodeCordoned,
    NodeName,
    NodeRemoved,
    NodeUpdated,
)
from muster.projections.flavors import tolerated_taint_keys
from muster.projections.state import ClusterState

__all__ = ["Translator"]

Resources = dict[str, int]


@dataclass(frozen=True)
class _Emitted:
    labels: dict[str, str]
    capacity: Resources
    ready: bool
    unschedulable: bool
    reserved: Resources
    cordoned: bool

    def same_description(self, other: _Emitted) -> bool:
        return (self.labels, self.capacity, self.ready, self.unschedulable, self.reserved) == (
            other.labels,
            other.capacity,
            other.ready,
            other.unschedulable,
            other.reserved,
        )


class Translator:
    def __init__(
        self,
        *,
        scheduler_name: str = "muster",
        tolerated_taints: frozenset[str] = DEFAULT_TOLERATED_TAINTS,
        state: Callable[[], ClusterState] | None = None,
        namespace_queues: bool = False,
    ) -> None:
        self.scheduler_name = scheduler_name
        self.tolerated_taints = tolerated_taints
        self._state = state
        self._nodes: dict[str, NodeView] = {}
        self._emitted: dict[str, _Emitted] = {}
        self._reserving: dict[str, tuple[str, Resources]] = {}
        """Pod key -> (node, requests) for running pods of other schedulers."""
        self._reserved: dict[str, Resources] = {}
        self._dirty: set[str] = set()
        self._jobs: list[Event] = []
        self._lost: set[str] = set()
        """Nodes deleted since the last flush."""
        self._primed = False
        self._judged_with: frozenset[str] | None = None
        """The taints tolerated when every node view was last judged (`_judge_taints`)."""
        self.flavors_changed = False
        """Set by the adapter when the log's flavors changed: `flush` has nodes to judge again."""
        self.gangs = Gangs(
            known=self._known_job if state is not None else None,
            namespace_queues=namespace_queues,
            claim=ControllerJobs(state).claim if state is not None else None,
        )
        self.problems: list[str] = []

    def _tolerated(self) -> frozenset[str]:
        """The taints that leave a node schedulable: the configured ones, and those of the log's flavors
        (their pods get the tolerations at binding)."""
        if self._state is None:
            return self.tolerated_taints
        return self.tolerated_taints | tolerated_taint_keys(self._state())

    # ------------------------------------------------------------ inputs

    def on_node(self, event: WatchEvent) -> None:
        name = object_key(event.obj)
        if event.type == "DELETED":
            self._nodes.pop(name, None)
            # judged at the flush, which writes them with the node's removal: the core then never
            # evicts and requeues a gang whose pods can never come back
            self._lost.add(name)
        else:
            problems: list[str] = []
            self._nodes[name] = node_view(event.obj, self._tolerated(), problems)
            if problems:
                self.problems.append(f"node {name}: " + "; ".join(problems))
        self._dirty.add(name)

    def on_pod(self, event: WatchEvent, at: int) -> None:
        key = object_key(event.obj)
        if event.type == "DELETED":
            self._unreserve(key)
            self._jobs += self.gangs.pod_deleted(key, at)
            return
        info = event.info if event.info is not None else pod_info(event.obj)
        if info.scheduler == self.scheduler_name and info.gated and not info.node:
            # as kube-scheduler: a pod is not schedulable until its gates are removed (gates can only be
            # removed, so a gated pod was never part of a gang); its gang waits for it, whole
            return
        if info.scheduler == self.scheduler_name:
            self._jobs += self.gangs.pod_changed(info, at)
            self.gangs.recheck.add(key)
            self._recheck()
        elif info.node and info.phase not in ("Succeeded", "Failed"):
            self._reserve(info)
        else:
            self._unreserve(key)

    def _recheck(self) -> None:
        """Reserve what muster's own pods hold outside their job's accounting (see Gangs.holds_capacity)."""
        keys, self.gangs.recheck = self.gangs.recheck, set()
        for key in sorted(keys):
            info = self.gangs.pod(key)
            if info is not None and self.gangs.holds_capacity(info):
                self._reserve(info)
            else:
                self._unreserve(key)

    def on_owner_size(self, owner: Owner, sizing: Sizing, at: int) -> None:
        self._jobs += self.gangs.set_size(owner, sizing, at)
        self._recheck()

    def on_namespace_queue(self, namespace: str, queue: str, at: int) -> None:
        """A namespace's default queue (`muster.dev/default-queue`), "" for none."""
        self._jobs += self.gangs.set_namespace_queue(namespace, queue, at)
        self._recheck()

    def add_job_events(self, events: list[Event]) -> None:
        """Job events found while applying (a pod gone before its binding), written with the next flush."""
        self._jobs += events

    @property
    def changed(self) -> bool:
        """Whether `flush` may have something to write (changes since the last flush)."""
        return bool(
            not self._primed or self._lost or self.gangs.recheck or self._dirty or self._jobs or self.flavors_changed
        )

    def flush(self, at: int) -> list[Event]:
        if not self._primed:
            self._primed = True
            self._prime_from_log()
        if self._lost:
            lost = {name for name in self._lost if name not in self._nodes}  # not re-created meanwhile
            self._lost.clear()
            self._jobs += self.gangs.nodes_lost(lost, at)
        self._recheck()
        self._judge_taints()
        out: list[Event] = []
        for name in sorted(self._dirty):
            out += self._node_events(name, at)
        self._dirty.clear()
        out += self._jobs
        self._jobs = []
        self.problems += self.gangs.problems
        self.gangs.problems = []
        return out

    # ------------------------------------------------------------ views

    def node_names(self) -> list[str]:
        return sorted(self._nodes)

    # ------------------------------------------------------------ internals

    def _known_job(self, job: JobId) -> Any:
        assert self._state is not None
        return self._state().jobs.get(job)

    def _reserve(self, info: PodInfo) -> None:
        old = self._reserving.get(info.key)
        new = (info.node, info.requests)
        if old == new:
            return
        self._unreserve(info.key)
        self._reserving[info.key] = new
        acc = self._reserved.setdefault(info.node, {})
        for k, v in info.requests.items():
            acc[k] = acc.get(k, 0) + v
        self._dirty.add(info.node)

    def _unreserve(self, key: str) -> None:
        old = self._reserving.pop(key, None)
        if old is None:
            return
        node, requests = old
        acc = self._reserved.get(node, {})
        for k, v in requests.items():
            acc[k] = acc.get(k, 0) - v
            if acc[k] <= 0:
                del acc[k]
        self._dirty.add(node)

    def _judge_taints(self) -> None:
        """Judge every node's taints again when the tolerated ones changed (the log's flavors, see `_tolerated`)."""
        self.flavors_changed = False
        tolerated = self._tolerated()
        if tolerated == self._judged_with:
            return
        self._judged_with = tolerated
        for name, view in self._nodes.items():
            blocked = taints_block(view.taints, tolerated)
            if blocked != view.unschedulable:
                self._nodes[name] = replace(view, unschedulable=blocked)
                self._dirty.add(name)

    def _prime_from_log(self) -> None:
        if self._state is None:
            return
        for name, node in self._state().nodes.items():
            self._emitted[name] = _Emitted(
                labels=dict(node.labels),
                capacity=dict(node.capacity),
                ready=node.ready,
                unschedulable=node.unschedulable,
                reserved={k: v for k, v in sorted(node.reserved.items()) if v > 0},
                cordoned=node.cordoned,
            )
            self._dirty.add(name)

    def _node_events(self, name: str, at: int) -> list[Event]:
        view = self._nodes.get(name)
        prev = self._emitted.get(name)
        node = NodeName(name)
        if view is None:
            if prev is None:
                return []
            del self._emitted[name]
            return [NodeRemoved(at=at, node=node)]
        reserved = {k: v for k, v in sorted(self._reserved.get(name, {}).items()) if v > 0}
        now = _Emitted(view.labels, view.capacity, view.ready, view.unschedulable, reserved, view.cordoned)
        self._emitted[name] = now
        fields: dict[str, Any] = {
            "labels": now.labels,
            "capacity": now.capacity,
            "ready": now.ready,
            "unschedulable": now.unschedulable,
            "reserved": now.reserved,
        }
        events: list[Event] = []
        if prev is None:
            events.append(NodeAdded(at=at, node=node, **fields))
            if now.cordoned:
                events.append(NodeCordoned(at=at, node=node, cordoned=True))
            return events
        if not now.same_description(prev):
            events.append(NodeUpdated(at=at, node=node, **fields))
        if now.cordoned != prev.cordoned:
            events.append(NodeCordoned(at=at, node=node, cordoned=now.cordoned))
        return events
