"""Reading the timeline of a scenario (spec/scenario.md, Timeline): timed inputs in file order.

Each entry is one input at a time: a job submitted, a node down or up, cordoned or uncordoned, a
job cancelled, a job's GPU utilization, or an update of a queue. Shape errors name file and line
(`ScenarioError`); a *job* that is invalid (1.5 pods, a negative request) is not an error here: it
is marked `invalid` and becomes a `JobRejected` event from the scheduler core, as in the daemon.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import yaml

from muster.events.types import PodSet, QueueConfigured, Topology
from muster.projections.resources import parse_quantity
from muster.replay.queuespec import PLAIN_QUOTA, QUEUE_FIELDS, Known, queue_from
from muster.replay.specreader import Reader, ScenarioError


@dataclass
class Input:
    """One timed input of the timeline, in file order."""

    at: int
    order: int
    kind: str
    data: dict[str, Any]
    line: int | None = None


_EVENT_KINDS = {"submit", "node_down", "node_up", "cordon", "uncordon", "cancel", "utilization", "queue_update"}


def entries(
    r: Reader, node: yaml.Node, queues: dict[str, QueueConfigured], known: Known, nodes: set[str]
) -> list[Input]:
    """The `timeline:` entries as inputs, in file order; each names only nodes and queues that are defined."""
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
            data = submit(r, v, known.flavors)
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
                fields |= set(PLAIN_QUOTA)
            elif fields & set(PLAIN_QUOTA):
                fields.add("resource_groups")
            data = {"name": qname, "fields": sorted(fields), "queue": parsed}
        out.append(Input(at, order, kind, data, line))
    return out


_PODSET_FIELDS = {"name", "count", "requests", "topology", "flavors"}
_SUBMIT_FIELDS = {"job", "queue", "priority_class", "podsets", "runtime", "checkpoint_every", "max_runtime"}


def submit(r: Reader, node: yaml.Node, flavors: Collection[str] | None = None) -> dict[str, Any]:
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


def _requests(r: Reader, node: yaml.Node) -> dict[str, int]:
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


def unique_jobs(path: str, inputs: list[Input], seen: dict[str, str]) -> None:
    """A job id is submitted once: a second submission would be dropped by the fold, so it is an error."""
    for i in inputs:
        if i.kind != "submit":
            continue
        job = i.data["job"]
        if job in seen:
            raise ScenarioError(path, i.line, f"job {job!r} is submitted twice (first at {seen[job]})")
        seen[job] = f"{path}:{i.line}"


def named_jobs_submitted(path: str, inputs: list[Input]) -> None:
    """A `cancel` or `utilization` names a job the scenario submits: one that names no such job (a typo)
    would change nothing, silently. Its time is not checked: before the submission it is harmless."""
    submitted = {i.data["job"] for i in inputs if i.kind == "submit"}
    for i in inputs:
        job = i.data["name"] if i.kind == "cancel" else i.data["job"] if i.kind == "utilization" else None
        if job is not None and job not in submitted:
            raise ScenarioError(path, i.line, f"{i.kind}: job {job!r} is not submitted in this scenario")
