"""A replica never folds past a hole in its log: events that left the stream unread stop it, with their range."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
import structlog
import yaml
from loopkit import configure, job
from structlog.testing import capture_logs

from muster.daemon.archiving import Sealer, SealerOptions
from muster.daemon.config import load_config
from muster.daemon.daemoncli import serve
from muster.daemon.following import LogFollower
from muster.daemon.metrics import DaemonMetrics
from muster.events.archive import DirectoryArchive
from muster.events.embedded import free_port
from muster.events.store import EventStore, LogHole, Retention


def daemon_config(tmp_path: Path, url: str, store: EventStore, **sections: Any) -> Any:
    """A simulated-cluster daemon's config for `store`'s stream, with a health port, and `sections` added."""
    path = tmp_path / "config.yaml"
    cfg = {
        "nats": {"url": url, "stream": store.stream, "subject_prefix": store.prefix},
        "leader_election": {"backend": "nats-kv", "kv_bucket": f"lead-{store.prefix}"},
        "http": {"health_port": free_port()},
        **sections,
    }
    path.write_text(yaml.safe_dump(cfg))
    return load_config(str(path), env={}, overrides={"simulated_cluster": "1x1x2x8", "identity": "muster-0"})


@contextlib.contextmanager
def captured_logs() -> Iterator[list[dict[str, Any]]]:
    """The structlog lines logged meanwhile; structlog left unconfigured if it was (capture_logs alone leaves it
    configured, and the CLI's quiet logging then never takes over)."""
    configured = structlog.is_configured()
    try:
        with capture_logs() as logs:
            yield logs
    finally:
        if not configured:
            structlog.reset_defaults()


async def ready(port: int) -> bool:
    """Whether the daemon's /readyz answers 200 (it folded the log and follows it)."""
    with contextlib.suppress(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/readyz") as resp:
            return resp.status == 200
    return False


async def test_a_daemon_without_archive_refuses_a_purged_stream_and_starts_with_it(
    nats_url: str, store: EventStore, tmp_path: Path
) -> None:
    """The stream's first events purged: without an archive the daemon exits 1 naming them; with it, it starts."""
    await configure(store)
    await store.append([job(f"j{i}") for i in range(20)])
    archive = tmp_path / "archive"
    options = SealerOptions(5, consumers=(), window=Retention(max_bytes=1), state_every=10)
    purged = (await Sealer(store, DirectoryArchive(archive), options).step()).purged
    assert purged > 10

    with captured_logs() as logs, anyio.fail_after(30):
        code = await serve(daemon_config(tmp_path, nats_url, store))
    assert code == 1
    holes = [e for e in logs if e["event"].startswith("the log has a hole")]
    assert [(h["log_level"], h["missing"]) for h in holes] == [("error", f"1..{purged}")]
    assert await store.last_seq() == 22, "it appended nothing (it never led)"

    cfg = daemon_config(tmp_path, nats_url, store, archive={"directory": str(archive)})
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve, cfg)
        with anyio.fail_after(30):
            while not await ready(cfg.health_port):  # noqa: ASYNC110 - readiness is polled over HTTP
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()


async def test_a_follower_that_finds_events_gone_stops_naming_them(store: EventStore) -> None:
    """Events purged after the replica folded, before it followed them: following stops with their range."""
    await configure(store)
    follower = LogFollower(store, DaemonMetrics(), buffer=100, catch_up_timeout=5)
    await follower.replay()
    assert follower.folded_seq == 2
    await store.append([job(f"j{i}") for i in range(5)])
    await store.purge_before(5)
    with captured_logs() as logs, anyio.fail_after(10), pytest.raises(LogHole) as hole:
        await follower.follow()
    assert (hole.value.first, hole.value.last) == (3, 4)
    assert [e["missing"] for e in logs if e["event"].startswith("the log has a hole")] == ["3..4"]
    assert follower.folded_seq == 2, "nothing after the hole was folded"
    follower.close()
