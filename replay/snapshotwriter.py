"""Writing snapshots as the log is folded: one whenever the sequence crosses a multiple of N.

Role: `Snapshotter.maybe_snapshot` (usable by any writer that folds, like the
daemon's leader) and `write_snapshots` (`muster snapshot`, once or following
the stream), with the leader gates that let one replica's writer write.

Snapshots written by `muster snapshot` are verified by construction: it folds
from a trusted point and writes what it folded. A writer that did not
(`Snapshotter(trusted_from=None)`) leaves its snapshots to be verified on load.

Who writes in production: `muster snapshot --follow --leader BUCKET/KEY` (or
`--log-leader`), a sidecar of every daemon replica (the Helm chart's
`snapshots` container). Every replica's sidecar folds the log; only the one
whose holder name the daemon's leader key names (`KvLeaderGate`, read before
each write), or the log's last `LeaderElected` names (`LogLeaderGate`, for
either election backend), writes, so one snapshot is written per N events,
not one per replica. The gate is a
courtesy, not a safety condition: snapshots are keyed by sequence and
verified on load, so a double write at a handover (two sidecars that both
saw their name within a TTL of each other) stores the same fold twice under
one name; should the two puts interleave so that the stored one cannot be
read back intact, it is discarded on load like any torn snapshot and replay
starts from an older one. Nothing depends on exactly one writer.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable
from typing import Any, Protocol

from muster.events.leases import LEADER_KEY, LEADER_NAME, holder_of
from muster.projections.cluster import evolve
from muster.projections.state import ClusterState
from muster.replay.heap import no_gc
from muster.replay.snapshotcodec import SnapshotMeta
from muster.replay.snapshots import Snapshots
from muster.replay.source import LogSource

DEFAULT_EVERY = 50_000


class LeaderGate(Protocol):
    """Whether this writer may write now (asked before each write, with the state folded; an error reads "no")."""

    async def allows(self, state: ClusterState) -> bool: ...

    def why_not(self) -> str: ...


class LogLeaderGate:
    """Allows writes while the log's current leader (its last `LeaderElected` folded) is `holder`.

    The daemon announces each term on the log with its identity, whichever
    election backend gave it the lease (NATS KV or a Kubernetes Lease), and
    the writer folds that log anyway: so this gate needs no access to the
    lease, and a replica that lost its lease stops writing once its
    successor's announcement is folded.
    """

    def __init__(self, holder: str) -> None:
        self.holder = holder
        self.last_seen: str | None = None

    async def allows(self, state: ClusterState) -> bool:
        self.last_seen = state.leader or None
        return self.last_seen == self.holder

    def why_not(self) -> str:
        if self.last_seen is None:
            return "no leader has announced itself on the log"
        return f"the log's leader is {self.last_seen!r}, not {self.holder!r}"


LEADER_BUCKET = LEADER_NAME
"""Where the daemon's `KvElector` keeps its lease (its default; the chart's `leaderElection.kvBucket`)."""


class KvLeaderGate:
    """Allows writes while the daemon's leader key (a NATS KV entry) names `holder`.

    The daemon's elector stores the holder's name (UTF-8) under `key` in the
    KV bucket `bucket`, created with a TTL and refreshed every TTL/5; the key
    disappears when its holder stops refreshing. This reads that entry as
    stored (the daemon's package is not imported: replay and daemon are
    separate layers). A missing bucket or key, a deleted key, another name or
    any NATS trouble means "not ours": the write is skipped, never retried
    later, and the writer carries on following the log.
    """

    def __init__(self, js: Any, holder: str, *, bucket: str = LEADER_BUCKET, key: str = LEADER_KEY) -> None:
        self.js = js
        self.holder = holder
        self.bucket = bucket
        self.key = key
        self.kv: Any = None
        self.last_seen: str | None = None
        """The holder named at the last check (None: nobody, or unreadable)."""
        self.last_error: str | None = None

    async def current(self) -> str | None:
        """The name the leader key holds now; None when no one holds it. Raises on NATS trouble."""
        from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError

        if self.kv is None:
            try:
                self.kv = await self.js.key_value(self.bucket)
            except (BucketNotFoundError, NotFoundError):
                return None  # no daemon has campaigned yet; look again at the next write
        try:
            entry = await self.kv.get(self.key)
        except (KeyNotFoundError, NotFoundError):
            return None  # expired (TTL), resigned (deleted) or never won
        return holder_of(entry.value)

    async def allows(self, state: ClusterState | None = None) -> bool:
        try:
            self.last_seen = await self.current()
            self.last_error = None
        except Exception as exc:  # NATS trouble: skip this write rather than stop following
            self.kv = None
            self.last_seen = None
            self.last_error = f"{type(exc).__name__}: {exc}"
            return False
        return self.last_seen == self.holder

    def why_not(self) -> str:
        """Why the last check said no, for a log line."""
        where = f"{self.bucket}/{self.key}"
        if self.last_error is not None:
            return f"cannot read the leader key {where} ({self.last_error})"
        if self.last_seen is None:
            return f"no one holds the leader key {where}"
        return f"the leader key {where} names {self.last_seen!r}, not {self.holder!r}"


class Snapshotter:
    """Writes a snapshot whenever the folded sequence crosses a multiple of `every`.

    A writer calls `maybe_snapshot(state, seq)` after folding; it is cheap when
    nothing is due. `trusted_from` marks the snapshots verified (only for a
    caller that folded from that trusted point, like `muster snapshot`).
    With a `gate`, a due snapshot is written only when the gate allows it
    (asked then, once per due point); a refused one is skipped for good and
    the next chance is the next multiple of `every`.
    """

    def __init__(
        self,
        snapshots: Snapshots,
        every: int = DEFAULT_EVERY,
        *,
        fmt: str = "msgpack+zlib",
        trusted_from: int | None = None,
        gate: LeaderGate | None = None,
    ) -> None:
        if every < 1:
            raise ValueError("every must be at least 1")
        self.snapshots = snapshots
        self.every = every
        self.fmt = fmt
        self.trusted_from = trusted_from
        self.gate = gate
        self.last = 0
        """The sequence of the last due point handled (written, or skipped by the gate)."""
        self.written: list[SnapshotMeta] = []
        self.skipped: list[int] = []
        """Due points the gate refused (another replica leads)."""

    async def start(self) -> None:
        """Continue after the newest existing snapshot."""
        metas = await self.snapshots.catalog()
        self.last = metas[-1].seq if metas else 0

    def due(self, seq: int) -> bool:
        return seq // self.every > self.last // self.every

    async def maybe_snapshot(self, state: ClusterState, seq: int) -> SnapshotMeta | None:
        """Write `state` (the fold of 1..seq) if a multiple of `every` was crossed since the last one."""
        if not self.due(seq):
            return None
        if self.gate is not None and not await self.gate.allows(state):
            # the leader's writer takes this one; ours is the next multiple, if we lead by then
            self.last = seq
            self.skipped.append(seq)
            return None
        meta = await self.snapshots.write(state, seq, fmt=self.fmt, verified_from=self.trusted_from)
        self.last = seq
        self.written.append(meta)
        return meta


async def write_snapshots(
    source: LogSource,
    snapshots: Snapshots,
    *,
    every: int,
    fmt: str = "msgpack+zlib",
    verify: bool = False,
    follow: bool = False,
    store: Any = None,
    gate: LeaderGate | None = None,
    progress: Callable[[int, SnapshotMeta | None], None] | None = None,
) -> dict[str, Any]:
    """Fold from the nearest trusted snapshot to the end, writing one whenever a multiple of `every` is crossed.

    What it writes is verified by construction (folded from a trusted point).
    With `follow` and the log's `store`, it then follows the stream and keeps
    writing, until cancelled (`muster snapshot --follow`, the chart's sidecar).
    With a `gate` (`KvLeaderGate`: the daemon's leader key names us), each
    due snapshot is written only if the gate allows it when it falls due; a
    follower keeps folding, so it writes at the next multiple once it leads.
    `progress(seq, meta)` is called at every due point (meta None: skipped).
    """
    t0 = time.perf_counter()
    last = await source.last_seq()
    loaded = await snapshots.nearest(max_seq=last, verify="full" if verify else "marks")
    writer = Snapshotter(snapshots, every, fmt=fmt, trusted_from=loaded.seq, gate=gate)
    writer.last = loaded.seq
    state, seq, folded = loaded.state, loaded.seq, loaded.folded

    async def at_due_point(s: int) -> None:
        meta = await writer.maybe_snapshot(state, s)
        if progress is not None:
            progress(s, meta)

    async for batch in source.batches(seq + 1, last):
        i = 0
        while i < len(batch):
            due = None
            with no_gc():  # up to the next due point: the snapshot's write awaits with the collector on
                for s, ev in itertools.islice(batch, i, None):
                    i += 1
                    evolve(state, ev)
                    if writer.due(s):
                        due = s
                        break
            if due is not None:
                await at_due_point(due)
        folded += len(batch)
        seq = batch[-1][0]
    if follow and store is not None:
        async with contextlib.aclosing(store.follow(seq + 1)) as events:
            async for s, ev in events:
                evolve(state, ev)
                seq = s
                if writer.due(s):
                    await at_due_point(s)
    return {
        "seq": seq,
        "started_from": "the empty state" if loaded.base == 0 else f"the verified snapshot at seq {loaded.base}",
        "written": [m.seq for m in writer.written],
        "skipped": writer.skipped,
        "checked": loaded.checked,
        "verified": loaded.verified_now,
        "discarded": [{"seq": d.seq, "reason": d.reason} for d in loaded.discarded],
        "folded": folded,
        "seconds": round(time.perf_counter() - t0, 3),
    }
