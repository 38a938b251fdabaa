"""The rate card of chargeback: its versions, read and checked (`parse_rate_card`).

A rate card is a list of versions, each effective from a date (or epoch
second) on the hour (the ledger books by the hour), with GPU rates per model, CPU and memory rates, a borrowed premium
and discounts per priority class; `teams` maps queues to teams. Bad input
raises `RateCardError` with a message that says where. Pricing with it is
`chargeback`.
"""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

import msgspec

from muster.projections.ledger import HOUR

_DATES_FROM = 10**9
"""Effective times from here on (2001) are dates; below, seconds of a simulation's clock."""


class RateCardError(ValueError):
    """The rate card is not valid; the message says where."""


class RateVersion(msgspec.Struct, frozen=True, kw_only=True):
    version: str
    effective_from: int
    """Epoch seconds (or virtual seconds) from which this version applies."""
    gpu_hour: dict[str, Decimal] = {}
    """GPU model (node label value) -> price per GPU-hour."""
    default_gpu_hour: Decimal = Decimal(0)
    cpu_core_hour: Decimal = Decimal(0)
    memory_gib_hour: Decimal = Decimal(0)
    borrowed_premium: Decimal = Decimal(1)
    """Multiplier on the GPU price of GPU-hours run on borrowed quota."""
    priority_discounts: dict[str, Decimal] = {}
    """Priority class -> fraction taken off the charge (0.6 = 60 % off)."""

    def gpu_rate(self, model: str) -> Decimal:
        return self.gpu_hour.get(model, self.default_gpu_hour)


class RateCard(msgspec.Struct, frozen=True, kw_only=True):
    versions: list[RateVersion]
    """Sorted by `effective_from`."""
    currency: str = ""
    teams: dict[str, str] = {}
    """Queue -> team; a queue not named here is its own team."""

    def team_of(self, queue: str) -> str:
        return self.teams.get(queue, queue)

    def version_at(self, t: int) -> RateVersion | None:
        starts = [v.effective_from for v in self.versions]
        i = bisect.bisect_right(starts, t) - 1
        return self.versions[i] if i >= 0 else None


def parse_time(value: object) -> int:
    """Epoch seconds from an int, an ISO date or datetime (UTC unless it says otherwise), or a YAML date."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a time")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.lstrip("-").isdigit():
            return int(text)
        try:
            value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{value!r} is not a time (epoch seconds, 2025-01-31 or 2025-01-31T12:00:00Z)") from None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return int(value.timestamp())
    if isinstance(value, dt.date):
        return int(dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC).timestamp())
    raise ValueError(f"{value!r} is not a time")


def _when(t: int) -> str:
    """An effective time as a card could say it: ISO UTC for a date, seconds for a simulation's clock."""
    if t < _DATES_FROM:
        return str(t)
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _money(where: str, value: object) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise RateCardError(f"{where}: {value!r} is not a number")
    try:
        d = Decimal(str(value))
    except InvalidOperation:
        raise RateCardError(f"{where}: {value!r} is not a number") from None
    if not d.is_finite() or d < 0:
        raise RateCardError(f"{where}: {value!r} must be a non-negative number")
    return d


def _mapping(where: str, value: object) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RateCardError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def parse_rate_card(data: object) -> RateCard:
    """A RateCard from the parsed YAML document; raises RateCardError naming the bad field.

    ```yaml
    currency: USD
    teams: {research-a: research, research-b: research}
    versions:
      - version: "2025-01"
        effective_from: 2025-01-01
        gpu_hour: {default: 2.50, NVIDIA-H100-80GB-HBM3: 4.00}
        cpu_core_hour: 0.04
        memory_gib_hour: 0.005
        borrowed_premium: 1.25
        priority_discounts: {scavenger: 0.6}
    ```
    """
    doc = _mapping("rate card", data)
    raw_versions = doc.get("versions")
    if not isinstance(raw_versions, list) or not raw_versions:
        raise RateCardError("rate card: `versions` must be a non-empty list")
    versions: list[RateVersion] = []
    for i, raw in enumerate(raw_versions):
        where = f"versions[{i}]"
        v = _mapping(where, raw)
        name = v.get("version")
        if not isinstance(name, (str, int)) or isinstance(name, bool) or str(name) == "":
            raise RateCardError(f"{where}: `version` (a name) is required")
        where = f"version {name}"
        if "effective_from" not in v:
            raise RateCardError(f"{where}: `effective_from` is required")
        try:
            start = parse_time(v["effective_from"])
        except ValueError as exc:
            raise RateCardError(f"{where}: effective_from: {exc}") from None
        if start % HOUR:
            # a ledger row is one hour, priced by the version in force at its start: a version taking
            # effect mid-hour would silently start at the next hour instead
            before, after = _when(start - start % HOUR), _when(start - start % HOUR + HOUR)
            raise RateCardError(
                f"{where}: effective_from {v['effective_from']} is not on the hour: the ledger books GPU-hours "
                f"per hour (UTC), so prices can change only at the start of one ({before} or {after})"
            )
        gpu = {
            str(k): _money(f"{where}: gpu_hour.{k}", p)
            for k, p in _mapping(f"{where}: gpu_hour", v.get("gpu_hour")).items()
        }
        default = gpu.pop("default", Decimal(0))
        discounts = {
            str(k): _money(f"{where}: priority_discounts.{k}", d)
            for k, d in _mapping(f"{where}: priority_discounts", v.get("priority_discounts")).items()
        }
        for k, d in discounts.items():
            if d > 1:
                raise RateCardError(f"{where}: priority_discounts.{k} is a fraction (0..1), got {d}")
        premium = _money(f"{where}: borrowed_premium", v.get("borrowed_premium", 1))
        versions.append(
            RateVersion(
                version=str(name),
                effective_from=start,
                gpu_hour=gpu,
                default_gpu_hour=default,
                cpu_core_hour=_money(f"{where}: cpu_core_hour", v.get("cpu_core_hour", 0)),
                memory_gib_hour=_money(f"{where}: memory_gib_hour", v.get("memory_gib_hour", 0)),
                borrowed_premium=premium,
                priority_discounts=discounts,
            )
        )
    versions.sort(key=lambda x: x.effective_from)
    for a, b in itertools.pairwise(versions):
        if a.effective_from == b.effective_from:
            raise RateCardError(f"versions {a.version} and {b.version} take effect at the same time")
    names = [v.version for v in versions]
    if len(set(names)) != len(names):
        raise RateCardError("rate card: version names must be unique")
    teams = {str(q): str(t) for q, t in _mapping("teams", doc.get("teams")).items()}
    currency = doc.get("currency", "")
    return RateCard(versions=versions, currency=str(currency), teams=teams)
