"""Helpers for the dashboard tests: logs to show, a served dashboard, waiting for a condition.

The logs are the replay tests' `muster sim` runs (`tests/replay/replaykit.py`,
put on the path here) and, for the browser, a `muster demo` log.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "replay"))

from replaykit import FLAVORED_QUEUES, IDLE, STORY, memory_log, mixed, sim, write_jsonl

from muster.ui.feed import Feed
from muster.ui.server import serve

__all__ = ["FLAVORED_QUEUES", "IDLE", "STORY", "memory_log", "mixed", "serving", "sim", "wait_for", "write_jsonl"]


@contextlib.asynccontextmanager
async def serving(feed: Feed, **options: Any) -> AsyncIterator[str]:
    """The dashboard of `feed` on a free port of 127.0.0.1, caught up with the log; yields its base URL."""
    async with anyio.create_task_group() as tg:
        port = await tg.start(functools.partial(serve, feed, port=0, **options))
        with anyio.fail_after(30):
            await feed.ready.wait()
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            tg.cancel_scope.cancel()


async def wait_for(check: Callable[[], Awaitable[bool]], what: str, seconds: float = 20.0) -> None:
    """Poll `check` until it holds; fail naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:g} s waiting for {what}")
        await anyio.sleep(0.05)
