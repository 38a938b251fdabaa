"""Why a flavor's quota does not hold a flavored job's request: the words of its verdict, and the keys they hang on.

A flavor the quota stops is named with the limit that stops it (`assignment`'s reasons,
shown by `explain` and stored in `JobInadmissible`): more requested than nominal (no cohort)
or than nominal plus borrowing limit, a borrowing limit reached, nominal quota in use, or a
cohort with no room to lend. The words are built anew at every try of every waiting flavored
job, so their parts are split by what they depend on: what a request asks of the flavor's
quota and those keys' limits come from the queue's configuration alone (`quota_asked`, kept
in a class's `flavorplan.Plan`); which borrowing limit the queue's use reaches comes from the
cycle's quota tree (`limit_reached`); the words are a pure function of both (`words_of`,
cached, so a queue's jobs asking alike share them).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING

from muster.projections.resources import fmt
from muster.projections.state import QueueState

if TYPE_CHECKING:
    from muster.projections.cycle import Cycle


def quota_asked(
    queue: QueueState, requests: Mapping[str, int], flavor: str | None
) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int, int | None], ...]]:
    """What a request asks of a flavor's quota (all flavors': None), and those keys' (nominal, borrowing
    limit): the part of `quota_words` that the queue's configuration alone gives."""
    suffix = f"@{flavor}" if flavor is not None else ""
    nominal, limits = queue.nominal, queue.borrowing_limit or {}
    asked = tuple((k, v) for k, v in requests.items() if v > 0 and k in nominal and k.endswith(suffix))
    return asked, tuple((k, nominal[k], limits.get(k)) for k, _ in asked)


def quota_words(
    cycle: Cycle,
    queue: QueueState,
    asked: tuple[tuple[str, int], ...],
    quota: tuple[tuple[str, int, int | None], ...],
    allow_borrow: bool,
) -> tuple[str, tuple[str, ...]]:
    """Why a flavor's quota does not hold the request (which of its limits stops it), and the keys
    whose use decides between "limit reached" and "no room to lend" (`asked`, `quota`: `quota_asked`)."""
    reached = limit_reached(cycle, queue, asked, quota)
    return words_of(asked, quota, allow_borrow, queue.cohort is not None, reached)


def limit_reached(
    cycle: Cycle, queue: QueueState, asked: tuple[tuple[str, int], ...], quota: tuple[tuple[str, int, int | None], ...]
) -> str | None:
    """The first key of `asked` whose borrowing limit the queue's use with the request would pass."""
    usage = cycle.idx.quota.queues[queue.name].usage
    for (k, v), (_, n, lim) in zip(asked, quota, strict=True):
        if lim is not None and usage.get(k, 0) + v > n + lim:
            return k
    return None


@functools.lru_cache(maxsize=4096)
def words_of(
    asked: tuple[tuple[str, int], ...],
    quota: tuple[tuple[str, int, int | None], ...],
    allow_borrow: bool,
    cohort: bool,
    reached: str | None,
) -> tuple[str, tuple[str, ...]]:
    """`quota_words` of a request (`asked`) and its keys' (nominal, borrowing limit) in `quota`, the
    first key whose borrowing limit the tree's use reaches: a pure function of them, so a queue's jobs
    asking alike share the words (the reason of every waiting flavored job is built anew each try)."""

    def short(d: Mapping[str, int]) -> str:
        return fmt({k.partition("@")[0]: v for k, v in d.items()})

    nominal = {k: n for k, n, _ in quota}
    limits = {k: lim for k, _, lim in quota if lim is not None}
    wanted = dict(asked)
    if not allow_borrow:
        return f"quota (nominal {short(nominal)} in use; a non-preemptible job never borrows)", ()
    if not cohort:
        if any(v > nominal[k] for k, v in asked):
            return f"quota ({short(wanted)} requested is more than nominal {short(nominal)})", ()
        return f"quota (nominal {short(nominal)} in use; no cohort to borrow from)", ()
    for k, v in asked:
        if k in limits and v > nominal[k] + limits[k]:
            most = f"nominal {short({k: nominal[k]})} + borrowing limit {short({k: limits[k]})}"
            return f"quota ({short({k: v})} requested is more than {most})", ()
    if reached is not None:
        return f"quota (borrowing limit {short({reached: limits[reached]})} reached)", ()
    return f"quota (nominal {short(nominal)} in use; the cohort has no room to lend)", tuple(sorted(limits))
