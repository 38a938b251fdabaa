"""Reading a `muster sim` scenario file (spec/scenario.md) into events.

The YAML is read as a node tree so that every error names the file, the line
and what is wrong (`ScenarioError`, exit status 2 in the CLI). Unknown fields
are errors. The scenario becomes a list of configuration events (applied at
time 0) and a timeline of timed inputs; invalid *jobs* are not errors here:
they become `JobRejected` events from the scheduler core, exactly as in the
daemon.
"""

from __future__ import annotations

import csv
import io
import itertools
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import msgspec
import yaml

from muster.events.types import (
    BorrowPolicy,
    BorrowWithinCohort,
    CohortConfigured,
    CohortName,
    Event,
    FlavorConfigured,
    IdleReclaimPolicy,
    NodeAdded,
    NodeName,
    PodSet,
    PreemptionPolicy,
    PriorityClassConfigured,
    QueueConfigured,
    QueueName,
    ReclaimPolicy,
    SchedulerConfigured,
    Topology,
    WithinQueuePolicy,
)
from muster.projections.resources import parse_quantity, parse_resources
from muster.projections.validation import MAX_QUANTITY, quantity_problem
from muster.replay import flavorspec


class ScenarioError(Exception):
    """An invalid scenario: file, line and what is wrong."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line
        self.message = message


@dataclass
class Input:
    """One timed input of the timeline, in file order."""

    at: int
    order: int
    kind: str
    data: dict[str, Any]
    line: int | None = None


@dataclass
class Scenario:
    path: str
    config: list[Event]
    inputs: list[Input]
    until: int | None
    levels: list[str]
    queues: dict[str, QueueConfigured] = field(default_factory=dict)
    nodes: dict[str, NodeAdded] = field(default_factory=dict)
    flavors: dict[str, FlavorConfigured] = field(default_factory=dict)
    keys: frozenset[str] = frozenset()
    """The top-level keys the file gives (`queues apply` changes only what the file mentions)."""


# ------------------------------------------------------------------ node helpers


class _Reader:
    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, node: yaml.Node | None, message: str) -> ScenarioError:
        line = node.start_mark.line + 1 if node is not None else None
        return ScenarioError(self.path, line, message)

    def mapping(
        self, node: yaml.Node, what: str, allowed: set[str], required: frozenset[str] | set[str] = frozenset()
    ) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, f"{what} must be a mapping")
        out: dict[str, yaml.Node] = {}
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode):
                raise self.fail(k, f"{what}: keys must be plain names")
            key = str(k.value)
            if key not in allowed:
                raise self.fail(k, f"{what}: unknown field {key!r} (allowed: {', '.join(sorted(allowed))})")
            if key in out:
                raise self.fail(k, f"{what}: field {key!r} appears twice")
            out[key] = v
        for key in sorted(required):
            if key not in out:
                raise self.fail(node, f"{what}: missing field {key!r}")
        return out

    def seq(self, node: yaml.Node, what: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, f"{what} must be a list")
        return list(node.value)

    def scalar(self, node: yaml.Node, what: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, f"{what} must be a single value")
        if node.tag == "tag:yaml.org,2002:str":
            return node.value
        # construct the value from the node itself (a round trip through text fails on an
        # empty value, as in `{gpu}`)
        try:
            return yaml.constructor.SafeConstructor().construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            raise self.fail(node, f"{what}: {exc}") from None

    def string(self, node: yaml.Node, what: str) -> str:
        v = self.scalar(node, what)
        if v is None or isinstance(v, (list, dict)):
            raise self.fail(node, f"{what} must be a string")
        return str(v)

    def integer(self, node: yaml.Node, what: str, minimum: int | None = 0, maximum: int | None = MAX_QUANTITY) -> int:
        v = self.scalar(node, what)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
            raise self.fail(node, f"{what} must be a whole number, not {v!r}")
        if minimum is not None and v < minimum:
            raise self.fail(node, f"{what} must be at least {minimum}, not {v}")
        if maximum is not None and abs(v) > maximum:
            raise self.fail(node, f"{what} must be at most {maximum}, not {v}")
        return int(v)

    def number(self, node: yaml.Node, what: str, lo: float | None = None, hi: float | None = None) -> float:
        v = self.scalar(node, what)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.fail(node, f"{what} must be a number, not {v!r}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            if lo is not None and hi is not None:
                bound = f"between {lo} and {hi}"
            else:
                bound = f"at least {lo}" if lo is not None else f"at most {hi}"
            raise self.fail(node, f"{what} must be {bound}, not {v}")
        return float(v)

    def boolean(self, node: yaml.Node, what: str) -> bool:
        v = self.scalar(node, what)
        if not isinstance(v, bool):
            raise self.fail(node, f"{what} must be true or false, not {v!r}")
        return v

    def resources(self, node: yaml.Node, what: str) -> dict[str, int]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, f"{what} must be a mapping of resource to quantity")
        raw: dict[str, Any] = {}
        for k, v in node.value:
            raw[str(k.value)] = self.scalar(v, f"{what}.{k.value}")
            try:
                parse_resources({str(k.value): raw[str(k.value)]})
            except ValueError as exc:
                raise self.fail(v, f"{what}: {exc}") from None
        parsed: dict[str, int] = parse_resources(raw)
        problem = quantity_problem(parsed)
        if problem is not None:
            raise self.fail(node, f"{what}: {problem}")
        return parsed

    def labels(self, node: yaml.Node, what: str) -> dict[str, str]:
        """A mapping of label keys to values."""
        return {k: self.string(v, f"label {k}") for k, v in self.mapping(node, what, set(_keys(node))).items()}

    def choice(self, node: yaml.Node, what: str, options: tuple[str, ...]) -> str:
        v = self.string(node, what)
        if v not in options:
            raise self.fail(node, f"{what} must be one of {', '.join(options)}, not {v!r}")
        return v


# ------------------------------------------------------------------ top level

_TOP = {
    "topology",
    "nodes",
    "priority_classes",
    "cohorts",
    "fair_sharing",
    "flavors",
    "queues",
    "idle_reclaim",
    "timeline",
    "timeline_csv",
    "until",
}


class _AnyName(set[str]):
    """Every name is defined: checking a queues file's cohorts and flavors is left to the caller (`queues apply`)."""

    def __contains__(self, item: object) -> bool:
        return True


def load(
    path: str | Path, known_cohorts: Collection[str] | None = (), known_flavors: Collection[str] | None = ()
) -> Scenario:
    """Read and check a scenario file; raise ScenarioError naming file and line on anything wrong.

    `known_cohorts` and `known_flavors` are defined besides the file's own (`queues apply`: those
    on the log); None accepts any name."""
    p = Path(path)
    name = str(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(name, None, f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ScenarioError(name, None, "not UTF-8 text") from None
    return loads(text, name, base=p.parent, known_cohorts=known_cohorts, known_flavors=known_flavors)


def loads(
    text: str,
    name: str = "<scenario>",
    base: Path | None = None,
    known_cohorts: Collection[str] | None = (),
    known_flavors: Collection[str] | None = (),
) -> Scenario:
    r = _Reader(name)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise ScenarioError(name, line, f"malformed YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(name, None, f"malformed YAML: {exc}") from None
    except RecursionError:  # PyYAML composes recursively: hostile nesting must be bad input, not a crash
        raise ScenarioError(name, None, "malformed YAML: nested too deeply") from None
    if root is None:
        raise ScenarioError(name, None, "the scenario is empty")
    top = r.mapping(root, "scenario", _TOP)
    levels: list[str] = []
    if "topology" in top:
        t = r.mapping(top["topology"], "topology", {"levels"})
        if "levels" in t:
            for n in r.seq(t["levels"], "topology.levels"):
                lv = r.string(n, "topology level")
                if lv in levels or lv == "host":
                    raise r.fail(n, f"topology level {lv!r} is repeated or reserved")
                levels.append(lv)
    fair = r.boolean(top["fair_sharing"], "fair_sharing") if "fair_sharing" in top else False
    idle: IdleReclaimPolicy | None = None
    if "idle_reclaim" in top:
        m = r.mapping(top["idle_reclaim"], "idle_reclaim", {"threshold", "after", "only_borrowing"})
        idle = IdleReclaimPolicy(
            threshold=r.number(m["threshold"], "idle_reclaim.threshold", 0, 1) if "threshold" in m else 0.05,
            after=r.integer(m["after"], "idle_reclaim.after") if "after" in m else 1800,
            only_borrowing=r.boolean(m["only_borrowing"], "idle_reclaim.only_borrowing")
            if "only_borrowing" in m
            else True,
        )
    config: list[Event] = [SchedulerConfigured(at=0, levels=levels, fair_sharing=fair, idle_reclaim=idle)]
    classes = _priority_classes(r, top.get("priority_classes"))
    config.extend(classes)
    cohorts = _cohorts(r, top.get("cohorts"), known_cohorts)
    config.extend(cohorts)
    cohort_names: set[str] = {str(c.name) for c in cohorts} | set(known_cohorts or ())
    if known_cohorts is None:
        cohort_names = _AnyName(cohort_names)
    nodes = _nodes(r, top.get("nodes"), levels)
    flavors = flavorspec.flavors(r, top.get("flavors"), nodes)
    config.extend(flavors.values())
    flavor_names: set[str] = set(flavors) | set(known_flavors or ())
    known = Known(cohort_names, flavor_names if known_flavors is not None else _AnyName(flavor_names))
    queues = _queues(r, top.get("queues"), known)
    config.extend(queues.values())
    config.extend(nodes.values())
    inputs: list[Input] = []
    if "timeline" in top:
        inputs.extend(_timeline(r, top["timeline"], queues, known, set(nodes)))
    _unique_jobs(name, inputs, {})
    if "timeline_csv" in top:
        csv_name = r.string(top["timeline_csv"], "timeline_csv")
        csv_path = (base or Path(".")) / csv_name
        rows = _timeline_csv(csv_path, start=len(inputs))
        _unique_jobs(str(csv_path), rows, {i.data["job"]: f"{name}:{i.line}" for i in inputs if i.kind == "submit"})
        inputs.extend(rows)
    # at equal times, timeline entries come before CSV rows (stable sort keeps file order)
    inputs.sort(key=lambda i: (i.at, i.order))
    until = r.integer(top["until"], "until") if "until" in top else None
    return Scenario(name, config, inputs, until, levels, queues, nodes, flavors, keys=frozenset(top))


def _unique_jobs(path: str, inputs: list[Input], seen: dict[str, str]) -> None:
    """A job id is submitted once: a second submission would be dropped by the fold, so it is an error."""
    for i in inputs:
        if i.kind != "submit":
            continue
        job = i.data["job"]
        if job in seen:
            raise ScenarioError(path, i.line, f"job {job!r} is submitted twice (first at {seen[job]})")
        seen[job] = f"{path}:{i.line}"


def _priority_classes(r: _Reader, node: yaml.Node | None) -> list[PriorityClassConfigured]:
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


def _cohorts(r: _Reader, node: yaml.Node | None, known: Collection[str] | None = ()) -> list[CohortConfigured]:
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
_STRATEGIES = ("best_effort_fifo", "strict_fifo")
_PLAIN_QUOTA = ("nominal", "borrowing_limit", "lending_limit")


@dataclass
class Known:
    """Names a queue may refer to: cohorts and flavors."""

    cohorts: set[str]
    flavors: set[str] = field(default_factory=set)


def queue_from(r: _Reader, n: yaml.Node, known: Known, base: QueueConfigured | None = None) -> QueueConfigured:
    """A queue definition (or, with `base`, an update of some of its fields)."""
    m = r.mapping(n, "queue", QUEUE_FIELDS, {"name"})
    name = r.string(m["name"], "queue name")
    grouped = "resource_groups" in m or (base is not None and bool(base.resource_groups) and "nominal" not in m)
    plain = [f for f in _PLAIN_QUOTA if f in m]
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
    for f in _PLAIN_QUOTA:
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


def _queues(r: _Reader, node: yaml.Node | None, known: Known) -> dict[str, QueueConfigured]:
    out: dict[str, QueueConfigured] = {}
    if node is None:
        return out
    for n in r.seq(node, "queues"):
        q = queue_from(r, n, known)
        if q.name in out:
            raise r.fail(n, f"queue {q.name!r} is defined twice")
        out[q.name] = q
    return out


MAX_NODES = 100_000
"""A scenario's node limit: far above the benchmarks, low enough that a typo'd count fails fast."""


def _nodes(r: _Reader, node: yaml.Node | None, levels: list[str]) -> dict[str, NodeAdded]:
    out: dict[str, NodeAdded] = {}
    if node is None:
        return out

    def add(n: yaml.Node, name: str, labels: dict[str, str], capacity: dict[str, int]) -> None:
        if name in out:
            raise r.fail(n, f"node {name!r} is defined twice")
        out[name] = NodeAdded(at=0, node=NodeName(name), labels=labels, capacity=capacity)

    for n in r.seq(node, "nodes"):
        if isinstance(n, yaml.MappingNode) and any(k.value == "generate" for k, _ in n.value):
            outer = r.mapping(n, "nodes entry", {"generate"})
            g = r.mapping(outer["generate"], "generate", {"count", "name", "labels", "capacity"}, {"count", "name"})
            count = r.integer(g["count"], "generate.count", minimum=1)
            pattern = r.string(g["name"], "generate.name")
            capacity = r.resources(g["capacity"], "generate.capacity") if "capacity" in g else {}
            axes: list[tuple[str, list[str]]] = []
            if "labels" in g:
                lm = r.mapping(g["labels"], "generate.labels", set(_keys(g["labels"])))
                for key, vn in lm.items():
                    if isinstance(vn, yaml.SequenceNode):
                        axes.append((key, [r.string(x, f"label {key}") for x in vn.value]))
                    else:
                        axes.append((key, [r.string(vn, f"label {key}")]))
            total = count
            for _, vals in axes:
                total *= len(vals)
            if len(out) + total > MAX_NODES:
                raise r.fail(g["count"], f"generate: {total} more nodes is too many (at most {MAX_NODES} in all)")
            for combo in itertools.product(*[vals for _, vals in axes]):
                labels = {k: v for (k, _), v in zip(axes, combo, strict=True)}
                for i in range(count):
                    add(n, _fill(r, g["name"], pattern, {**labels, "i": str(i)}), dict(labels), dict(capacity))
        else:
            m = r.mapping(n, "node", {"name", "labels", "capacity"}, {"name"})
            name = r.string(m["name"], "node name")
            node_labels: dict[str, str] = {}
            if "labels" in m:
                node_labels = r.labels(m["labels"], f"node {name}: labels")
            capacity = r.resources(m["capacity"], f"node {name}: capacity") if "capacity" in m else {}
            add(n, name, node_labels, capacity)
    return out


_FIELD = re.compile(r"\{([^{}]*)\}")


def _fill(r: _Reader, node: yaml.Node, pattern: str, values: dict[str, str]) -> str:
    """`pattern` with each `{label}` and `{i}` replaced: plain substitution, not str.format (no attributes or specs)."""

    def one(m: re.Match[str]) -> str:
        key = m.group(1)
        if key not in values:
            raise r.fail(node, f"generate.name {pattern!r}: cannot fill {{{key}}} (known: {', '.join(sorted(values))})")
        return values[key]

    return _FIELD.sub(one, pattern)


def _keys(node: yaml.Node) -> list[str]:
    if isinstance(node, yaml.MappingNode):
        return [str(k.value) for k, _ in node.value]
    return []


_EVENT_KINDS = {"submit", "node_down", "node_up", "cordon", "uncordon", "cancel", "utilization", "queue_update"}


def _timeline(
    r: _Reader, node: yaml.Node, queues: dict[str, QueueConfigured], known: Known, nodes: set[str]
) -> list[Input]:
    out: list[Input] = []
    for order, n in enumerate(r.seq(node, "timeline")):
        m = r.mapping(n, "timeline entry", {"at"} | _EVENT_KINDS, {"at"})
        at = r.integer(m["at"], "at")
        kinds = [k for k in m if k != "at"]
        if len(kinds) != 1:
            raise r.fail(n, f"timeline entry must have exactly one of {', '.join(sorted(_EVENT_KINDS))}")
        kind = kinds[0]
        v = m[kind]
        line = n.start_mark.line + 1
        if kind == "submit":
            data = _submit(r, v, known.flavors)
        elif kind in ("node_down", "node_up", "cordon", "uncordon", "cancel"):
            data = {"name": r.string(v, kind)}
            if kind != "cancel" and data["name"] not in nodes:
                raise r.fail(v, f"{kind}: node {data['name']!r} is not defined")
        elif kind == "utilization":
            u = r.mapping(v, "utilization", {"job", "gpu"}, {"job", "gpu"})
            data = {"job": r.string(u["job"], "utilization.job"), "gpu": r.number(u["gpu"], "utilization.gpu", 0, 1)}
        else:
            um = r.mapping(v, "queue_update", QUEUE_FIELDS, {"name"})
            qname = r.string(um["name"], "queue_update.name")
            if qname not in queues:
                raise r.fail(v, f"queue_update: queue {qname!r} is not defined")
            parsed = queue_from(r, v, known, base=queues[qname])
            fields = {f for f in um if f != "name"}
            # plain quota and groups replace each other: new groups clear the plain quota, and
            # plain quota clears the groups (a no-op on a queue that has none)
            if "resource_groups" in fields:
                fields |= set(_PLAIN_QUOTA)
            elif fields & set(_PLAIN_QUOTA):
                fields.add("resource_groups")
            data = {"name": qname, "fields": sorted(fields), "queue": parsed}
        out.append(Input(at, order, kind, data, line))
    return out


_PODSET_FIELDS = {"name", "count", "requests", "topology", "flavors"}
_SUBMIT_FIELDS = {"job", "queue", "priority_class", "podsets", "runtime", "checkpoint_every", "max_runtime"}


def _submit(r: _Reader, node: yaml.Node, flavors: Collection[str] | None = None) -> dict[str, Any]:
    """A job as written; shape errors are scenario errors, spec errors become JobRejected.

    `flavors` are the names a podset may restrict itself to (None: any; the core rejects unknown ones)."""
    m = r.mapping(node, "submit", _SUBMIT_FIELDS, {"job", "queue"})
    podsets: list[PodSet] = []
    invalid: str | None = None
    for pn in r.seq(m["podsets"], "podsets") if "podsets" in m else []:
        p = r.mapping(pn, "podset", _PODSET_FIELDS, {"count"})
        topo = None
        if "topology" in p:
            t = r.mapping(p["topology"], "topology", {"required", "preferred"})
            topo = Topology(
                required=r.string(t["required"], "topology.required") if "required" in t else None,
                preferred=r.string(t["preferred"], "topology.preferred") if "preferred" in t else None,
            )
        name = r.string(p["name"], "podset name") if "name" in p else "worker"
        allowed: list[str] = []
        for fn in r.seq(p["flavors"], f"podset {name!r}: flavors") if "flavors" in p else []:
            fname = r.string(fn, "flavor")
            if flavors is not None and fname not in flavors:
                raise r.fail(fn, f"podset {name!r}: flavor {fname!r} is not defined")
            allowed.append(fname)
        # a count or a request that is not a whole quantity (1.5 pods, 0.5 GPUs) makes the
        # job invalid, not the scenario: the job is rejected and the run goes on
        try:
            count = r.integer(p["count"], f"podset {name!r}: count", minimum=None, maximum=None)
            requests = _requests(r, p["requests"]) if "requests" in p else {}
        except ScenarioError as exc:
            invalid = invalid or exc.message
            count, requests = 0, {}
        podsets.append(PodSet(name=name, count=count, requests=requests, topology=topo, flavors=allowed))
    out: dict[str, Any] = {
        "job": r.string(m["job"], "job"),
        "queue": r.string(m["queue"], "queue"),
        "priority_class": r.string(m["priority_class"], "priority_class") if "priority_class" in m else None,
        "podsets": podsets,
        "runtime": r.integer(m["runtime"], "runtime", minimum=None, maximum=None) if "runtime" in m else None,
        "checkpoint_every": r.integer(m["checkpoint_every"], "checkpoint_every", minimum=None, maximum=None)
        if "checkpoint_every" in m
        else None,
        "max_runtime": r.integer(m["max_runtime"], "max_runtime", minimum=None, maximum=None)
        if "max_runtime" in m
        else None,
    }
    if invalid is not None:
        out["invalid"] = invalid
    return out


def _requests(r: _Reader, node: yaml.Node) -> dict[str, int]:
    """Per-pod requests; a negative amount is kept (negative) so the core rejects the job."""
    if not isinstance(node, yaml.MappingNode):
        raise r.fail(node, "requests must be a mapping of resource to quantity")
    out: dict[str, int] = {}
    for k, v in node.value:
        key = "gpu" if k.value == "nvidia.com/gpu" else str(k.value)
        raw = r.scalar(v, f"requests.{key}")
        negative = isinstance(raw, (int, float)) and not isinstance(raw, bool) and raw < 0
        try:
            amount = parse_quantity(key, -raw if negative else raw)
        except ValueError as exc:
            raise r.fail(v, f"requests: {exc}") from None
        out[key] = -amount if negative else amount
    return out


_CSV_REQUIRED = ("job", "submit", "queue", "gpus", "gpus_per_pod", "runtime")
_CSV_OPTIONAL = ("priority_class", "checkpoint_every", "topology", "limit")


def _timeline_csv(path: Path, start: int) -> list[Input]:
    name = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ScenarioError(name, None, f"cannot read timeline_csv: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError(name, raw.count(b"\n", 0, exc.start) + 1, "not UTF-8 text") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        return _csv_rows(name, reader, start)
    except csv.Error as exc:
        raise ScenarioError(name, reader.line_num, f"malformed CSV: {exc}") from None


def _csv_rows(name: str, reader: Any, start: int) -> list[Input]:
    """The trace's jobs, one per row after the header."""
    out: list[Input] = []
    try:
        header = next(reader)
    except StopIteration:
        raise ScenarioError(name, 1, "empty CSV: expected a header row") from None
    header = [h.strip() for h in header]
    unknown = [h for h in header if h not in _CSV_REQUIRED + _CSV_OPTIONAL]
    if unknown:
        raise ScenarioError(name, 1, f"unknown column {unknown[0]!r}")
    missing = [h for h in _CSV_REQUIRED if h not in header]
    if missing:
        raise ScenarioError(name, 1, f"missing column {missing[0]!r}")
    col = {h: i for i, h in enumerate(header)}
    for lineno, row in enumerate(reader, start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise ScenarioError(name, lineno, f"expected {len(header)} columns, found {len(row)}")

        def get(c: str, row: list[str] = row) -> str:
            return row[col[c]].strip() if c in col else ""

        def integer(c: str, lineno: int = lineno) -> int:
            text = get(c)
            try:
                v = float(text)
            except ValueError:
                raise ScenarioError(name, lineno, f"column {c}: {text!r} is not a number") from None
            if not v.is_integer():
                raise ScenarioError(name, lineno, f"column {c}: {text!r} is not a whole number")
            if abs(v) > MAX_QUANTITY:
                raise ScenarioError(
                    name, lineno, f"column {c}: {text} is more than muster accepts (at most {MAX_QUANTITY})"
                )
            return int(v)

        job = get("job")
        at = integer("submit")
        if at < 0:
            raise ScenarioError(name, lineno, f"column submit: {at} is negative")
        # GPUs that are not a whole number make the job invalid (JobRejected), not the trace
        bad: list[str] = []

        def gpu_count(c: str, bad: list[str] = bad) -> int:
            try:
                return integer(c)
            except ScenarioError as exc:
                bad.append(exc.message)
                return 0

        gpus = gpu_count("gpus")
        per_pod = gpu_count("gpus_per_pod")
        runtime = integer("runtime")
        topo = None
        if get("topology"):
            kind, _, level = get("topology").partition(":")
            if kind not in ("required", "preferred") or not level:
                raise ScenarioError(
                    name, lineno, f"column topology: {get('topology')!r} is not required:LEVEL or preferred:LEVEL"
                )
            topo = Topology(required=level) if kind == "required" else Topology(preferred=level)
        data: dict[str, Any] = {
            "job": job,
            "queue": get("queue"),
            "priority_class": get("priority_class") or None,
            "runtime": runtime,
            "checkpoint_every": integer("checkpoint_every") if get("checkpoint_every") else None,
            "max_runtime": integer("limit") if get("limit") else None,
        }
        invalid = bad[0] if bad else None
        if invalid is None and per_pod <= 0:
            invalid = f"gpus_per_pod {per_pod} must be positive"
        elif invalid is None and gpus < 0:
            invalid = f"gpus {gpus} is negative"
        elif invalid is None and gpus >= per_pod and gpus % per_pod:
            invalid = f"gpus {gpus} is not a multiple of gpus_per_pod {per_pod}"
        if invalid is not None:
            data["podsets"] = [PodSet(name="worker", count=0, requests={"gpu": gpus})]
            data["invalid"] = invalid
        elif gpus < per_pod:
            data["podsets"] = [PodSet(name="worker", count=1, requests={"gpu": gpus}, topology=topo)]
        else:
            data["podsets"] = [PodSet(name="worker", count=gpus // per_pod, requests={"gpu": per_pod}, topology=topo)]
        out.append(Input(at, start + lineno, "submit", data, lineno))
    return out
