"""The fold of the cluster's configuration: nodes, queues, flavors, cohorts, priority classes, settings.

Part of `cluster.evolve` (which dispatches through `HANDLERS`): each handler
records what its event says and holds no policy. A node that comes up or is
uncordoned counts its GPUs as freed, so whoever waits for room looks again;
a change of shape (nodes, queues, cohorts, classes, levels) bumps
`state.structure` so the scheduler's derived indexes are rebuilt. A queue
turned back into one plain pool (`nominal` after `resource_groups`) holds in
that pool what its running jobs hold on flavors (`_into_one_pool`).
"""

from __future__ import annotations

from muster.events.types import (
    CohortConfigured,
    Event,
    FlavorConfigured,
    FlavorFungibility,
    NodeAdded,
    NodeCordoned,
    NodeRemoved,
    NodeUpdated,
    PriorityClassConfigured,
    QueueConfigured,
    ResourceGroup,
    SchedulerConfigured,
)
from muster.projections.resources import flavored, unflavored
from muster.projections.state import (
    ClusterState,
    FlavorState,
    NodeState,
    PriorityClassState,
    QueueState,
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
    if not groups:
        _into_one_pool(state, state.queues[ev.name])
    state.dirty_queues.add(ev.name)
    state.structure += 1
    state.released += 1
    return state


def _into_one_pool(state: ClusterState, queue: QueueState) -> None:
    """A plain queue's quota is one pool over every node (spec, Flavors): the jobs it admitted on flavors
    before it turned plain hold their resources in that pool, so they count against its nominal quota and
    are victims for what its jobs (and its cohort's) ask, as any job of the pool (keyed `gpu@h100` they
    would count against nothing and be no one's victim). Their flavors stay: they say where their pods are."""
    if not any("@" in k for k in queue.usage):
        return
    queue.usage = unflavored(queue.usage)
    for job in state.jobs.values():
        if job.queue == queue.name and job.status == "admitted" and job.flavors:
            job.requests = unflavored(job.requests)
            job.borrowed = unflavored(job.borrowed)
            state.dirty_jobs.add(job.id)


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
