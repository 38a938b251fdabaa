"""The state sealed at each archive segment's start, so a read of the archive's past folds one segment, not the log.

Role: the leader's sealer (`daemon/archiving.py`) writes, into each segment,
the cluster state before the segment's first sequence (`seal_state`); a
replay of an archived point (`replay.rebuild.state_at`) starts from the state
sealed in the last segment that begins at or before the point
(`nearest_sealed`) and folds only the events after it.

Why a sealed state can be trusted:
- Integrity: it is inside the segment, whose sha256 is checked on every read.
- Same code: it carries the fold's `fingerprint()`; a state sealed by another
  muster version is not used (an older segment's, or the empty state, is).
- Same state as a fresh fold: the sealer folds it from the state sealed in an
  earlier segment (or from the empty state) through the archived events in
  between, so by induction each is the fold of its whole prefix. Tests compare
  it with the plain fold byte for byte.

Invariant: `nearest_sealed` returns the fold of `1..seq` with `seq` at or
before the point (and, for a time, a state whose latest event is not later
than it); it only ever moves the start later than the empty state.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from muster.events.archive import SegmentRef
from muster.projections.state import ClusterState
from muster.replay.snapshotcodec import decode_state, encode_state, fingerprint
from muster.replay.source import ArchivedLog

__all__ = ["Sealed", "SealedState", "nearest_sealed", "open_state", "seal_state"]


class SealedState(msgspec.Struct, frozen=True, kw_only=True):
    """What a segment holds as its snapshot: the fold of sequences 1..seq, encoded."""

    seq: int
    at: int
    """`state.now`: the latest event time folded (a time query may start here when it is not later)."""
    fingerprint: str
    format: str
    state: bytes


@dataclass
class Sealed:
    """A state to fold on from: the fold of 1..seq, sealed in `segment` (None: the empty state)."""

    state: ClusterState
    seq: int
    segment: SegmentRef | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(SealedState)


def seal_state(state: ClusterState, seq: int) -> bytes:
    """The snapshot bytes of a segment starting at `seq + 1` (uncompressed: the segment compresses it)."""
    fmt = "msgpack"
    try:
        data = encode_state(state, fmt)
    except OverflowError:  # msgpack holds 64-bit integers only; a job past MAX_QUANTITY needs JSON
        fmt = "json"
        data = encode_state(state, fmt)
    sealed = SealedState(seq=seq, at=state.now, fingerprint=fingerprint(), format=fmt, state=data)
    return _encoder.encode(sealed)


def open_state(data: bytes) -> SealedState | None:
    """A segment's sealed state; None when it has none or another muster version sealed it."""
    if not data:
        return None
    try:
        sealed = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return sealed if sealed.fingerprint == fingerprint() else None


async def nearest_sealed(log: ArchivedLog, *, max_seq: int, max_time: int | None = None) -> Sealed:
    """The state sealed in the last segment starting at or before the point; the empty state when none fits.

    Not every segment holds a state (`archive.state_every_events`). For a sequence it reads the
    segment that holds the point, and earlier ones until one holds a usable state; for a time, a
    binary search: the nearest state at or before a segment is not later than the point up to
    some segment, and later after it (sealed times grow with the sequence).
    """
    refs = [ref for ref in await log.archive.segments() if ref.first - 1 <= max_seq]
    nearest: dict[int, tuple[SegmentRef, SealedState] | None] = {}

    async def at_or_before(i: int) -> tuple[SegmentRef, SealedState] | None:
        """The nearest usable state sealed in segment i or before it (None: the empty state)."""
        walked: list[int] = []
        found: tuple[SegmentRef, SealedState] | None = None
        while i >= 0 and i not in nearest:
            walked.append(i)
            sealed = open_state((await log.segment(refs[i])).snapshot)
            if sealed is not None and sealed.seq == refs[i].first - 1:
                found = (refs[i], sealed)
                break
            i -= 1
        else:
            found = nearest.get(i) if i >= 0 else None
        for j in walked:
            nearest[j] = found
        return found

    def fits(found: tuple[SegmentRef, SealedState] | None) -> bool:
        return found is None or max_time is None or found[1].at <= max_time

    best: tuple[SegmentRef, SealedState] | None = None
    lo, hi = 0, len(refs)
    while lo < hi:  # the last segment whose nearest state fits; without a time, the last one at once
        mid = hi - 1 if max_time is None else (lo + hi) // 2
        found = await at_or_before(mid)
        if fits(found):
            best, lo = found, mid + 1
        else:
            hi = mid
    if best is None:
        return Sealed(ClusterState(), 0)
    ref, sealed = best
    return Sealed(decode_state(sealed.state, sealed.format), sealed.seq, ref)
