"""Hostile scenario files for `muster sim`: never a traceback; exit 2 naming file:line, or JobRejected events.

A hypothesis fuzzer writes scenario files that are garbage (random bytes,
truncated or mangled YAML, wrong types, unknown fields) or valid files with
absurd jobs (unknown queues and topology levels, a million pods, a billion
GPUs, negative requests, names with unicode and path characters). `muster
sim --output jsonl` runs in-process through the CLI entry point: anything
escaping it is a traceback a user would see. Invalid files exit 2 with the
file name (and a line where there is one); absurd jobs become JobRejected
(or wait with a JobInadmissible reason), every other job runs.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from muster.cli import main

pytestmark = pytest.mark.faults

BASE = """\
topology: {levels: [rack]}
nodes:
  - {name: n0, labels: {rack: r0}, capacity: {gpu: 8}}
  - generate: {count: 2, name: "{rack}-n{i}", labels: {rack: [r1]}, capacity: {gpu: 8}}
priority_classes: [{name: low, value: 0}]
queues:
  - {name: team-a, nominal: {gpu: 24}}
timeline:
"""

ABSURD: list[tuple[str, str, str]] = [
    # (podsets / extra fields, outcome, words in the reason)
    ("queue: nope, podsets: [{name: w, count: 1, requests: {gpu: 1}}]", "rejected", "does not exist"),
    ("queue: team-a, priority_class: god, podsets: [{name: w, count: 1, requests: {gpu: 1}}]", "rejected", "class"),
    ("queue: team-a, podsets: [{name: w, count: 1000000, requests: {gpu: 1}}]", "rejected", "pods"),
    ("queue: team-a, podsets: [{name: w, count: 1, requests: {gpu: 1000000000}}]", "waits", "more than"),
    (
        "queue: team-a, podsets: [{name: w, count: 1, requests: {gpu: 1}, topology: {required: zone}}]",
        "rejected",
        "level",
    ),
    (
        "queue: team-a, podsets: [{name: w, count: 1, requests: {gpu: 1}, topology: {preferred: galaxy}}]",
        "rejected",
        "level",
    ),
    ("queue: team-a, podsets: []", "rejected", "no pods"),
    ("queue: team-a, podsets: [{name: w, count: 1, requests: {gpu: 1}}], runtime: 10", "runs", ""),
]
NAMES = ["../../etc/passwd", "ジョブ🚀", "a.b.*.>", "team a/train 1", "%2F..", "x" * 200, "名前.ü", "- [x]: {y}"]


def run_sim(path: Path) -> tuple[int, str, list[dict]]:
    """`muster sim --output jsonl PATH` in-process: (exit status, stderr, events)."""
    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.StringIO()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        code = main(["sim", "--output", "jsonl", str(path)])
    finally:
        sys.stdout, sys.stderr = saved
    out.flush()
    raw = out.buffer.getvalue().decode()  # type: ignore[attr-defined]
    return code, err.getvalue(), [json.loads(line) for line in raw.splitlines() if line.strip()]


MANGLE = [b":", b"{", b"- ", b"\t", b"&a", b"*a", b"!!python/object/apply:os.system ['true']", b"\x00"]
WRONG = [
    ("count: 1", "count: many"),
    ("gpu: 8}", "gpu: -8}"),
    ("at: 0", "at: yesterday"),
    ("levels: [rack]", "levels: rack"),
    ("nominal: {gpu: 24}", "nominal: 24"),
    ("count: 2", "count: 1.5"),
    ("gpu: 1}", "gpu: 1.5}"),
    ("at: 0", "at: -1"),
]


@st.composite
def garbage(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bytes", "truncated", "mangled", "wrong-type", "unknown-field", "text"]))
    valid = (BASE + f"  - {{at: 0, submit: {{job: j, {ABSURD[-1][0]}}}}}\n").encode()
    if kind == "bytes":
        return draw(st.binary(max_size=400))
    if kind == "truncated":
        return valid[: draw(st.integers(0, len(valid) - 1))]
    if kind == "mangled":
        i = draw(st.integers(0, len(valid) - 1))
        return valid[:i] + draw(st.sampled_from(MANGLE)) + valid[i + 1 :]
    if kind == "wrong-type":
        field, value = draw(st.sampled_from(WRONG))
        return valid.replace(field.encode(), value.encode(), 1)
    if kind == "unknown-field":
        return valid.replace(b"queues:", b"queuez:", 1) if draw(st.booleans()) else valid + b"surprise: 1\n"
    return draw(st.text(max_size=300)).encode()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(data=garbage())
def test_garbage_scenarios_exit_2_with_the_file_and_never_a_traceback(tmp_path: Path, data: bytes) -> None:
    """Random, truncated, mangled and mistyped scenario files: exit 0, or 2 with a message naming the file."""
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(data)
    code, err, _ = run_sim(path)  # an exception escaping here is the traceback a user would see
    assert code in (0, 2), (code, err)
    if code == 2:
        assert f"{path}" in err and "Traceback" not in err, err


@st.composite
def absurd_scenarios(draw: st.DrawFn) -> tuple[str, list[tuple[str, str, str]]]:
    entries = draw(st.lists(st.sampled_from(ABSURD), min_size=1, max_size=8))
    lines, expect = [], []
    for i, (spec, outcome, words) in enumerate(entries):
        job = f"{draw(st.sampled_from(NAMES))}#{i}"
        quoted = json.dumps(job, ensure_ascii=False)  # a JSON string is a YAML double-quoted scalar
        lines.append(f"  - {{at: {draw(st.integers(0, 5))}, submit: {{job: {quoted}, {spec}}}}}")
        expect.append((job, outcome, words))
    lines.sort(key=lambda line: int(line.split("at: ")[1].split(",")[0]))
    return BASE + "\n".join(lines) + "\n", expect


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(case=absurd_scenarios())
def test_absurd_jobs_in_a_scenario_are_answered(tmp_path: Path, case: tuple[str, list[tuple[str, str, str]]]) -> None:
    """Each absurd job is rejected (or waits) with a reason that names the problem; sensible ones run."""
    text, expect = case
    path = tmp_path / "absurd.yaml"
    path.write_text(text)
    code, err, events = run_sim(path)
    assert code == 0, err
    answers: dict[str, dict] = {}
    for ev in events:
        if ev["type"] in ("JobAdmitted", "JobRejected", "JobInadmissible"):
            answers.setdefault(ev["job"], ev)
    for job, outcome, words in expect:
        answer = answers.get(job)
        want = {"rejected": "JobRejected", "waits": "JobInadmissible", "runs": "JobAdmitted"}[outcome]
        assert answer is not None and answer["type"] == want, (job, answer)
        if words:
            assert words in answer["reason"], answer


def test_deeply_nested_yaml_is_an_invalid_scenario(tmp_path: Path) -> None:
    """A scenario of 5,000 nested lists is refused with exit 2 and a message, not a traceback."""
    path = tmp_path / "deep.yaml"
    path.write_text("topology: " + "[" * 5000 + "]" * 5000 + "\n")
    code, err, _ = run_sim(path)
    assert code == 2 and str(path) in err and "nested too deeply" in err


def test_the_command_line_prints_no_traceback_on_garbage(tmp_path: Path) -> None:
    """`muster sim` as a process, on random bytes: exit 2, the file named, no traceback on stderr."""
    path = tmp_path / "noise.yaml"
    path.write_bytes(bytes(range(256)) * 4)
    muster = Path(sys.executable).parent / "muster"
    done = subprocess.run([str(muster), "sim", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert str(path) in done.stderr and "Traceback" not in done.stderr
