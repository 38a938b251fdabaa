"""The YAML node reader every scenario module reads with: typed values whose errors name file and line.

The file is read as a node tree (not plain Python values) so that each error can say where it is;
unknown fields and repeated fields are errors. `ScenarioError` is the one error of the scenario
reader (exit status 2 in the CLI).
"""

from __future__ import annotations

from typing import Any

import yaml

from muster.projections.resources import parse_resources
from muster.projections.validation import MAX_QUANTITY, quantity_problem


class ScenarioError(Exception):
    """An invalid scenario: file, line and what is wrong."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line
        self.message = message


def yaml_problem(exc: Exception) -> tuple[int | None, str]:
    """Where a YAML file could not be parsed (its line, when the parser knows it) and why: `malformed YAML: ...`.

    The one form every file muster reads reports bad YAML in (scenarios, queues files, job files, configs,
    rate cards), so a user is pointed at `FILE:LINE` whichever command read it. A RecursionError is
    PyYAML composing hostile nesting recursively: bad input, not a crash.
    """
    if isinstance(exc, RecursionError):
        return None, "malformed YAML: nested too deeply"
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        return (mark.line + 1 if mark is not None else None), f"malformed YAML: {exc.problem or exc}"
    return None, f"malformed YAML: {exc}"


def malformed(name: str, exc: Exception) -> str:
    """`NAME:LINE: malformed YAML: PROBLEM` (`yaml_problem`; `NAME: ...` when the line is unknown)."""
    line, message = yaml_problem(exc)
    return f"{name}:{line}: {message}" if line is not None else f"{name}: {message}"


class Reader:
    """Typed values from the nodes of one file; each failure is a `ScenarioError` at the node's line."""

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
        return {k: self.string(v, f"label {k}") for k, v in self.mapping(node, what, set(keys_of(node))).items()}

    def choice(self, node: yaml.Node, what: str, options: tuple[str, ...]) -> str:
        v = self.string(node, what)
        if v not in options:
            raise self.fail(node, f"{what} must be one of {', '.join(options)}, not {v!r}")
        return v


def keys_of(node: yaml.Node) -> list[str]:
    """The keys of a mapping node as written (none for any other node)."""
    if isinstance(node, yaml.MappingNode):
        return [str(k.value) for k, _ in node.value]
    return []
