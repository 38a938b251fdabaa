"""The cluster state at any point of the log: nearest trusted snapshot, then the events since.

Role: the one place that turns (log, point, snapshots) into a `ClusterState`,
for `muster replay`, `explain`, `audit --from` and `whatif --from` (the state
just before their window: `state_before`). The cost
is the events since the nearest snapshot at or before the point (plus, once,
the interval that verifies an unverified snapshot; see `snapshots`); in the
archive's past, the state sealed at a segment's start may be the nearest
(`sealedstate`).

Invariant: the state returned equals `fold(events 1..seq)` of the log, with
`seq` the last sequence at or before the point (for a time T: before the first
event later than T). Tests compare it with the state the simulator held.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from muster.projections.state import ClusterState
from muster.replay.points import Point
from muster.replay.sealedstate import nearest_sealed
from muster.replay.snapshotcodec import SnapshotMeta
from muster.replay.snapshots import Discarded, Snapshots, Verify, fold_range
from muster.replay.source import ArchivedLog, LogSource


@dataclass
class Replayed:
    state: ClusterState
    seq: int
    """Last sequence at or before the point (0: nothing)."""
    last_seq: int
    """The end of the log when it was read."""
    snapshot: SnapshotMeta | None = None
    """The snapshot the fold started from (None: the empty state, or `sealed`)."""
    sealed: int | None = None
    """The sequence of the archive segment's sealed state the fold started from (None: not one)."""
    folded: int = 0
    """Events folded after the snapshot to reach the point."""
    verify_folded: int = 0
    """Events folded to verify snapshots on the way."""
    discarded: list[Discarded] = field(default_factory=list)
    seconds: float = 0.0


async def state_at(
    source: LogSource,
    point: Point,
    snapshots: Snapshots | None = None,
    *,
    verify: Verify = "marks",
) -> Replayed:
    """Rebuild the state at `point` (a sequence, a time, or the end of the log)."""
    t0 = time.perf_counter()
    last = await source.last_seq()
    target = last if point.seq is None else min(point.seq, last)
    if snapshots is not None:
        loaded = await snapshots.nearest(max_seq=target, max_time=point.time, verify=verify)
        state, seq, meta = loaded.state, loaded.seq, loaded.meta
        verify_folded, discarded = loaded.folded, loaded.discarded
    else:
        state, seq, meta, verify_folded, discarded = ClusterState(), 0, None, 0, []
    sealed_at = None
    if isinstance(source, ArchivedLog):  # the state sealed with an archive segment may be nearer
        sealed = await nearest_sealed(source, max_seq=target, max_time=point.time)
        if sealed.seq > seq:
            state, seq, meta, sealed_at = sealed.state, sealed.seq, None, sealed.seq
    folded_to, folded = await fold_range(source, state, seq + 1, target, until=point.time)
    if folded:
        seq = folded_to
    elif point.time is None:
        seq = max(seq, target)
    return Replayed(
        state=state,
        seq=seq,
        last_seq=last,
        snapshot=meta,
        sealed=sealed_at,
        folded=folded,
        verify_folded=verify_folded,
        discarded=discarded,
        seconds=time.perf_counter() - t0,
    )


async def states(
    source: LogSource,
    point: Point,
    snapshots: Snapshots | None = None,
    *,
    verify: Verify = "marks",
    watch: float | None = None,
) -> AsyncIterator[Replayed]:
    """The state at `point`; with `watch` (seconds), the same state again each time the log grew.

    A watcher folds only the events appended since its last look (`muster jobs --watch`), so
    each refresh costs what the cluster did in the meantime, not a replay.
    """
    import anyio

    replayed = await state_at(source, point, snapshots, verify=verify)
    yield replayed
    if watch is None:
        return
    while True:
        await anyio.sleep(watch)
        t0 = time.perf_counter()
        last, folded = await fold_range(source, replayed.state, replayed.seq + 1, None)
        if folded:
            replayed.seq = last
            replayed.last_seq = max(replayed.last_seq, last)
            replayed.folded = folded
            replayed.seconds = time.perf_counter() - t0
            yield replayed


@dataclass
class WindowStart:
    """The state just before a window of the log, and the first sequence of the window."""

    state: ClusterState
    from_seq: int


async def state_before(
    source: LogSource, start: Point | None, snapshots: Snapshots | None = None, *, verify: Verify = "marks"
) -> WindowStart:
    """The state just before a window that starts at `start` (`audit --from`, `whatif --from`).

    No start (or the end of the log) starts from the empty state at sequence 1.
    """
    if start is None or start.is_end:
        return WindowStart(ClusterState(), 1)
    before = Point(seq=start.seq - 1) if start.seq is not None else Point(time=(start.time or 0) - 1)
    if before.seq == 0:
        return WindowStart(ClusterState(), 1)
    replayed = await state_at(source, before, snapshots, verify=verify)
    return WindowStart(replayed.state, replayed.seq + 1)
