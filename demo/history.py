"""The emulated API server's history of changes, and the watch streams that replay and follow it.

As etcd's revision, one global resourceVersion counts every change (`History.next_version`);
a list carries the current one. The changes are kept (up to a limit, then the older half is
compacted) so that a watch from version V replays the changes after V, then follows. A watch
from a version older than the oldest kept answers 410 Gone (an ERROR event in the stream) and
ends, as do the watches open when `expire` compacts everything, so the client must relist;
`close_watches` ends open streams without error. Changes are snapshots, never mutated once
recorded, so every stream sends them as they are.
"""

from __future__ import annotations

import asyncio
import bisect
import copy
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import kmock

from muster.demo.apiobjects import KINDS, TRUE, Obj, selected


@dataclass(frozen=True)
class Change:
    """One change as watchers see it: its version, the object's key, the event type and the object then."""

    rv: int
    resource: kmock.resource
    namespace: str | None
    name: str
    type: str
    obj: Obj


class History:
    """The current resourceVersion, the changes kept for watch replay, and a wake-up for the open watches."""

    def __init__(self, limit: int, bookmark_seconds: float) -> None:
        self.limit = limit
        """Changes kept for watch replay; older ones are compacted (watches from before them get 410)."""
        self.bookmark_seconds = bookmark_seconds
        self.rv = 1
        """The resourceVersion of the last change."""
        self.oldest = 0
        """Watches from a version older than this get 410 Gone."""
        self._changes: list[Change] = []
        self._change_rvs: list[int] = []
        """The changes' versions, in order (to find where a watch resumes)."""
        self._changed = asyncio.Event()
        """Set (and replaced) at every change: the open watches wait on it."""
        self._generation = 0
        """Bumped by `close_watches`: a stream opened in an older generation ends."""

    def next_version(self) -> int:
        """The version of a change about to be recorded (`record`)."""
        self.rv += 1
        return self.rv

    def record(self, change: Change) -> None:
        """Keep `change` (made at `next_version`) for watch replay and wake the open watches."""
        self._changes.append(change)
        self._change_rvs.append(change.rv)
        if len(self._changes) > self.limit:
            drop = len(self._changes) - self.limit // 2
            self.oldest = self._changes[drop - 1].rv
            del self._changes[:drop]
            del self._change_rvs[:drop]
        self._notify()

    def expire(self) -> None:
        """Compact all history: every version clients hold is now too old (410), open watches end with 410."""
        self.rv += 1
        self.oldest = self.rv
        self._changes.clear()
        self._change_rvs.clear()
        self._notify()

    def close_watches(self) -> None:
        """End every open watch stream cleanly (clients reconnect from their last version)."""
        self._generation += 1
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def watch(
        self, request: kmock.Request, listing: Callable[[kmock.resource, str | None], list[Obj]]
    ) -> AsyncIterator[Any]:
        """The events of a watch `request`: from version 0 (or none) every object `listing` gives as ADDED, else
        the changes kept after its version; then the changes as they come, with bookmarks when asked for,
        until its timeout, `close_watches`, 410 Gone, or the client leaving."""
        # The real server sends the headers at once; kmock waits for the first chunk.
        yield b""
        assert request.resource is not None
        res, ns = request.resource, request.namespace
        labels = request.params.get("labelSelector", "")
        fields = request.params.get("fieldSelector", "")
        if request.name:
            fields = ",".join(filter(None, [fields, f"metadata.name={request.name}"]))
        loop = asyncio.get_running_loop()
        limit = request.params.get("timeoutSeconds")
        deadline = loop.time() + float(limit) if limit else None
        bookmarks = request.params.get("allowWatchBookmarks") in TRUE
        generation = self._generation
        since = request.params.get("resourceVersion", "")
        if since in ("", "0"):
            cursor = self.rv
            for obj in listing(res, ns):
                if selected(obj, labels, fields):
                    yield {"type": "ADDED", "object": copy.deepcopy(obj)}
        else:
            try:
                cursor = int(since)
            except ValueError:
                cursor = -1
        idle = 0.0
        while True:
            changed = self._changed
            if self._generation != generation:
                return
            if cursor < self.oldest:
                yield {
                    "type": "ERROR",
                    "object": {
                        "apiVersion": "v1",
                        "kind": "Status",
                        "metadata": {},
                        "status": "Failure",
                        "message": f"too old resource version: {cursor} ({self.oldest})",
                        "reason": "Expired",
                        "code": 410,
                    },
                }
                return
            start = bisect.bisect_right(self._change_rvs, cursor)
            pending = self._changes[start:]
            for change in pending:
                if self._generation != generation or cursor < self.oldest:
                    break
                cursor = change.rv
                mine = change.resource == res and (ns is None or change.namespace == ns)
                if mine and selected(change.obj, labels, fields):
                    yield {"type": change.type, "object": change.obj}  # never mutated after `record`
            if pending:
                idle = 0.0
                continue
            raw = request._raw_request
            if raw is not None and (raw.transport is None or raw.transport.is_closing()):
                return  # the client went away; nobody reads this stream any more
            wait = min(self.bookmark_seconds, 0.5)
            if deadline is not None:
                wait = min(wait, deadline - loop.time())
                if wait <= 0:
                    return
            try:
                await asyncio.wait_for(changed.wait(), timeout=wait)
            except TimeoutError:
                idle += wait
                if bookmarks and idle >= self.bookmark_seconds and cursor >= self.oldest:
                    idle = 0.0
                    cursor = max(cursor, self.rv)
                    yield {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": KINDS.get(res.plural or "", "Object"),
                            "apiVersion": "v1",
                            "metadata": {"resourceVersion": str(cursor)},
                        },
                    }
