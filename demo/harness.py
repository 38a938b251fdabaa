"""`muster demo`: the whole system on a laptop, with no cluster and no NATS.

It starts, in one process:
- an embedded nats-server with JetStream, its store in `DIR/nats`;
- an emulated Kubernetes API (kmock, `demo/emulator.py`) holding a
  512-GPU cluster (4 blocks x 4 racks x 4 nodes x 8 GPUs) and a simulated
  kubelet that runs bound pods for their runtime (divided by `speed`);
- the queue configuration on the log (four teams of 128 GPUs in one cohort);
- the real daemon: `SchedulerLoop` with NATS KV leader election and the
  Kubernetes adapter, exactly as `muster daemon` runs it;
- the teams' workload (`workload`), and a live view (`view`);
- GPU utilization measured as in production: a fake dcgm-exporter
  (`dcgm`) serves each running pod's GPU utilization (its gang's
  profile) over HTTP, and the daemon's real `UtilizationScraper` scrapes it
  into `GpuUtilizationSampled` events, which idle reclaim (on in the demo)
  and billing read. A rate card for the demo's GPU model is
  written to `DIR/rates.yaml` for `muster billing report --rates`.

It runs for `duration` seconds (or until Ctrl-C), then stops the daemon
cleanly and returns what happened; the stream stays in `DIR/nats` for
`muster replay`, `explain` and `audit`. The daemon's JSON logs go to
`DIR/daemon.log`.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog

__all__ = ["DemoOptions", "DemoResult", "prepare_dir", "run_demo"]

log = structlog.get_logger("muster.demo")

MARKER = ".muster-demo"
STREAM = "MUSTER"
RATES = """\
# The demo's rate card (illustrative prices, per GPU flavor): muster billing report --rates FILE
currency: USD
versions:
  - version: demo-2026
    effective_from: 2020-01-01
    gpu_hour: {default: 2.50, h100: 4.00, a100: 2.00}
    borrowed_premium: 1.25
    priority_discounts: {scavenger: 0.6}
"""


@dataclass
class DemoOptions:
    directory: Path = Path(".muster-demo")
    duration: float = 60.0
    speed: float = 4.0
    rate: float = 1.0
    """Gangs per second at speed 1."""
    seed: int = 1
    scrape_interval: float = 1.0
    """Seconds between scrapes of the fake dcgm-exporter (wall clock)."""
    idle_after: float = 16.0
    """Seconds at speed 1 a job may stay idle before idle reclaim (divided by `speed`, like runtimes)."""
    reserve_after: float | None = None
    """Seconds at speed 1 a gang may wait before its queue reserves room for it (None: no reservations)."""
    reconcile_seconds: float = 60.0
    """Seconds between the daemon's reconciliation passes (wall clock; the daemon's default)."""
    live: bool = True
    console: Any = None
    ui_port: int | None = None
    """Serve the web dashboard on this port of 127.0.0.1 (another free one if taken); None: no dashboard."""


@dataclass
class DemoResult:
    url: str
    port: int
    store_dir: Path
    stream: str
    events: int
    by_type: Counter[str] = field(default_factory=Counter)
    elapsed: float = 0.0
    submitted_gangs: int = 0
    replaced_pods: int = 0
    interrupted: bool = False
    sample_job: str = ""
    rates: Path | None = None
    scrapes: int = 0
    ui_url: str = ""


class DemoDirError(RuntimeError):
    pass


def prepare_dir(directory: Path) -> Path:
    """A fresh store folder under `directory`; refuses a non-empty folder the demo did not make."""
    directory = directory.resolve()
    if directory.exists() and any(directory.iterdir()) and not (directory / MARKER).exists():
        raise DemoDirError(f"{directory} exists and was not made by muster demo; choose another --dir")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MARKER).write_text("made by muster demo; safe to delete\n")
    store_dir = directory / "nats"
    if store_dir.exists():
        shutil.rmtree(store_dir)
    return store_dir


async def run_demo(options: DemoOptions) -> DemoResult:
    """Run the demo; returns once it has stopped (duration over, Ctrl-C, or SIGTERM)."""
    from muster.daemon.cluster import KubeCluster
    from muster.daemon.leader import KvElector
    from muster.daemon.loop import LoopOptions, SchedulerLoop
    from muster.daemon.utilization import UtilizationScraper
    from muster.demo.dcgm import FakeDcgm, serving
    from muster.demo.emulator import KubeEmulator, running
    from muster.demo.kubelet_sim import SimulatedKubelet
    from muster.demo.view import DemoStats, Replayed
    from muster.demo.workload import Workload, demo_config, demo_nodes
    from muster.events.embedded import EmbeddedNats
    from muster.events.store import EventStore

    store_dir = prepare_dir(options.directory)
    rates = store_dir.parent / "rates.yaml"
    rates.write_text(RATES)
    server = EmbeddedNats(store_dir, stop_timeout=5, binary=own_session_binary(store_dir.parent))
    await server.astart()
    started = time.monotonic()
    stats = DemoStats()
    interrupted = False
    ui_url = ""
    try:
        store = await EventStore.connect(server.url, stream=STREAM)
        try:
            idle_after = max(1, round(options.idle_after / options.speed))
            reserve_after = None if options.reserve_after is None else round(options.reserve_after / options.speed)
            await store.append(demo_config(int(time.time()), idle_after=idle_after, reserve_after=reserve_after))
            async with AsyncExitStack() as stack:
                emulator, api = await stack.enter_async_context(running(KubeEmulator(keep_requests=2000)))
                for node in demo_nodes():
                    emulator.put_object("v1/nodes", node)
                workload = Workload(emulator, api, seed=options.seed, rate=options.rate * options.speed)
                dcgm = FakeDcgm(
                    lambda: emulator.list_objects("v1/nodes"),
                    lambda: emulator.list_objects("v1/pods"),
                    workload.gpu_utilization,
                )
                dcgm_url = await stack.enter_async_context(serving(dcgm))
                # the daemon's own scraper, as `muster daemon --utilization-url` runs it
                scraper = UtilizationScraper(dcgm_url, source="exporter", interval=options.scrape_interval)
                elector = KvElector(store.js, holder="demo-daemon", ttl=5.0)
                loop = SchedulerLoop(
                    store,
                    elector=elector,
                    cluster=KubeCluster.factory(api, watch_seconds=60, reconcile_seconds=options.reconcile_seconds),
                    options=LoopOptions(debounce=0.01),
                    services=[scraper.run],
                )
                loop.on_fold(lambda seq, ev, ok: stats.observe(loop.state, seq, ev, ok))
                kubelet = SimulatedKubelet(api, speed=options.speed)
                stop = anyio.Event()
                stopped = anyio.Event()

                async def daemon(*, task_status: Any) -> None:
                    try:
                        await loop.run(task_status=task_status)
                    finally:
                        stopped.set()

                with _live_view(options, loop, stats, started) as redraw:
                    async with anyio.create_task_group() as tg:
                        if threading.current_thread() is threading.main_thread():
                            tg.start_soon(_stop_on_signal, stop)
                        await tg.start(kubelet.run)
                        await tg.start(workload.controller)
                        await tg.start(daemon)
                        tg.start_soon(workload.run)
                        if options.ui_port is not None:
                            ui_url = f"http://127.0.0.1:{await _dashboard(tg, store, loop, options.ui_port, rates)}/"
                            _console(options).print(f"dashboard: [bold]{ui_url}[/bold] (until the demo ends)")
                        with anyio.move_on_after(options.duration):
                            await _show(redraw, stop)
                        interrupted = stop.is_set()
                        loop.stop()  # steps down and releases the lease, as on SIGTERM
                        with anyio.move_on_after(10):
                            await stopped.wait()
                        tg.cancel_scope.cancel()
                    events = await store.last_seq()
                    by_type: Counter[str] = Counter()
                    sample = ""
                    final = Replayed()
                    async for batch in store.iter_batches(1, events):
                        for stored in batch:
                            by_type[type(stored.event).__name__] += 1
                            if not sample and type(stored.event).__name__ == "JobPreempted":
                                sample = getattr(stored.event, "job", "")
                            final.step(stored.seq, stored.event)
                    # the last frame is the log as it ends: facts and submissions land after the daemon stops folding
                    redraw(final.state, final.stats)
            if not sample:
                sample = next((j for j, s in loop.state.jobs.items() if s.status == "finished"), "")
        finally:
            with anyio.CancelScope(shield=True):
                await store.close()
    finally:
        await server.astop()
    return DemoResult(
        url=server.url,
        port=server.port,
        store_dir=store_dir,
        stream=STREAM,
        events=events,
        by_type=by_type,
        elapsed=time.monotonic() - started,
        submitted_gangs=len(workload.gangs),
        replaced_pods=workload.replaced,
        interrupted=interrupted,
        sample_job=sample,
        rates=rates,
        scrapes=dcgm.scrapes,
        ui_url=ui_url,
    )


async def _dashboard(tg: Any, store: Any, loop: Any, port: int, rates: Path) -> int:
    """Start the web dashboard of the daemon's fold on `port` (any free port when taken); returns its port."""
    import functools

    from muster.daemon.billing_report import load_rate_card
    from muster.ui.server import serve_stream

    serving = functools.partial(serve_stream, store, shared=loop, rates=load_rate_card(rates))
    try:
        port_used: int = await tg.start(functools.partial(serving, port=port))
    except OSError:  # another program (another demo?) holds the port
        port_used = await tg.start(functools.partial(serving, port=0))
    return port_used


_SESSION_WRAPPER = """#!{python}
# Runs nats-server in a session of its own: a Ctrl-C in the terminal goes to the whole foreground
# process group, and must reach only `muster demo`, which stops the daemon cleanly and the server last.
import os, sys
os.setsid()
os.execv({binary!r}, [{binary!r}, *sys.argv[1:]])
"""


def own_session_binary(directory: Path) -> Path:
    """A launcher for nats-server that puts it in its own session (same pid: it execs the real binary)."""
    import os
    import sys

    from muster.events.embedded import find_nats_server

    path = directory / "nats-server-own-session"
    path.write_text(_SESSION_WRAPPER.format(python=sys.executable, binary=str(find_nats_server())))
    os.chmod(path, 0o755)
    return path


def _console(options: DemoOptions) -> Any:
    """Every command's console (`cliutil.console`): a reader gone from the pipe ends the demo as it ends every
    command (141, silently), where rich's own console exits 1."""
    from muster.replay.cliutil import console

    return options.console or console()


Redraw = Callable[..., None]
"""`redraw()`: the daemon's state now; `redraw(state, stats)`: those."""


@contextlib.contextmanager
def _live_view(options: DemoOptions, loop: Any, stats: Any, started: float) -> Iterator[Redraw]:
    """The live view while the demo runs (nothing without `options.live`); yields the function that redraws it."""
    from rich.live import Live

    from muster.demo.view import render

    def view(state: Any = None, shown: Any = None) -> Any:
        return render(
            state if state is not None else loop.state,
            shown if shown is not None else stats,
            elapsed=time.monotonic() - started,
            duration=options.duration,
            speed=options.speed,
        )

    if not options.live:
        yield lambda *_: None
        return
    with Live(view(), console=_console(options), refresh_per_second=4, transient=False) as live:
        yield lambda *shown: live.update(view(*shown))


async def _show(redraw: Redraw, stop: anyio.Event) -> None:
    """Redraw four times a second until `stop` (or the caller's deadline)."""
    while not stop.is_set():
        with anyio.move_on_after(0.25):
            await stop.wait()
        redraw()


async def _stop_on_signal(stop: anyio.Event) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as received:
        async for _ in received:
            stop.set()
            return
