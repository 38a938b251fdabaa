"""Connecting to NATS: which URLs are NATS URLs, and a client that fails fast on its first connection.

Every long-running client (the event store, the billing subscriber) connects
through `connect_client`: the first connection gives up after a few tries
with the server's own reason (never a password in a message), later ones
reconnect as the caller's options say.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import anyio
import nats
import structlog
from nats.aio.client import Client as NatsClient

from muster.events.errors import StoreError, StoreUnreachable
from muster.events.wire import redact

__all__ = ["DEFAULT_URL", "NATS_SCHEMES", "connect_client", "default_url", "refusal", "url_problem"]

log = structlog.get_logger("muster.events.store")

DEFAULT_URL = "nats://127.0.0.1:4222"


def default_url() -> str:
    """The NATS server to use: `$NATS_URL`, else the local default."""
    return os.environ.get("NATS_URL") or DEFAULT_URL


NATS_SCHEMES = ("nats", "tls", "ws", "wss")


def url_problem(url: str) -> str | None:
    """Why `url` is no NATS server URL (`http://...`, a typo in the scheme), or None."""
    scheme, sep, rest = url.strip().partition("://")
    if not sep:
        return None if url.strip() else "the NATS URL is empty"
    if scheme.lower() not in NATS_SCHEMES:
        host = rest.rpartition("@")[2].split("/", 1)[0] or "HOST:4222"
        return (
            f"{redact(url)} is not a NATS URL: NATS speaks its own protocol, not {scheme}; "
            f"use nats://{host} (or {', '.join(s + '://' for s in NATS_SCHEMES[1:])})"
        )
    return None


_ERRORS: weakref.WeakKeyDictionary[NatsClient, list[Exception]] = weakref.WeakKeyDictionary()
"""The latest errors the server sent each client connected here."""


def refusal(nc: NatsClient) -> str | None:
    """The latest permissions violation the server told `nc` of, or None.

    NATS answers a publish its permissions refuse with an asynchronous `-ERR`
    and no reply, so the request itself only times out: this says why.
    """
    for exc in reversed(_ERRORS.get(nc, [])):
        if "permissions violation" in str(exc).lower():
            return str(exc).strip().strip("'")
    return None


async def connect_client(servers: list[str], attempts: int, nats_options: dict[str, Any]) -> NatsClient:
    """A nats-py client that fails fast on the first connection (StoreError naming the URLs) and
    reconnects as `nats_options` say afterwards. Every long-running client connects through it."""
    return await _connect(servers, attempts, nats_options)


async def _connect(servers: list[str], attempts: int, nats_options: dict[str, Any]) -> NatsClient:
    """A nats-py client that fails fast on the first connection and reconnects as configured afterwards."""
    for url in servers:
        problem = url_problem(url)
        if problem is not None:
            raise StoreError(problem)
    last_error: list[Exception] = []
    caller_cb = nats_options.get("error_cb")

    async def on_error(exc: Exception) -> None:
        last_error.append(exc)
        del last_error[:-10]  # the client lives long: keep only the latest few
        log.debug("nats client error", error=f"{type(exc).__name__}: {exc}")
        if caller_cb is not None:
            await caller_cb(exc)

    options: dict[str, Any] = {
        "name": "muster",
        "reconnect_time_wait": 0.25,
        "connect_timeout": 5,
        "error_cb": on_error,
        "disconnected_cb": _nats_disconnected,
        "reconnected_cb": _nats_reconnected,
    }
    options.update({k: v for k, v in nats_options.items() if k != "error_cb"})
    reconnects = options.pop("max_reconnect_attempts", -1)
    # nats-py never gives up a first connection unless max_reconnect_attempts > 0, so
    # bound it for the first connection and switch to the caller's setting afterwards
    # nats-py 2.16 can also hang after a failed TLS handshake: bound the whole first connection
    per_try = float(options["connect_timeout"]) + float(options["reconnect_time_wait"])
    try:
        with anyio.fail_after(attempts * len(servers) * per_try + 1):
            nc = await nats.connect(servers=servers, max_reconnect_attempts=max(1, attempts - 1), **options)
    except Exception as exc:
        # the server's own word (an authorization violation) says more than the reset
        # of the socket it closed right after, whichever the client saw last
        said = [e for e in last_error if not isinstance(e, OSError)]
        reason = said[-1] if said else (last_error[-1] if last_error else exc)
        where = ", ".join(redact(u) for u in servers)  # never a password in a message or a log
        # a server that takes the connection and says nothing times out with no text of its own
        why = (
            f"no answer within {float(options['connect_timeout']):g} s"
            if isinstance(reason, TimeoutError) and not str(reason)
            else f"{type(reason).__name__}: {reason}"
        )
        raise StoreUnreachable(f"cannot connect to {where}: {why}") from None
    nc.options["max_reconnect_attempts"] = reconnects
    _ERRORS[nc] = last_error
    return nc


async def _nats_disconnected() -> None:
    log.info("nats disconnected")


async def _nats_reconnected() -> None:
    log.info("nats reconnected")
