"""Resource flavors as given/when/then scenarios: Kueue's flavor assigner and fungibility, in GPUs.

The cases port, by behaviour, those of Kueue's `pkg/scheduler/flavorassigner/flavorassigner_test.go`
(flavors tried in order, one flavor per resource group and podset, resource groups apart, podsets
apart and cumulative, a podset's node selector) and of its flavor fungibility tests
(`whenCanBorrow`, `whenCanPreempt`), with quota per flavor in a cohort (spec/scenario.md, Flavors).
"""

from __future__ import annotations

from typing import Any

import pytest
from simkit import PRIORITIES, run

from muster.events.codec import decode, encode
from muster.events.types import (
    CohortConfigured,
    Event,
    FlavorConfigured,
    FlavorQuota,
    JobAdmitted,
    JobSubmitted,
    NodeAdded,
    NodeUpdated,
    PodSet,
    PreemptionPolicy,
    PriorityClassConfigured,
    QueueConfigured,
    ResourceGroup,
    SchedulerConfigured,
)
from muster.projections.cluster import fold
from muster.projections.index import index_of
from muster.projections.scheduler import decide


def cluster(h100: int = 2, a100: int = 2, cpu: int = 0) -> str:
    """Nodes of 8 GPUs labelled by model (`h{i}` H100, `a{i}` A100), CPU-only nodes `c{i}`, one rack each
    model, and the flavors `h100`, `a100` (and `cpu` when there are CPU nodes)."""
    lines = ["topology: {levels: [rack]}", "nodes:"]
    for i in range(h100):
        lines.append(f"  - {{name: h{i}, labels: {{rack: rh, model: H100}}, capacity: {{gpu: 8, cpu: 64}}}}")
    for i in range(a100):
        lines.append(f"  - {{name: a{i}, labels: {{rack: ra, model: A100}}, capacity: {{gpu: 8, cpu: 64}}}}")
    for i in range(cpu):
        lines.append(f"  - {{name: c{i}, labels: {{rack: rc, model: none}}, capacity: {{cpu: 64}}}}")
    lines.append("flavors:")
    if h100:
        lines.append("  - {name: h100, node_labels: {model: H100}}")
    if a100:
        lines.append("  - {name: a100, node_labels: {model: A100}}")
    if cpu:
        lines.append("  - {name: cpu, node_labels: {model: none}}")
    return "\n".join(lines) + "\n" + PRIORITIES


def fq(name: str, gpu: int, borrowing: int | None = None, lending: int | None = None, cpu: int | None = None) -> str:
    """One flavor of a resource group, in flow style."""
    nominal = f"gpu: {gpu}" + (f", cpu: {cpu}" if cpu is not None else "")
    out = f"{{name: {name}, nominal: {{{nominal}}}"
    if borrowing is not None:
        out += f", borrowing_limit: {{gpu: {borrowing}}}"
    if lending is not None:
        out += f", lending_limit: {{gpu: {lending}}}"
    return out + "}"


def fqueue(
    name: str,
    *flavors: str,
    cohort: str | None = None,
    covered: str = "gpu",
    borrow: str | None = None,
    preempt: str | None = None,
    policy: str | None = None,
    groups: list[tuple[str, list[str]]] | None = None,
) -> str:
    """A `queues` entry with resource groups (one over `covered` with `flavors`, or `groups`)."""
    rg = groups if groups is not None else [(covered, list(flavors))]
    text = f"  - name: {name}\n"
    if cohort is not None:
        text += f"    cohort: {cohort}\n"
    text += "    resource_groups:\n"
    for cov, fls in rg:
        text += f"      - covered: [{cov}]\n        flavors: [{', '.join(fls)}]\n"
    fung = [f"when_can_borrow: {borrow}"] if borrow else []
    fung += [f"when_can_preempt: {preempt}"] if preempt else []
    if fung:
        text += f"    flavor_fungibility: {{{', '.join(fung)}}}\n"
    if policy is not None:
        text += f"    preemption: {{{policy}}}\n"
    return text


def job(
    name: str,
    q: str,
    *podsets: str,
    at: int = 0,
    prio: str | None = None,
    runtime: int = 3600,
) -> str:
    """A timeline `submit`; each podset is `NAME:COUNTxGPU[:cpu=N][:flavors=a+b]`."""
    ps = []
    for spec in podsets:
        parts = spec.split(":")
        psname, shape = parts[0], parts[1]
        count, gpu = shape.split("x")
        req = [f"gpu: {gpu}"] if int(gpu) else []
        restrict = ""
        for extra in parts[2:]:
            key, _, value = extra.partition("=")
            if key == "cpu":
                req.append(f"cpu: {value}")
            elif key == "flavors":
                restrict = f", flavors: [{', '.join(value.split('+'))}]"
        ps.append(f"{{name: {psname}, count: {count}, requests: {{{', '.join(req)}}}{restrict}}}")
    out = f"job: {name}, queue: {q}, podsets: [{', '.join(ps)}], runtime: {runtime}"
    if prio is not None:
        out += f", priority_class: {prio}"
    return f"  - {{at: {at}, submit: {{{out}}}}}\n"


def scenario(nodes: str, queues: list[str], timeline: list[str], cohorts: tuple[str, ...] = ()) -> str:
    text = nodes
    if cohorts:
        text += "cohorts:\n" + "".join(f"  - {{name: {c}}}\n" for c in cohorts)
    return text + "queues:\n" + "".join(queues) + "timeline:\n" + "".join(timeline)


def flavors_of(out: Any, name: str) -> dict[str, str]:
    """Per podset, the flavor of its GPUs (or CPUs) at the job's first admission."""
    adm = out.admitted(name)
    return {ps: chosen.get("gpu", chosen.get("cpu", "?")) for ps, chosen in adm.flavors.items()}


# ---------------------------------------------------------------- assignment (Kueue's flavor assigner)

ASSIGN_CASES = [
    pytest.param(
        scenario(cluster(), [fqueue("q", fq("h100", 16))], [job("j", "q", "w:2x8")]),
        {"j": {"w": "h100"}},
        {},
        id="single-flavor-fits",
    ),
    pytest.param(
        scenario(cluster(), [fqueue("q", fq("h100", 8), fq("a100", 16))], [job("j", "q", "w:2x8")]),
        {"j": {"w": "a100"}},
        {},
        id="first-flavor-too-small-next-fits",
    ),
    pytest.param(
        scenario(
            cluster(),
            [fqueue("q", fq("h100", 16), fq("a100", 16))],
            [job("j1", "q", "w:2x8"), job("j2", "q", "w:1x8")],
        ),
        {"j1": {"w": "h100"}, "j2": {"w": "a100"}},
        {},
        id="first-flavor-used-up-next-fits",
    ),
    pytest.param(
        scenario(cluster(), [fqueue("q", fq("h100", 16), fq("a100", 16))], [job("j", "q", "w:1x8:flavors=a100")]),
        {"j": {"w": "a100"}},
        {},
        id="podset-selector-rules-out-first-flavor",
    ),
    pytest.param(
        scenario(cluster(), [fqueue("q", fq("h100", 32), fq("a100", 32))], [job("j", "q", "w:3x8")]),
        {},
        {"j": ["h100: 3 pods of gpu=8 do not fit on the schedulable nodes; a100: 3 pods of gpu=8 do not fit"]},
        id="quota-fits-but-no-flavor-has-the-nodes",
    ),
    pytest.param(
        scenario(cluster(h100=4), [fqueue("q", fq("h100", 8), fq("a100", 16))], [job("j", "q", "w:3x8")]),
        {},
        {"j": ["h100: quota (gpu=24 requested is more than nominal gpu=8)", "a100: quota"]},
        id="exceeds-every-flavor-says-why-each",
    ),
    pytest.param(
        scenario(
            cluster(),
            [fqueue("q", fq("h100", 16), fq("a100", 16))],
            [job("j", "q", "launcher:1x8", "workers:2x8")],
        ),
        {"j": {"launcher": "h100", "workers": "a100"}},
        {},
        id="podsets-cumulative-second-takes-next-flavor",
    ),
    pytest.param(
        scenario(
            cluster(h100=2, a100=0, cpu=1),
            [
                fqueue(
                    "q",
                    groups=[("gpu", [fq("h100", 16)]), ("cpu", ["{name: cpu, nominal: {cpu: 64}}"])],
                )
            ],
            [job("j", "q", "launcher:1x0:cpu=4", "workers:2x8")],
        ),
        {"j": {"launcher": "cpu", "workers": "h100"}},
        {},
        id="resource-groups-apart-cpu-launcher-gpu-workers",
    ),
    pytest.param(
        scenario(
            cluster(),
            [fqueue("q", fq("h100", 8), fq("a100", 8))],
            [job("j", "q", "a:1x8:flavors=h100", "b:2x8:flavors=h100")],
        ),
        {},
        {"j": ["b: h100: quota"]},
        id="gang-whole-or-not-second-podset-has-no-flavor",
    ),
]


@pytest.mark.parametrize(("text", "placed", "waiting"), ASSIGN_CASES)
def test_flavor_assignment(text: str, placed: dict[str, dict[str, str]], waiting: dict[str, list[str]]) -> None:
    """Each podset takes the first flavor (in order, as its selector allows) whose quota and nodes hold it."""
    out = run(text)
    for name, want in placed.items():
        assert flavors_of(out, name) == want
        adm = out.admitted(name)
        models = {ps: {n[0] for pod, n in adm.placement.items() if pod.rsplit("-", 1)[0] == ps} for ps in want}
        expected = {ps: {"h100": {"h"}, "a100": {"a"}, "cpu": {"c"}}[f] for ps, f in want.items()}
        assert models == expected, "pods land on their flavor's nodes"
    for name, fragments in waiting.items():
        assert not out.admissions(name), f"{name} is admitted whole or not at all"
        reason = out.reasons(name)[-1]
        for fragment in fragments:
            assert fragment in reason, reason


# ---------------------------------------------------------------- fungibility and cohorts per flavor

COHORT = ("org",)


def lender(gpu_h100: int = 16, gpu_a100: int = 16) -> str:
    return fqueue("lender", fq("h100", gpu_h100), fq("a100", gpu_a100), cohort="org")


FUNGIBILITY_CASES = [
    pytest.param(
        scenario(
            cluster(h100=4, a100=2),
            [fqueue("q", fq("h100", 8), fq("a100", 16), cohort="org"), lender()],
            [job("j", "q", "w:2x8")],
            COHORT,
        ),
        {"j": "h100"},
        id="borrow-default-stops-at-first-flavor-that-borrows",
    ),
    pytest.param(
        scenario(
            cluster(h100=4, a100=2),
            [fqueue("q", fq("h100", 8), fq("a100", 16), cohort="org", borrow="TryNextFlavor"), lender()],
            [job("j", "q", "w:2x8")],
            COHORT,
        ),
        {"j": "a100"},
        id="try-next-flavor-prefers-nominal-elsewhere",
    ),
    pytest.param(
        scenario(
            cluster(h100=4, a100=2),
            [fqueue("q", fq("h100", 8), fq("a100", 8), cohort="org", borrow="TryNextFlavor"), lender()],
            [job("j", "q", "w:2x8")],
            COHORT,
        ),
        {"j": "h100"},
        id="try-next-flavor-falls-back-to-first-that-borrows",
    ),
    pytest.param(
        scenario(
            cluster(h100=4, a100=2),
            [fqueue("q", fq("h100", 8, borrowing=0), fq("a100", 16), cohort="org"), lender()],
            [job("j", "q", "w:2x8")],
            COHORT,
        ),
        {"j": "a100"},
        id="borrowing-limit-is-per-flavor",
    ),
    pytest.param(
        scenario(
            cluster(h100=4, a100=2),
            [
                fqueue("q", fq("h100", 8), fq("a100", 8), cohort="org"),
                fqueue("lender", fq("h100", 16, lending=0), fq("a100", 16), cohort="org"),
            ],
            [job("j", "q", "w:2x8")],
            COHORT,
        ),
        {"j": "a100"},
        id="lending-limit-is-per-flavor",
    ),
]


@pytest.mark.parametrize(("text", "flavor"), FUNGIBILITY_CASES)
def test_fungibility_and_cohorts(text: str, flavor: dict[str, str]) -> None:
    """Borrowing is per flavor; `when_can_borrow` decides between borrowing early and a later flavor."""
    out = run(text)
    for name, want in flavor.items():
        assert flavors_of(out, name) == {"w": want}


def _preempt_scenario(preempt: str | None) -> str:
    """q holds all of h100 with low-priority work; a100 has room; a high-priority job arrives."""
    return scenario(
        cluster(h100=2, a100=2),
        [fqueue("q", fq("h100", 16), fq("a100", 16), preempt=preempt, policy="within_queue: LowerPriority")],
        [job("low", "q", "w:2x8", prio="low"), job("high", "q", "w:2x8", prio="high", at=10)],
    )


def test_when_can_preempt_try_next_flavor_avoids_preemption() -> None:
    """By default (TryNextFlavor) a job that fits on a later flavor goes there instead of preempting."""
    out = run(_preempt_scenario(None))
    assert not out.preemptions()
    assert flavors_of(out, "high") == {"w": "a100"}


def test_when_can_preempt_preempt_evicts_in_the_first_flavor() -> None:
    """With `Preempt` the job preempts in the first flavor where victims make room, before trying later ones."""
    out = run(_preempt_scenario("Preempt"))
    assert [(p.job, p.preemptor) for p in out.preemptions()] == [("low", "high")]
    assert flavors_of(out, "high") == {"w": "h100"}


def test_preemption_when_no_flavor_fits_picks_the_flavor_with_victims() -> None:
    """When no flavor fits, victims are looked for flavor by flavor; they hold the same flavor's quota."""
    text = scenario(
        cluster(h100=2, a100=2),
        [fqueue("q", fq("h100", 16), fq("a100", 16), policy="within_queue: LowerPriority")],
        [
            job("h-top", "q", "w:2x8", prio="urgent"),
            job("a-low", "q", "w:2x8", prio="low", at=1),
            job("high", "q", "w:2x8", prio="high", at=10),
        ],
    )
    out = run(text)
    assert flavors_of(out, "h-top") == {"w": "h100"}
    assert flavors_of(out, "a-low") == {"w": "a100"}
    assert [(p.job, p.preemptor, p.at) for p in out.preemptions()] == [("a-low", "high", 10)]
    assert flavors_of(out, "high") == {"w": "a100"}


def test_preemption_takes_the_first_flavor_in_order_with_victims() -> None:
    """Victims in both flavors: the preemptor evicts in the first flavor of its group, as Kueue does."""
    text = scenario(
        cluster(h100=2, a100=2),
        [fqueue("q", fq("h100", 16), fq("a100", 16), policy="within_queue: LowerPriority")],
        [
            job("h-low", "q", "w:2x8", prio="low"),
            job("a-low", "q", "w:2x8", prio="low", at=1),
            job("high", "q", "w:2x8", prio="high", at=10),
        ],
    )
    out = run(text)
    assert [(p.job, p.preemptor) for p in out.preemptions()][:1] == [("h-low", "high")]
    assert flavors_of(out, "high") == {"w": "h100"}


def test_a_job_borrowing_on_its_first_flavor_reclaims_on_the_next_where_it_is_within_nominal() -> None:
    """Whether a preemptor reclaims or borrows is judged per flavor: on h100 it would borrow (and may take
    nothing), on a100 it is within nominal and takes back what a cohort neighbour borrowed there."""
    text = scenario(
        cluster(h100=2, a100=2),
        [
            fqueue("q", fq("h100", 0), fq("a100", 16), cohort="c", policy="reclaim_within_cohort: Any"),
            fqueue("r", fq("h100", 16), fq("a100", 0), cohort="c"),
        ],
        [job("r-h", "r", "w:2x8"), job("r-a", "r", "w:2x8", at=1), job("mine", "q", "w:2x8", at=10)],
        cohorts=("c",),
    )
    out = run(text)
    assert flavors_of(out, "r-a") == {"w": "a100"}
    assert [(p.job, p.preemptor, p.reason) for p in out.preemptions()] == [("r-a", "mine", "ReclaimWithinCohort")]
    assert flavors_of(out, "mine") == {"w": "a100"}


def test_a_queue_update_reordering_flavors_sends_the_next_job_of_a_tried_class_to_the_new_first() -> None:
    """What a job's queue and podsets give its flavor assignment is worked out once per class, and again
    after a queue_update: a job like one admitted before the update goes to the flavor now first."""
    groups = f"[{{covered: [gpu], flavors: [{fq('a100', 16)}, {fq('h100', 16)}]}}]"
    update = f"  - {{at: 50, queue_update: {{name: q, resource_groups: {groups}}}}}\n"
    out = run(
        scenario(
            cluster(),
            [fqueue("q", fq("h100", 16), fq("a100", 16))],
            [job("before", "q", "w:1x8"), update, job("after", "q", "w:1x8", at=60)],
        )
    )
    assert flavors_of(out, "before") == {"w": "h100"}
    assert flavors_of(out, "after") == {"w": "a100"}


def test_cohort_adds_up_per_flavor() -> None:
    """A queue borrows a flavor's quota only from what its cohort has of that flavor."""
    text = scenario(
        cluster(h100=4, a100=4),
        [fqueue("q", fq("h100", 8), cohort="org"), fqueue("lender", fq("a100", 32), cohort="org")],
        [job("j", "q", "w:2x8")],
        COHORT,
    )
    out = run(text)
    assert not out.admissions("j")
    assert "h100: quota (nominal gpu=8 in use; the cohort has no room to lend)" in out.reasons("j")[-1]


def test_borrowed_and_usage_are_per_flavor_on_the_log() -> None:
    """`JobAdmitted.borrowed` names the flavor, and the summary splits a queue's GPU-seconds by flavor."""
    text = scenario(
        cluster(h100=4, a100=2),
        [fqueue("q", fq("h100", 8), fq("a100", 16), cohort="org"), lender()],
        [job("j", "q", "w:2x8", runtime=100), job("k", "q", "w:1x8", runtime=100, at=1)],
        COHORT,
    )
    out = run(text)
    assert out.admitted("j").borrowed == {"gpu@h100": 8}
    per_flavor = out.summary()["queues"]["q"]["flavors"]
    assert out.admitted("k").borrowed == {"gpu@h100": 8}
    assert per_flavor == {"h100": {"gpu_seconds": 2400, "borrowed_gpu_seconds": 1600}}
    total = out.summary()["queues"]["q"]["gpu_seconds"]
    assert total == sum(f["gpu_seconds"] for f in per_flavor.values())


# ---------------------------------------------------------------- the log stays as it was without flavors


def test_admission_without_flavors_encodes_as_before() -> None:
    """An admission written before flavors decodes, and encodes again to the same bytes."""
    old_adm = (
        b'{"type":"JobAdmitted","at":0,"v":1,"job":"j","queue":"q","placement":{"w-0":"n0"},'
        b'"borrowed":{},"cycle":1,"epoch":0,"policy_version":"muster/1","explanation":""}'
    )
    adm = decode(old_adm)
    assert isinstance(adm, JobAdmitted)
    assert encode(adm) == old_adm


def test_a_resource_no_group_covers_is_inadmissible_until_a_queue_update_covers_it() -> None:
    """As in Kueue, a job asking for a resource its queue's resource groups do not cover waits, named in its
    reason; it is admitted once `queue_update` gives that resource quota. A plain queue leaves it unlimited."""
    groups = f"[{{covered: [gpu, cpu], flavors: [{fq('h100', 16, cpu=64)}]}}]"
    update = f"  - {{at: 100, queue_update: {{name: q, resource_groups: {groups}}}}}\n"
    out = run(
        scenario(
            cluster(),
            [fqueue("q", fq("h100", 16)), "  - {name: plain, nominal: {gpu: 8}}\n"],
            [job("j", "q", "w:1x8:cpu=4"), job("k", "plain", "w:1x8:cpu=4"), update],
        )
    )
    assert out.reasons("j") == ["no resource group of queue q covers cpu"]
    assert out.admitted("j").at == 100 and flavors_of(out, "j") == {"w": "h100"}
    assert out.admitted("k").at == 0


def test_nodes_of_a_tainted_flavor_take_only_pods_on_that_flavor() -> None:
    """Pods of a plain queue tolerate no flavor's taint: they wait rather than go to the spot nodes, which a
    queue with quota on the spot flavor uses."""
    text = """\
nodes:
  - {name: od0, labels: {pool: on-demand}, capacity: {gpu: 8}}
  - {name: spot0, labels: {pool: spot}, capacity: {gpu: 8}}
  - {name: spot1, labels: {pool: spot}, capacity: {gpu: 8}}
flavors:
  - {name: spot, node_labels: {pool: spot}, taints: [{key: spot, effect: NoSchedule}]}
queues:
  - {name: plain, nominal: {gpu: 64}}
  - name: cheap
    resource_groups: [{covered: [gpu], flavors: [{name: spot, nominal: {gpu: 16}}]}]
timeline:
  - {at: 0, submit: {job: p1, queue: plain, podsets: [{count: 2, requests: {gpu: 8}}], runtime: 100}}
  - {at: 0, submit: {job: p2, queue: plain, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 100}}
  - {at: 0, submit: {job: s1, queue: cheap, podsets: [{count: 2, requests: {gpu: 8}}], runtime: 100}}
"""
    out = run(text)
    assert set(out.admitted("p2").placement.values()) == {"od0"}
    assert set(out.admitted("s1").placement.values()) == {"spot0", "spot1"}
    assert not out.admissions("p1")  # 16 GPUs: more than the untainted node holds, though spot is free
    assert out.reasons("p1") == ["2 pods of gpu=8 do not fit on the schedulable nodes"]


def test_a_queue_turned_plain_counts_and_preempts_what_its_jobs_hold_on_flavors() -> None:
    """After `queue_update` gives a flavored queue a plain `nominal`, a job it admitted on a flavor counts
    against the one pool (a second job waits for quota) and a higher-priority job of the queue evicts it."""
    update = "  - {at: 10, queue_update: {name: q, nominal: {gpu: 8}, preemption: {within_queue: LowerPriority}}}\n"
    text = scenario(
        cluster(h100=1, a100=0),
        [fqueue("q", fq("h100", 8))],
        [
            job("old", "q", "w:1x8", prio="low"),
            update,
            job("same", "q", "w:1x8", prio="low", at=20),
            job("urgent", "q", "w:1x8", prio="high", at=30),
        ],
    )
    out = run(text)
    assert flavors_of(out, "old") == {"w": "h100"}
    assert out.reasons("same")[0].startswith("queue q has no room for gpu=8 within its quota (nominal gpu=8)")
    assert [(p.job, p.preemptor, p.reason, p.at) for p in out.preemptions()] == [("old", "urgent", "WithinQueue", 30)]
    assert out.admitted("urgent").at == 30 and not out.admitted("urgent").flavors


def test_a_queue_turned_flavored_counts_and_preempts_what_its_jobs_hold_on_their_nodes_flavor() -> None:
    """After `queue_update` gives a plain queue resource groups, a job it admitted on an h100 node counts
    against its h100 quota (a second job waits for quota though a node is free) and a higher-priority job
    of the queue evicts it there."""
    groups = "[{covered: [gpu], flavors: [{name: h100, nominal: {gpu: 8}}]}]"
    policy = "preemption: {within_queue: LowerPriority}"
    update = f"  - {{at: 10, queue_update: {{name: q, resource_groups: {groups}, {policy}}}}}\n"
    text = scenario(
        cluster(h100=2, a100=0),
        ["  - {name: q, nominal: {gpu: 8}}\n"],
        [
            job("old", "q", "w:1x8", prio="low"),
            update,
            job("same", "q", "w:1x8", prio="low", at=20),
            job("urgent", "q", "w:1x8", prio="high", at=30),
        ],
    )
    out = run(text)
    assert not out.admitted("old").flavors
    assert out.admitted("same").at > 30  # not at 20 on the free node h1: h100's quota is full
    assert out.reasons("same")[0].startswith("h100: quota (nominal gpu=8 in use")
    assert [(p.job, p.preemptor, p.reason, p.at) for p in out.preemptions()] == [("old", "urgent", "WithinQueue", 30)]
    assert out.admitted("urgent").at == 30 and flavors_of(out, "urgent") == {"w": "h100"}


def test_a_queue_update_dropping_a_flavor_keeps_its_running_jobs_counted() -> None:
    """A job running on a flavor its queue's `queue_update` drops still counts against the queue's quota (its
    first flavor's, no flavor of the queue being that of its nodes): the queue is not admitted past nominal."""
    groups = "[{covered: [gpu], flavors: [{name: h100, nominal: {gpu: 8}}]}]"
    update = f"  - {{at: 10, queue_update: {{name: q, resource_groups: {groups}}}}}\n"
    text = scenario(
        cluster(h100=1, a100=1),
        [fqueue("q", fq("h100", 8), fq("a100", 8))],
        [job("old", "q", "w:1x8:flavors=a100"), update, job("new", "q", "w:1x8", at=20)],
    )
    out = run(text)
    assert flavors_of(out, "old") == {"w": "a100"}
    assert out.reasons("new") == ["h100: quota (nominal gpu=8 in use; no cohort to borrow from)"]
    assert out.admitted("new").at == 3600


def _relabel_log() -> list[Event]:
    """Two H100 nodes (slots 0 and 1), a queue with 8 GPUs of quota on each of h100 and a100, and a job
    admitted on h100 on `h1`."""
    worker = [PodSet(name="w", count=1, requests={"gpu": 8})]
    groups = [
        ResourceGroup(covered=["gpu"], flavors=[FlavorQuota(name=f, nominal={"gpu": 8}) for f in ("h100", "a100")])
    ]
    return [
        SchedulerConfigured(at=0, levels=[]),
        FlavorConfigured(at=0, name="h100", node_labels={"model": "H100"}),
        FlavorConfigured(at=0, name="a100", node_labels={"model": "A100"}),
        NodeAdded(at=0, node="h0", labels={"model": "H100", "slot": "0"}, capacity={"gpu": 8}),  # type: ignore[arg-type]
        NodeAdded(at=0, node="h1", labels={"model": "H100", "slot": "1"}, capacity={"gpu": 8}),  # type: ignore[arg-type]
        QueueConfigured(at=0, name="q", resource_groups=groups),  # type: ignore[arg-type]
        JobSubmitted(at=0, job="j", queue="q", podsets=worker),  # type: ignore[arg-type]
        JobAdmitted(at=0, job="j", queue="q", placement={"w-0": "h1"}, flavors={"w": {"gpu": "h100"}}),  # type: ignore[arg-type]
    ]


def test_a_node_relabelled_into_another_flavor_moves_its_running_jobs_usage_there() -> None:
    """A node whose labels move it from h100 to a100 under a running job: the job holds a100 quota from then
    on, so a job that may take only h100 is admitted on the other H100 node within h100's nominal quota."""
    state = fold(_relabel_log())  # type: ignore[arg-type]
    relabel = NodeUpdated(at=5, node="h1", labels={"model": "A100"}, capacity={"gpu": 8})  # type: ignore[arg-type]
    only_h100 = [PodSet(name="w", count=1, requests={"gpu": 8}, flavors=["h100"])]
    fold([relabel, JobSubmitted(at=5, job="k", queue="q", podsets=only_h100)], state)  # type: ignore[arg-type]
    assert state.jobs["j"].flavors == {"w": {"gpu": "a100"}}
    decided = decide(state, 5)
    assert [(type(e).__name__, e.job) for e in decided] == [("JobAdmitted", "k")]  # type: ignore[attr-defined]
    assert decided[0].placement == {"w-0": "h0"}  # type: ignore[attr-defined]


def test_a_flavor_redefined_over_running_jobs_moves_their_usage_to_their_nodes_flavor() -> None:
    """A flavor whose labels change so that a running job's node is no longer its (now a100's): the job
    holds a100 quota, and a job that may take only h100 is admitted on the node left to h100."""
    state = fold(_relabel_log())  # type: ignore[arg-type]
    events = [
        FlavorConfigured(at=5, name="h100", node_labels={"model": "H100", "slot": "0"}),
        FlavorConfigured(at=5, name="a100", node_labels={"model": "H100", "slot": "1"}),
    ]
    only_h100 = [PodSet(name="w", count=1, requests={"gpu": 8}, flavors=["h100"])]
    fold([*events, JobSubmitted(at=5, job="k", queue="q", podsets=only_h100)], state)  # type: ignore[arg-type]
    assert state.jobs["j"].flavors == {"w": {"gpu": "a100"}}
    assert [(type(e).__name__, e.job) for e in decide(state, 5)] == [("JobAdmitted", "k")]  # type: ignore[attr-defined]


def _flavored_borrowing_log(priority_class: str) -> list[Event]:
    """Flavored queues qa, qb, qc of 8 GPUs of flavor x in one cohort over three 8-GPU nodes; qa and qb
    full, `s` (16 GPUs, qa) waits."""
    policy = PreemptionPolicy(within_queue="LowerPriority", reclaim_within_cohort="LowerPriority")
    groups = [ResourceGroup(covered=["gpu"], flavors=[FlavorQuota(name="x", nominal={"gpu": 8})])]
    events: list[Event] = [
        SchedulerConfigured(at=0, levels=["rack"]),
        PriorityClassConfigured(at=0, name="low", value=0),
        PriorityClassConfigured(at=0, name="high", value=100),
        CohortConfigured(at=0, name="org"),
        FlavorConfigured(at=0, name="x", node_labels={"rack": "r0"}),
    ]
    for q in ("qa", "qb", "qc"):
        events.append(QueueConfigured(at=0, name=q, cohort="org", resource_groups=groups, preemption=policy))  # type: ignore[arg-type]
        events.append(NodeAdded(at=0, node=f"n-{q}", labels={"rack": "r0"}, capacity={"gpu": 8}))  # type: ignore[arg-type]
    for name, q in (("a0", "qa"), ("b0", "qb")):
        one = [PodSet(name="w", count=1, requests={"gpu": 8})]
        events.append(JobSubmitted(at=0, job=name, queue=q, podsets=one, priority_class="high"))  # type: ignore[arg-type]
    two = [PodSet(name="w", count=2, requests={"gpu": 8})]
    events.append(JobSubmitted(at=1, job="s", queue="qa", podsets=two, priority_class=priority_class))  # type: ignore[arg-type]
    return events


@pytest.mark.parametrize(
    ("priority_class", "woken"), [("low", False), ("high", True)], ids=["evicts-no-one", "may-evict"]
)
def test_a_new_borrower_wakes_a_flavored_job_only_if_it_may_evict_it(priority_class: str, woken: bool) -> None:
    """As for a plain job: a queue of the cohort that starts borrowing on a flavor wakes a waiting flavored job
    that may evict it, not one that may evict no one (the lowest priority, taking only lower ones)."""
    state = fold(_flavored_borrowing_log(priority_class))  # type: ignore[arg-type]
    fold(decide(state, 1), state)
    assert state.jobs["s"].status == "pending" and "s" in index_of(state).parking.parked
    b1 = [PodSet(name="w", count=1, requests={"gpu": 8})]
    fold([JobSubmitted(at=2, job="b1", queue="qb", podsets=b1, priority_class="low")], state)  # type: ignore[list-item]
    fold(decide(state, 2), state)
    assert state.jobs["b1"].status == "admitted" and state.jobs["b1"].flavors == {"w": {"gpu": "x"}}
    assert ("s" not in index_of(state).parking.parked) == woken


def test_what_a_running_job_borrowed_is_keyed_as_its_queues_pools_after_each_change() -> None:
    """A job admitted borrowing in a plain queue shows what it borrowed as h100 quota once its queue has flavors
    (its node is an H100), and as plain quota again once the queue turns back into one pool."""
    worker = [PodSet(name="w", count=1, requests={"gpu": 8})]
    groups = [ResourceGroup(covered=["gpu"], flavors=[FlavorQuota(name="h100", nominal={"gpu": 8})])]
    state = fold(
        [  # type: ignore[arg-type]
            FlavorConfigured(at=0, name="h100", node_labels={"model": "H100"}),
            NodeAdded(at=0, node="h0", labels={"model": "H100"}, capacity={"gpu": 8}),  # type: ignore[arg-type]
            QueueConfigured(at=0, name="q", nominal={"gpu": 0}),  # type: ignore[arg-type]
            JobSubmitted(at=0, job="j", queue="q", podsets=worker),  # type: ignore[arg-type]
            JobAdmitted(at=0, job="j", queue="q", placement={"w-0": "h0"}, borrowed={"gpu": 8}),  # type: ignore[arg-type]
            QueueConfigured(at=5, name="q", resource_groups=groups),  # type: ignore[arg-type]
        ]
    )
    j = state.jobs["j"]
    assert (j.flavors, j.borrowed, state.queues["q"].usage["gpu@h100"]) == ({"w": {"gpu": "h100"}}, {"gpu@h100": 8}, 8)
    fold([QueueConfigured(at=9, name="q", nominal={"gpu": 8})], state)  # type: ignore[arg-type, list-item]
    assert (j.borrowed, state.queues["q"].usage["gpu"]) == ({"gpu": 8}, 8)


def test_a_job_restricted_to_a_flavor_it_would_borrow_on_comes_after_one_within_nominal() -> None:
    """Of two pending jobs of one queue and size restricted to different flavors, the one that would borrow on
    its flavor comes after another queue's job within its nominal quota there, whichever was judged first:
    that job takes the last node of the flavor, and the borrower waits."""
    text = scenario(
        cluster(),
        [
            fqueue("q1", fq("h100", 8), fq("a100", 8), cohort="c"),
            fqueue("q2", fq("h100", 8), fq("a100", 8), cohort="c"),
        ],
        [
            job("r", "q1", "w:1x8:flavors=a100", at=0, runtime=10_000),  # uses q1's a100 nominal
            job("hb", "q2", "w:2x8:flavors=h100", at=0, runtime=10_000),  # no h100 node is free
            job("y", "q1", "w:1x8:flavors=h100", at=10),  # within nominal on h100, no node
            job("x", "q1", "w:1x8:flavors=a100", at=10),  # would borrow on a100
            job("z", "q2", "w:1x8:flavors=a100", at=10),  # within nominal on a100
        ],
        cohorts=("c",),
    )
    out = run(text)
    assert out.admitted("z").at == 10
    assert out.admitted("x").at > 10
