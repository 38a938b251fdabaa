"""Warm start: a replica starts from the newest verified snapshot and folds only the log's tail.

A daemon that folded the log from sequence 1 would take longer to start (and a
new leader longer to take over after a restart) the longer the log grows.
The snapshot sidecar (`muster snapshot --follow`) keeps verified snapshots of
the fold every N events (`replay.snapshots`); a starting replica loads the
newest one the stream's end covers, after the checks `Snapshots.nearest`
makes on every load (integrity, same code, same log, verified against a
fresh fold), so the state it starts from is the fold of the log up to that
sequence, byte for byte: replay, audit and a new leader reach the same state
whether they folded the snapshot's prefix or loaded it.

What a new leader applies again at the start of its term is derived from
the state too (`reapply`), so it owes the cluster the same decisions whether
it started warm or cold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import structlog

from muster.events.store import EventStore
from muster.projections.state import ClusterState
from muster.replay.snapshots import Snapshots
from muster.replay.snapshotstores import NatsSnapshots, default_bucket
from muster.replay.source import NatsLog

__all__ = ["SnapshotStart", "Start", "StartingPoint", "stream_snapshots"]

log = structlog.get_logger("muster.loop")


@dataclass(frozen=True)
class Start:
    """A trusted state: the fold of the log's sequences 1..seq."""

    state: ClusterState
    seq: int


class StartingPoint(Protocol):
    """Where a replica's fold starts instead of the empty state."""

    async def load(self, end: int) -> Start | None:
        """The newest trusted state at or before sequence `end`; None to fold from the start."""
        ...


class SnapshotStart:
    """The newest verified snapshot (`replay.snapshots`); any trouble reading them means a cold start."""

    def __init__(self, snapshots: Snapshots) -> None:
        self.snapshots = snapshots

    async def load(self, end: int) -> Start | None:
        try:
            loaded = await self.snapshots.nearest(max_seq=end, verify="marks")
        except Exception as exc:  # an unreadable bucket must not stop the daemon: fold from the start
            log.warning("cannot load a snapshot; folding the log from its start", error=f"{type(exc).__name__}: {exc}")
            return None
        for discarded in loaded.discarded:
            log.warning("snapshot not used", seq=discarded.seq, reason=discarded.reason)
        if loaded.seq == 0:
            return None
        log.info("starting from a snapshot", seq=loaded.seq, snapshot=loaded.meta.seq if loaded.meta else None)
        return Start(loaded.state, loaded.seq)


async def stream_snapshots(store: EventStore) -> SnapshotStart | None:
    """The snapshots the chart's sidecar writes for `store`'s stream (bucket `<stream>-snapshots`), if any.

    Opened read-only: the daemon never writes snapshots (the sidecar does), and no bucket means a cold start.
    """
    try:
        backend = await NatsSnapshots.open(store.js, default_bucket(store.stream), create=False)
    except Exception as exc:  # not allowed to read it, NATS trouble: fold from the start
        log.warning("cannot open the snapshots; folding the log from its start", error=f"{type(exc).__name__}: {exc}")
        return None
    return None if backend is None else SnapshotStart(Snapshots(backend, NatsLog(store)))
