"""What the event store raises: classified by what the caller should do about it."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "AppendError",
    "ConcurrencyConflict",
    "EventTooLarge",
    "LogHole",
    "StoreError",
    "StoreRefused",
    "StoreUnreachable",
    "StreamMissing",
]


class StoreError(Exception):
    """The event store cannot do what was asked (missing stream, server unreachable...)."""


class StoreUnreachable(StoreError):
    """No server of the URLs answered the first connection (a runtime failure, not bad input)."""


class StoreRefused(StoreError):
    """The server refused this identity what it asked (NATS permissions): trying again cannot help."""


class StreamMissing(StoreError):
    """The stream does not exist and the caller did not ask to create it."""


class LogHole(StoreError):
    """Events a reader needs left the stream unread (purged, or dropped by limits someone set).

    Never started past in silence: a fold past a hole would decide on a state lacking its past.
    `first..last` is the missing range; `hint` says where the reader could find it.
    """

    def __init__(self, stream: str, first: int, last: int, hint: str = "") -> None:
        super().__init__(f"events {first}..{last} left stream {stream} unread{hint}")
        self.stream = stream
        self.first = first
        self.last = last


class ConcurrencyConflict(StoreError):
    """A fenced append found the stream ended elsewhere than expected.

    `stored` holds the sequences of the batch's messages stored before the
    conflict (a fenced batch is checked message by message).
    """

    def __init__(self, expected: int, actual: int, stored: Sequence[int] = ()) -> None:
        super().__init__(f"expected the stream to end at {expected}, it ends at {actual}")
        self.expected = expected
        self.actual = actual
        self.stored = list(stored)


class EventTooLarge(StoreError, ValueError):
    """An event whose encoded form exceeds the size cap; nothing of its batch was stored."""

    def __init__(self, index: int, event_type: str, size: int, limit: int) -> None:
        super().__init__(f"event #{index} ({event_type}) encodes to {size} bytes, over the {limit}-byte cap")
        self.index = index
        self.size = size
        self.limit = limit


class AppendError(StoreError):
    """Some messages of a batch could not be confirmed stored after retries; retrying the batch is safe."""
