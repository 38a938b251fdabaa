"""Reading the flavors of a scenario (spec/scenario.md, Flavors): `flavors:`, and a queue's
`resource_groups` and `flavor_fungibility`, with the errors that name file and line.

Part of the scenario reader (`scenario`, through `queuespec`), which calls these with its `Reader`.
"""

from __future__ import annotations

import msgspec
import yaml

from muster.events.types import (
    FlavorConfigured,
    FlavorFungibility,
    FlavorQuota,
    NodeAdded,
    QueueConfigured,
    ResourceGroup,
    Taint,
)
from muster.projections.flavors import carries
from muster.replay.specreader import Reader

_WHEN_CAN_BORROW = ("Borrow", "TryNextFlavor")
_WHEN_CAN_PREEMPT = ("Preempt", "TryNextFlavor")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def flavors(r: Reader, node: yaml.Node | None, nodes: dict[str, NodeAdded]) -> dict[str, FlavorConfigured]:
    """Resource flavors: each names node labels (and taints); in a file with nodes it must match one."""
    out: dict[str, FlavorConfigured] = {}
    if node is None:
        return out
    for n in r.seq(node, "flavors"):
        m = r.mapping(n, "flavor", {"name", "node_labels", "taints"}, {"name"})
        name = r.string(m["name"], "flavor name")
        if name in out:
            raise r.fail(n, f"flavor {name!r} is defined twice")
        if not name or "@" in name:
            raise r.fail(m["name"], f"flavor name {name!r} must be non-empty and may not contain '@'")
        labels: dict[str, str] = {}
        if "node_labels" in m:
            labels = r.labels(m["node_labels"], f"flavor {name}: node_labels")
        taints: list[Taint] = []
        for tn in r.seq(m["taints"], f"flavor {name}: taints") if "taints" in m else []:
            t = r.mapping(tn, "taint", {"key", "value", "effect"}, {"key"})
            taints.append(
                Taint(
                    key=r.string(t["key"], "taint key"),
                    value=r.string(t["value"], "taint value") if "value" in t else "",
                    effect=r.choice(t["effect"], "taint effect", _EFFECTS) if "effect" in t else "NoSchedule",
                )
            )
        # a queues file has no nodes (the cluster's come from Kubernetes): only a scenario's are checked
        if nodes and not any(carries(nd.labels, labels) for nd in nodes.values()):
            raise r.fail(n, f"flavor {name!r} has no nodes (no node carries {labels or 'any labels'})")
        out[name] = FlavorConfigured(at=0, name=name, node_labels=labels, taints=taints)
    return out


def fungibility(r: Reader, node: yaml.Node, base: QueueConfigured | None) -> FlavorFungibility:
    """`flavor_fungibility`; a field it leaves out keeps its value (Kueue's default on a new queue)."""
    m = r.mapping(node, "flavor_fungibility", {"when_can_borrow", "when_can_preempt"})
    old = base.flavor_fungibility if base is not None and base.flavor_fungibility else FlavorFungibility()
    chosen = {
        key: r.choice(m[key], key, options) if key in m else getattr(old, key)
        for key, options in (("when_can_borrow", _WHEN_CAN_BORROW), ("when_can_preempt", _WHEN_CAN_PREEMPT))
    }
    return msgspec.convert(chosen, FlavorFungibility)


def resource_groups(r: Reader, node: yaml.Node, queue: str, flavors: set[str]) -> list[ResourceGroup]:
    """A queue's quota per flavor; a resource in two groups, a flavor twice, or an unknown flavor is an error."""
    groups: list[ResourceGroup] = []
    covered_by: dict[str, int] = {}
    flavor_in: dict[str, int] = {}
    items = r.seq(node, f"queue {queue}: resource_groups")
    if not items:
        raise r.fail(node, f"queue {queue}: resource_groups is empty")
    for gi, gn in enumerate(items):
        g = r.mapping(gn, "resource group", {"covered", "flavors"}, {"covered", "flavors"})
        covered: list[str] = []
        for cn in r.seq(g["covered"], "covered"):
            res = r.string(cn, "covered resource")
            res = "gpu" if res == "nvidia.com/gpu" else res
            if "@" in res:
                raise r.fail(cn, f"queue {queue}: resource name {res!r} may not contain '@'")
            if res in covered_by:
                raise r.fail(cn, f"queue {queue}: resource {res!r} is in two resource groups (one group per resource)")
            covered_by[res] = gi
            covered.append(res)
        if not covered:
            raise r.fail(g["covered"], f"queue {queue}: a resource group must cover at least one resource")
        fqs: list[FlavorQuota] = []
        fitems = r.seq(g["flavors"], "flavors")
        if not fitems:
            raise r.fail(g["flavors"], f"queue {queue}: a resource group needs at least one flavor")
        for fn in fitems:
            f = r.mapping(fn, "flavor quota", {"name", "nominal", "borrowing_limit", "lending_limit"}, {"name"})
            fname = r.string(f["name"], "flavor name")
            if fname not in flavors:
                raise r.fail(
                    f["name"],
                    f"queue {queue}: flavor {fname!r} is not defined (flavors: {', '.join(sorted(flavors)) or 'none'})",
                )
            if fname in flavor_in:
                raise r.fail(f["name"], f"queue {queue}: flavor {fname!r} appears twice in its resource groups")
            flavor_in[fname] = gi
            limits: dict[str, dict[str, int] | None] = {}
            for key in ("nominal", "borrowing_limit", "lending_limit"):
                limits[key] = r.resources(f[key], f"queue {queue}: flavor {fname}: {key}") if key in f else None
                for res in limits[key] or {}:
                    if res not in covered:
                        raise r.fail(
                            f[key],
                            f"queue {queue}: flavor {fname}: {key} names {res!r}, "
                            f"which its group does not cover ({', '.join(covered)})",
                        )
            fqs.append(
                FlavorQuota(
                    name=fname,
                    nominal=limits["nominal"] or {},
                    borrowing_limit=limits["borrowing_limit"],
                    lending_limit=limits["lending_limit"],
                )
            )
        groups.append(ResourceGroup(covered=covered, flavors=fqs))
    return groups
