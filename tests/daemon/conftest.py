"""Fixtures for the daemon tests.

Kubernetes (`test_k8s_*`):
- `kube`: the API server double (`KubeEmulator`, kmock) served on a local
  port, and a kubernetes-asyncio ApiClient pointed at it.
- `start_adapter`: `async with start_adapter(api) as (adapter, events):` a
  running KubernetesAdapter whose sink is `events` (an `EventLog`).
- `FAST`: backoff delays short enough for tests.

Add new shared fixtures in their own section below, with a one-line docstring.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
from kubernetes_asyncio.client import ApiClient

from muster.daemon.k8s import Backoff, KubernetesAdapter
from muster.daemon.k8s.emulator import KubeEmulator, running
from muster.events.types import Event

# ---------------------------------------------------------------- Kubernetes

FAST = Backoff(initial=0.01, maximum=0.05, jitter=0.0)


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


@pytest.fixture
async def kube() -> AsyncIterator[tuple[KubeEmulator, ApiClient]]:
    """A Kubernetes API server double on a local port and an ApiClient for it."""
    async with running() as (emulator, api):
        yield emulator, api


@contextlib.asynccontextmanager
async def _adapter(api: ApiClient, **options: Any) -> AsyncIterator[tuple[KubernetesAdapter, EventLog]]:
    log = EventLog()
    options.setdefault("backoff", FAST)
    # No Events by default: tests wait on `caught_up("pods", emulator.resource_version)`, and the
    # emulator's one counter would also count Event writes no pod watch ever brings back.
    # Reporting is tested against the real API server (tests/k8s/test_feedback_real.py).
    options.setdefault("report", False)
    adapter = KubernetesAdapter(api, **options)
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(30):
            await tg.start(adapter.run, log)
        yield adapter, log
        tg.cancel_scope.cancel()


@pytest.fixture
def start_adapter() -> Callable[..., contextlib.AbstractAsyncContextManager[tuple[KubernetesAdapter, EventLog]]]:
    """`async with start_adapter(api, **options) as (adapter, events):` a running adapter; `events` is its sink."""
    return _adapter
