"""Fixtures for the daemon tests.

Kubernetes (`test_k8s_*`):
- `kube`: the API server double (`KubeEmulator`, kmock) served on a local
  port, and a kubernetes-asyncio ApiClient pointed at it.
- `start_adapter`: `async with start_adapter(api) as (adapter, events):` a
  running KubernetesAdapter whose sink is `events` (an `EventLog`).
- backoff delays short enough for tests: `adapterkit.FAST` (a helper module, not this conftest,
  which only pytest may import).

Add new shared fixtures in their own section below, with a one-line docstring.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from adapterkit import FAST, EventLog, running_adapter
from kubernetes_asyncio.client import ApiClient

from muster.daemon.k8s import KubernetesAdapter
from muster.demo.emulator import KubeEmulator, running

# ---------------------------------------------------------------- Kubernetes


@pytest.fixture
async def kube() -> AsyncIterator[tuple[KubeEmulator, ApiClient]]:
    """A Kubernetes API server double on a local port and an ApiClient for it."""
    async with running() as (emulator, api):
        yield emulator, api


@contextlib.asynccontextmanager
async def _adapter(api: ApiClient, **options: Any) -> AsyncIterator[tuple[KubernetesAdapter, EventLog]]:
    options.setdefault("backoff", FAST)
    # No Events by default: tests wait on `caught_up("pods", emulator.resource_version)`, and the
    # emulator's one counter would also count Event writes no pod watch ever brings back.
    # Reporting is tested against the real API server (tests/k8s/test_feedback_real.py).
    options.setdefault("report", False)
    async with running_adapter(api, **options) as running:
        yield running


@pytest.fixture
def start_adapter() -> Callable[..., contextlib.AbstractAsyncContextManager[tuple[KubernetesAdapter, EventLog]]]:
    """`async with start_adapter(api, **options) as (adapter, events):` a running adapter; `events` is its sink."""
    return _adapter
