"""The daemon's HTTP endpoints: `/healthz`, `/readyz` and Prometheus `/metrics`.

- `/healthz` (liveness): 200 while the loop turns; 503 once it is caught up
  but has not turned for `stall_seconds` (a wedged loop should be restarted).
- `/readyz` (readiness): 200 once the replica has folded the log it found at
  start and follows it; 503 before that and after it stopped.
- `/metrics`: the daemon's registry (`metrics.DaemonMetrics`).

Health and metrics may share a port or have one each (the Helm chart uses
8080 and 9090).
"""

from __future__ import annotations

from typing import Any, Protocol

import anyio
from anyio.abc import TaskStatus

__all__ = ["Observed", "serve_http"]


class Observed(Protocol):
    """What the endpoints read (`SchedulerLoop` fits)."""

    ready: bool

    @property
    def folded_seq(self) -> int: ...

    @property
    def epoch(self) -> int: ...

    @property
    def heartbeat(self) -> float: ...


async def serve_http(
    observed: Observed,
    registry: Any,
    *,
    health_port: int | None,
    metrics_port: int | None,
    host: str = "0.0.0.0",
    stall_seconds: float = 60.0,
    task_status: TaskStatus[list[int]] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; reports started with the bound ports (0 in the config picks a free one)."""
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from muster.ui.server import start_site

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        stalled = observed.ready and anyio.current_time() - observed.heartbeat > stall_seconds
        if stalled:
            return web.Response(text="stalled\n", status=503)
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if observed.ready:
            role = "leader" if observed.epoch else "standby"
            return web.Response(text=f"ready {role} seq={observed.folded_seq}\n")
        return web.Response(text="starting\n", status=503)

    ports: dict[int, web.Application] = {}
    for port, routes in ((health_port, "health"), (metrics_port, "metrics")):
        if port is None:
            continue
        app = ports.setdefault(port, web.Application())
        if routes == "health":
            app.router.add_get("/healthz", healthz)
            app.router.add_get("/readyz", readyz)
        else:
            app.router.add_get("/metrics", metrics)
    runners: list[web.AppRunner] = []
    bound: list[int] = []
    try:
        for port, app in ports.items():
            runner = web.AppRunner(app, handle_signals=False, access_log=None)
            runners.append(runner)
            await runner.setup()
            bound.append(await start_site(runner, host, port))
        task_status.started(bound)
        await anyio.sleep_forever()
    finally:
        with anyio.move_on_after(2, shield=True):
            for runner in runners:
                await runner.cleanup()
