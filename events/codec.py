"""JSON encoding of events, and upcasting of older schema versions.

Decoding is strict about shape: an unknown `type`, a malformed payload or a
field of the wrong type raises `DecodeError` carrying the raw bytes, so the
reader can report the sequence and skip it (design invariant 7). Older
versions are turned into the current one by pure upcasters, tried only when
the fast typed decode fails or reports an old `v`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from muster.events.types import AnyEvent, Event

MAX_EVENT_BYTES = 1024 * 1024
"""Events larger than this are refused on append and rejected on decode."""


class DecodeError(ValueError):
    """Bytes that are not a valid event of any known version."""

    def __init__(self, raw: bytes, message: str) -> None:
        super().__init__(message)
        self.raw = raw
        self.message = message


_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[AnyEvent] = msgspec.json.Decoder(AnyEvent)
_raw_decoder = msgspec.json.Decoder()

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


def upcast_job_submitted_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v1 JobSubmitted had a flat `pods` count and `gpus` per pod; v2 has podsets."""
    out = {k: v for k, v in data.items() if k not in ("pods", "gpus", "gpus_per_pod")}
    pods = data.get("pods", 1)
    gpus = data.get("gpus", 0)
    out["podsets"] = [{"name": "worker", "count": pods, "requests": {"gpu": gpus}}]
    out["v"] = 2
    return out


UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("JobSubmitted", 1): upcast_job_submitted_v1,
}
"""(type, version) -> function producing the next version's dict."""


def _current_version(tag: str) -> int:
    version = 1
    while (tag, version) in UPCASTERS:
        version += 1
    return version


def encode(event: Event) -> bytes:
    """The stored JSON form of an event."""
    return _encoder.encode(event)


def upcast(data: dict[str, Any]) -> dict[str, Any]:
    """Apply upcasters until the dict is at its type's current version."""
    tag = data.get("type")
    version = data.get("v", 1)
    while isinstance(tag, str) and isinstance(version, int) and (tag, version) in UPCASTERS:
        data = UPCASTERS[(tag, version)](data)
        version = data.get("v", version + 1)
    return data


def _slow_decode(raw: bytes, first_error: Exception | None) -> AnyEvent:
    try:
        data = _raw_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise DecodeError(raw, f"not JSON: {exc}") from None
    except RecursionError:  # hostile nesting (`[[[[...`) must not escape as anything but bad input
        raise DecodeError(raw, "not JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise DecodeError(raw, "not a JSON object")
    tag = data.get("type")
    if not isinstance(tag, str):
        raise DecodeError(raw, "no string `type` field")
    if tag not in _KNOWN_TAGS:
        raise DecodeError(raw, f"unknown event type {tag!r}")
    version = data.get("v", 1)
    if not isinstance(version, int):
        raise DecodeError(raw, f"{tag}: `v` is not an integer")
    current = _current_version(tag)
    if version > current:
        raise DecodeError(raw, f"{tag} v{version} is newer than this muster understands (v{current})")
    data = upcast(data)
    try:
        event: AnyEvent = msgspec.convert(data, AnyEvent)
        return event
    except msgspec.ValidationError as exc:
        detail = str(first_error) if first_error is not None else str(exc)
        raise DecodeError(raw, f"invalid {tag} v{version}: {detail}") from None


def decode(raw: bytes) -> AnyEvent:
    """Decode one stored event, upcasting older versions; raise DecodeError otherwise."""
    if len(raw) > MAX_EVENT_BYTES:
        raise DecodeError(raw[:256], f"event of {len(raw)} bytes exceeds the {MAX_EVENT_BYTES}-byte cap")
    try:
        event = _decoder.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return _slow_decode(raw, exc)
    except RecursionError:
        raise DecodeError(raw, "not JSON: nested too deeply") from None
    current = _CURRENT.get(type(event), 1)
    if event.v != current or (current > 1 and b'"v"' not in raw):
        # a missing `v` means version 1, which the typed decoder cannot see
        return _slow_decode(raw, None)
    return event


def decode_many(raws: Iterable[bytes]) -> list[AnyEvent]:
    """Decode several events; raises on the first bad one."""
    return [decode(r) for r in raws]


def _build_current() -> dict[type[Event], int]:
    from muster.events.types import EVENT_TYPES

    out: dict[type[Event], int] = {}
    for cls in EVENT_TYPES:
        tag = cls.__struct_config__.tag
        assert isinstance(tag, str)
        out[cls] = _current_version(tag)
    return out


_CURRENT = _build_current()
_KNOWN_TAGS = frozenset(str(cls.__struct_config__.tag) for cls in _CURRENT)
