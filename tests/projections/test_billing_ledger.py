"""The billing ledger fold and its pricing, on a log whose numbers were worked out by hand.

The scripted log (times from T0, an hour boundary):

- node-a: 8 x A100, node-b: 8 x H100, both ready from T0.
- j1 (team-a): 1 pod x 4 GPUs, 8 CPU, 64 GiB on node-a, held [0, 3600);
  utilization unknown until 600, 0.5 on [600, 1800), 1.0 on [1800, 3600).
- j2 (team-b): 2 pods x (4 GPUs, 8 CPU, 64 GiB) on node-b; run 1 [1800, 5400)
  with 4 GPUs borrowed, preempted losing 7200 GPU-seconds; run 2 [7200, 9000)
  at utilization 0.25.
- j3 (team-b, scavenger): 2 GPUs on node-a, held [3600, 5400), then cancelled.

Rate card v1 from T0: A100 2.00, H100 4.00, CPU 0.05, memory 0.01, borrowed
premium x1.5, scavenger 50 % off; v2 from T0+7200: H100 5.00.
"""

from __future__ import annotations

import itertools
from decimal import Decimal
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from muster.events.types import (
    Event,
    GpuUtilizationSampled,
    JobAdmitted,
    JobCancelled,
    JobFinished,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    LeaderElected,
    NodeAdded,
    NodeRemoved,
    NodeUpdated,
    PodSet,
    QueueConfigured,
)
from muster.projections.billing import evolve_billing, fold_billing, settle, skip_bad
from muster.projections.chargeback import Report, build_report, hourly_series, split
from muster.projections.ledger import (
    HOUR,
    Ledger,
    Usage,
    decode_tracker,
    drain,
    encode_tracker,
    merge_into,
    new_billing_state,
)
from muster.projections.ratecard import RateCardError, parse_rate_card, parse_time

T0 = 472_222 * HOUR  # 2023-11-14T22:00:00Z
GIB = 1 << 30
A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
LABEL = "nvidia.com/gpu.product"


def _pods(count: int, gpu: int, cpu: int = 0, mem_gib: int = 0) -> list[PodSet]:
    req = {"gpu": gpu}
    if cpu:
        req["cpu"] = cpu * 1000
    if mem_gib:
        req["memory"] = mem_gib * GIB
    return [PodSet(name="worker", count=count, requests=req)]


def scripted_log() -> list[Event]:
    return [
        QueueConfigured(at=T0 - 100, name="team-a", nominal={"gpu": 8}),
        QueueConfigured(at=T0 - 100, name="team-b", nominal={"gpu": 8}),
        NodeAdded(at=T0, node="node-a", labels={LABEL: A100}, capacity={"gpu": 8, "cpu": 96000}),
        NodeAdded(at=T0, node="node-b", labels={LABEL: H100}, capacity={"gpu": 8, "cpu": 96000}),
        JobSubmitted(at=T0, job="j1", queue="team-a", podsets=_pods(1, 4, 8, 64)),
        JobAdmitted(at=T0, job="j1", queue="team-a", placement={"worker-0": "node-a"}),
        JobStarted(at=T0 + 60, job="j1"),
        GpuUtilizationSampled(at=T0 + 600, job="j1", gpu=0.5),
        GpuUtilizationSampled(at=T0 + 1800, job="j1", gpu=1.0),
        JobSubmitted(at=T0 + 1800, job="j2", queue="team-b", podsets=_pods(2, 4, 8, 64)),
        JobAdmitted(
            at=T0 + 1800,
            job="j2",
            queue="team-b",
            placement={"worker-0": "node-b", "worker-1": "node-b"},
            borrowed={"gpu": 4},
        ),
        JobFinished(at=T0 + 3600, job="j1"),
        JobSubmitted(at=T0 + 3600, job="j3", queue="team-b", priority_class="scavenger", podsets=_pods(1, 2)),
        JobAdmitted(at=T0 + 3600, job="j3", queue="team-b", placement={"worker-0": "node-a"}),
        JobPreempted(at=T0 + 5400, job="j2", preemptor=None, reason="ReclaimWithinCohort", lost_gpu_seconds=7200),
        JobCancelled(at=T0 + 5400, job="j3"),
        JobAdmitted(at=T0 + 7200, job="j2", queue="team-b", placement={"worker-0": "node-b", "worker-1": "node-b"}),
        GpuUtilizationSampled(at=T0 + 7200, job="j2", gpu=0.25),
        JobFinished(at=T0 + 9000, job="j2"),
    ]


RATES = {
    "currency": "USD",
    "teams": {"team-a": "vision", "team-b": "language"},
    "versions": [
        {
            "version": "v2",
            "effective_from": T0 + 7200,
            "gpu_hour": {"default": 1, A100: 2, H100: 5},
            "cpu_core_hour": 0.05,
            "memory_gib_hour": 0.01,
            "borrowed_premium": 1.5,
            "priority_discounts": {"scavenger": 0.5},
        },
        {
            "version": "v1",
            "effective_from": T0,
            "gpu_hour": {"default": 1, A100: 2, H100: 4},
            "cpu_core_hour": 0.05,
            "memory_gib_hour": 0.01,
            "borrowed_premium": 1.5,
            "priority_discounts": {"scavenger": 0.5},
        },
    ],
}


def _ledger(events: list[Event]) -> Ledger:
    return fold_billing(enumerate(events, start=1)).ledger


def _per_job(ledger: Ledger) -> dict[str, Usage]:
    out: dict[str, Usage] = {}
    for (job, _hour, _model), row in ledger.usage.items():
        out.setdefault(job, Usage(queue=row.queue)).add(row)
    return out


def _report(**kw: Any) -> Report:
    ledger = _ledger(scripted_log())
    args = {"start": T0, "end": T0 + 3 * HOUR, "rates": parse_rate_card(RATES)}
    args.update(kw)
    return build_report(ledger.usage.items(), ledger.capacity.items(), ledger.queues, **args)


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        pytest.param(
            "j1",
            dict(
                alloc_gpu_s=4 * 3600,
                sampled_gpu_s=4 * 3000,
                used_mgpu_s=4 * (1200 * 500 + 1800 * 1000),
                borrowed_gpu_s=0,
                lost_gpu_s=0,
                cpu_mcore_s=8000 * 3600,
                mem_mib_s=64 * 1024 * 3600,
            ),
            id="sampled-part-of-the-run",
        ),
        pytest.param(
            "j2",
            dict(
                alloc_gpu_s=8 * 3600 + 8 * 1800,
                sampled_gpu_s=8 * 1800,
                used_mgpu_s=8 * 1800 * 250,
                borrowed_gpu_s=4 * 3600,
                lost_gpu_s=7200,
                cpu_mcore_s=16000 * 5400,
                mem_mib_s=128 * 1024 * 5400,
            ),
            id="preempted-borrower-readmitted",
        ),
        pytest.param(
            "j3",
            dict(alloc_gpu_s=2 * 1800, sampled_gpu_s=0, used_mgpu_s=0, borrowed_gpu_s=0, lost_gpu_s=0),
            id="cancelled-while-running",
        ),
    ],
)
def test_job_totals_match_hand_computation(job: str, expected: dict[str, int]) -> None:
    """Each job's allocated, sampled, used, borrowed, lost, CPU and memory seconds are exactly the hand figures."""
    usage = _per_job(_ledger(scripted_log()))[job]
    assert {k: getattr(usage, k) for k in expected} == expected


def test_usage_is_cut_at_hour_boundaries_and_gpu_models() -> None:
    """j2's first run lands half in hour 0 and half in hour 1, all on the H100 model; capacity is per model and hour."""
    ledger = _ledger(scripted_log())
    assert ledger.usage[("j2", T0, H100)].alloc_gpu_s == 8 * 1800
    assert ledger.usage[("j2", T0 + HOUR, H100)].alloc_gpu_s == 8 * 1800
    assert ledger.usage[("j2", T0 + HOUR, H100)].lost_gpu_s == 7200
    assert ledger.usage[("j2", T0 + 2 * HOUR, H100)].alloc_gpu_s == 8 * 1800
    assert ledger.capacity == {
        (T0, A100): 8 * 3600,
        (T0, H100): 8 * 3600,
        (T0 + HOUR, A100): 8 * 3600,
        (T0 + HOUR, H100): 8 * 3600,
        (T0 + 2 * HOUR, A100): 8 * 1800,
        (T0 + 2 * HOUR, H100): 8 * 1800,
    }
    assert {k: (r.status, r.preemptions) for k, r in ledger.jobs.items()} == {
        "j1": ("finished", 0),
        "j2": ("finished", 1),
        "j3": ("cancelled", 0),
    }


def test_report_by_queue_prices_each_hour_with_its_rate_version() -> None:
    """GPU-hours and costs per queue equal the hand figures; team-b's charge names both rate versions."""
    report = _report()
    rows = {r.key: r for r in report.rows}
    a, b = rows["team-a"], rows["team-b"]
    assert (a.allocated_gpu_hours, a.used_gpu_hours, a.idle_gpu_hours) == (
        Decimal(4),
        Decimal("2.666667"),
        Decimal("0.666667"),
    )
    assert a.efficiency == Decimal("0.8")
    assert (a.cpu_core_hours, a.memory_gib_hours) == (Decimal(8), Decimal(64))
    assert a.cost == Decimal("9.04")  # 4 x 2.00 + 8 x 0.05 + 64 x 0.01
    assert a.rate_versions == ["v1"]
    assert (b.allocated_gpu_hours, b.borrowed_gpu_hours, b.lost_gpu_hours) == (Decimal(13), Decimal(4), Decimal(2))
    assert (b.used_gpu_hours, b.idle_gpu_hours) == (Decimal(1), Decimal(3))
    # j2: 8 h x 4.00 + 4 borrowed h x 4.00 x 0.5 + 4 h x 5.00 (v2) + 24 core-h x 0.05 + 192 GiB-h x 0.01 = 63.12
    # j3: 1 h x 2.00 x (1 - 0.5) = 1.00
    assert b.cost == Decimal("64.12")
    assert b.rate_versions == ["v1", "v2"]
    assert report.totals.cost == Decimal("73.16")
    assert report.totals.allocated_gpu_hours == Decimal(17)


def test_idle_capacity_is_reported_and_shared_by_nominal_or_usage() -> None:
    """23 unheld GPU-hours cost 62.00; nominal 8:8 splits them evenly, usage 4:13 by largest remainder."""
    none = _report(share_idle="none")
    idle = none.idle_capacity
    assert (idle.capacity_gpu_hours, idle.allocated_gpu_hours, idle.unallocated_gpu_hours) == (
        Decimal(40),
        Decimal(17),
        Decimal(23),
    )
    assert idle.cost == Decimal("62.00")  # A100 15 h x 2.00 + H100 8 h x 4.00
    assert all(r.idle_share_cost == 0 for r in none.rows)

    nominal = {r.key: r for r in _report(share_idle="nominal").rows}
    assert (nominal["team-a"].idle_share_cost, nominal["team-b"].idle_share_cost) == (Decimal(31), Decimal(31))
    assert nominal["team-a"].idle_share_gpu_hours == Decimal("11.5")
    assert nominal["team-a"].total_cost == Decimal("40.04")

    usage = {r.key: r for r in _report(share_idle="usage").rows}
    assert (usage["team-a"].idle_share_cost, usage["team-b"].idle_share_cost) == (
        Decimal("14.5882"),
        Decimal("47.4118"),
    )


def test_report_by_team_and_by_job_add_up_to_the_same_totals() -> None:
    """Grouping changes the rows, never the totals; teams come from the rate card's queue mapping."""
    by_queue = _report(share_idle="nominal")
    by_team = _report(by="team", share_idle="nominal")
    by_job = _report(by="job", share_idle="nominal")
    assert [r.key for r in by_team.rows] == ["language", "vision"]
    assert [r.key for r in by_job.rows] == ["j1", "j2", "j3"]
    assert by_job.rows[2].team == "language"
    for name in ("allocated_gpu_hours", "cost", "idle_share_cost", "total_cost"):
        assert getattr(by_team.totals, name) == getattr(by_queue.totals, name) == getattr(by_job.totals, name)


def test_report_window_keeps_only_overlapping_hours() -> None:
    """A one-hour window counts only that hour's GPU-seconds, capacity and preemption losses."""
    report = _report(start=T0 + HOUR, end=T0 + 2 * HOUR)
    rows = {r.key: r for r in report.rows}
    assert set(rows) == {"team-b"}
    assert rows["team-b"].allocated_gpu_hours == Decimal(5)  # j2 4 h + j3 1 h
    assert rows["team-b"].lost_gpu_hours == Decimal(2)
    assert report.idle_capacity.unallocated_gpu_hours == Decimal(11)


def test_hourly_series_feeds_the_plot() -> None:
    """Per hour: allocated GPU-seconds per queue, used, and capacity."""
    ledger = _ledger(scripted_log())
    points = hourly_series(ledger.usage.items(), ledger.capacity.items(), start=T0, end=T0 + 3 * HOUR)
    assert [p.hour for p in points] == [T0, T0 + HOUR, T0 + 2 * HOUR]
    assert points[0].allocated_by_queue == {"team-a": 4 * 3600, "team-b": 8 * 1800}
    assert points[2].capacity_gpu_s == 16 * 1800


def test_replayed_sequence_changes_nothing() -> None:
    """Applying an event again under its old sequence number leaves the ledger as it was."""
    events = scripted_log()
    state = fold_billing(enumerate(events, start=1))
    before = msgspec.json.encode(sorted(state.ledger.usage.items()))
    for seq, ev in enumerate(events, start=1):
        evolve_billing(state, seq, ev)
    assert msgspec.json.encode(sorted(state.ledger.usage.items())) == before


def late_log() -> list[Event]:
    """The scripted log with a sample stamped 600 s before the latest event (a late watcher)."""
    events = scripted_log()
    return [*events[:12], GpuUtilizationSampled(at=T0 + 3000, job="j2", gpu=0.75), *events[12:]]


@settings(max_examples=60, deadline=None)
@given(
    late=st.booleans(),
    cuts=st.lists(st.integers(min_value=1, max_value=20), max_size=6, unique=True),
    settles=st.lists(st.integers(min_value=1, max_value=20), max_size=6, unique=True),
)
def test_draining_settling_and_restoring_anywhere_gives_the_same_ledger(
    late: bool, cuts: list[int], settles: list[int]
) -> None:
    """Draining and settling at any points, with the tracker encoded and decoded (a restart), equals one fold."""
    events = late_log() if late else scripted_log()
    clean = _ledger(events)
    total = Ledger()
    state = new_billing_state()
    for seq, ev in enumerate(events, start=1):
        evolve_billing(state, seq, ev)
        if seq in settles:
            settle(state)
        if seq in cuts:
            merge_into(total, drain(state))
            state.tracker = decode_tracker(encode_tracker(state.tracker))
    merge_into(total, drain(settle(state)))
    assert sorted(total.usage.items()) == sorted(clean.usage.items())
    assert total.capacity == clean.capacity
    assert total.jobs == clean.jobs


def test_late_event_counts_at_the_latest_time() -> None:
    """A sample stamped before the latest event applies from the latest event time, never rewriting the past."""
    usage = _per_job(_ledger(late_log()))["j2"]
    # run 1 [1800, 5400): unsampled until 3600, then 0.75 for 1800 s; run 2 as before at 0.25
    assert usage.sampled_gpu_s == 8 * 1800 + 8 * 1800
    assert usage.used_mgpu_s == 8 * 1800 * 750 + 8 * 1800 * 250


def test_fenced_and_misplaced_decisions_are_ignored() -> None:
    """An admission from a deposed leader's epoch, or one that misses a pod, books nothing."""
    base = scripted_log()[:5]  # queues, nodes, j1 submitted
    events = [
        *base,
        LeaderElected(at=T0, epoch=2, holder="b"),
        JobAdmitted(at=T0, job="j1", queue="team-a", placement={"worker-0": "node-a"}, epoch=1),
        JobAdmitted(at=T0, job="j1", queue="team-a", placement={"worker-1": "node-a"}, epoch=2),
        JobAdmitted(at=T0, job="j1", queue="team-a", placement={"worker-0": "node-x"}, epoch=2),
        JobFinished(at=T0 + 600, job="j1"),
    ]
    state = fold_billing(enumerate(events, start=1))
    assert state.ledger.usage == {}
    assert state.tracker.ignored == 3


def test_node_changes_move_capacity() -> None:
    """A node that goes not-ready or is removed stops counting as capacity from that moment."""
    events: list[Event] = [
        NodeAdded(at=T0, node="n", labels={LABEL: A100}, capacity={"gpu": 8}, reserved={"gpu": 2}),
        NodeUpdated(at=T0 + 600, node="n", labels={LABEL: A100}, capacity={"gpu": 8}, ready=False),
        NodeUpdated(at=T0 + 1200, node="n", labels={LABEL: A100}, capacity={"gpu": 8}),
        NodeRemoved(at=T0 + 1800, node="n"),
        QueueConfigured(at=T0 + 2400, name="q"),
    ]
    assert _ledger(events).capacity == {(T0, A100): 6 * 600 + 8 * 600}


def test_malformed_event_moves_the_cursor_and_is_recorded() -> None:
    """A skipped sequence is listed with its reason and later events still apply."""
    events = scripted_log()
    state = new_billing_state()
    for seq, ev in enumerate(events, start=1):
        if seq == 3:
            skip_bad(state, 100, "not JSON")  # out of band: a bad event between 2 and 3
            continue
        evolve_billing(state, seq if seq < 3 else seq + 100, ev)
    assert state.ledger.skipped == [(100, "not JSON")]
    assert state.tracker.skipped == 1
    # node-a was the skipped event: j1 and j3 cannot be placed; j2 runs on node-b as before
    assert set(_per_job(state.ledger)) == {"j2"}


def test_rate_card_versions_and_errors() -> None:
    """Versions are sorted by date, priced by the one in force, and bad cards are refused with a reason."""
    card = parse_rate_card(RATES)
    assert [v.version for v in card.versions] == ["v1", "v2"]
    assert card.version_at(T0 - 1) is None
    assert card.version_at(T0 + 7199).version == "v1"
    assert card.version_at(T0 + 7200).gpu_rate(H100) == Decimal(5)
    assert card.version_at(T0).gpu_rate("unknown") == Decimal(1)
    with pytest.raises(RateCardError, match="versions"):
        parse_rate_card({"versions": []})
    with pytest.raises(RateCardError, match="cpu_core_hour"):
        parse_rate_card({"versions": [{"version": "x", "effective_from": 0, "cpu_core_hour": "cheap"}]})
    with pytest.raises(RateCardError, match="fraction"):
        parse_rate_card({"versions": [{"version": "x", "effective_from": 0, "priority_discounts": {"s": 2}}]})
    assert parse_time("2025-01-02") == parse_time("2025-01-02T00:00:00Z") == 1735776000


def test_a_rate_version_taking_effect_mid_hour_is_refused_with_the_hours_around_it() -> None:
    """A price change at 10:30 would be billed from 11:00 (rows are hours): the card is refused, naming both hours."""
    card = {"versions": [{"version": "spring", "effective_from": "2025-03-01T10:30:00Z", "gpu_hour": {"default": 2}}]}
    with pytest.raises(RateCardError, match="not on the hour") as err:
        parse_rate_card(card)
    assert "version spring" in str(err.value)
    assert "(2025-03-01T10:00:00Z or 2025-03-01T11:00:00Z)" in str(err.value)
    with pytest.raises(RateCardError, match=r"\(3600 or 7200\)"):
        parse_rate_card({"versions": [{"version": "sim", "effective_from": 5400}]})
    on_the_hour = parse_rate_card({"versions": [{"version": "sim", "effective_from": 7200}]})
    assert on_the_hour.versions[0].effective_from == 7200


def test_usage_before_the_first_rate_version_is_unpriced() -> None:
    """Hours before the first effective date are counted as unpriced GPU-hours, not charged."""
    only_v2 = parse_rate_card({"versions": [RATES["versions"][0]]})
    report = _report(start=T0 - HOUR, end=T0 + 3 * HOUR, rates=only_v2)
    assert report.unpriced_gpu_hours == Decimal(13)  # j1 4 h + j2 8 h + j3 1 h before T0+7200
    # j2's last half hour: 4 GPU-h x 5.00 + 8 core-h x 0.05 + 64 GiB-h x 0.01
    assert report.totals.cost == Decimal("21.04")
    assert report.totals.rate_versions == ["v2"]


@given(
    total=st.integers(min_value=0, max_value=10**9),
    weights=st.dictionaries(st.text(min_size=1, max_size=3), st.integers(min_value=0, max_value=10**6), max_size=6),
)
def test_split_adds_up(total: int, weights: dict[str, int]) -> None:
    """Largest-remainder shares always add up to the amount split when any weight is positive."""
    shares = split(total, weights.items())
    if any(w > 0 for w in weights.values()) and total:
        assert sum(shares.values()) == total
        for a, b in itertools.combinations(shares, 2):
            if weights[a] == weights[b]:
                assert abs(shares[a] - shares[b]) <= 1
    else:
        assert shares == {}


# ---------------------------------------------------------------- resource flavors

FLAVOR_RATES = {
    "currency": "EUR",
    "versions": [{"version": "f1", "effective_from": 0, "gpu_hour": {"h100": 4, "a100": 2, "l4": 0.5}}],
}


def _flavors_log() -> tuple[list[Event], dict[str, Any]]:
    """The log and summary of `examples/flavors.yaml` (three GPU models as flavors, four teams)."""
    from pathlib import Path

    from muster.replay.scenario import load
    from muster.replay.simcli import summary
    from muster.replay.simulator import simulate

    result = simulate(load(Path(__file__).resolve().parents[2] / "examples" / "flavors.yaml"))
    return list(result.events), summary(result)


def test_ledger_is_per_flavor_and_flavors_add_up_to_the_totals() -> None:
    """With flavors, GPU-seconds are booked per flavor, each queue's match the sim's per-flavor figures,
    and the flavors' allocated, capacity and cost add up to the totals."""
    events, sim = _flavors_log()
    ledger = fold_billing(enumerate(events, start=1)).ledger
    per: dict[tuple[str, str], int] = {}
    for (_job, _hour, flavor), row in ledger.usage.items():
        per[(row.queue, flavor)] = per.get((row.queue, flavor), 0) + row.alloc_gpu_s
    want = {
        (q, f): v["gpu_seconds"]
        for q, qs in sim["queues"].items()
        for f, v in qs.get("flavors", {}).items()
        if v["gpu_seconds"]
    }
    assert per == want
    capacity: dict[str, int] = {}
    for (_hour, flavor), gpu_s in ledger.capacity.items():
        capacity[flavor] = capacity.get(flavor, 0) + gpu_s
    end = events[-1].at
    assert capacity == {"h100": 32 * end, "a100": 32 * end, "l4": 16 * end}
    args = {"start": 0, "end": end, "rates": parse_rate_card(FLAVOR_RATES), "share_idle": "usage"}
    by_flavor = build_report(ledger.usage.items(), ledger.capacity.items(), ledger.queues, by="flavor", **args)
    by_queue = build_report(ledger.usage.items(), ledger.capacity.items(), ledger.queues, by="queue", **args)
    assert [r.key for r in by_flavor.rows] == ["a100", "h100", "l4"]
    for name in ("allocated_gpu_hours", "borrowed_gpu_hours", "cost"):
        assert sum(getattr(r, name) for r in by_flavor.rows) == getattr(by_flavor.totals, name)
        assert getattr(by_flavor.totals, name) == getattr(by_queue.totals, name), name
    h100 = next(r for r in by_flavor.rows if r.key == "h100")
    assert h100.allocated_gpu_hours == Decimal(24)  # r-pretrain: 24 H100 for an hour
    rows = {r.key: r for r in by_flavor.rows}
    assert rows["h100"].cost == Decimal(96)  # 24 GPU-h x 4.00; its idle is apart (idle_share_cost)
    assert rows["h100"].idle_share_cost == Decimal(4 * (32 * end - 24 * 3600) // 3600)  # its own idle GPU-h
