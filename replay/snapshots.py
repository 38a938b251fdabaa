"""Snapshots of the folded cluster state, so replay to a point costs the events since the last one.

Role: encode `ClusterState` with msgspec (msgpack, zlib level 1; or JSON) and
keep it, keyed by stream sequence, in a NATS object store bucket (never in
the event stream, which only the sealer purges), a directory, or memory; find the
nearest trustworthy snapshot at or before a point; write one every N events
(`Snapshotter.maybe_snapshot`, usable by the daemon's leader, and
`muster snapshot`).

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

Invariants: a discarded snapshot is deleted from the backend and reported
with its sequence and reason; a load never returns a state it did not check
as above; all I/O goes through the `SnapshotBackend` protocol.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import gc
import hashlib
import json
import os
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import msgspec

from muster.events.leases import LEADER_KEY, LEADER_NAME, holder_of
from muster.events.types import AnyEvent
from muster.projections import cluster as cluster_module
from muster.projections import configuration as configuration_module
from muster.projections import state as state_module
from muster.projections.cluster import evolve
from muster.projections.state import ClusterState
from muster.replay.source import LogSource

Format = Literal["msgpack+zlib", "msgpack", "json"]
FORMATS: tuple[str, ...] = ("msgpack+zlib", "msgpack", "json")
Verify = Literal["marks", "full", "none"]
DEFAULT_EVERY = 50_000


# ---------------------------------------------------------------- encoding


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic GC while building many small objects (decode, fold): 5-10x faster decodes.

    The fold and decoders make no reference cycles worth collecting early;
    the collector runs again on exit.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def encode_state(state: ClusterState, fmt: str = "msgpack+zlib") -> bytes:
    """The stored bytes of a state (the instance dict, i.e. the scheduler index, is not stored)."""
    if fmt == "json":
        return msgspec.json.encode(state)
    packed = msgspec.msgpack.encode(state)
    if fmt == "msgpack":
        return packed
    if fmt == "msgpack+zlib":
        return zlib.compress(packed, 1)
    raise ValueError(f"unknown snapshot format {fmt!r} (known: {', '.join(FORMATS)})")


def decode_state(data: bytes, fmt: str) -> ClusterState:
    """Decode stored bytes; raises ValueError on anything that is not a state in this format."""
    try:
        with no_gc():
            if fmt == "json":
                return msgspec.json.decode(data, type=ClusterState)
            if fmt == "msgpack":
                return msgspec.msgpack.decode(data, type=ClusterState)
            if fmt == "msgpack+zlib":
                return msgspec.msgpack.decode(zlib.decompress(data), type=ClusterState)
    except (msgspec.DecodeError, msgspec.ValidationError, zlib.error) as exc:
        raise ValueError(f"not a {fmt} cluster state: {exc}") from None
    raise ValueError(f"unknown snapshot format {fmt!r}")


@functools.cache
def fingerprint() -> str:
    """Identifies the state's schema and the fold's code: snapshots of another version are not used."""
    h = hashlib.sha256()
    h.update(msgspec.json.encode(msgspec.json.schema(ClusterState)))
    for source in (state_module.__file__, cluster_module.__file__, configuration_module.__file__):
        h.update(Path(source).read_bytes())
    return h.hexdigest()[:16]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class SnapshotMeta(msgspec.Struct, kw_only=True):
    """What is recorded with a snapshot (the object's description in NATS)."""

    seq: int
    """The state is the fold of sequences 1..seq."""
    at: int
    """`state.now`: the latest event time folded (time queries may start here when it is not later)."""
    stream: str
    format: str
    size: int
    sha256: str
    """Of the stored bytes."""
    fingerprint: str
    anchor: str
    """SHA-256 of the stored event at `seq`: ties the snapshot to one log."""
    jobs: int = 0
    written: str = ""
    """Wall-clock time of writing, for people."""
    verified: str = ""
    """The `sha256` a fold check (or a trusted writer) vouched for; empty until then."""
    verified_from: int | None = None
    """Sequence of the trusted point the check folded from (0: the empty state)."""

    @property
    def name(self) -> str:
        return snapshot_name(self.seq)

    @property
    def is_verified(self) -> bool:
        return bool(self.verified) and self.verified == self.sha256


def snapshot_name(seq: int) -> str:
    return f"seq-{seq:012d}"


class SnapshotError(Exception):
    """A snapshot's bytes cannot be read back intact."""


# ---------------------------------------------------------------- backends


class SnapshotBackend(Protocol):
    """Where snapshots live. `get` raises SnapshotError on bytes that fail the store's own checks."""

    async def put(self, meta: SnapshotMeta, data: bytes) -> None: ...

    async def list(self) -> list[SnapshotMeta]: ...

    async def get(self, name: str) -> bytes: ...

    async def set_meta(self, meta: SnapshotMeta) -> None: ...

    async def delete(self, name: str) -> None: ...


class MemorySnapshots:
    """Snapshots in a dict (tests, benchmarks, one-off analyses)."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[SnapshotMeta, bytes]] = {}

    async def put(self, meta: SnapshotMeta, data: bytes) -> None:
        self.items[meta.name] = (meta, data)

    async def list(self) -> list[SnapshotMeta]:
        return [m for m, _ in self.items.values()]

    async def get(self, name: str) -> bytes:
        try:
            return self.items[name][1]
        except KeyError:
            raise SnapshotError(f"{name}: no such snapshot") from None

    async def set_meta(self, meta: SnapshotMeta) -> None:
        if meta.name in self.items:
            self.items[meta.name] = (meta, self.items[meta.name][1])

    async def delete(self, name: str) -> None:
        self.items.pop(name, None)


class DirSnapshots:
    """Snapshots as files `NAME.snap` + `NAME.json` in a directory (for file logs); writes are atomic renames."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _write(self, target: Path, data: bytes) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(target.suffix + f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, target)

    async def put(self, meta: SnapshotMeta, data: bytes) -> None:
        self._write(self.path / f"{meta.name}.snap", data)
        self._write(self.path / f"{meta.name}.json", msgspec.json.encode(meta))

    async def list(self) -> list[SnapshotMeta]:
        out: list[SnapshotMeta] = []
        if not self.path.is_dir():
            return out
        for p in sorted(self.path.glob("seq-*.json")):
            try:
                out.append(msgspec.json.decode(p.read_bytes(), type=SnapshotMeta))
            except (OSError, msgspec.DecodeError, msgspec.ValidationError):
                continue  # not ours, or half-written by a crashed writer: never trusted
        return out

    async def get(self, name: str) -> bytes:
        try:
            return (self.path / f"{name}.snap").read_bytes()
        except OSError as exc:
            raise SnapshotError(f"{name}: {exc.strerror or exc}") from None

    async def set_meta(self, meta: SnapshotMeta) -> None:
        self._write(self.path / f"{meta.name}.json", msgspec.json.encode(meta))

    async def delete(self, name: str) -> None:
        for suffix in (".snap", ".json"):
            (self.path / f"{name}{suffix}").unlink(missing_ok=True)


class NatsSnapshots:
    """Snapshots in a JetStream object store bucket; the metadata is the object's description (JSON)."""

    def __init__(self, obs: Any, bucket: str) -> None:
        self.obs = obs
        self.bucket = bucket

    @classmethod
    async def open(cls, js: Any, bucket: str, *, create: bool) -> NatsSnapshots | None:
        """The bucket, created when `create` (file storage); None when it does not exist and may not be made."""
        from nats.js.api import ObjectStoreConfig, StorageType
        from nats.js.errors import BucketNotFoundError, NotFoundError

        try:
            return cls(await js.object_store(bucket), bucket)
        except (BucketNotFoundError, NotFoundError):
            if not create:
                return None
        obs = await js.create_object_store(
            bucket, ObjectStoreConfig(description="muster cluster state snapshots", storage=StorageType.FILE)
        )
        return cls(obs, bucket)

    async def put(self, meta: SnapshotMeta, data: bytes) -> None:
        from nats.js.api import ObjectMeta

        await self.obs.put(meta.name, data, meta=ObjectMeta(name=meta.name, description=_meta_text(meta)))

    async def list(self) -> list[SnapshotMeta]:
        from nats.js.errors import NotFoundError

        try:
            infos = await self.obs.list(ignore_deletes=True)
        except NotFoundError:
            return []
        out: list[SnapshotMeta] = []
        for info in infos:
            if info.deleted or not info.description:
                continue
            try:
                out.append(msgspec.json.decode(info.description.encode(), type=SnapshotMeta))
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
        return out

    async def get(self, name: str) -> bytes:
        import io

        from nats.js.errors import Error as NatsJsError

        buf = io.BytesIO()
        try:
            # writeinto: nats-py otherwise grows the result with bytes += chunk (quadratic)
            result = await self.obs.get(name, writeinto=buf)
        except NatsJsError as exc:
            raise SnapshotError(f"{name}: {type(exc).__name__} {exc}") from None
        return buf.getvalue() or bytes(result.data or b"")

    async def set_meta(self, meta: SnapshotMeta) -> None:
        from nats.js.api import ObjectMeta

        await self.obs.update_meta(meta.name, ObjectMeta(name=meta.name, description=_meta_text(meta)))

    async def delete(self, name: str) -> None:
        from nats.js.errors import Error as NatsJsError

        with contextlib.suppress(NatsJsError):
            await self.obs.delete(name)


def _meta_text(meta: SnapshotMeta) -> str:
    return msgspec.json.encode(meta).decode()


def default_bucket(stream: str) -> str:
    return f"{stream}-snapshots"


# ---------------------------------------------------------------- loading and writing


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
    with no_gc():
        async for batch in source.batches(from_seq, to_seq, until=until):
            ev: AnyEvent
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
        with no_gc():
            for s, ev in batch:
                evolve(state, ev)
                if writer.due(s):
                    await at_due_point(s)
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


def describe(meta: SnapshotMeta) -> dict[str, Any]:
    """A snapshot's metadata for JSON output."""
    out: dict[str, Any] = json.loads(msgspec.json.encode(meta))
    return out
