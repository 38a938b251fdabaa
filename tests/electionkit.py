"""Running a leader elector in a test: until the block ends, or until the test crashes it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Protocol

import anyio


class Campaigning(Protocol):
    async def run(self) -> None: ...


@contextlib.asynccontextmanager
async def running(elector: Campaigning) -> AsyncIterator[anyio.CancelScope]:
    """Run the elector until the block ends; cancelling the yielded scope stops it (no resign), as a crash."""
    async with anyio.create_task_group() as tg:
        scope = anyio.CancelScope()

        async def run() -> None:
            with scope:
                await elector.run()

        tg.start_soon(run)
        yield scope
        tg.cancel_scope.cancel()
