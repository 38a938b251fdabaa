"""Declared time limits (`max_runtime`): carried from every edge to the log, enforced by the simulated cluster."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from muster.daemon.k8s import manifests as m
from muster.daemon.k8s.owners import Sizing, owner_sizing
from muster.daemon.k8s.pods import pod_info
from muster.daemon.k8s.translating import Translator
from muster.daemon.k8s.watching import WatchEvent
from muster.events.codec import decode, encode
from muster.events.types import JobFailed, JobFinished, JobRejected, JobSubmitted, PodSet
from muster.replay.scenario import load, loads
from muster.replay.simulator import DEADLINE_EXCEEDED, simulate
from muster.replay.specreader import ScenarioError

CLUSTER = """\
nodes:
  - {name: n0, capacity: {gpu: 8}}
queues:
  - {name: q, nominal: {gpu: 8}}
timeline:
"""


def _job(job: str, at: int, fields: str) -> str:
    return (
        f"  - at: {at}\n    submit: {{job: {job}, queue: q, podsets: [{{count: 1, requests: {{gpu: 8}}}}], {fields}}}\n"
    )


def _ends(text: str) -> dict[str, tuple[str, int, str]]:
    """job -> (how it ended, when, reason) in the simulated log."""
    out: dict[str, tuple[str, int, str]] = {}
    for ev in simulate(loads(CLUSTER + text, "s.yaml")).events:
        if isinstance(ev, JobFinished):
            out[ev.job] = ("finished", ev.at, "")
        elif isinstance(ev, (JobFailed, JobRejected)):
            out[ev.job] = (type(ev).__name__, ev.at, ev.reason)
    return out


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param("runtime: 100", ("finished", 100, ""), id="no-limit-finishes"),
        pytest.param("runtime: 100, max_runtime: 150", ("finished", 100, ""), id="work-ends-before-the-limit"),
        pytest.param("runtime: 100, max_runtime: 100", ("finished", 100, ""), id="work-ends-exactly-at-the-limit"),
        pytest.param("runtime: 100, max_runtime: 60", ("JobFailed", 60, DEADLINE_EXCEEDED), id="past-the-limit"),
        pytest.param("max_runtime: 60", ("JobFailed", 60, DEADLINE_EXCEEDED), id="endless-work-with-a-limit"),
        pytest.param("runtime: 100, max_runtime: 0", ("JobRejected", 0, "max_runtime 0 must be"), id="zero-limit"),
        pytest.param("runtime: 100, max_runtime: -5", ("JobRejected", 0, "max_runtime -5 must be"), id="negative"),
    ],
)
def test_a_run_ends_at_its_work_or_its_declared_limit(fields: str, expected: tuple[str, int, str]) -> None:
    """A run ends when its work is done or, first, at its declared limit (DeadlineExceeded); a bad limit is rejected."""
    kind, at, reason = _ends(_job("j", 0, fields))["j"]
    assert (kind, at) == expected[:2] and reason.startswith(expected[2])


def test_the_limit_counts_from_each_admission_and_the_room_goes_to_the_next_job() -> None:
    """A job ended at its limit frees its GPUs at once: the job waiting behind it is admitted then."""
    ends = _ends(_job("long", 0, "runtime: 1000, max_runtime: 300") + _job("next", 10, "runtime: 50"))
    assert ends["long"] == ("JobFailed", 300, DEADLINE_EXCEEDED)
    assert ends["next"] == ("finished", 350, "")


def test_a_trace_limit_column_becomes_max_runtime_and_a_bad_one_names_file_and_line(tmp_path: Path) -> None:
    """`limit` in timeline_csv is the job's max_runtime (empty: none); a fraction is a scenario error at its line."""
    (tmp_path / "t.csv").write_text(
        "job,submit,queue,gpus,gpus_per_pod,runtime,limit\na,0,q,8,8,500,200\nb,1,q,8,8,5,\n"
    )
    scenario = tmp_path / "s.yaml"
    scenario.write_text(CLUSTER.replace("timeline:\n", "timeline_csv: t.csv\n"))
    subs = {e.job: e for e in simulate(load(scenario)).events if isinstance(e, JobSubmitted)}
    assert (subs["a"].max_runtime, subs["b"].max_runtime) == (200, None)
    (tmp_path / "t.csv").write_text("job,submit,queue,gpus,gpus_per_pod,runtime,limit\na,0,q,8,8,500,2.5\n")
    with pytest.raises(ScenarioError) as err:
        load(scenario)
    assert err.value.line == 2 and "column limit" in str(err.value) and "t.csv" in str(err.value)


def test_a_fractional_max_runtime_in_yaml_is_a_scenario_error_with_its_line() -> None:
    """`max_runtime: 1.5` is not a whole number of seconds: the scenario is refused naming the line."""
    with pytest.raises(ScenarioError) as err:
        loads(CLUSTER + _job("j", 0, "max_runtime: 1.5"), "s.yaml")
    assert err.value.line == 7 and "max_runtime" in str(err.value)


def test_an_event_without_max_runtime_decodes_with_no_limit() -> None:
    """A JobSubmitted stored before the field existed decodes with max_runtime None; one with it round-trips."""
    old = b'{"type":"JobSubmitted","at":1,"v":2,"job":"j","queue":"q","podsets":[]}'
    assert decode(old) == JobSubmitted(at=1, job="j", queue="q")
    new = JobSubmitted(at=1, job="j", queue="q", podsets=[PodSet(name="w", count=1, requests={})], max_runtime=60)
    assert decode(encode(new)) == new


@pytest.mark.parametrize(
    ("annotations", "pod_deadline", "expected", "problem"),
    [
        pytest.param({"muster.dev/max-runtime": "2h"}, None, 7200, None, id="annotation"),
        pytest.param({}, 900, 900, None, id="pod-active-deadline"),
        pytest.param({"muster.dev/max-runtime": "90m"}, 900, 5400, None, id="annotation-wins"),
        pytest.param({}, None, None, None, id="none"),
        pytest.param({"muster.dev/max-runtime": "soon"}, None, None, "is not a duration", id="bad-annotation"),
    ],
)
def test_a_pod_declares_its_limit_by_annotation_or_active_deadline(
    annotations: dict[str, str], pod_deadline: int | None, expected: int | None, problem: str | None
) -> None:
    """The annotation `muster.dev/max-runtime` (a duration) or the pod's activeDeadlineSeconds is its limit."""
    pod = m.pod("p", "ns", gpus=1, annotations=annotations)
    if pod_deadline is not None:
        pod["spec"]["activeDeadlineSeconds"] = pod_deadline
    info = pod_info(pod)
    assert info.max_runtime == expected
    assert (problem is None) == (not info.problems)
    if problem is not None:
        assert problem in info.problems[0]


@pytest.mark.parametrize(
    ("deadline", "annotations", "expected"),
    [
        pytest.param(3600, {}, 3600, id="job-deadline"),
        pytest.param(None, {}, None, id="none"),
        pytest.param(3600, {"muster.dev/max-runtime": "10m"}, 600, id="pod-annotation-wins"),
    ],
)
def test_a_jobs_active_deadline_is_its_gangs_limit(
    deadline: int | None, annotations: dict[str, str], expected: int | None
) -> None:
    """A Kubernetes Job's spec.activeDeadlineSeconds, read with its size, is the submitted gang's max_runtime."""
    job = m.job("train", "ns", parallelism=2)
    if deadline is not None:
        job["spec"]["activeDeadlineSeconds"] = deadline
    t = Translator()
    for p in m.job_pods(job, gpus=1, annotations=annotations):
        p["metadata"].setdefault("uid", p["metadata"]["name"] + "-uid")
        t.on_pod(WatchEvent("pods", "ADDED", p), 1)
    t.flush(1)
    for owner in t.gangs.owners_to_fetch():
        sizing = owner_sizing(owner, job)
        t.on_owner_size(
            owner, Sizing(sizing.size, uid=sizing.uid, queue=sizing.queue, max_runtime=sizing.max_runtime), 2
        )
    [sub] = [e for e in t.flush(2) if isinstance(e, JobSubmitted)]
    assert sub.max_runtime == expected


def test_yaml_docs_example_declares_a_limit(tmp_path: Path) -> None:
    """The spec's example field (`max_runtime: 10800`) is accepted by the loader as written."""
    text = CLUSTER + textwrap.indent("- at: 0\n  submit: {job: j, queue: q, max_runtime: 10800}\n", "  ")
    [inp] = loads(text, "s.yaml").inputs
    assert inp.data["max_runtime"] == 10800
