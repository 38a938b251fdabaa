"""Pricing the billing ledger: rate cards, grouped reports and idle-capacity sharing.

Pure: the shell reads the rate card file and the ledger rows; this module turns
them into report rows. Nothing here reads a clock or a file.

A rate card is a list of versions, each effective from a date (or epoch
second). A ledger row is priced by the version in force at the start of its
hour; every report row lists the versions it used. Usage before the first
version is left unpriced and counted in `Report.unpriced_gpu_hours`.

Cost of one ledger row, under version V, for a job of priority class P:

    ( alloc_gpu_h x gpu_rate(model)
    + borrowed_gpu_h x gpu_rate(model) x (borrowed_premium - 1)
    + cpu_core_h x cpu_rate + memory_gib_h x memory_rate ) x (1 - discount(P))

Idle capacity (GPU-seconds of ready nodes nobody held) is priced at the plain
GPU rate of its model and reported apart; `share_idle` spreads it over queues
in proportion to their nominal GPUs (`nominal`), to their allocated GPU-hours
(`usage`), or not at all (`none`).

Invariants:
- Exact arithmetic: quantities are integers, prices Decimals, each report row's
  cost is computed as an exact fraction and rounded once (half-even) to
  `MONEY_PLACES`; shares are split by largest remainder, so they add up to
  the amount shared.
- A report's totals are the sums of its rows as shown: a CSV of the rows adds up
  to the JSON totals exactly.
- Deterministic order: rows sorted by key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Literal

import msgspec

from muster.projections.ledger import HOUR, CapacityKey, QueueRecord, Usage, UsageKey
from muster.projections.ratecard import RateCard, RateVersion

GroupBy = Literal["queue", "job", "team", "flavor"]
ShareIdle = Literal["nominal", "usage", "none"]

HOURS_PLACES = 6
MONEY_PLACES = 4
_HOURS_Q: Decimal = Decimal(1).scaleb(-HOURS_PLACES)
_MONEY_UNIT: int = 10**MONEY_PLACES
_RATIO_Q = Decimal("0.0001")


# ---------------------------------------------------------------- report


class ReportRow(msgspec.Struct, kw_only=True):
    key: str
    queue: str = ""
    team: str = ""
    allocated_gpu_hours: Decimal = Decimal(0)
    used_gpu_hours: Decimal = Decimal(0)
    idle_gpu_hours: Decimal = Decimal(0)
    """Allocated but unused, where utilization was sampled."""
    sampled_gpu_hours: Decimal = Decimal(0)
    borrowed_gpu_hours: Decimal = Decimal(0)
    lost_gpu_hours: Decimal = Decimal(0)
    cpu_core_hours: Decimal = Decimal(0)
    memory_gib_hours: Decimal = Decimal(0)
    efficiency: Decimal | None = None
    """used / allocated over the time utilization was sampled; None with no samples."""
    cost: Decimal = Decimal(0)
    idle_share_gpu_hours: Decimal = Decimal(0)
    idle_share_cost: Decimal = Decimal(0)
    total_cost: Decimal = Decimal(0)
    rate_versions: list[str] = []


ROW_NUMBERS: tuple[str, ...] = (
    "allocated_gpu_hours",
    "used_gpu_hours",
    "idle_gpu_hours",
    "sampled_gpu_hours",
    "borrowed_gpu_hours",
    "lost_gpu_hours",
    "cpu_core_hours",
    "memory_gib_hours",
    "cost",
    "idle_share_gpu_hours",
    "idle_share_cost",
    "total_cost",
)
"""The additive columns: a report's totals are their sums."""


class IdleCapacity(msgspec.Struct, kw_only=True):
    capacity_gpu_hours: Decimal
    allocated_gpu_hours: Decimal
    unallocated_gpu_hours: Decimal
    cost: Decimal
    shared: ShareIdle


class Report(msgspec.Struct, kw_only=True):
    by: GroupBy
    start: int
    end: int
    """The window counted: the one asked for, widened to whole hours (ledger rows are hours)."""
    currency: str
    share_idle: ShareIdle
    rows: list[ReportRow]
    totals: ReportRow
    idle_capacity: IdleCapacity
    unpriced_gpu_hours: Decimal = Decimal(0)
    rate_versions: list[str] = []
    unknown_team_queues: list[str] = []
    """Queues the rate card's `teams` maps that the ledger never saw (configured or billed): a typo there
    leaves the real queue its own team."""
    unnamed_models: dict[str, list[str]] = {}
    """Rate version -> the GPU models (flavors) of the window that its `gpu_hour` does not name, so
    priced at its default rate: a card written for other model names prices them all alike, maybe at 0."""


def hours(seconds: int, per: int = 1) -> Decimal:
    """`seconds` (in units of 1/per) as hours, rounded to HOURS_PLACES."""
    value: Decimal = (Decimal(seconds) / (HOUR * per)).quantize(_HOURS_Q)
    return value


def _money_units(amount: Fraction) -> int:
    """An exact amount in units of 10**-MONEY_PLACES, rounded half-even."""
    return round(amount * _MONEY_UNIT)


def _from_units(units: int) -> Decimal:
    return Decimal(units).scaleb(-MONEY_PLACES)


def split(total: int, weights: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Split an integer among keys in proportion to integer weights, by largest remainder (ties by key)."""
    items = sorted((k, w) for k, w in weights if w > 0)
    wsum = sum(w for _, w in items)
    if wsum == 0 or total == 0:
        return {}
    out = {k: total * w // wsum for k, w in items}
    left = total - sum(out.values())
    by_remainder = sorted(items, key=lambda kw: (-(total * kw[1] % wsum), kw[0]))
    for k, _ in by_remainder[:left]:
        out[k] += 1
    return out


def in_window(hour: int, start: int, end: int) -> bool:
    """Whether the hour starting at `hour` overlaps [start, end): windows are widened to whole hours."""
    return hour + HOUR > start and hour < end


class _Acc:
    """Integer sums of one report group, and its exact cost."""

    __slots__ = ("cost", "queue", "team", "usage", "versions")

    def __init__(self, queue: str, team: str) -> None:
        self.queue = queue
        self.team = team
        self.usage = Usage(queue=queue)
        self.cost = Fraction(0)
        self.versions: set[str] = set()


def build_report(
    usage: Iterable[tuple[UsageKey, Usage]],
    capacity: Iterable[tuple[CapacityKey, int]],
    queues: Mapping[str, QueueRecord],
    *,
    start: int,
    end: int,
    by: GroupBy = "queue",
    rates: RateCard | None = None,
    share_idle: ShareIdle = "none",
) -> Report:
    """Group, price and total the ledger rows whose hour overlaps [start, end); the report says the window it
    counted, [start, end) widened to whole hours."""
    start, end = start - start % HOUR, end + (-end) % HOUR
    card = rates if rates is not None else RateCard(versions=[])
    version_cache: dict[int, RateVersion | None] = {}

    unnamed: dict[str, set[str]] = {}

    def version(hour: int) -> RateVersion | None:
        if hour not in version_cache:
            version_cache[hour] = card.version_at(hour)
        return version_cache[hour]

    def rate(v: RateVersion, model: str) -> Fraction:
        if model not in v.gpu_hour:
            unnamed.setdefault(v.version, set()).add(model or "-")
        return Fraction(v.gpu_rate(model))

    groups: dict[str, _Acc] = {}
    # integer sums per (group, hour, model, class) first, priced once each
    priced: dict[tuple[str, int, str, str], Usage] = {}
    alloc_by_hour_model: dict[CapacityKey, int] = {}
    queue_alloc: dict[str, int] = {}
    job_queue_alloc: dict[str, dict[str, int]] = {}
    for (job, hour, model), row in usage:
        if not in_window(hour, start, end):
            continue
        team = card.team_of(row.queue)
        key = row.queue if by == "queue" else job if by == "job" else team if by == "team" else model or "-"
        acc = groups.get(key)
        if acc is None:
            acc = groups[key] = _Acc(row.queue if by in ("queue", "job") else "", team if by != "flavor" else "")
        acc.usage.add(row)
        pkey = (key, hour, model, row.priority_class)
        p = priced.get(pkey)
        if p is None:
            p = priced[pkey] = Usage(queue=row.queue)
        p.add(row)
        hm = (hour, model)
        alloc_by_hour_model[hm] = alloc_by_hour_model.get(hm, 0) + row.alloc_gpu_s
        queue_alloc[row.queue] = queue_alloc.get(row.queue, 0) + row.alloc_gpu_s
        if by == "job":
            per_job = job_queue_alloc.setdefault(row.queue, {})
            per_job[job] = per_job.get(job, 0) + row.alloc_gpu_s

    unpriced_s = 0
    for (key, hour, model, pclass), u in priced.items():
        v = version(hour)
        if v is None:
            unpriced_s += u.alloc_gpu_s
            continue
        acc = groups[key]
        acc.versions.add(v.version)
        acc.cost += _price(v, rate(v, model), pclass, u)

    # idle capacity: ready GPUs nobody held, priced at the plain GPU rate
    cap_s = alloc_s = unalloc_s = 0
    idle_cost = Fraction(0)
    idle_versions: set[str] = set()
    idle_by_model: dict[str, Fraction] = {}
    idle_s_by_model: dict[str, int] = {}
    for (hour, model), gpu_s in capacity:
        if not in_window(hour, start, end):
            continue
        cap_s += gpu_s
        held = alloc_by_hour_model.get((hour, model), 0)
        alloc_s += min(held, gpu_s)
        free = max(0, gpu_s - held)
        unalloc_s += free
        idle_s_by_model[model or "-"] = idle_s_by_model.get(model or "-", 0) + free
        v = version(hour)
        if v is not None and free:
            idle_versions.add(v.version)
            cost = Fraction(free) * rate(v, model) / HOUR
            idle_cost += cost
            idle_by_model[model or "-"] = idle_by_model.get(model or "-", Fraction(0)) + cost
    idle_units = _money_units(idle_cost)

    if by == "flavor" and share_idle != "none":
        # a flavor's idle capacity is its own: each row takes the idle cost of its flavor
        weights = [(m, _money_units(c)) for m, c in sorted(idle_by_model.items())]
        share_units, share_s = split(idle_units, weights), {m: s for m, s in idle_s_by_model.items() if s}
    else:
        share_units, share_s = _shares(
            share_idle, by, groups, queues, card, queue_alloc, job_queue_alloc, idle_units, unalloc_s
        )
    for key in share_units.keys() | share_s.keys():
        if key not in groups:
            queue = key[1:-1] if by == "job" else key if by == "queue" else ""
            groups[key] = _Acc(queue, card.team_of(queue) if queue else key)

    rows: list[ReportRow] = []
    for key in sorted(groups):
        acc = groups[key]
        cost_units = _money_units(acc.cost)
        s_units = share_units.get(key, 0)
        versions = set(acc.versions)
        if s_units:
            versions |= idle_versions
        rows.append(_row(key, acc, cost_units, s_units, share_s.get(key, 0), sorted(versions)))

    totals = ReportRow(key="total")
    for name in ROW_NUMBERS:
        setattr(totals, name, sum((getattr(r, name) for r in rows), Decimal(0)))
    totals.efficiency = _ratio(totals.used_gpu_hours, totals.sampled_gpu_hours)
    totals.rate_versions = sorted({v for r in rows for v in r.rate_versions} | idle_versions)
    return Report(
        by=by,
        start=start,
        end=end,
        currency=card.currency,
        share_idle=share_idle,
        rows=rows,
        totals=totals,
        idle_capacity=IdleCapacity(
            capacity_gpu_hours=hours(cap_s),
            allocated_gpu_hours=hours(alloc_s),
            unallocated_gpu_hours=hours(unalloc_s),
            cost=_from_units(idle_units),
            shared=share_idle,
        ),
        unpriced_gpu_hours=hours(unpriced_s),
        rate_versions=totals.rate_versions,
        unnamed_models={v: sorted(models) for v, models in sorted(unnamed.items())},
        unknown_team_queues=sorted(set(card.teams) - set(queues) - set(queue_alloc)),
    )


def _price(v: RateVersion, gpu_rate: Fraction, pclass: str, u: Usage) -> Fraction:
    amount: Fraction = (
        u.alloc_gpu_s * gpu_rate
        + u.borrowed_gpu_s * gpu_rate * (Fraction(v.borrowed_premium) - 1)
        + Fraction(u.cpu_mcore_s, 1000) * Fraction(v.cpu_core_hour)
        + Fraction(u.mem_mib_s, 1024) * Fraction(v.memory_gib_hour)
    ) / HOUR
    discount = v.priority_discounts.get(pclass)
    if discount is not None:
        amount *= 1 - Fraction(discount)
    return amount


def _shares(
    mode: ShareIdle,
    by: GroupBy,
    groups: Mapping[str, _Acc],
    queues: Mapping[str, QueueRecord],
    card: RateCard,
    queue_alloc: Mapping[str, int],
    job_queue_alloc: Mapping[str, Mapping[str, int]],
    idle_units: int,
    idle_s: int,
) -> tuple[dict[str, int], dict[str, int]]:
    """Each group's share of the idle cost (money units) and of idle GPU-seconds."""
    if mode == "none":
        return {}, {}
    if mode == "usage":
        weights = [(k, a.usage.alloc_gpu_s) for k, a in groups.items()]
        return split(idle_units, weights), split(idle_s, weights)
    nominal = [(q, r.nominal_gpu) for q, r in queues.items()]
    if by == "queue":
        return split(idle_units, nominal), split(idle_s, nominal)
    if by == "team":
        team_w: dict[str, int] = {}
        for q, w in nominal:
            team_w[card.team_of(q)] = team_w.get(card.team_of(q), 0) + w
        items = list(team_w.items())
        return split(idle_units, items), split(idle_s, items)
    # by job: each queue's share goes to its jobs in proportion to their allocation;
    # a queue with nominal quota but no jobs in the window keeps its share on a `[queue]` row
    money: dict[str, int] = {}
    secs: dict[str, int] = {}
    for q, units in split(idle_units, nominal).items():
        jobs = job_queue_alloc.get(q, {})
        money.update(split(units, jobs.items()) if queue_alloc.get(q) else {f"[{q}]": units})
    for q, s in split(idle_s, nominal).items():
        jobs = job_queue_alloc.get(q, {})
        secs.update(split(s, jobs.items()) if queue_alloc.get(q) else {f"[{q}]": s})
    return money, secs


def _ratio(num: Decimal, den: Decimal) -> Decimal | None:
    if den == 0:
        return None
    return (num / den).quantize(_RATIO_Q)


def _row(key: str, acc: _Acc, cost_units: int, share_units: int, share_s: int, versions: list[str]) -> ReportRow:
    u = acc.usage
    used = hours(u.used_mgpu_s, 1000)
    sampled = hours(u.sampled_gpu_s)
    return ReportRow(
        key=key,
        queue=acc.queue,
        team=acc.team,
        allocated_gpu_hours=hours(u.alloc_gpu_s),
        used_gpu_hours=used,
        idle_gpu_hours=hours(u.idle_mgpu_s, 1000),
        sampled_gpu_hours=sampled,
        borrowed_gpu_hours=hours(u.borrowed_gpu_s),
        lost_gpu_hours=hours(u.lost_gpu_s),
        cpu_core_hours=hours(u.cpu_mcore_s, 1000),
        memory_gib_hours=hours(u.mem_mib_s, 1024),
        efficiency=_ratio(Decimal(u.used_mgpu_s), Decimal(u.sampled_gpu_s * 1000)),
        cost=_from_units(cost_units),
        idle_share_gpu_hours=hours(share_s),
        idle_share_cost=_from_units(share_units),
        total_cost=_from_units(cost_units + share_units),
        rate_versions=versions,
    )


# ---------------------------------------------------------------- time series (plots)


class HourPoint(msgspec.Struct, kw_only=True):
    hour: int
    allocated_by_queue: dict[str, int]
    """Queue -> allocated GPU-seconds in the hour."""
    used_mgpu_s: int = 0
    sampled_gpu_s: int = 0
    capacity_gpu_s: int = 0
    allocated_by_flavor: dict[str, int] = {}
    """Flavor (the ledger's model: a node's flavor, else its GPU model; "-" for none) -> allocated GPU-seconds."""
    used_by_flavor: dict[str, int] = {}
    """Flavor -> used milli-GPU-seconds."""
    capacity_by_flavor: dict[str, int] = {}
    """Flavor -> capacity GPU-seconds."""


def hourly_series(
    usage: Iterable[tuple[UsageKey, Usage]],
    capacity: Iterable[tuple[CapacityKey, int]],
    *,
    start: int,
    end: int,
) -> list[HourPoint]:
    """Per hour of the window: allocated GPU-seconds per queue, used, sampled and capacity, each also per
    flavor (hours in order)."""
    points: dict[int, HourPoint] = {}

    def point(hour: int) -> HourPoint:
        p = points.get(hour)
        if p is None:
            p = points[hour] = HourPoint(
                hour=hour, allocated_by_queue={}, allocated_by_flavor={}, used_by_flavor={}, capacity_by_flavor={}
            )
        return p

    for (_job, hour, model), row in usage:
        if in_window(hour, start, end):
            p = point(hour)
            p.allocated_by_queue[row.queue] = p.allocated_by_queue.get(row.queue, 0) + row.alloc_gpu_s
            p.used_mgpu_s += row.used_mgpu_s
            p.sampled_gpu_s += row.sampled_gpu_s
            flavor = model or "-"
            p.allocated_by_flavor[flavor] = p.allocated_by_flavor.get(flavor, 0) + row.alloc_gpu_s
            p.used_by_flavor[flavor] = p.used_by_flavor.get(flavor, 0) + row.used_mgpu_s
    for (hour, model), gpu_s in capacity:
        if in_window(hour, start, end):
            p = point(hour)
            p.capacity_gpu_s += gpu_s
            flavor = model or "-"
            p.capacity_by_flavor[flavor] = p.capacity_by_flavor.get(flavor, 0) + gpu_s
    return [points[h] for h in sorted(points)]
