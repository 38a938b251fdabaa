"""A replica's standing watch of nodes and pods, so a new term's adapter starts from memory, not from a list.

Every replica, leading or not, runs one `Mirror` for its whole life: it
lists and watches nodes and pods (`watch_objects`) and keeps the objects as
they are now. When the replica takes over, its term's adapter subscribes
(`subscribe`) instead of listing: it gets every object the mirror holds as
ADDED, then `Synced` at the mirror's resourceVersion, then the changes as
they come. That is what a fresh list and watch would give it, without the
requests and their decoding between winning the lease and deciding; and
each pod comes already read (`pods.pod_info`, done while standing by).

Invariants:
- A subscriber sees each object in its current form, then every later
  change, in the order the watch gave them: the snapshot and the
  subscription are taken together (no await in between).
- Before the mirror's first list has ended, a subscriber gets what has been
  listed so far and the `Synced` when the list ends, as a list would.
- A subscriber that falls behind holds the watch back (bounded buffer, as
  the adapter's own watch would); one that goes away (its term ended) is
  dropped.
- Kubernetes errors never escape `run` (`watch_objects` retries them).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.pods import pod_info
from muster.daemon.k8s.watching import Backoff, Obj, Synced, WatchEvent, object_key, watch_objects

__all__ = ["Mirror"]

Item = WatchEvent | Synced


@dataclass
class _View:
    objects: dict[str, WatchEvent] = field(default_factory=dict)
    """Each object's last change (ADDED or MODIFIED), with the pod already read."""
    version: str | None = None
    """The resourceVersion of the last (re)list, once one ended."""
    subscribers: list[MemoryObjectSendStream[Item]] = field(default_factory=list)
    listed: anyio.Event = field(default_factory=anyio.Event)

    def take(self, item: Item) -> None:
        if isinstance(item, Synced):
            self.version = item.resource_version
            self.listed.set()
        elif item.type == "DELETED":
            self.objects.pop(object_key(item.obj), None)
        else:
            self.objects[object_key(item.obj)] = item


class Mirror:
    """The current nodes and pods of the cluster, for the adapter of whichever term this replica leads next."""

    def __init__(
        self,
        client: KubeClient,
        resources: tuple[str, ...] = ("nodes", "pods"),
        *,
        backoff: Backoff | None = None,
        watch_seconds: int = 300,
        page_size: int = 500,
        buffer: int = 500,
    ) -> None:
        self.client = client
        self.backoff = backoff or Backoff()
        self.watch_seconds = watch_seconds
        self.page_size = page_size
        self.buffer = buffer
        self._views = {resource: _View() for resource in resources}
        self.running = False
        """Whether `run` is watching (a term's adapter lists by itself otherwise)."""

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch every resource until cancelled; reports started once every first list has ended."""
        try:
            async with anyio.create_task_group() as tg:
                for resource in self._views:
                    tg.start_soon(self._watch, resource)
                self.running = True
                await self.listed()
                task_status.started()
        finally:
            self.running = False

    async def listed(self) -> None:
        """Wait until the first list of every resource has ended."""
        for view in self._views.values():
            await view.listed.wait()

    def objects(self, resource: str) -> dict[str, Obj]:
        """The objects of `resource` the mirror holds now, by `namespace/name`."""
        return {key: event.obj for key, event in self._views[resource].objects.items()}

    async def subscribe(self, resource: str) -> AsyncGenerator[Item, None]:
        """What a list and watch of `resource` would yield from now on (see the module docstring)."""
        view = self._views[resource]
        send, receive = anyio.create_memory_object_stream[Item](self.buffer)
        snapshot: list[Item] = [WatchEvent(resource, "ADDED", e.obj, e.info) for e in view.objects.values()]
        if view.version is not None:
            snapshot.append(Synced(resource, view.version))
        view.subscribers.append(send)
        try:
            for item in snapshot:
                yield item
            async with receive:
                async for item in receive:
                    yield item
        finally:
            view.subscribers.remove(send)
            send.close()

    async def _watch(self, resource: str) -> None:
        view = self._views[resource]
        stream = watch_objects(
            self.client, resource, backoff=self.backoff, server_seconds=self.watch_seconds, page_size=self.page_size
        )
        async with aclosing(stream):
            async for item in stream:
                if isinstance(item, WatchEvent) and resource == "pods" and item.type != "DELETED":
                    item = WatchEvent(item.resource, item.type, item.obj, pod_info(item.obj))  # read while standing by
                view.take(item)
                for send in list(view.subscribers):
                    try:
                        await send.send(item)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        continue  # its term ended: `subscribe` drops it
