"""The fold of the cluster's configuration: nodes, queues, flavors, cohorts, priority classes, settings.

Part of `cluster.evolve` (which dispatches through `HANDLERS`): each handler
records what its event says and holds no policy. A node that comes up or is
uncordoned counts its GPUs as freed, so whoever waits for room looks again;
a change of shape (nodes, queues, cohorts, classes, levels) bumps
`state.structure` so the scheduler's derived indexes are rebuilt. After a
queue's pools change (plain to flavored, new resource groups, back to one
plain pool) or a node or flavor is relabelled, the running jobs hold their
resources in the pool their pods' nodes are in now (`repool`).
"""

from __future__ import annotations

from collections.abc import Mapping

from muster.events.types import (
    CohortConfigured,
    Event,
    FlavorConfigured,
    FlavorFungibility,
    NodeAdded,
    NodeCordoned,
    NodeRemoved,
    NodeUpdated,
    PodSet,
    PriorityClassConfigured,
    QueueConfigured,
    ResourceGroup,
    SchedulerConfigured,
)
from muster.projections.resources import flavored, unflavored
from muster.projections.state import (
    ClusterState,
    FlavorState,
    JobState,
    NodeState,
    PriorityClassState,
    QueueState,
    podset_of,
    skip,
)

# ---------------------------------------------------------------- evolve


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


def on_node(state: ClusterState, ev: NodeAdded | NodeUpdated) -> ClusterState:
    """A node's facts; `cluster` adds what admitted jobs hold on a node that comes back under a removed one's name."""
    old = state.nodes.get(ev.node)
    node = _node_from(ev, old)
    state.nodes[ev.node] = node
    state.dirty_nodes.add(ev.node)
    if old is None or old.labels != node.labels:
        state.structure += 1
        if old is not None:
            for job_id in node.jobs:  # relabelled under running jobs: they hold where their pods now are
                if job_id in state.jobs:
                    repool(state, state.jobs[job_id])
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
    node = state.nodes.get(ev.node)
    if node is None:
        return skip(state)
    if node.jobs:
        state.departed.add(ev.node)
    del state.nodes[ev.node]
    state.dirty_nodes.add(ev.node)
    state.structure += 1
    return state


def _on_cordoned(state: ClusterState, ev: NodeCordoned) -> ClusterState:
    node = state.nodes.get(ev.node)
    if node is None:
        return skip(state)
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
    _repool_queue(state, state.queues[ev.name])
    state.dirty_queues.add(ev.name)
    state.structure += 1
    state.released += 1
    return state


def carries(labels: Mapping[str, str], flavor_labels: Mapping[str, str]) -> bool:
    """Whether a node with `labels` belongs to a flavor of `flavor_labels`: it carries every one of them."""
    return all(labels.get(k) == v for k, v in flavor_labels.items())


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


def _repool_queue(state: ClusterState, queue: QueueState) -> None:
    """After a queue's quota changed shape, its running jobs hold their resources in its new pools."""
    if not queue.resource_groups and not any("@" in k for k in queue.usage):
        return  # plain before and after: nothing is keyed by flavor
    for job in state.jobs.values():
        if job.queue == queue.name and job.status == "admitted":
            repool(state, job)


def repool(state: ClusterState, job: JobState) -> None:
    """Key what a running job holds as its queue's quota is now kept (spec, Flavors): a job holds its
    resources where its pods run, so a queue's quota (and preemption for it) sees them after any change
    of its pools. A plain queue is one pool over every node: its jobs hold plain `gpu` (keyed `gpu@h100`
    they would count against nothing and be no one's victim); their flavors stay, saying where their pods
    are. A queue with resource groups holds each podset's resources of a group in the flavor its nodes
    belong to (`_flavor_of`): a job admitted before its queue had flavors, on a flavor its queue dropped,
    or on nodes relabelled into another flavor counts against that flavor's quota and is a victim there."""
    queue = state.queues.get(job.queue)
    if queue is None:
        return
    if queue.resource_groups:
        chosen = _flavors_on_nodes(state, job, queue.resource_groups)
        requests = flavored_requests(job.podsets, chosen)
    else:
        chosen, requests = job.flavors, unflavored(job.requests)
    if requests == job.requests and chosen == job.flavors:
        return
    usage = queue.usage
    for k, v in job.requests.items():
        usage[k] = usage.get(k, 0) - v
    for k, v in requests.items():
        usage[k] = usage.get(k, 0) + v
    job.borrowed = _rekeyed(job.borrowed, job.podsets, chosen if queue.resource_groups else {})
    job.flavors, job.requests = chosen, requests
    state.dirty_jobs.add(job.id)
    state.dirty_queues.add(queue.name)


def _flavors_on_nodes(state: ClusterState, job: JobState, groups: list[ResourceGroup]) -> dict[str, dict[str, str]]:
    """Per podset, resource -> flavor for every group its requests touch: the flavor it holds, while that is
    one of the group's and every node of its pods belongs to it, else the flavor of its nodes."""
    out: dict[str, dict[str, str]] = {}
    for ps in job.podsets:
        held = job.flavors.get(ps.name, {}) if job.flavors else {}
        mine = [n for pod, n in job.placement.items() if podset_of(pod) == ps.name]
        nodes = [state.nodes[n] for n in mine if n in state.nodes]
        for group in groups:
            covered = [r for r in group.covered if ps.requests.get(r, 0) > 0]
            if not covered:
                continue
            names = [fq.name for fq in group.flavors]
            now = held.get(covered[0])
            if now not in names or _pods_on(state, now, nodes) < len(nodes):
                now = _flavor_of(state, names, nodes)
            out.setdefault(ps.name, {}).update(dict.fromkeys(covered, now))
    return out


def _flavor_of(state: ClusterState, names: list[str], nodes: list[NodeState]) -> str:
    """The flavor of a group (`names`, in order) most of a podset's pods run on (the first on a tie, the
    group's first when none does: what its pods hold counts against some flavor of the queue)."""
    return max(names, key=lambda name: _pods_on(state, name, nodes))


def _pods_on(state: ClusterState, name: str | None, nodes: list[NodeState]) -> int:
    """How many of the pods on `nodes` (one entry per pod) run on the flavor `name`'s nodes."""
    flavor = state.flavors.get(name) if name is not None else None
    return sum(carries(n.labels, flavor.node_labels) for n in nodes) if flavor is not None else 0


def _rekeyed(
    borrowed: Mapping[str, int], podsets: list[PodSet], chosen: Mapping[str, Mapping[str, str]]
) -> dict[str, int]:
    """What a job borrowed, keyed as its requests now are (the flavor of the first podset asking each resource;
    plain where `chosen` gives none, as in a plain queue)."""
    where: dict[str, str] = {}
    for ps in podsets:
        for r, f in chosen.get(ps.name, {}).items():
            where.setdefault(r, f)
    out: dict[str, int] = {}
    for r, v in unflavored(borrowed).items():
        key = flavored(r, where[r]) if r in where else r
        out[key] = out.get(key, 0) + v
    return out


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
    old = state.flavors.get(ev.name)
    state.flavors[ev.name] = FlavorState(name=ev.name, node_labels=dict(ev.node_labels), taints=list(ev.taints))
    if old is not None and old.node_labels != ev.node_labels:
        for job in state.jobs.values():  # its nodes changed under running jobs: they hold where their pods are
            if job.status == "admitted":
                repool(state, job)
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


HANDLERS: dict[type[Event], object] = {
    NodeAdded: on_node,
    NodeUpdated: on_node,
    NodeRemoved: _on_node_removed,
    NodeCordoned: _on_cordoned,
    QueueConfigured: _on_queue,
    CohortConfigured: _on_cohort,
    PriorityClassConfigured: _on_priority_class,
    SchedulerConfigured: _on_scheduler,
    FlavorConfigured: _on_flavor,
}
