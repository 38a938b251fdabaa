"""Reading the queue configuration of a scenario (spec/scenario.md, Quotas, Preemption, Queueing):
`priority_classes:`, `cohorts:` and `queues:`, and a `queue_update` of some of a queue's fields.

Every error names file and line (`ScenarioError`); a queue may name only cohorts and flavors that
are defined (`Known`). The flavor parts of a queue are read by `flavorspec`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, cast

import msgspec
import yaml

from muster.events.types import (
    BorrowPolicy,
    BorrowWithinCohort,
    CohortConfigured,
    CohortName,
    PreemptionPolicy,
    PriorityClassConfigured,
    QueueConfigured,
    QueueName,
    ReclaimPolicy,
    WithinQueuePolicy,
)
from muster.replay import flavorspec
from muster.replay.specreader import Reader


def priority_classes(r: Reader, node: yaml.Node | None) -> list[PriorityClassConfigured]:
    """The `priority_classes:` list, each name defined once."""
    out: list[PriorityClassConfigured] = []
    if node is None:
        return out
    seen: set[str] = set()
    for n in r.seq(node, "priority_classes"):
        m = r.mapping(n, "priority class", {"name", "value", "preemptible"}, {"name", "value"})
        name = r.string(m["name"], "priority class name")
        if name in seen:
            raise r.fail(n, f"priority class {name!r} is defined twice")
        seen.add(name)
        out.append(
            PriorityClassConfigured(
                at=0,
                name=name,
                value=r.integer(m["value"], f"priority class {name}: value", minimum=None),
                preemptible=r.boolean(m["preemptible"], "preemptible") if "preemptible" in m else True,
            )
        )
    return out


def cohorts(r: Reader, node: yaml.Node | None, known: Collection[str] | None = ()) -> list[CohortConfigured]:
    """The `cohorts:` list: each parent defined (here or in `known`; None: any) and no cycles."""
    if node is None:
        return []
    out: list[CohortConfigured] = []
    lines: dict[str, yaml.Node] = {}
    for n in r.seq(node, "cohorts"):
        m = r.mapping(n, "cohort", {"name", "parent"}, {"name"})
        name = r.string(m["name"], "cohort name")
        if name in lines:
            raise r.fail(n, f"cohort {name!r} is defined twice")
        lines[name] = n
        parent = r.string(m["parent"], "cohort parent") if "parent" in m else None
        out.append(
            CohortConfigured(at=0, name=CohortName(name), parent=CohortName(parent) if parent is not None else None)
        )
    parents = {c.name: c.parent for c in out}
    for c in out:
        if c.parent is not None and c.parent not in parents and known is not None and c.parent not in known:
            raise r.fail(lines[c.name], f"cohort {c.name!r}: parent cohort {c.parent!r} is not defined")
    for c in out:
        seen = [c.name]
        cur = c.parent
        while cur is not None:
            if cur in seen:
                cycle = " -> ".join([*seen, cur])
                raise r.fail(lines[c.name], f"cohorts form a cycle: {cycle}")
            seen.append(cur)
            cur = parents.get(cur)
    return out


_WITHIN = ("Never", "LowerPriority", "LowerOrNewerEqualPriority")
_RECLAIM = ("Never", "LowerPriority", "Any")
_BORROW = ("Never", "LowerPriority")
QUEUE_FIELDS = {
    "name",
    "cohort",
    "nominal",
    "borrowing_limit",
    "lending_limit",
    "resource_groups",
    "flavor_fungibility",
    "weight",
    "preemption",
    "queueing_strategy",
    "reserve_after",
}
_STRATEGIES = ("best_effort_fifo", "strict_fifo", "shortest_limit_first")
PLAIN_QUOTA = ("nominal", "borrowing_limit", "lending_limit")


@dataclass
class Known:
    """Names a queue may refer to: cohorts and flavors."""

    cohorts: set[str]
    flavors: set[str] = field(default_factory=set)


def queue_from(r: Reader, n: yaml.Node, known: Known, base: QueueConfigured | None = None) -> QueueConfigured:
    """A queue definition (or, with `base`, an update of some of its fields)."""
    m = r.mapping(n, "queue", QUEUE_FIELDS, {"name"})
    name = r.string(m["name"], "queue name")
    grouped = "resource_groups" in m or (base is not None and bool(base.resource_groups) and "nominal" not in m)
    plain = [f for f in PLAIN_QUOTA if f in m]
    if "resource_groups" in m and plain:
        raise r.fail(
            m[plain[0]], f"queue {name!r}: {plain[0]} and resource_groups exclude each other (give quota per flavor)"
        )
    if grouped and plain:
        raise r.fail(m[plain[0]], f"queue {name!r} has resource_groups: change its quota there, not with {plain[0]}")
    if base is None and "nominal" not in m and "resource_groups" not in m:
        raise r.fail(n, "queue: missing field 'nominal' (or 'resource_groups')")
    kw: dict[str, Any] = {}
    if "cohort" in m:
        cohort = r.string(m["cohort"], "cohort")
        if cohort not in known.cohorts:
            raise r.fail(m["cohort"], f"queue {name!r}: cohort {cohort!r} is not defined")
        kw["cohort"] = cohort
    for f in PLAIN_QUOTA:
        if f in m:
            kw[f] = r.resources(m[f], f"queue {name}: {f}")
    if "nominal" in m and base is not None:
        kw["resource_groups"] = msgspec.UNSET  # back to one pool over every node
    if "resource_groups" in m:
        kw["resource_groups"] = flavorspec.resource_groups(r, m["resource_groups"], name, known.flavors)
        kw.update(nominal={}, borrowing_limit=None, lending_limit=None)
    if "flavor_fungibility" in m:
        kw["flavor_fungibility"] = flavorspec.fungibility(r, m["flavor_fungibility"], base)
    if "weight" in m:
        kw["weight"] = r.number(m["weight"], f"queue {name}: weight", 0, None)
    if "queueing_strategy" in m:
        kw["queueing_strategy"] = r.choice(m["queueing_strategy"], f"queue {name}: queueing_strategy", _STRATEGIES)
    if "reserve_after" in m:
        if grouped:
            raise r.fail(
                m["reserve_after"], f"queue {name!r} has resource_groups: reservations do not cover flavors yet"
            )
        kw["reserve_after"] = r.integer(m["reserve_after"], f"queue {name}: reserve_after", 0, None)
    if "preemption" in m:
        p = r.mapping(m["preemption"], "preemption", {"within_queue", "reclaim_within_cohort", "borrow_within_cohort"})
        old = base.preemption if base is not None else PreemptionPolicy()
        bwc = old.borrow_within_cohort
        if "borrow_within_cohort" in p:
            b = r.mapping(p["borrow_within_cohort"], "borrow_within_cohort", {"policy", "max_priority_threshold"})
            bwc = BorrowWithinCohort(
                policy=cast(BorrowPolicy, r.choice(b["policy"], "borrow_within_cohort.policy", _BORROW))
                if "policy" in b
                else "Never",
                max_priority_threshold=r.integer(b["max_priority_threshold"], "max_priority_threshold", None)
                if "max_priority_threshold" in b
                else None,
            )
        kw["preemption"] = PreemptionPolicy(
            within_queue=cast(WithinQueuePolicy, r.choice(p["within_queue"], "within_queue", _WITHIN))
            if "within_queue" in p
            else old.within_queue,
            reclaim_within_cohort=cast(
                ReclaimPolicy, r.choice(p["reclaim_within_cohort"], "reclaim_within_cohort", _RECLAIM)
            )
            if "reclaim_within_cohort" in p
            else old.reclaim_within_cohort,
            borrow_within_cohort=bwc,
        )
    if base is not None:
        return msgspec.structs.replace(base, **kw)
    return QueueConfigured(at=0, name=QueueName(name), **kw)


def queues(r: Reader, node: yaml.Node | None, known: Known) -> dict[str, QueueConfigured]:
    """The `queues:` list, by name, each defined once."""
    out: dict[str, QueueConfigured] = {}
    if node is None:
        return out
    for n in r.seq(node, "queues"):
        q = queue_from(r, n, known)
        if q.name in out:
            raise r.fail(n, f"queue {q.name!r} is defined twice")
        out[q.name] = q
    return out
