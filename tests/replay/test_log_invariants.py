"""The invariant checker (`replay/invariants.py`): silent on honest logs, loud on each kind of broken one.

Every check is shown failing on a history broken on purpose, next to the
honest history it was made from; random `muster sim` runs (the real core)
give no violation.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from muster.events.types import (
    CohortConfigured,
    Event,
    JobAdmitted,
    JobFailed,
    JobFinished,
    JobInadmissible,
    JobPreempted,
    JobRejected,
    JobSubmitted,
    LeaderElected,
    NodeAdded,
    NodeCordoned,
    NodeUpdated,
    PodSet,
    QueueConfigured,
)
from muster.replay.invariants import CHECKS, Binding, Checker, check_log
from muster.replay.scenario import loads
from muster.replay.simulator import simulate


def gang(job: str, queue: str = "a", pods: int = 2, gpu: int = 4, at: int = 1, k8s: bool = False) -> JobSubmitted:
    """A gang of `pods` pods of `gpu` GPUs (with Kubernetes pod names `ns/<job>-<i>` when `k8s`)."""
    mapping = {f"w-{i}": f"ns/{job}-{i}" for i in range(pods)} if k8s else {}
    return JobSubmitted(
        at=at, job=job, queue=queue, podsets=[PodSet(name="w", count=pods, requests={"gpu": gpu})], pods=mapping
    )


def admit(job: str, *nodes: str, queue: str = "a", at: int = 2, epoch: int = 1, cycle: int = 1) -> JobAdmitted:
    return JobAdmitted(
        at=at, job=job, queue=queue, placement={f"w-{i}": n for i, n in enumerate(nodes)}, epoch=epoch, cycle=cycle
    )


def base() -> list[Event]:
    """Two 8-GPU nodes, queues a and b in cohort org (8 GPUs nominal each), leader epoch 1."""
    return [
        LeaderElected(at=0, epoch=1, holder="d-0"),
        NodeAdded(at=0, node="n1", capacity={"gpu": 8}),
        NodeAdded(at=0, node="n2", capacity={"gpu": 8}),
        CohortConfigured(at=0, name="org"),
        QueueConfigured(at=0, name="a", cohort="org", nominal={"gpu": 8}),
        QueueConfigured(at=0, name="b", cohort="org", nominal={"gpu": 8}),
    ]


def honest() -> list[Event]:
    """A log every check accepts: admit, preempt, re-admit, finish, reject, wait."""
    return [
        *base(),
        gang("j1", k8s=True),
        admit("j1", "n1", "n1"),
        gang("j2", queue="b"),
        JobInadmissible(at=2, job="j2", reason="waiting", epoch=1, cycle=1),
        admit("j2", "n2", "n2", queue="b", cycle=2),
        JobPreempted(at=3, job="j1", preemptor=None, reason="NodeFailure", epoch=1, cycle=3),
        admit("j1", "n1", "n1", at=4, cycle=4),
        JobFinished(at=5, job="j1"),
        gang("j3", queue="nope"),
        JobRejected(at=5, job="j3", reason="queue 'nope' does not exist", epoch=1, cycle=5),
    ]


def test_an_honest_log_has_no_violation() -> None:
    """The honest history passes every check, and the report tells each job's status once."""
    report = check_log(honest(), submitted=["j1", "j2", "j3"])
    assert report.ok, report.summary()
    assert report.status == {"j1": "finished", "j2": "running", "j3": "rejected"}
    assert report.by_check() == dict.fromkeys(CHECKS, 0)


BROKEN = [
    pytest.param("jobs", [*base(), gang("j1")], {"submitted": ["j1", "lost"]}, id="acknowledged-submission-lost"),
    pytest.param("jobs", [*base(), gang("j1"), gang("j1")], {}, id="submission-stored-twice"),
    pytest.param(
        "bindings",
        [*base(), gang("j1", k8s=True), gang("j2", k8s=False)],
        {"bindings": [Binding("uid-1", "n1"), Binding("uid-1", "n2")]},
        id="pod-bound-to-two-nodes",
    ),
    pytest.param(
        "bindings",
        [*base(), gang("j1", k8s=True), admit("j1", "n1", "n1")],
        {"bindings": [Binding("uid-1", "n1", "j1", "w-0"), Binding("uid-1", "n1", "j1", "w-0")]},
        id="pod-bound-twice",
    ),
    pytest.param(
        "bindings",
        [*base(), gang("j1", k8s=True), admit("j1", "n1", "n1")],
        {"bindings": [Binding("uid-1", "n2", "j1", "w-0")]},
        id="binding-no-admission-asked-for",
    ),
    pytest.param(
        "bindings",
        [
            *base(),
            LeaderElected(at=3, epoch=2, holder="d-1"),
            gang("j1", k8s=True),
            admit("j1", "n2", "n2", epoch=1),  # the deposed leader's decision: fenced
            admit("j1", "n1", "n1", epoch=2),
        ],
        {"bindings": [Binding("uid-1", "n2", "j1", "w-0")]},
        id="binding-of-a-fenced-decision",
    ),
    pytest.param(
        "bindings",
        [
            *base(),
            gang("j1", k8s=True),
            JobSubmitted(
                at=1,
                job="j2",
                queue="a",
                podsets=[PodSet(name="w", count=1, requests={"gpu": 1})],
                pods={"w-0": "ns/j1-0"},  # claims a pod of j1
            ),
            admit("j1", "n1", "n1"),
            admit("j2", "n2"),
        ],
        {},
        id="one-pod-held-by-two-running-jobs",
    ),
    pytest.param("nodes", [*base(), gang("j1", pods=3), admit("j1", "n1", "n1", "n1")], {}, id="node-over-capacity"),
    pytest.param(
        "nodes",
        [
            *base(),
            NodeUpdated(at=0, node="n1", capacity={"gpu": 8}, reserved={"gpu": 2}),
            gang("j1", pods=2),
            admit("j1", "n1", "n1"),
        ],
        {},
        id="node-over-capacity-with-reserved",
    ),
    pytest.param("nodes", [*base(), gang("j1"), admit("j1", "n1", "n9")], {}, id="placed-on-a-missing-node"),
    pytest.param(
        "nodes",
        [*base(), NodeCordoned(at=1, node="n2"), gang("j1"), admit("j1", "n1", "n2")],
        {},
        id="placed-on-a-cordoned-node",
    ),
    pytest.param(
        "queues",
        [*base()[:3], QueueConfigured(at=0, name="a", nominal={"gpu": 4}), gang("j1"), admit("j1", "n1", "n1")],
        {},
        id="queue-without-cohort-over-nominal",
    ),
    pytest.param(
        "queues",
        [
            *base(),
            QueueConfigured(at=0, name="a", cohort="org", nominal={"gpu": 8}, borrowing_limit={"gpu": 2}),
            gang("j1", pods=3),
            admit("j1", "n1", "n1", "n2"),
        ],
        {},
        id="queue-over-borrowing-limit",
    ),
    pytest.param(
        "lending",
        [
            *base(),
            QueueConfigured(at=0, name="b", cohort="org", nominal={"gpu": 8}, lending_limit={"gpu": 2}),
            gang("j1", pods=3),
            admit("j1", "n1", "n1", "n2"),  # a borrows 4 from b, which lends at most 2
        ],
        {},
        id="cohort-lends-over-lending-limit",
    ),
    pytest.param(
        "lending",
        [
            *base(),
            NodeAdded(at=0, node="n3", capacity={"gpu": 8}),
            gang("j1", pods=4),
            gang("j2", queue="b"),
            admit("j1", "n1", "n1", "n2", "n2"),
            admit("j2", "n3", "n3", queue="b"),
        ],
        {},
        id="cohort-over-its-total-quota",
    ),
    pytest.param(
        "decisions",
        [*base(), gang("j1"), admit("j1", "n1", "n1"), admit("j1", "n2", "n2", cycle=2)],
        {},
        id="admitted-twice-without-preemption",
    ),
    pytest.param(
        "decisions",
        [*base(), gang("j1"), admit("j1", "n1", "n1"), admit("j1", "n1", "n1")],
        {},
        id="identical-decision-stored-twice",
    ),
    pytest.param(
        "decisions",
        [*base(), gang("j1"), JobPreempted(at=2, job="j1", preemptor=None, reason="WithinQueue", epoch=1)],
        {},
        id="preempted-while-pending",
    ),
    pytest.param(
        "decisions",
        [
            *base(),
            gang("j1"),
            admit("j1", "n1", "n1"),
            JobFinished(at=3, job="j1"),
            JobRejected(at=4, job="j1", reason="late", epoch=1),
        ],
        {},
        id="rejected-after-it-finished",
    ),
    pytest.param("decisions", [*base(), admit("ghost", "n1")], {}, id="decision-about-an-unknown-job"),
    pytest.param(
        "decisions",
        [*base(), LeaderElected(at=1, epoch=1, holder="d-1")],
        {},
        id="two-leaders-claim-one-epoch",
    ),
    pytest.param(
        "decisions",
        [*base(), gang("j1"), gang("j2")],
        {"msg_ids": ["m1", "m2", "m3", "m4", "m5", "m6", "m7", "m7"]},
        id="message-id-stored-twice",
    ),
    pytest.param("gangs", [*base(), gang("j1", pods=3), admit("j1", "n1", "n2")], {}, id="partial-gang-admitted"),
    pytest.param(
        "gangs",
        [*base(), gang("j1", k8s=True), admit("j1", "n1", "n2")],
        {"bindings": [Binding("uid-1", "n1", "j1", "w-0")], "settled": True},
        id="running-gang-partly-bound",
    ),
]


@pytest.mark.parametrize(("check", "log", "options"), BROKEN)
def test_each_check_fails_on_a_broken_history(check: str, log: list[Event], options: dict) -> None:
    """A history broken in one way is reported by the check for that invariant (and by it alone)."""
    report = check_log(log, **options)
    assert not report.ok
    counts = report.by_check()
    assert counts[check] >= 1, report.summary()
    assert {c for c, n in counts.items() if n} == {check}, report.summary()
    assert all(v.seq >= 1 and v.message for v in report.violations)


def test_an_end_reported_twice_is_a_note_not_a_violation() -> None:
    """A JobFinished repeated by a second adapter is counted as a duplicate fact; the fold ignores it."""
    log = [*base(), gang("j1"), admit("j1", "n1", "n1"), JobFinished(at=3, job="j1"), JobFailed(at=4, job="j1")]
    report = check_log(log)
    assert report.ok and report.duplicate_facts == 1
    assert "ended twice" in report.notes[0]


def test_fenced_decisions_take_no_effect() -> None:
    """A deposed leader's admission after a newer LeaderElected is counted as fenced, not as a double admission."""
    log = [*base(), gang("j1"), LeaderElected(at=2, epoch=2, holder="d-1"), admit("j1", "n1", "n1", epoch=1)]
    log.append(admit("j1", "n2", "n2", epoch=2))
    report = check_log(log)
    assert report.ok, report.summary()
    assert report.fenced == 1
    assert report.status["j1"] == "running"


def test_bindings_that_follow_the_log_pass() -> None:
    """Bindings of a settled gang that match its admission, with replacement pods after a preemption, pass."""
    log = [*honest()[:8], JobPreempted(at=3, job="j1", preemptor=None, reason="NodeFailure", epoch=1, cycle=3)]
    log.append(admit("j1", "n2", "n2", at=4, cycle=4))
    bindings = [Binding(f"uid-{i}", "n1", "j1", f"w-{i}") for i in range(2)]
    bindings += [Binding(f"uid-new-{i}", "n2", "j1", f"w-{i}") for i in range(2)]
    report = check_log(log, bindings=bindings, settled=True)
    assert report.ok, report.summary()


def test_checker_is_incremental() -> None:
    """Feeding events one by one gives the same verdict as checking the whole log at once."""
    log = BROKEN[-2].values[1]
    checker = Checker()
    for ev in log:
        checker.feed(ev)
    assert checker.report().by_check() == check_log(log).by_check()


# ---------------------------------------------------------------- the real core gives honest logs

SCENARIO = """\
topology: {{levels: [rack]}}
nodes:
  - generate: {{count: {per_rack}, name: "{{rack}}-n{{i}}", labels: {{rack: [r0, r1]}}, capacity: {{gpu: 8}}}}
priority_classes: [{{name: low, value: 0}}, {{name: high, value: 100}}]
cohorts: [{{name: org}}]
queues:
  - name: a
    cohort: org
    nominal: {{gpu: {qa}}}
    borrowing_limit: {{gpu: {bl}}}
    preemption: {{within_queue: LowerPriority, reclaim_within_cohort: Any}}
  - {{name: b, cohort: org, nominal: {{gpu: {qb}}}, lending_limit: {{gpu: {ll}}}}}
  - {{name: solo, nominal: {{gpu: 8}}}}
timeline:
{timeline}
"""


@st.composite
def sim_logs(draw: st.DrawFn) -> str:
    per_rack = draw(st.integers(1, 3))
    total = per_rack * 2 * 8
    lines = []
    for i in range(draw(st.integers(1, 14))):
        at = draw(st.sampled_from([0, 0, 10, 20, 30]))
        q = draw(st.sampled_from(["a", "b", "solo", "missing"]))
        pods, gpu = draw(st.integers(1, 4)), draw(st.sampled_from([1, 2, 4, 8]))
        prio = draw(st.sampled_from(["low", "high"]))
        topo = draw(st.sampled_from(["", ", topology: {required: rack}"]))
        lines.append(
            f"  - {{at: {at}, submit: {{job: j{i}, queue: {q}, priority_class: {prio}, runtime: "
            f"{draw(st.integers(5, 60))}, podsets: [{{name: w, count: {pods}, requests: {{gpu: {gpu}}}{topo}}}]}}}}"
        )
    if draw(st.booleans()):
        lines.append(f"  - {{at: 15, node_down: r0-n0}}\n  - {{at: {draw(st.integers(16, 40))}, node_up: r0-n0}}")
    return SCENARIO.format(
        per_rack=per_rack,
        qa=draw(st.integers(0, total // 2)),
        qb=draw(st.integers(0, total // 2)),
        bl=draw(st.integers(0, 16)),
        ll=draw(st.integers(0, 8)),
        timeline="\n".join(sorted(lines, key=lambda line: int(line.split(",")[0].split(":")[1]))),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sim_logs())
def test_the_scheduler_core_gives_logs_without_violations(text: str) -> None:
    """Random `muster sim` runs with borrowing, lending limits, preemption and node failures break no invariant."""
    result = simulate(loads(text, "random.yaml"))
    submitted = [e.job for e in result.events if isinstance(e, JobSubmitted)]
    report = check_log(result.events, submitted=submitted)
    assert report.ok, report.summary()
