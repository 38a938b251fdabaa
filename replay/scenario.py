"""Reading a `muster sim` scenario file (spec/scenario.md) into events.

The YAML is read as a node tree so that every error names the file, the line
and what is wrong (`ScenarioError`, exit status 2 in the CLI). Unknown fields
are errors. The scenario becomes a list of configuration events (applied at
time 0) and a timeline of timed inputs; invalid *jobs* are not errors here:
they become `JobRejected` events from the scheduler core, exactly as in the
daemon.

This module reads the top level and puts the parts together; each part is read
by its own module: `queuespec` (priority classes, cohorts, queues), `nodespec`,
`flavorspec`, `timelinespec` and `tracecsv`, all with `specreader.Reader`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from muster.events.types import (
    Event,
    FlavorConfigured,
    IdleReclaimPolicy,
    NodeAdded,
    QueueConfigured,
    SchedulerConfigured,
)
from muster.replay import flavorspec, nodespec, queuespec, timelinespec, tracecsv
from muster.replay.queuespec import Known
from muster.replay.specreader import Reader, ScenarioError, yaml_problem
from muster.replay.timelinespec import Input


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
SIM_ONLY = frozenset({"nodes", "timeline", "timeline_csv", "until"})
"""Top-level keys of a scenario that a queues file (`queues apply`) may not give: the cluster and what happens."""


class _AnyName(set[str]):
    """Every name is defined: checking a queues file's cohorts and flavors is left to the caller (`queues apply`)."""

    def __contains__(self, item: object) -> bool:
        return True


def load(
    path: str | Path,
    known_cohorts: Collection[str] | None = (),
    known_flavors: Collection[str] | None = (),
    *,
    queues_file: bool = False,
) -> Scenario:
    """Read and check a scenario file; raise ScenarioError naming file and line on anything wrong.

    `known_cohorts` and `known_flavors` are defined besides the file's own (`queues apply`: those
    on the log); None accepts any name. A `queues_file` gives no `SIM_ONLY` key, and its errors
    call it a queues file."""
    p = Path(path)
    name = str(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(name, None, f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ScenarioError(name, None, "not UTF-8 text") from None
    return loads(
        text, name, base=p.parent, known_cohorts=known_cohorts, known_flavors=known_flavors, queues_file=queues_file
    )


def loads(
    text: str,
    name: str = "<scenario>",
    base: Path | None = None,
    known_cohorts: Collection[str] | None = (),
    known_flavors: Collection[str] | None = (),
    *,
    queues_file: bool = False,
) -> Scenario:
    r = Reader(name)
    what = "queues file" if queues_file else "scenario"
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError) as exc:
        raise ScenarioError(name, *yaml_problem(exc)) from None
    if root is None:
        raise ScenarioError(name, None, f"the {what} is empty")
    if queues_file and isinstance(root, yaml.MappingNode):
        for key, _ in root.value:
            if isinstance(key, yaml.ScalarNode) and key.value in SIM_ONLY:
                raise r.fail(key, f"{key.value} belongs in a `muster sim` scenario, not a queues file")
    # a queues file's unknown key lists only what a queues file may give
    top = r.mapping(root, what, _TOP - SIM_ONLY if queues_file else _TOP)
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
    classes = queuespec.priority_classes(r, top.get("priority_classes"))
    config.extend(classes)
    cohorts = queuespec.cohorts(r, top.get("cohorts"), known_cohorts)
    config.extend(cohorts)
    cohort_names: set[str] = {str(c.name) for c in cohorts} | set(known_cohorts or ())
    if known_cohorts is None:
        cohort_names = _AnyName(cohort_names)
    nodes = nodespec.nodes(r, top.get("nodes"), levels)
    flavors = flavorspec.flavors(r, top.get("flavors"), nodes)
    config.extend(flavors.values())
    flavor_names: set[str] = set(flavors) | set(known_flavors or ())
    known = Known(cohort_names, flavor_names if known_flavors is not None else _AnyName(flavor_names))
    queues = queuespec.queues(r, top.get("queues"), known)
    config.extend(queues.values())
    config.extend(nodes.values())
    inputs: list[Input] = []
    if "timeline" in top:
        inputs.extend(timelinespec.entries(r, top["timeline"], queues, known, set(nodes)))
    timelinespec.unique_jobs(name, inputs, {})
    if "timeline_csv" in top:
        csv_name = r.string(top["timeline_csv"], "timeline_csv")
        csv_path = (base or Path(".")) / csv_name
        rows = tracecsv.inputs(csv_path, start=len(inputs))
        timelinespec.unique_jobs(
            str(csv_path), rows, {i.data["job"]: f"{name}:{i.line}" for i in inputs if i.kind == "submit"}
        )
        inputs.extend(rows)
    timelinespec.named_jobs_submitted(name, inputs)
    # at equal times, timeline entries come before CSV rows (stable sort keeps file order)
    inputs.sort(key=lambda i: (i.at, i.order))
    until = r.integer(top["until"], "until") if "until" in top else None
    return Scenario(name, config, inputs, until, levels, queues, nodes, flavors, keys=frozenset(top))
