"""A KubernetesAdapter running for a test, and `EventLog`, its sink, which lets a test wait for events.

`eventually(check)` polls an async or plain predicate until it holds or a deadline passes.
`FAST`: backoff delays short enough for tests. `lists(emulator, plural)`: the list requests the
API double answered; `describe(events)`: events counted by type and node or job.

Shared by the emulator tests (tests/daemon) and the real API server tier (tests/k8s).
"""

from __future__ import annotations

import contextlib
import inspect
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import anyio
from kubernetes_asyncio.client import ApiClient

from muster.daemon.k8s import Backoff, KubernetesAdapter
from muster.events.types import Event

if TYPE_CHECKING:
    from muster.demo.emulator import KubeEmulator

FAST = Backoff(initial=0.01, maximum=0.05, jitter=0.0)
"""Backoff delays short enough for tests against the API double."""


def lists(emulator: KubeEmulator, plural: str) -> list[Any]:
    """The list (not watch) requests the API double answered for `plural`."""
    return [
        r
        for r in emulator
        if r.resource is not None
        and r.resource.plural == plural
        and r.name is None
        and str(r.method.value) == "GET"
        and r.params.get("watch") not in ("true", "True")
    ]


def describe(events: list[Event]) -> Counter[tuple[str, str]]:
    """The events counted by type and the node or job they name (order left out)."""
    return Counter((type(e).__name__, str(getattr(e, "node", "") or getattr(e, "job", ""))) for e in events)


class EventLog:
    """A sink that keeps every batch of events and lets a test wait for one."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.batches = 0
        self._changed = anyio.Event()

    async def __call__(self, events: list[Event]) -> None:
        self.events.extend(events)
        self.batches += 1
        self._changed.set()
        self._changed = anyio.Event()

    def of(self, cls: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, cls)]

    async def wait_for(self, predicate: Callable[[EventLog], bool], seconds: float = 30.0) -> None:
        # generous: it returns as soon as the predicate holds, and CI shares 2 cores with the whole suite
        with anyio.fail_after(seconds):
            while not predicate(self):
                await self._changed.wait()


async def eventually(check: Callable[[], Any], seconds: float = 20.0, every: float = 0.05) -> Any:
    """Poll `check()` (sync or async) until it returns something truthy; fail after `seconds`."""
    with anyio.fail_after(seconds):
        while True:
            value = check()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            await anyio.sleep(every)


@contextlib.asynccontextmanager
async def running_adapter(api: ApiClient, **options: Any) -> AsyncIterator[tuple[KubernetesAdapter, EventLog]]:
    """A KubernetesAdapter (`options` as its constructor's) running against `api` until the block ends."""
    log = EventLog()
    adapter = KubernetesAdapter(api, **options)
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(30):
            await tg.start(adapter.run, log)
        yield adapter, log
        tg.cancel_scope.cancel()
