"""The stored form of a snapshot of the folded cluster state: its bytes, its metadata, its identity.

A `ClusterState` is encoded with msgspec (msgpack, zlib level 1; or JSON, which
holds integers past 64 bits). `SnapshotMeta` is what is recorded with the bytes:
the sequence it is the fold of, their size and SHA-256, the `fingerprint()` of
the code that folded it (the state's msgspec schema and the fold's source,
`projections/state.py`, `cluster.py`, `configuration.py`: a snapshot of another muster
version is not used), and
the anchor that ties it to one log. How these are checked on load is
`snapshots`; where the bytes live is `snapshotstores`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import zlib
from typing import Any, Literal

import msgspec

from muster.projections import SOURCES
from muster.projections.state import ClusterState
from muster.replay.heap import no_gc

Format = Literal["msgpack+zlib", "msgpack", "json"]
FORMATS: tuple[str, ...] = ("msgpack+zlib", "msgpack", "json")


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
    for source in ("state.py", "cluster.py", "configuration.py"):  # the same whether the core runs compiled or not
        h.update((SOURCES / source).read_bytes())
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


def describe(meta: SnapshotMeta) -> dict[str, Any]:
    """A snapshot's metadata for JSON output."""
    out: dict[str, Any] = json.loads(msgspec.json.encode(meta))
    return out
