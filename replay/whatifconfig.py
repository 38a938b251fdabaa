"""The configuration a what-if runs under: a file of scenario sections, the log filling in what it leaves out.

The file holds the scenario sections `queues` (required), `cohorts`,
`priority_classes`, `flavors`, `fair_sharing`, `idle_reclaim`
(spec/scenario.md); a section it leaves out keeps the log's, and so does a
queue it does not name (a file changing one queue's quota need not repeat the
others). Errors are `WhatIfError`, with file and line when known.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import yaml

from muster.events.types import (
    CohortName,
    Event,
    FlavorFungibility,
    QueueConfigured,
    QueueName,
    SchedulerConfigured,
)
from muster.projections.state import ClusterState, QueueState
from muster.replay.scenario import loads
from muster.replay.specreader import ScenarioError, malformed

CONFIG_SECTIONS = ("queues", "cohorts", "priority_classes", "flavors", "fair_sharing", "idle_reclaim")


class WhatIfError(Exception):
    """A configuration file that cannot be used (with file and line when known)."""


def load_config(text: str, name: str, state: ClusterState) -> tuple[list[Event], set[str]]:
    """Configuration events from the file, the log's state filling in the sections it leaves out.

    Returns the events (scheduler, classes, cohorts, queues) and the kinds the file replaces.
    """
    try:
        root = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as exc:
        raise WhatIfError(malformed(name, exc)) from None
    if not isinstance(root, dict):
        raise WhatIfError(f"{name}: expected a mapping with {', '.join(CONFIG_SECTIONS)}")
    unknown = sorted(set(root) - set(CONFIG_SECTIONS))
    if unknown:
        raise WhatIfError(
            f"{name}: unknown section {unknown[0]!r}: a what-if configuration holds only {', '.join(CONFIG_SECTIONS)}"
        )
    if "queues" not in root:
        raise WhatIfError(f"{name}: missing section 'queues'")
    extra = ""
    if "cohorts" not in root and state.cohorts:
        extra += "\ncohorts:\n" + "".join(
            f"  - {{name: {_q(c)}{', parent: ' + _q(p) if p else ''}}}\n" for c, p in sorted(state.cohorts.items())
        )
    if "priority_classes" not in root and state.priority_classes:
        extra += "\npriority_classes:\n" + "".join(
            f"  - {{name: {_q(pc.name)}, value: {pc.value}, preemptible: {'true' if pc.preemptible else 'false'}}}\n"
            for pc in sorted(state.priority_classes.values(), key=lambda p: p.name)
        )
    if "flavors" not in root and state.flavors:
        # JSON is YAML: label keys and values go through whatever they hold
        extra += "\nflavors:\n" + "".join(
            "  - "
            + json.dumps(
                {"name": f.name, "node_labels": f.node_labels, "taints": msgspec.to_builtins(f.taints)},
                sort_keys=True,
            )
            + "\n"
            for f in sorted(state.flavors.values(), key=lambda f: f.name)
        )
    try:
        scenario = loads(text.rstrip("\n") + "\n" + extra, name)
    except ScenarioError as exc:
        raise WhatIfError(str(exc)) from None
    events: list[Event] = []
    for ev in scenario.config:
        if isinstance(ev, SchedulerConfigured):
            ev = SchedulerConfigured(
                at=0,
                levels=list(state.levels),
                fair_sharing=ev.fair_sharing if "fair_sharing" in root else state.fair_sharing,
                idle_reclaim=ev.idle_reclaim if "idle_reclaim" in root else state.idle_reclaim,
            )
        events.append(ev)
    # a queue the file does not name keeps the log's configuration (as `queues apply` leaves it)
    named = {ev.name for ev in events if isinstance(ev, QueueConfigured)}
    for q in sorted(state.queues.values(), key=lambda q: q.name):
        if q.name not in named:
            events.append(_queue_event(q))
    replaced = {"QueueConfigured"}
    if "cohorts" in root:
        replaced.add("CohortConfigured")
    if "priority_classes" in root:
        replaced.add("PriorityClassConfigured")
    if "flavors" in root:
        replaced.add("FlavorConfigured")
    if "fair_sharing" in root or "idle_reclaim" in root:
        replaced.add("SchedulerConfigured")
    return events, replaced


def _queue_event(q: QueueState) -> QueueConfigured:
    """The configuration event a folded queue came from (its quota per flavor given back as groups)."""
    grouped = bool(q.resource_groups)
    return QueueConfigured(
        at=0,
        name=QueueName(q.name),
        cohort=CohortName(q.cohort) if q.cohort is not None else None,
        nominal={} if grouped else dict(q.nominal),
        borrowing_limit=dict(q.borrowing_limit) if q.borrowing_limit is not None and not grouped else None,
        lending_limit=dict(q.lending_limit) if q.lending_limit is not None and not grouped else None,
        weight=q.weight,
        preemption=q.preemption,
        queueing_strategy=q.queueing_strategy,  # type: ignore[arg-type]
        resource_groups=list(q.resource_groups) if grouped else msgspec.UNSET,
        flavor_fungibility=q.fungibility if grouped else msgspec.UNSET,
        reserve_after=q.reserve_after,
    )


def _q(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def named_queues(text: str) -> set[str]:
    """The queue names a (valid) configuration file gives."""
    root = yaml.safe_load(text) or {}
    queues = root.get("queues") if isinstance(root, dict) else None
    return {str(q["name"]) for q in queues or [] if isinstance(q, dict) and "name" in q}


def queues_of(config: list[Event]) -> list[QueueConfigured]:
    return [e for e in config if isinstance(e, QueueConfigured)]


def changed_queues(state: ClusterState, config: list[Event]) -> list[str]:
    """The queues whose configuration differs from the log's (quota per flavor included)."""
    out = []
    for q in queues_of(config):
        old = state.queues.get(q.name)
        if old is None or _same_terms(_queue_event(old)) != _same_terms(q):
            out.append(q.name)
    return sorted(out)


def _same_terms(q: QueueConfigured) -> QueueConfigured:
    """A queue's configuration with what the fold fills in made explicit (time aside)."""
    fungibility = (q.flavor_fungibility or FlavorFungibility()) if q.resource_groups else msgspec.UNSET
    return msgspec.structs.replace(q, at=0, flavor_fungibility=fungibility)


def read_config(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise WhatIfError(f"{path}: cannot read: {exc.strerror or exc}") from None
