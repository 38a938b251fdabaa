"""Reading the nodes of a scenario (spec/scenario.md, Nodes): plain nodes and `generate` entries.

A `generate` entry makes `count` nodes for every combination of its label values, named by filling
`{label}` and `{i}` into its name pattern. Every error names file and line (`ScenarioError`); a node
name is defined once and a scenario has at most `MAX_NODES` nodes.
"""

from __future__ import annotations

import itertools
import re

import yaml

from muster.events.types import NodeAdded, NodeName
from muster.replay.specreader import Reader, keys_of

MAX_NODES = 100_000
"""A scenario's node limit: far above the benchmarks, low enough that a typo'd count fails fast."""


def nodes(r: Reader, node: yaml.Node | None, levels: list[str]) -> dict[str, NodeAdded]:
    """The `nodes:` list, by name: plain nodes and `generate` entries expanded over their label values."""
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
                lm = r.mapping(g["labels"], "generate.labels", set(keys_of(g["labels"])))
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


def _fill(r: Reader, node: yaml.Node, pattern: str, values: dict[str, str]) -> str:
    """`pattern` with each `{label}` and `{i}` replaced: plain substitution, not str.format (no attributes or specs)."""

    def one(m: re.Match[str]) -> str:
        key = m.group(1)
        if key not in values:
            raise r.fail(node, f"generate.name {pattern!r}: cannot fill {{{key}}} (known: {', '.join(sorted(values))})")
        return values[key]

    return _FIELD.sub(one, pattern)
