"""`muster billing run|report`: the chargeback subscriber and its reports.

`run` folds the stream into the ledger until SIGTERM/SIGINT (finishing the
batch in hand) or, with `--once`, until it has caught up. `report` prices and
prints the ledger. Top-level imports stay light: the heavy modules load in the
subcommand that needs them.

`run --config FILE` reads the YAML the Helm chart mounts (`nats.url`,
`nats.stream`, `nats.inbox_prefix`, `nats.auth.*_file`, `nats.tls.*`,
`billing.consumer`, `billing.data_dir`, `http.metrics_port`,
`http.health_port`); flags given on the command line win. The `nats`
block's inbox, auth and TLS files, and `--creds` and `--tls-*` over them, are
read by the one connection module every client uses (`replay.natsconnect`),
before NATS is reached.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

DEFAULT_DB = "sqlite:///muster-billing.db"
CONFIG_TOP = frozenset({"billing", "nats", "http", "log", "identity"})
"""The sections of the billing subscriber's config file (the chart's billing.yaml); others are refused."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from muster.replay.natsconnect import add_credential_arguments

    sub = parser.add_subparsers(dest="billing_command", metavar="SUBCOMMAND")
    sub.required = True

    run_help = "fold the event stream into the ledger (a durable JetStream consumer)"
    run = sub.add_parser("run", help=run_help, description=run_help)
    run.add_argument("--config", help="YAML config (as mounted by the Helm chart)")
    run.add_argument("--nats", help="NATS URL(s), comma-separated (default: $NATS_URL or nats://127.0.0.1:4222)")
    run.add_argument("--stream", help="JetStream stream of the log (default MUSTER)")
    run.add_argument("--db", help=f"ledger URL: sqlite:///FILE or postgresql://... (default {DEFAULT_DB})")
    run.add_argument("--durable", help="durable consumer name (default muster-billing)")
    run.add_argument("--once", action="store_true", help="catch up with the stream, then exit")
    run.add_argument(
        "--from-stream-start",
        action="store_true",
        help="a ledger whose next events left the stream (purged, dropped) starts at the stream's first message "
        "instead of refusing (it misses their GPU-hours)",
    )
    run.add_argument("--batch", type=int, default=1000, help="messages per fetch and per transaction")
    run.add_argument("--gpu-label", help="node label naming the GPU model (default nvidia.com/gpu.product)")
    run.add_argument("--connect-timeout", type=float, default=30.0, help="seconds to reach NATS at start")
    run.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port")
    run.add_argument("--health-port", type=int, help="serve /healthz and /readyz on this port")
    add_credential_arguments(run)
    run.set_defaults(_billing="run")

    report_help = "allocated, used, idle, borrowed and lost GPU-hours with costs, from the ledger"
    rep = sub.add_parser("report", help=report_help, description=report_help)
    rep.add_argument("--db", default=DEFAULT_DB, help=f"ledger URL (default {DEFAULT_DB})")
    rep.add_argument("--from", dest="start", help="start: ISO date/time (UTC) or epoch seconds (default: ledger start)")
    rep.add_argument("--to", dest="end", help="end (exclusive): ISO date/time or epoch seconds (default: ledger end)")
    rep.add_argument(
        "--by",
        choices=("queue", "job", "team", "flavor"),
        default="queue",
        help="one row per queue (default), job, team (the rate card's teams) or GPU flavor",
    )
    rep.add_argument(
        "-o",
        "--output",
        "--format",
        dest="format",
        choices=("table", "csv", "json", "jsonl"),
        default="table",
        help="table (default), csv, one JSON document (json) or one row per line (jsonl)",
    )
    rep.add_argument("--rates", help="rate card YAML (without it, costs are zero)")
    rep.add_argument(
        "--share-idle",
        choices=("nominal", "usage", "none"),
        default="none",
        help="charge the GPU-hours nobody held to the rows: by nominal quota, by allocated GPU-hours, "
        "or not at all (default: reported apart, as idle capacity)",
    )
    rep.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw GPU-hours per queue (--by flavor: per flavor) and allocated vs used",
    )
    rep.set_defaults(_billing="report")


def run(args: argparse.Namespace) -> int:
    if args._billing == "report":
        from muster.daemon.billing_report import report_command

        code: int = report_command(args)
        return code
    return _run_subscriber(args)


# ---------------------------------------------------------------- run


def _load_config(path: str | None) -> dict[str, Any]:
    """The chart's billing config, read as the daemon's is (ConfigError naming the file and key)."""
    from muster.daemon.config import check_keys, read_file

    data = read_file(path)
    if path:
        check_keys(data, path, top=CONFIG_TOP)
    return data


def _run_subscriber(args: argparse.Namespace) -> int:
    import anyio

    from muster.daemon.billing_store import LedgerError, LedgerUnreachable
    from muster.daemon.config import log_settings
    from muster.daemon.logs import configure_logging
    from muster.replay.natsconnect import ConfigProblem, connect_options, flag_options

    try:
        cfg = _load_config(args.config)
        # the chart writes `log` (json, the daemon's level) for this process too: it was never read
        level, fmt = log_settings(cfg.get("log"), default_format="console")
    except (OSError, ValueError) as exc:
        print(f"muster billing run: config: {exc}", file=sys.stderr)
        return 2
    configure_logging(level, fmt)
    try:
        # the flags over the config file's, both read and checked before NATS
        options = connect_options(cfg.get("nats") or {}) | flag_options(args)
    except ConfigProblem as exc:
        print(f"muster billing run: {exc}", file=sys.stderr)
        return 2
    try:
        code: int = anyio.run(_serve, args, cfg, options)
    except LedgerError as exc:
        print(f"muster billing run: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, LedgerUnreachable) else 2
    return code


async def _serve(args: argparse.Namespace, cfg: dict[str, Any], nats_options: dict[str, Any]) -> int:
    import threading

    import anyio

    from muster.daemon.billing import BillingMetrics, BillingSubscriber, SubscriberOptions
    from muster.daemon.billing_store import LedgerDB
    from muster.events.store import StoreError, connect_client, url_problem
    from muster.events.wire import redact

    nats_cfg = cfg.get("nats") or {}
    billing_cfg = cfg.get("billing") or {}
    http_cfg = cfg.get("http") or {}
    url = args.nats or nats_cfg.get("url") or os.environ.get("NATS_URL") or "nats://127.0.0.1:4222"
    db_url = args.db
    if db_url is None and billing_cfg.get("data_dir"):
        db_url = f"sqlite:///{os.path.join(billing_cfg['data_dir'], 'billing.db')}"
    options = SubscriberOptions(
        stream=args.stream or nats_cfg.get("stream") or "MUSTER",
        durable=args.durable or billing_cfg.get("consumer") or "muster-billing",
        batch=max(1, args.batch),
        from_stream_start=args.from_stream_start,
    )
    if args.gpu_label:
        options.gpu_label = args.gpu_label
    metrics_port = args.metrics_port if args.metrics_port is not None else http_cfg.get("metrics_port")
    health_port = args.health_port if args.health_port is not None else http_cfg.get("health_port")

    servers = [u.strip() for u in url.split(",")]
    for server in servers:
        if (problem := url_problem(server)) is not None:
            print(f"muster billing run: {problem}", file=sys.stderr)
            return 2
    ledger = LedgerDB.open(db_url or DEFAULT_DB)
    try:
        # a refused or unreachable server fails within seconds (the store's first-connection rule);
        # once connected, the client reconnects for ever
        with anyio.fail_after(args.connect_timeout):
            nc = await connect_client(
                servers,
                3,
                {
                    "name": "muster-billing",
                    "max_reconnect_attempts": -1,
                    "connect_timeout": 2,
                    "error_cb": _nats_error,
                    **nats_options,
                },
            )
        nc.options["reconnect_time_wait"] = 1.0
    except (StoreError, TimeoutError) as exc:
        ledger.close()
        why = f"no answer within {args.connect_timeout:g} s" if isinstance(exc, TimeoutError) else str(exc)
        print(f"muster billing run: cannot use NATS at {redact(url)}: {why}", file=sys.stderr)
        return 1
    metrics = BillingMetrics()
    sub = BillingSubscriber(nc.jetstream(), ledger, options, metrics)
    stop = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            if threading.current_thread() is threading.main_thread():
                tg.start_soon(_stop_on_signal, stop, signal.SIGTERM, signal.SIGINT)
            ports = {p for p in (metrics_port, health_port) if p}
            for port in sorted(ports):
                await tg.start(_http, sub, int(port), port == metrics_port, port == health_port)
            code = await _start_and_run(sub, once=args.once, stop=stop)
            tg.cancel_scope.cancel()  # the signal watcher and the HTTP servers
    finally:
        with anyio.move_on_after(5, shield=True):
            await sub.close()
            await nc.close()
        ledger.close()
    return code


async def _start_and_run(sub: Any, *, once: bool, stop: Any) -> int:
    """Start (waiting for the stream unless `once`), then fold until stopped or caught up."""
    import anyio
    import structlog

    from muster.daemon.billing import StreamMissing

    log = structlog.get_logger("muster.billing")
    while True:
        try:
            await sub.start()
            break
        except StreamMissing as exc:
            if once:
                print(f"muster billing run: {exc}", file=sys.stderr)
                return 1
            log.warning("billing.waiting_for_stream", error=str(exc))
            with anyio.move_on_after(2):
                await stop.wait()
            if stop.is_set():
                return 0
    await sub.run(once=once, stop=stop)
    log.info("billing.stopped", seq=sub.tracker.seq)
    return 0


async def _nats_error(exc: Exception) -> None:
    import structlog

    structlog.get_logger("muster.billing").warning("billing.nats", error=f"{type(exc).__name__}: {exc}")


async def _stop_on_signal(stop: Any, *signals: signal.Signals) -> None:
    import anyio
    import structlog

    with anyio.open_signal_receiver(*signals) as received:
        async for signum in received:
            structlog.get_logger("muster.billing").info("billing.stopping", signal=signum)
            stop.set()
            return


async def _http(sub: Any, port: int, metrics: bool, health: bool, *, task_status: Any) -> None:
    """Serve /metrics and/or /healthz, /readyz on `port` until cancelled."""
    import anyio
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    async def metrics_handler(_: web.Request) -> web.Response:
        body = generate_latest(sub.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ready\n" if sub.ready else "starting\n", status=200 if sub.ready else 503)

    app = web.Application()
    if metrics:
        app.router.add_get("/metrics", metrics_handler)
    if health:
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, "0.0.0.0", port).start()
        task_status.started()
        await anyio.sleep_forever()
    finally:
        with anyio.move_on_after(2, shield=True):
            await runner.cleanup()
