"""Reading a scenario's `timeline_csv` trace (spec/scenario.md, Timeline): one job per row.

The header names the columns (`job, submit, queue, gpus, gpus_per_pod, runtime` and optional
`priority_class, checkpoint_every, topology, limit`); errors name file and line (`ScenarioError`).
GPUs that are not a whole number of pods make the job invalid (`JobRejected`), not the trace.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from muster.events.types import PodSet, Topology
from muster.projections.validation import MAX_QUANTITY
from muster.replay.specreader import ScenarioError
from muster.replay.timelinespec import Input

_CSV_REQUIRED = ("job", "submit", "queue", "gpus", "gpus_per_pod", "runtime")
_CSV_OPTIONAL = ("priority_class", "checkpoint_every", "topology", "limit")


def inputs(path: Path, start: int) -> list[Input]:
    """The trace's jobs as `submit` inputs, ordered after the `start` timeline entries at equal times."""
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
