"""Reading Kubernetes Node and Pod objects (raw JSON dicts) into what muster needs.

Pure functions, no I/O. Malformed fields never raise: a quantity that does
not parse (or, in a node's capacity, is past `MAX_QUANTITY`) is left out and
reported in the returned `problems`; a pod's request past it is kept, so the
core rejects the job with a `JobRejected` that says why.

- Capacity is the node's `status.allocatable` (what pods may use), in base
  units: `nvidia.com/gpu` is `gpu`, cpu is milli-CPU, memory is bytes. Only the
  resources muster accounts for are kept: cpu, memory, gpu and other extended
  resources (names with a `/`); `pods`, `ephemeral-storage` and hugepages are
  dropped on both sides, nodes and pods, so `fits` compares like with like.
- A pod's requests are what the kube-scheduler counts: the larger of the sum
  over containers and the largest init container, plus the pod overhead; a
  resource given only as a limit counts as requested (the API server defaults
  requests to limits).
- A node is `ready` when its Ready condition is True; it is `unschedulable`
  when it carries a NoSchedule/NoExecute taint muster does not tolerate (the
  `node.kubernetes.io/not-ready` taint of a new node included); `cordoned`
  mirrors `spec.unschedulable` (its `node.kubernetes.io/unschedulable` taint
  is the cordon, not an extra reason).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from muster.projections.resources import GPU, K8S_GPU, parse_quantity
from muster.projections.validation import MAX_QUANTITY

__all__ = [
    "DEFAULT_TOLERATED_TAINTS",
    "NodeView",
    "node_view",
    "pod_requests",
    "taints_block",
    "tracked_resources",
]

Obj = dict[str, Any]
Resources = dict[str, int]

CORDON_TAINT = "node.kubernetes.io/unschedulable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
DEFAULT_TOLERATED_TAINTS: frozenset[str] = frozenset({"nvidia.com/gpu"})
"""GPU nodes are commonly tainted `nvidia.com/gpu:NoSchedule` to keep CPU pods away; GPU gangs tolerate it."""


def _tracked(name: str) -> bool:
    return name in ("cpu", "memory", K8S_GPU, GPU) or ("/" in name and not name.startswith("hugepages"))


@functools.lru_cache(maxsize=4096)
def _quantity(key: str, value: str | int | float) -> int:
    """`parse_quantity`, remembered: a cluster's pods spell the same few quantities over and over,
    and its exact arithmetic (fractions) was ~3% of the daemon's CPU in gangs of one."""
    return parse_quantity(key, value)


def tracked_resources(
    values: Mapping[str, Any] | None, problems: list[str] | None = None, *, bounded: bool = False
) -> Resources:
    """Parse the resources muster tracks; unparsable quantities are skipped and reported, and so are
    quantities past MAX_QUANTITY when `bounded` (a node's capacity; a pod's request is kept, and the
    core rejects its job)."""
    out: Resources = {}
    if not isinstance(values, Mapping):
        return out
    for name, value in values.items():
        if not _tracked(str(name)):
            continue
        key = GPU if name == K8S_GPU else str(name)
        try:
            amount = _quantity(key, value) if isinstance(value, (str, int, float)) else parse_quantity(key, value)
        except ValueError as exc:
            if problems is not None:
                problems.append(str(exc))
            continue
        if bounded and amount > MAX_QUANTITY:
            if problems is not None:
                problems.append(f"{key}: {value!r} is more than muster accepts (at most {MAX_QUANTITY}); left out")
            continue
        out[key] = amount
    return out


def _container_requests(container: Any, problems: list[str]) -> Resources:
    if not isinstance(container, Mapping):
        return {}
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        return {}
    limits = tracked_resources(resources.get("limits"), problems)
    requests = tracked_resources(resources.get("requests"), problems)
    return {**limits, **requests}


def _add_into(total: Resources, part: Mapping[str, int]) -> None:
    for k, v in part.items():
        total[k] = total.get(k, 0) + v


def pod_requests(pod: Obj, problems: list[str] | None = None) -> Resources:
    """The resources the pod holds on its node (see module docstring)."""
    problems = problems if problems is not None else []
    spec = pod.get("spec") or {}
    containers: Resources = {}
    for c in _iter(spec.get("containers")):
        _add_into(containers, _container_requests(c, problems))
    sidecars: Resources = {}
    init_peak: Resources = {}
    for c in _iter(spec.get("initContainers")):
        req = _container_requests(c, problems)
        if isinstance(c, Mapping) and c.get("restartPolicy") == "Always":
            # A sidecar runs beside the main containers for the pod's whole life.
            _add_into(sidecars, req)
            continue
        for k, v in req.items():
            # An init container runs with the sidecars started before it.
            init_peak[k] = max(init_peak.get(k, 0), v + sidecars.get(k, 0))
    total = dict(containers)
    _add_into(total, sidecars)
    for k, v in init_peak.items():
        total[k] = max(total.get(k, 0), v)
    _add_into(total, tracked_resources(spec.get("overhead"), problems))
    return {k: v for k, v in sorted(total.items()) if v > 0}


def _iter(value: Any) -> Iterable[Any]:
    return value if isinstance(value, list) else ()


@dataclass(frozen=True)
class NodeView:
    """What muster knows of a node, as the NodeAdded/NodeUpdated events say it."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    capacity: Resources = field(default_factory=dict)
    ready: bool = True
    unschedulable: bool = False
    cordoned: bool = False
    taints: frozenset[str] = frozenset()
    """The keys of its taints that keep pods off it (NoSchedule, NoExecute, not-ready), tolerated or not: the
    log's flavors decide which muster tolerates, and they change while the node does not (`taints_block`)."""


def taints_block(taints: frozenset[str], tolerated: frozenset[str]) -> bool:
    """Whether a node with these taints (`NodeView.taints`) is unschedulable for pods that tolerate `tolerated`.

    A new node's not-ready taint blocks whatever is tolerated.
    """
    return NOT_READY_TAINT in taints or not taints <= tolerated


def node_view(
    node: Obj, tolerated: frozenset[str] = DEFAULT_TOLERATED_TAINTS, problems: list[str] | None = None
) -> NodeView:
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    labels = meta.get("labels") or {}
    ready = False
    for cond in _iter(status.get("conditions")):
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            ready = cond.get("status") == "True"
    taints: set[str] = set()
    for taint in _iter(spec.get("taints")):
        if not isinstance(taint, Mapping):
            continue
        key = str(taint.get("key") or "")
        if key == CORDON_TAINT:
            continue
        if key == NOT_READY_TAINT or taint.get("effect") in ("NoSchedule", "NoExecute"):
            taints.add(key)
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    return NodeView(
        name=str(meta.get("name") or ""),
        labels={str(k): str(v) for k, v in sorted(labels.items())} if isinstance(labels, Mapping) else {},
        capacity=dict(sorted(tracked_resources(allocatable, problems, bounded=True).items())),
        ready=ready,
        unschedulable=taints_block(frozenset(taints), tolerated),
        cordoned=bool(spec.get("unschedulable")),
        taints=frozenset(taints),
    )
