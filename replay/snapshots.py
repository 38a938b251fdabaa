"""Loading the nearest trustworthy snapshot of the folded cluster state, so replay to a point costs the events since.

Role: `Snapshots` ties a backend (`snapshotstores`) to one log; `nearest` finds
the trusted state nearest at or before a point, checking each snapshot it
passes; `write` stores one (`snapshotcodec` is the stored form; who writes, and
when, is `snapshotwriter`). `fold_range` folds a stretch of the log onto a state.

Why a snapshot can be trusted (checked on every load, cheapest first):
1. Integrity: the SHA-256 of the stored bytes (and their size) match what was
   recorded when it was written (the object store checks its own digest too);
   a torn or bit-flipped snapshot is discarded.
2. Same code: `fingerprint()` hashes the state's msgspec schema and the fold's
   source (`projections/state.py`, `cluster.py`, `configuration.py`). A
   snapshot of another muster version is skipped (not deleted: that version
   may still be running and use it), and the state is folded from an older one
   or from the start.
3. Same log: the anchor is the SHA-256 of the stored event at the snapshot's
   sequence; a snapshot whose anchor differs (a recreated stream, another log)
   is discarded.
4. Same state as a fresh fold: a snapshot is *verified* when the fold of the
   log from a trusted point (the empty state, or an older verified snapshot)
   up to its sequence equals it (`==` on the decoded structs, which ignores
   dict order). The verification is recorded in the snapshot's metadata
   (`verified` = the SHA-256 of its bytes), so it happens once per snapshot;
   a later change of the bytes voids the mark. An unverified snapshot is
   checked the first time a load passes it, by folding from the nearest
   verified one below it, so the first load pays one extra interval and
   later loads none. A snapshot that does not match is discarded and
   reported. Induction from the empty state makes every verified snapshot
   the fold of its whole prefix; `verify="full"` re-checks the whole chain
   from the start (`muster snapshot --verify`).

Invariants: a discarded snapshot is deleted from the backend and reported
with its sequence and reason; a load never returns a state it did not check
as above; all I/O goes through the `SnapshotBackend` protocol.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from muster.events.types import AnyEvent
from muster.projections.cluster import evolve
from muster.projections.state import ClusterState
from muster.replay.heap import no_gc
from muster.replay.snapshotcodec import (
    FORMATS,
    SnapshotError,
    SnapshotMeta,
    decode_state,
    encode_state,
    fingerprint,
    sha256,
)
from muster.replay.snapshotstores import SnapshotBackend
from muster.replay.source import LogSource

Verify = Literal["marks", "full", "none"]


@dataclass
class Discarded:
    """A snapshot that was not used, and why (`deleted`: it was proven wrong and removed)."""

    seq: int
    reason: str
    deleted: bool = True

    def __str__(self) -> str:
        what = "discarded" if self.deleted else "skipped"
        return f"snapshot at seq {self.seq} {what}: {self.reason}"


@dataclass
class Loaded:
    """A trusted state: the fold of sequences 1..seq."""

    state: ClusterState
    seq: int
    meta: SnapshotMeta | None
    """The snapshot the state came from (None: folded from the empty state)."""
    base: int = 0
    """The trusted point the load started from: a verified snapshot's sequence, or 0 (the empty state)."""
    checked: list[int] = field(default_factory=list)
    """Snapshots this load fold-checked and found equal to the fold."""
    verified_now: list[int] = field(default_factory=list)
    """Of those, the ones it marked verified (they were not yet)."""
    folded: int = 0
    """Events folded to check snapshots."""
    discarded: list[Discarded] = field(default_factory=list)


async def fold_range(
    source: LogSource, state: ClusterState, from_seq: int, to_seq: int | None, until: int | None = None
) -> tuple[int, int]:
    """Fold sequences from_seq..to_seq (stopping before an event later than `until`) into `state`.

    Returns (last sequence folded or from_seq - 1, events folded).
    """
    last = from_seq - 1
    count = 0
    if to_seq is not None and from_seq > to_seq:
        return last, count
    async for batch in source.batches(from_seq, to_seq, until=until):
        ev: AnyEvent
        with no_gc():  # not across the read: a caller's other tasks (a daemon's, a server's) run meanwhile
            for _, ev in batch:
                evolve(state, ev)
        count += len(batch)
        last = batch[-1][0]
    return last, count


class Snapshots:
    """A backend tied to one log: load the nearest trusted state, write new snapshots."""

    def __init__(
        self,
        backend: SnapshotBackend,
        source: LogSource,
        *,
        report: Callable[[Discarded], None] | None = None,
    ) -> None:
        self.backend = backend
        self.source = source
        self.report = report

    def _discard(self, out: list[Discarded], d: Discarded) -> None:
        out.append(d)
        if self.report is not None:
            self.report(d)

    async def write(
        self, state: ClusterState, seq: int, *, fmt: str = "msgpack+zlib", verified_from: int | None = None
    ) -> SnapshotMeta:
        """Store `state` as the fold of 1..seq (as JSON, the returned meta says, if `fmt` cannot hold it).

        With `verified_from`, mark it verified: the caller folded it from that trusted point.
        """
        raw = await self.source.raw(seq)
        if raw is None:
            raise ValueError(f"seq {seq} is past the end of the log {self.source.name}")
        try:
            data = encode_state(state, fmt)
        except OverflowError:
            # msgpack holds 64-bit integers only; a job past MAX_QUANTITY (rejected, but folded) needs JSON
            fmt = "json"
            data = encode_state(state, fmt)
        digest = sha256(data)
        meta = SnapshotMeta(
            seq=seq,
            at=state.now,
            stream=self.source.name,
            format=fmt,
            size=len(data),
            sha256=digest,
            fingerprint=fingerprint(),
            anchor=sha256(raw),
            jobs=len(state.jobs),
            written=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            verified=digest if verified_from is not None else "",
            verified_from=verified_from,
        )
        await self.backend.put(meta, data)
        return meta

    async def catalog(self) -> list[SnapshotMeta]:
        """Every snapshot's metadata, oldest first."""
        return sorted(await self.backend.list(), key=lambda m: m.seq)

    async def open(self, meta: SnapshotMeta, discarded: list[Discarded]) -> ClusterState | None:
        """Read and check one snapshot (integrity, code, log); None when it cannot be used (reported)."""
        if meta.fingerprint != fingerprint() or meta.format not in FORMATS:
            self._discard(
                discarded,
                Discarded(
                    meta.seq, "written by another muster version (state schema or fold code differ)", deleted=False
                ),
            )
            return None
        reason = None
        state: ClusterState | None = None
        try:
            data = await self.backend.get(meta.name)
        except SnapshotError as exc:
            reason = f"unreadable ({exc})"
        else:
            if len(data) != meta.size or sha256(data) != meta.sha256:
                reason = "checksum mismatch: the stored bytes are not the ones written"
            else:
                raw = await self.source.raw(meta.seq)
                if raw is None:
                    reason = f"the log {self.source.name} ends before seq {meta.seq}"
                elif sha256(raw) != meta.anchor:
                    reason = f"the event at seq {meta.seq} is not the one it was taken after (another log?)"
                else:
                    try:
                        state = decode_state(data, meta.format)
                    except ValueError as exc:
                        reason = str(exc)
        if state is None:
            await self.backend.delete(meta.name)
            self._discard(discarded, Discarded(meta.seq, reason or "unusable"))
        return state

    async def nearest(self, *, max_seq: int, max_time: int | None = None, verify: Verify = "marks") -> Loaded:
        """The trusted state nearest at or before `max_seq` (and not later than `max_time`).

        `marks`: verified snapshots are trusted after the integrity checks;
        unverified ones at or below the point are fold-checked from the nearest
        trusted one below them. `full`: every snapshot is fold-checked from the
        empty state. `none`: integrity checks only.
        """
        discarded: list[Discarded] = []
        metas = [m for m in await self.catalog() if m.seq <= max_seq and (max_time is None or m.at <= max_time)]
        start: Loaded | None = None
        pending: list[SnapshotMeta] = []
        if verify != "full":
            for meta in reversed(metas):
                if verify == "marks" and not meta.is_verified:
                    pending.append(meta)
                    continue
                state = await self.open(meta, discarded)
                if state is not None:
                    start = Loaded(state, meta.seq, meta)
                    break
            pending.reverse()
        else:
            pending = list(metas)
        if start is None:
            start = Loaded(ClusterState(), 0, None)
        start.discarded = discarded
        start.base = base_seq = start.seq
        for meta in pending:
            if meta.seq <= start.seq:
                continue
            _, n = await fold_range(self.source, start.state, start.seq + 1, meta.seq)
            start.folded += n
            start.seq = meta.seq
            snap = await self.open(meta, discarded)
            if snap is None:
                continue
            if snap != start.state:
                await self.backend.delete(meta.name)
                self._discard(
                    discarded,
                    Discarded(
                        meta.seq, f"does not match a fresh fold of seq 1..{meta.seq} (folded from {_from(base_seq)})"
                    ),
                )
                continue
            start.meta = meta
            start.checked.append(meta.seq)
            if not meta.is_verified:
                marked = msgspec.structs.replace(meta, verified=meta.sha256, verified_from=base_seq)
                try:
                    await self.backend.set_meta(marked)
                    start.meta = marked
                except Exception:  # a reader without write access still uses what it checked
                    pass
                start.verified_now.append(meta.seq)
            base_seq = meta.seq
        return start


def _from(seq: int) -> str:
    return "the empty state" if seq == 0 else f"the verified snapshot at seq {seq}"
