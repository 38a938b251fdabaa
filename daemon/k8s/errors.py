"""What the Kubernetes API said, classified by what the caller should do about it.

The adapter never lets a kubernetes-asyncio or aiohttp exception escape: every
failure becomes one of these classes (the kopf way, `_cogs/clients/errors.py`).

- `TemporaryError`: try again after `delay` seconds (5xx, 429, timeouts,
  dropped connections). `ResourceGone` (410) is temporary too, but the cure is
  a relist, not the same request again.
- `PermanentError`: the same request will fail the same way (400, 401, 403,
  422, a bug in our request). `NotFound` (404) and `Conflict` (409) are
  permanent for that request but often mean "already done" to an idempotent
  caller, so they have their own classes.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

__all__ = [
    "Conflict",
    "KubeError",
    "NotFound",
    "PermanentError",
    "ResourceGone",
    "TemporaryError",
    "from_exception",
    "from_status",
]

DEFAULT_RETRY_DELAY = 1.0


class KubeError(Exception):
    """A failed call to the Kubernetes API; `status` is the HTTP status (0 when there was no answer)."""

    retryable: bool = False

    def __init__(self, message: str, *, status: int = 0, reason: str = "", delay: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason
        self.delay = delay if delay is not None else DEFAULT_RETRY_DELAY


class TemporaryError(KubeError):
    """Retry after `delay` seconds."""

    retryable = True


class ResourceGone(TemporaryError):
    """410 Gone: the resourceVersion is too old; relist and watch from the list's version."""


class PermanentError(KubeError):
    """The same request will not succeed; report it and move on."""


class NotFound(PermanentError):
    """404: the object (or the resource) does not exist."""


class Conflict(PermanentError):
    """409: the object exists or is in another state than the request assumes."""


def _status_body(body: bytes | str | Any) -> tuple[str, str]:
    """The `reason` and `message` of a Kubernetes Status body, best effort."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return "", body[:500]
    if isinstance(body, dict):
        return str(body.get("reason") or ""), str(body.get("message") or "")
    return "", ""


def from_status(status: int, body: bytes | str | Any = b"", *, retry_after: str | None = None) -> KubeError:
    """The error for a non-2xx answer."""
    reason, message = _status_body(body)
    text = message or reason or f"HTTP {status}"
    delay: float | None = None
    if retry_after:
        try:
            delay = max(0.0, float(retry_after))
        except ValueError:
            delay = None
    if status == 404:
        return NotFound(text, status=status, reason=reason)
    if status == 409:
        return Conflict(text, status=status, reason=reason)
    if status == 410:
        return ResourceGone(text, status=status, reason=reason, delay=0.0)
    if status == 429 or status >= 500:
        return TemporaryError(text, status=status, reason=reason, delay=delay)
    return PermanentError(text, status=status, reason=reason)


def from_exception(exc: BaseException) -> KubeError:
    """The error for an exception raised by the client library or the transport."""
    if isinstance(exc, KubeError):
        return exc
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status >= 100:
        # kubernetes_asyncio.client.ApiException (raised when content is preloaded)
        return from_status(status, getattr(exc, "body", b"") or b"", retry_after=None)
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return TemporaryError(f"timed out: {exc!r}")
    if isinstance(exc, (aiohttp.ClientError, ConnectionError, OSError)):
        return TemporaryError(f"connection failed: {exc!r}")
    return PermanentError(f"unexpected client error: {exc!r}")
