"""Hostile input for the fuzz tests: bad bytes and valid-but-absurd jobs, each labelled with what must happen.

- `bad_payloads()`: bytes that are not an event of any known version (random
  bytes, truncated JSON, unknown types, wrong field types, future schema
  versions, deep nesting, invalid UTF-8, non-objects). Readers must report
  each with its sequence and skip it.
- `absurd_jobs()`: JobSubmitted events that decode but make no sense, with
  the words their JobRejected (or JobInadmissible) reason must contain.
- `settle(state, now)`: run scheduling cycles the way the daemon and `muster
  sim` do, until one admits and preempts nothing.

Podsets that request nothing at all (`{"gpu": 0}`) have their own test in
test_hostile_stream.py (they used to crash the core).
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import strategies as st

from muster.events.codec import MAX_EVENT_BYTES, encode
from muster.events.types import (
    Event,
    JobAdmitted,
    JobPreempted,
    JobSubmitted,
    NodeAdded,
    PodSet,
    PriorityClassConfigured,
    QueueConfigured,
    SchedulerConfigured,
    Topology,
)
from muster.projections.cluster import evolve
from muster.projections.scheduler import decide
from muster.projections.state import ClusterState

LEVELS = ["rack"]


def config() -> list[Event]:
    """A small cluster: topology level `rack`, queue team-a (32 GPUs), two 8-GPU nodes, class `low`."""
    return [
        SchedulerConfigured(at=0, levels=LEVELS),
        PriorityClassConfigured(at=0, name="low", value=0),
        QueueConfigured(at=0, name="team-a", nominal={"gpu": 32}),
        NodeAdded(at=0, node="n0", labels={"rack": "r0"}, capacity={"gpu": 8, "cpu": 96_000}),
        NodeAdded(at=0, node="n1", labels={"rack": "r1"}, capacity={"gpu": 8, "cpu": 96_000}),
    ]


def valid_job(i: int) -> JobSubmitted:
    return JobSubmitted(
        at=1, job=f"ok-{i}", queue="team-a", podsets=[PodSet(name="w", count=1, requests={"gpu": 1})], runtime=60
    )


# ---------------------------------------------------------------- bad bytes


def _json(obj: Any) -> bytes:
    return msgspec.json.encode(obj)


def _valid_dict(i: int) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.json.decode(encode(valid_job(i)))
    return out


WRONG_TYPES: list[tuple[str, Any]] = [
    ("at", "yesterday"),
    ("at", 1.5),
    ("at", None),
    ("job", 42),
    ("queue", ["team-a"]),
    ("podsets", {"name": "w"}),
    ("podsets", [{"name": "w", "count": "3", "requests": {"gpu": 1}}]),
    ("podsets", [{"name": "w", "count": 1, "requests": {"gpu": 0.5}}]),
    ("podsets", [{"name": "w", "count": 1, "requests": {"gpu": True}}]),
    ("podsets", [{"name": "w", "count": 1, "requests": "8 GPUs"}]),
    ("runtime", "an hour"),
    ("v", "2"),
    ("priority_class", 7),
]


BAD_KINDS = [
    *("random", "truncated", "unknown-type", "wrong-type", "future-version", "deep", "utf8", "not-object"),
    *("no-type", "empty", "missing-field"),
]


@st.composite
def bad_payloads(draw: st.DrawFn) -> tuple[str, bytes]:
    """(kind, bytes) of something no reader may accept."""
    kind = draw(st.sampled_from(BAD_KINDS))
    i = draw(st.integers(0, 999))
    if kind == "random":
        data = draw(st.binary(min_size=1, max_size=200))
        if data.lstrip()[:1] in (b"{", b"[", b'"') or data.strip().isdigit():
            data = b"\x00" + data  # keep it from being valid JSON by accident
        return kind, data
    if kind == "truncated":
        full = encode(valid_job(i))
        return kind, full[: draw(st.integers(1, len(full) - 1))]
    if kind == "unknown-type":
        name = draw(st.sampled_from(["JobTeleported", "jobsubmitted", "", "Event", "__class__", "JobSubmitted "]))
        return kind, _json({**_valid_dict(i), "type": name})
    if kind == "wrong-type":
        field, value = draw(st.sampled_from(WRONG_TYPES))
        return kind, _json({**_valid_dict(i), field: value})
    if kind == "future-version":
        return kind, _json({**_valid_dict(i), "v": draw(st.integers(3, 2**31))})
    if kind == "deep":
        depth = draw(st.integers(500, 50_000))
        return kind, b'{"type":"JobSubmitted","at":' + b"[" * depth + b"]" * depth + b"}"
    if kind == "utf8":
        return kind, b'{"type":"JobSubmitted","at":1,"job":"\xff\xfe","queue":"team-a"}'
    if kind == "not-object":
        return kind, draw(st.sampled_from([b"[]", b"42", b'"JobSubmitted"', b"null", b"true", b"[{}]"]))
    if kind == "no-type":
        data = _valid_dict(i)
        del data["type"]
        return kind, _json(data)
    if kind == "missing-field":
        data = _valid_dict(i)
        del data[draw(st.sampled_from(["job", "queue", "at"]))]
        return kind, _json(data)
    return kind, b""


def huge_payload() -> bytes:
    """A well-formed JobSubmitted just over the size cap (the reader refuses it by size alone)."""
    data = _valid_dict(0)
    data["source"] = "x" * MAX_EVENT_BYTES
    return _json(data)


# ---------------------------------------------------------------- absurd jobs


def _job(job: str, podsets: list[PodSet], queue: str = "team-a", **kw: Any) -> JobSubmitted:
    return JobSubmitted(at=1, job=job, queue=queue, podsets=podsets, runtime=60, **kw)


def _ps(count: int = 1, gpu: int = 1, name: str = "w", topology: Topology | None = None) -> PodSet:
    return PodSet(name=name, count=count, requests={"gpu": gpu}, topology=topology)


NAMES = ["../../etc/passwd", "ジョブ-🚀", "a.b.*.>", "team a/train 1", "%2F..%2F", "x" * 300, "\t\n", "名前.ü"]


ABSURD_KINDS = [
    *("unknown-queue", "unknown-class", "unknown-level", "million-pods", "billion-gpus", "negative"),
    *("zero-count", "no-podsets", "dup-podsets", "many-podsets", "both-topologies", "negative-runtime"),
    *("zero-checkpoint", "odd-name", "wrong-level-preferred", "gpus-past-the-bound"),
]


@st.composite
def absurd_jobs(draw: st.DrawFn, index: int) -> tuple[JobSubmitted, str, str]:
    """(job, outcome, words): outcome is `rejected` or `waits`; the reason must contain `words`."""
    name = draw(st.sampled_from(NAMES)) + f"#{index}"
    kind = draw(st.sampled_from(ABSURD_KINDS))
    if kind == "unknown-queue":
        queue = draw(st.sampled_from(["nope", "", "team-a.evil", "TEAM-A", "ジョブ"]))
        return _job(name, [_ps()], queue=queue), "rejected", "names no queue" if not queue else "does not exist"
    if kind == "unknown-class":
        return _job(name, [_ps()], priority_class="god-mode"), "rejected", "priority class"
    if kind == "unknown-level":
        level = draw(st.sampled_from(["zone", "rack ", "datacenter", "ラック", "host.rack"]))
        return _job(name, [_ps(topology=Topology(required=level))]), "rejected", "topology level"
    if kind == "wrong-level-preferred":
        return _job(name, [_ps(topology=Topology(preferred="galaxy"))]), "rejected", "topology level"
    if kind == "million-pods":
        return _job(name, [_ps(count=draw(st.sampled_from([10_001, 10**6, 2**40])))]), "rejected", "pods"
    if kind == "billion-gpus":
        return _job(name, [_ps(gpu=10**9)]), "waits", "more than it may ever use"
    if kind == "gpus-past-the-bound":
        return _job(name, [_ps(gpu=draw(st.sampled_from([2**50 + 1, 2**62, 10**20])))]), "rejected", "muster accepts"
    if kind == "negative":
        return _job(name, [_ps(gpu=draw(st.integers(-(2**62), -1)))]), "rejected", "negative"
    if kind == "zero-count":
        return _job(name, [_ps(count=draw(st.integers(-(2**40), 0)))]), "rejected", "must be at least 1"
    if kind == "no-podsets":
        return _job(name, []), "rejected", "no pods"
    if kind == "dup-podsets":
        return _job(name, [_ps(), _ps()]), "rejected", "appears twice"
    if kind == "many-podsets":
        return _job(name, [_ps(name=f"p{i}") for i in range(9)]), "rejected", "podsets"
    if kind == "both-topologies":
        return _job(name, [_ps(topology=Topology(required="rack", preferred="rack"))]), "rejected", "both"
    if kind == "negative-runtime":
        return JobSubmitted(at=1, job=name, queue="team-a", podsets=[_ps()], runtime=-5), "rejected", "negative"
    if kind == "zero-checkpoint":
        job = JobSubmitted(at=1, job=name, queue="team-a", podsets=[_ps()], runtime=60, checkpoint_every=0)
        return job, "rejected", "checkpoint_every"
    # odd names alone are fine: the job runs
    return _job(name, [_ps()]), "runs", ""


# ---------------------------------------------------------------- the core, driven like the daemon


def settle(state: ClusterState, now: int, limit: int = 1000) -> list[Event]:
    """Scheduling cycles at `now` until one admits and preempts nothing; the decisions, folded into `state`."""
    out: list[Event] = []
    for _ in range(limit):
        decisions = decide(state, now)
        for ev in decisions:
            evolve(state, ev)
        out.extend(decisions)
        if not any(isinstance(ev, (JobAdmitted, JobPreempted)) for ev in decisions):
            return out
    raise AssertionError(f"scheduling did not settle at {now} after {limit} cycles")
