"""List, then watch from the list's resourceVersion; relist on 410; reconnect with backoff.

`watch_objects(client, "pods")` is one async generator per concern (kopf
`_cogs/clients/watching.py`). It yields `WatchEvent`s, and `Synced` after every
(re)list once the differences it found were yielded.

Invariants:
- The consumer sees each change of an object once: the generator remembers
  the last resourceVersion it yielded per object and drops anything it has
  already yielded (a watch that replays, a relist after 410 that finds the
  object unchanged).
- After a relist, objects that vanished meanwhile are yielded as DELETED and
  objects replaced under the same name (new uid) as DELETED then ADDED.
- A list is read in pages (`page_size` objects, `limit` + `continue`) and each
  page's changes are yielded before the next page is asked for, so a large
  cluster never arrives as one huge answer to decode and diff in one go.
- It never raises a Kubernetes or transport error: those are retried with
  exponential backoff (reset after progress). Only cancellation ends it.
"""

from __future__ import annotations

import random
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import anyio
import structlog

from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.errors import KubeError, ResourceGone

if TYPE_CHECKING:
    from muster.daemon.k8s.pods import PodInfo

__all__ = ["Backoff", "Synced", "WatchEvent", "object_key", "watch_objects"]

log = structlog.get_logger("muster.k8s.watch")

Obj = dict[str, Any]
EventType = Literal["ADDED", "MODIFIED", "DELETED"]


@dataclass(frozen=True)
class WatchEvent:
    resource: str
    type: EventType
    obj: Obj
    info: PodInfo | None = None
    """A pod as `pods.pod_info` reads it, when a reader did already (the standby's `mirroring.Mirror`)."""


@dataclass(frozen=True)
class Synced:
    """Everything the latest (re)list of `resource` found has been yielded."""

    resource: str
    resource_version: str = ""


@dataclass(frozen=True)
class Backoff:
    """Exponential delays with jitter: initial, initial*factor, ... up to maximum."""

    initial: float = 0.2
    maximum: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2

    def delay(self, attempt: int, hint: float | None = None) -> float:
        base = min(self.maximum, self.initial * self.factor ** max(0, attempt))
        if hint is not None:
            base = min(self.maximum, max(base, hint))
        # Jitter spreads the reconnects of many replicas after an API server restart.
        return base * (1 + self.jitter * random.random())


def _meta(obj: Obj) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def object_key(obj: Obj) -> str:
    meta = _meta(obj)
    ns = meta.get("namespace")
    name = str(meta.get("name") or "")
    return f"{ns}/{name}" if ns else name


def _rv(obj: Obj) -> str:
    return str(_meta(obj).get("resourceVersion") or "")


def _uid(obj: Obj) -> str:
    return str(_meta(obj).get("uid") or "")


async def watch_objects(
    client: KubeClient,
    resource: str,
    *,
    backoff: Backoff | None = None,
    server_seconds: int = 300,
    page_size: int | None = 500,
) -> AsyncGenerator[WatchEvent | Synced, None]:
    """Yield the changes of every object of `resource`, forever (see module docstring)."""
    backoff = backoff or Backoff()
    known: dict[str, Obj] = {}
    resource_version = ""
    failures = 0
    while True:
        try:
            if not resource_version:
                listed: set[str] = set()
                version = ""
                async with aclosing(client.list_pages(resource, page_size=page_size)) as pages:
                    async for items, page_version in pages:
                        version = version or page_version  # every page of one list has its snapshot's
                        for event in _diff_page(resource, known, items, listed):
                            yield event
                for event in _vanished(resource, known, listed):
                    yield event
                resource_version = version
                yield Synced(resource, resource_version)
                failures = 0
            opened = anyio.current_time()
            streamed = 0
            async with aclosing(client.watch(resource, resource_version, server_seconds=server_seconds)) as stream:
                async for raw in stream:
                    streamed += 1
                    kind = raw.get("type")
                    obj = raw.get("object")
                    if not isinstance(obj, dict):
                        continue
                    rv = _rv(obj)
                    if kind == "BOOKMARK":
                        if rv:
                            resource_version = rv
                        continue
                    if kind not in ("ADDED", "MODIFIED", "DELETED"):
                        log.warning("unknown watch event type", resource=resource, type=kind)
                        continue
                    if rv:
                        resource_version = rv
                    failures = 0
                    change = _remember(resource, known, kind, obj)
                    if change is not None:
                        yield change
            # The server closed the stream (its timeout): continue from where we are, but do not
            # spin on a server that closes every stream at once.
            if not streamed and anyio.current_time() - opened < 1.0:
                await anyio.sleep(backoff.delay(failures))
                failures += 1
        except ResourceGone:
            log.info("watch expired, relisting", resource=resource, resource_version=resource_version)
            resource_version = ""
        except KubeError as exc:
            delay = backoff.delay(failures, exc.delay if exc.status in (429,) else None)
            failures += 1
            log.warning(
                "watch failed, retrying",
                resource=resource,
                error=str(exc),
                status=exc.status,
                retryable=exc.retryable,
                delay=round(delay, 3),
            )
            await anyio.sleep(delay)


def _remember(resource: str, known: dict[str, Obj], kind: str, obj: Obj) -> WatchEvent | None:
    key = object_key(obj)
    old = known.get(key)
    if kind == "DELETED":
        if old is None:
            return None
        del known[key]
        return WatchEvent(resource, "DELETED", obj)
    if old is not None and _rv(old) == _rv(obj) and _uid(old) == _uid(obj):
        return None  # already yielded (a replay)
    known[key] = obj
    return WatchEvent(resource, "MODIFIED" if old is not None else "ADDED", obj)


def _diff_page(resource: str, known: dict[str, Obj], items: list[Obj], listed: set[str]) -> list[WatchEvent]:
    """The events that bring `known` to one page of a list; updates `known`, adds the page's keys to `listed`."""
    out: list[WatchEvent] = []
    for new in items:
        key = object_key(new)
        listed.add(key)
        old = known.get(key)
        if old is not None and _uid(old) != _uid(new):
            out.append(WatchEvent(resource, "DELETED", old))  # replaced under the same name
            old = None
        if old is None:
            out.append(WatchEvent(resource, "ADDED", new))
        elif _rv(old) != _rv(new):
            out.append(WatchEvent(resource, "MODIFIED", new))
        known[key] = new
    return out


def _vanished(resource: str, known: dict[str, Obj], listed: set[str]) -> list[WatchEvent]:
    """DELETED for what `known` holds and the whole list did not; updates `known`."""
    out = [WatchEvent(resource, "DELETED", obj) for key, obj in known.items() if key not in listed]
    for event in out:
        del known[object_key(event.obj)]
    return out
