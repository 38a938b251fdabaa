"""The reads the gangs ask for (`Gangs.owners_to_fetch`, `namespaces_to_fetch`), each in a task of its own.

An owner's size (`owners.fetch_sizing`), many owners of one kind and namespace wanted at once with one
paged list (`owners.list_sizings`), a namespace's default queue (`owners.fetch_namespace_queue`). The
answers (`OwnerSize`, `NamespaceQueue`) go on the adapter's queue and are translated in order with the
watch events.

Invariants:
- A read is retried with backoff while the API says it is worth it (one rule, `_read`); a permanent
  error is an answer too, so the gang is never left waiting for one: an owner that cannot be read
  has no size and a `problem` saying why (its pods are left alone, told why), a namespace that cannot
  be read has no default queue.
- At most `limiter`'s reads are in flight: a relist finding many new gangs must not flood the loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import structlog
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.errors import KubeError
from muster.daemon.k8s.owners import Sizing, fetch_namespace_queue, fetch_sizing, list_sizings
from muster.daemon.k8s.pods import Owner
from muster.daemon.k8s.watching import Backoff

__all__ = ["Lookups", "NamespaceQueue", "OwnerSize"]

log = structlog.get_logger("muster.k8s")

T = TypeVar("T")


@dataclass(frozen=True)
class OwnerSize:
    """An owner's size as read (`Gangs.set_size`)."""

    owner: Owner
    sizing: Sizing


@dataclass(frozen=True)
class NamespaceQueue:
    """A namespace's default queue as read, "" for none (`Gangs.set_namespace_queue`)."""

    namespace: str
    queue: str


Send = MemoryObjectSendStream[Any]
"""The adapter's queue: the answers go there, between the watch events."""


class Lookups:
    """Reads owners and namespaces for the gangs, retried, their answers sent to the adapter's queue."""

    def __init__(
        self, client: KubeClient, *, limiter: anyio.CapacityLimiter, backoff: Backoff, page_size: int, list_at: int
    ) -> None:
        """`list_at`: owners of one kind and namespace wanted at once from which one list replaces a GET each."""
        self._client = client
        self._limiter = limiter
        self._backoff = backoff
        self._page_size = page_size
        self._list_at = list_at

    def start(self, tg: TaskGroup, owners: list[Owner], namespaces: list[str], send: Send) -> None:
        """Start reading `owners` (listed by kind and namespace when there are many) and `namespaces`."""
        groups: dict[tuple[str, str], list[Owner]] = {}
        for owner in owners:
            groups.setdefault((owner.kind, owner.namespace), []).append(owner)
        for group in groups.values():
            if len(group) >= self._list_at:
                tg.start_soon(self._owners_listed, group, send.clone(), tg)
            else:
                for owner in group:
                    tg.start_soon(self._owner, owner, send.clone())
        for namespace in namespaces:
            tg.start_soon(self._namespace, namespace, send.clone())

    async def _owner(self, owner: Owner, send: Send) -> None:
        """Fetch the owner's gang size."""
        async with send:
            read = await self._read(
                lambda: fetch_sizing(self._client, owner), "owner lookup failed, retrying", owner=owner.source
            )
            if isinstance(read, KubeError):
                log.error("cannot size gang; its pods stay pending", owner=owner.source, error=read.message)
                read = Sizing(None, problem=f"{owner.source} cannot be read: {read.message}")
            await _sized(owner, read, send)

    async def _owners_listed(self, owners: list[Owner], send: Send, tg: TaskGroup) -> None:
        """Size many owners of one kind and namespace with one paged list; one by one (`_owner`, which retries)
        when the list cannot be read."""
        async with send:
            try:
                async with self._limiter:
                    sizings = await list_sizings(self._client, owners, page_size=self._page_size)
            except KubeError as exc:
                first = owners[0]
                log.warning(
                    "listing gang owners failed; looking them up one by one",
                    kind=first.kind,
                    namespace=first.namespace,
                    error=exc.message,
                )
                for owner in owners:
                    tg.start_soon(self._owner, owner, send.clone())
                return
            for owner, sizing in zip(owners, sizings, strict=True):
                await _sized(owner, sizing, send)

    async def _namespace(self, namespace: str, send: Send) -> None:
        """Read the namespace's default queue; "" when it cannot be read."""
        async with send:
            read = await self._read(
                lambda: fetch_namespace_queue(self._client, namespace),
                "namespace lookup failed, retrying",
                namespace=namespace,
            )
            if isinstance(read, KubeError):
                log.warning("cannot read a namespace's default queue", namespace=namespace, error=read.message)
                read = ""
            await send.send(NamespaceQueue(namespace, read))

    async def _read(self, read: Callable[[], Awaitable[T]], retrying: str, **context: str) -> T | KubeError:
        """`read()`'s answer, retried with backoff (a 429's Retry-After as a floor) while the error is worth
        retrying; the permanent error otherwise."""
        attempt = 0
        while True:
            try:
                async with self._limiter:
                    return await read()
            except KubeError as exc:
                if not exc.retryable:
                    return exc
                delay = self._backoff.delay(attempt, exc.delay if exc.status == 429 else None)
                attempt += 1
                log.warning(retrying, **context, error=exc.message)
                await anyio.sleep(delay)


async def _sized(owner: Owner, sizing: Sizing, send: Send) -> None:
    if sizing.problem:
        # bad input never stops the adapter: say why the pods are left alone
        log.warning("gang owner cannot be gang-scheduled", owner=owner.source, problem=sizing.problem)
    elif sizing.size is None:
        log.info("gang owner is gone; ignoring its pods", owner=owner.source)
    await send.send(OwnerSize(owner, sizing))
