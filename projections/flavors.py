"""Resource flavors: which nodes a flavor is, and a gang's requests on its chosen flavors.

Kueue's ResourceFlavor, in muster's terms:
- a flavor is a set of nodes: those carrying all of its labels. The topology
  index gives each such node a marker resource (`flavor:NAME`, never taken),
  and a podset placed on a flavor requests one marker per pod, so it lands
  only on that flavor's nodes with the ordinary placement rules;
- a queue with resource groups has quota per flavor and resource, kept in the
  quota tree under `resource@flavor` keys: cohorts add each flavor up on its
  own, and borrowing, lending, preemption and fair sharing work per flavor;
- a flavor's taints keep pods on no flavor off its nodes: when some flavor has
  taints, the other nodes carry an `UNTAINTED` marker that such pods request;
  pods on a flavor get its tolerations (and, when they carry muster's scheduling
  gate, its node labels as nodeSelector) at binding (`binding`).

Which flavor each podset takes is `assignment`'s choice, made on the cycle's
view; the chosen flavors go on `JobAdmitted.flavors` and the fold keys the
job's quota usage by them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import msgspec

from muster.events.types import PodSet, ResourceGroup
from muster.projections.configuration import carries as carries
from muster.projections.configuration import flavored_requests
from muster.projections.resources import flavored
from muster.projections.state import ClusterState, JobState, QueueState

MARKER = "flavor:"
"""Prefix of the marker resource a flavor's nodes carry in the topology index."""
_ROOM = 1 << 40
"""A marker's capacity on a node: more pods than any node holds, so it never limits placement."""

Flavors = dict[str, dict[str, str]]
"""Per podset, resource -> flavor (`JobAdmitted.flavors`)."""


# ---------------------------------------------------------------- nodes


UNTAINTED = MARKER + "*"
"""The marker of the nodes of no flavor with taints, when some flavor has taints: the only nodes a pod
placed on no flavor may take (it tolerates no flavor's taint)."""


def node_markers(state: ClusterState, labels: Mapping[str, str]) -> dict[str, int]:
    """The marker resources of the flavors a node with `labels` belongs to (and `UNTAINTED`)."""
    mine = [f for f in state.flavors.values() if carries(labels, f.node_labels)]
    out = {MARKER + f.name: _ROOM for f in mine}
    if any(f.taints for f in state.flavors.values()) and not any(f.taints for f in mine):
        out[UNTAINTED] = _ROOM
    return out


def plain(req: Mapping[str, int]) -> dict[str, int]:
    """A request without its flavor markers (for words)."""
    return {k: v for k, v in req.items() if not k.startswith(MARKER)}


def placement_request(
    job: JobState, podset_name: str, requests: Mapping[str, int], tainted: bool = False
) -> Mapping[str, int]:
    """One pod's request as placement sees it: with a marker per flavor chosen for its podset, or, for a
    podset on no flavor while some flavor has taints (`tainted`), the marker of the untainted nodes."""
    chosen = job.flavors.get(podset_name) if job.flavors else None
    if not chosen:
        return {**requests, UNTAINTED: 1} if tainted else requests
    out = dict(requests)
    for f in sorted(set(chosen.values())):
        out[MARKER + f] = 1
    return out


PodsetsKey = tuple[tuple[object, ...], ...]
"""What placing a job's podsets reads of the job: per podset, its pods, a pod's request as placement sees it
(with its flavor markers) and its topology."""


def podsets_key(job: JobState, tainted: bool) -> PodsetsKey:
    """The job's `PodsetsKey` (`tainted`: the topology's: whether pods on no flavor ask for the untainted nodes)."""
    out = []
    for ps in job.podsets:
        t = ps.topology
        req = placement_request(job, ps.name, ps.requests, tainted)
        out.append((ps.count, tuple(sorted(req.items())), t.required if t else None, t.preferred if t else None))
    return tuple(out)


class PodFit(NamedTuple):
    """What the pods of a podset admitted on flavors get at binding, so they land on those flavors."""

    label: str
    """The value of the pod's flavor label: its flavors' names joined by `_` ("" when that is no valid
    label value)."""
    tolerations: list[dict[str, str]]
    """The Kubernetes tolerations of its flavors' taints."""
    node_selector: dict[str, str]
    """Its flavors' node labels (a pod can be given them only while it has scheduling gates)."""


_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def binding(state: ClusterState, chosen: Mapping[str, Mapping[str, str]]) -> dict[str, PodFit]:
    """Per podset admitted on flavors (`JobAdmitted.flavors`), what its pods get at binding."""
    out: dict[str, PodFit] = {}
    for podset, by_resource in sorted(chosen.items()):
        names = sorted(set(by_resource.values()))
        if not names:
            continue
        needed: list[dict[str, str]] = []
        selector: dict[str, str] = {}
        for name in names:
            flavor = state.flavors.get(name)
            if flavor is None:
                continue
            selector.update(flavor.node_labels)
            for t in flavor.taints:
                toleration = {"key": t.key, "operator": "Equal", "value": t.value, "effect": t.effect}
                if toleration not in needed:
                    needed.append(toleration)
        label = "_".join(names)
        out[podset] = PodFit(label if _LABEL_VALUE.match(label) else "", needed, selector)
    return out


def tolerated_taint_keys(state: ClusterState) -> frozenset[str]:
    """The taint keys some flavor's pods tolerate: nodes carrying only those stay schedulable."""
    return frozenset(t.key for f in state.flavors.values() for t in f.taints)


# ---------------------------------------------------------------- jobs


def unassigned(state: ClusterState, job: JobState) -> bool:
    """Whether the job's queue has flavors and the job has none chosen (a pending job, not a view)."""
    if job.flavors:
        return False
    queue = state.queues.get(job.queue)
    return queue is not None and bool(queue.resource_groups)


def view(job: JobState, chosen: Flavors, upto: int | None = None) -> JobState:
    """The job on `chosen` flavors (its first `upto` podsets), with its requests keyed as its quota."""
    podsets = job.podsets if upto is None else job.podsets[:upto]
    kept = {ps: dict(c) for ps, c in chosen.items() if c}
    return msgspec.structs.replace(job, podsets=podsets, flavors=kept, requests=flavored_requests(podsets, kept))


def on_any_flavor(state: ClusterState, job: JobState) -> JobState:
    """A pending flavored job as asking for every flavored resource of its queue (and its plain ones):
    who may be its victim on some flavor holds one of them. Any other job is itself."""
    if not unassigned(state, job):
        return job
    wide = {k: 1 for k in state.queues[job.queue].nominal}
    wide.update((k, v) for k, v in job.requests.items() if v > 0)
    return msgspec.structs.replace(job, requests=wide)


def order_requests(state: ClusterState, job: JobState) -> Mapping[str, int]:
    """The requests that place a job in the admission order: on the first flavors it may use."""
    if not unassigned(state, job):
        return job.requests
    groups = state.queues[job.queue].resource_groups
    first: Flavors = {}
    for ps in job.podsets:
        for group in groups:
            names = allowed(group, ps.flavors)
            keys = covered(group, ps.requests)
            if names and keys:
                first.setdefault(ps.name, {}).update(dict.fromkeys(keys, names[0]))
    return flavored_requests(job.podsets, first)


def quota_asks(state: ClusterState, job: JobState) -> dict[str, int]:
    """Per quota key, what the job asks of it: its own requests once on flavors (or in a plain queue);
    for a pending flavored job, per flavor each podset may take, all that podset asks of the group's
    resources (`gpu@h100`: what it would take there, were every such podset put on h100)."""
    if not unassigned(state, job):
        return dict(job.requests)
    out: dict[str, int] = {}
    for ps in job.podsets:
        for group in state.queues[job.queue].resource_groups:
            keys = covered(group, ps.requests)
            for f in allowed(group, ps.flavors):
                for r in keys:
                    key = flavored(r, f)
                    out[key] = out.get(key, 0) + ps.requests[r] * ps.count
    return out


def gpu_flavors(state: ClusterState, job: JobState, podset: PodSet) -> list[str]:
    """The flavors a podset of a pending flavored job may take its GPUs (else its first group's
    resources) on, in order; empty for a job on no flavor or already on its flavors."""
    if not unassigned(state, job):
        return []
    groups = state.queues[job.queue].resource_groups
    touched = [g for g in groups if covered(g, podset.requests)]
    mine = next((g for g in touched if "gpu" in covered(g, podset.requests)), touched[0] if touched else None)
    return allowed(mine, podset.flavors) if mine is not None else []


def summary(chosen: Flavors) -> str:
    """`worker=h100 launcher=cpu` (a podset with flavors of several groups: `worker=h100+fast`)."""
    return " ".join(f"{ps}={'+'.join(sorted(set(c.values())))}" for ps, c in sorted(chosen.items()) if c)


def uncovered(queue: QueueState, podsets: Sequence[PodSet]) -> str:
    """Why a job of a queue with resource groups cannot be admitted for a resource none of them covers
    ("" when they cover every resource it asks for): Kueue's rule, quota is what makes a resource
    admissible. A plain queue (no groups) leaves unlimited what its nominal quota does not name."""
    if not queue.resource_groups:
        return ""
    covered = {r for group in queue.resource_groups for r in group.covered}
    parts = []
    for ps in podsets:
        missing = sorted(r for r, v in ps.requests.items() if v > 0 and r not in covered)
        if missing:
            prefix = f"{ps.name}: " if len(podsets) > 1 else ""
            parts.append(f"{prefix}no resource group of queue {queue.name} covers {', '.join(missing)}")
    return "; ".join(parts)


def allowed(group: ResourceGroup, restriction: list[str]) -> list[str]:
    """The group's flavors, in order, a podset restricted to `restriction` may take (empty: any)."""
    return [fq.name for fq in group.flavors if not restriction or fq.name in restriction]


def covered(group: ResourceGroup, requests: Mapping[str, int]) -> list[str]:
    """The resources of the group that `requests` asks for."""
    return [r for r in group.covered if requests.get(r, 0) > 0]
