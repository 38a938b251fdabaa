"""A bounded number of operations in flight, taken without a trip through the event loop when one is free.

`anyio.CapacityLimiter` yields to the event loop on every acquire (anyio makes
every async call a checkpoint), even when a token is free. The applier takes
a slot for every decision and the Kubernetes applier one for every binding:
two extra loop iterations per bound pod, each resuming a coroutine chain some
twenty frames deep, for nothing. `Slots` takes a free token at once
(`acquire_nowait`, which queues behind waiting tasks, so it stays fair) and
waits as the limiter does only when none is free. The operation that follows
(a request) yields anyway.
"""

from __future__ import annotations

from types import TracebackType

import anyio

__all__ = ["Slots"]


class Slots:
    """`async with slots:` holds one of `total` tokens for the current task."""

    def __init__(self, total: int) -> None:
        self.limiter = anyio.CapacityLimiter(total)

    async def __aenter__(self) -> None:
        try:
            self.limiter.acquire_nowait()
        except anyio.WouldBlock:
            await self.limiter.acquire()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.limiter.release()
