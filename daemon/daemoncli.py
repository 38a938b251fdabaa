"""`muster daemon`: the long-running scheduler (one replica of the Deployment).

Reads `--config FILE` (the chart's config.yaml), `MUSTER_*` variables and
flags (flags win), connects to NATS (creating the stream if needed), joins
leader election (a NATS KV key, or with `--leader-backend lease` a Kubernetes
Lease), and runs the scheduler loop against Kubernetes (in-cluster config,
else `--kubeconfig`/~/.kube/config) or, with `--simulated-cluster 4x4x4x8`,
against an in-process simulated cluster (lease election still needs the API). SIGTERM or SIGINT: the
replica releases its lease (a standby takes over at once) and exits 0.

Exit status: 0 after a signal, 1 when NATS cannot be reached, 2 on a bad
configuration. Top-level imports stay light (the CLI imports every command).
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from muster.events.leases import LEADER_NAME

_FILE_FLAGS = {
    "username_file": ("auth", "a file holding the NATS user name"),
    "password_file": ("auth", "a file holding the NATS password"),
    "token_file": ("auth", "a file holding a NATS token"),
    "creds_file": ("auth", "a NATS .creds file (JWT + NKey)"),
    "nkey_seed_file": ("auth", "a file holding an NKey seed"),
    "ca_file": ("tls", "CA bundle to verify the NATS server"),
    "cert_file": ("tls", "client certificate (mutual TLS)"),
    "key_file": ("tls", "client key (mutual TLS)"),
    "server_name": ("tls", "TLS server name to verify"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config (as mounted by the Helm chart)")
    parser.add_argument("--nats", help="NATS URL(s), comma-separated (default: $NATS_URL or nats://127.0.0.1:4222)")
    parser.add_argument("--stream", help="JetStream stream of the log (default MUSTER)")
    parser.add_argument("--subject-prefix", help="subject prefix of the log (default muster)")
    parser.add_argument("--identity", help="this replica's name in leader election (default $POD_NAME)")
    parser.add_argument("--leader-ttl", type=float, help="leader lease TTL in seconds (default 10)")
    parser.add_argument("--kv-bucket", help=f"KV bucket of the leader lease (default {LEADER_NAME})")
    parser.add_argument(
        "--leader-backend", choices=("nats-kv", "lease", "none"), help="leader election (default nats-kv)"
    )
    parser.add_argument("--lease-name", help=f"Kubernetes Lease of --leader-backend lease (default {LEADER_NAME})")
    parser.add_argument("--lease-namespace", help="the Lease's namespace (default: the pod's, $POD_NAMESPACE)")
    parser.add_argument("--health-port", type=int, help="serve /healthz and /readyz on this port")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port")
    parser.add_argument("--log-level", help="debug, info, warning, error (default info)")
    parser.add_argument("--log-format", choices=("json", "console"), help="default json")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else ~/.kube/config)")
    parser.add_argument("--scheduler-name", help="pods with this schedulerName are muster's (default muster)")
    parser.add_argument(
        "--simulated-cluster",
        metavar="BxRxNxG",
        help="no Kubernetes: an in-process cluster of B blocks x R racks x N nodes x G GPUs (e.g. 4x4x4x8)",
    )
    parser.add_argument("--utilization-url", help="DCGM metrics: a Prometheus URL or dcgm-exporter URL(s)")
    parser.add_argument(
        "--utilization-source",
        choices=("prometheus", "exporter"),
        help="what --utilization-url is: a Prometheus server (default) or dcgm-exporter /metrics URL(s)",
    )
    parser.add_argument("--utilization-interval", type=float, help="seconds between scrapes (default 60)")
    parser.add_argument("--connect-timeout", type=float, default=30.0, help="seconds to reach NATS at start")
    for key, (_, what) in _FILE_FLAGS.items():
        parser.add_argument(f"--nats-{key.replace('_', '-')}", dest=f"nats_{key}", help=what)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    nats: dict[str, Any] = {"url": args.nats, "stream": args.stream, "subject_prefix": args.subject_prefix}
    for key, (section, _) in _FILE_FLAGS.items():
        value = getattr(args, f"nats_{key}", None)
        if value is not None:
            nats.setdefault(section, {})[key] = value
    return {
        "identity": args.identity,
        "simulated_cluster": args.simulated_cluster,
        "nats": nats,
        "leader_election": {
            "backend": args.leader_backend,
            "ttl_seconds": args.leader_ttl,
            "kv_bucket": args.kv_bucket,
            "lease_name": args.lease_name,
            "lease_namespace": args.lease_namespace,
        },
        "http": {"health_port": args.health_port, "metrics_port": args.metrics_port},
        "log": {"level": args.log_level, "format": args.log_format},
        "kubernetes": {"kubeconfig": args.kubeconfig, "scheduler_name": args.scheduler_name},
        "utilization": {
            "url": args.utilization_url,
            "source": args.utilization_source,
            "interval_seconds": args.utilization_interval,
        },
    }


def run(args: argparse.Namespace) -> int:
    import anyio

    from muster.daemon import heap
    from muster.daemon.config import ConfigError, load_config
    from muster.daemon.logs import configure_logging

    try:
        cfg = load_config(args.config, overrides=_overrides(args))
    except ConfigError as exc:
        print(f"muster daemon: {exc}", file=sys.stderr)
        return 2
    configure_logging(cfg.log_level, cfg.log_format)
    heap.tune()
    try:
        code: int = anyio.run(serve, cfg, args.connect_timeout)
    except ConfigError as exc:
        print(f"muster daemon: {exc}", file=sys.stderr)
        return 2
    return code


def parse_shape(spec: str) -> tuple[int, int, int, int]:
    """`BxRxNxG` -> (blocks, racks, nodes per rack, GPUs per node)."""
    from muster.daemon.config import ConfigError

    parts = spec.lower().split("x")
    try:
        numbers = tuple(int(p) for p in parts)
    except ValueError:
        numbers = ()
    if len(numbers) != 4 or any(n < 1 for n in numbers):
        raise ConfigError(f"simulated cluster {spec!r}: expected BLOCKSxRACKSxNODESxGPUS, e.g. 4x4x4x8")
    return numbers[0], numbers[1], numbers[2], numbers[3]


async def serve(cfg: Any, connect_timeout: float = 30.0) -> int:
    """Run one replica until SIGTERM/SIGINT (or cancellation)."""
    import anyio
    import structlog

    from muster.daemon.cluster import Cluster, ClusterFactory
    from muster.daemon.config import nats_connect_options
    from muster.daemon.leader import KvElector
    from muster.daemon.loop import Elector, SchedulerLoop, Service, SoleElector, Standby
    from muster.daemon.metrics import DaemonMetrics
    from muster.events.store import EventStore, StoreError, url_problem
    from muster.projections import CORE

    log = structlog.get_logger("muster.daemon")
    structlog.contextvars.bind_contextvars(replica=cfg.identity)
    log.info("starting", config=cfg.describe(), core=CORE)
    if cfg.unknown:
        log.warning("configuration keys not used by the daemon", keys=cfg.unknown)
    if cfg.namespaces:
        log.warning("kubernetes.namespaces is not supported yet: pods of every namespace are scheduled")
    options = nats_connect_options(cfg)
    for url in cfg.nats_urls:
        if (problem := url_problem(url)) is not None:
            print(f"muster daemon: {problem}", file=sys.stderr)
            return 2
    try:
        with anyio.fail_after(connect_timeout):
            store = await EventStore.connect(
                cfg.nats_urls,
                stream=cfg.stream,
                prefix=cfg.subject_prefix,
                name=f"muster-daemon/{cfg.identity}",
                retention=cfg.retention_ceiling,
                **options,
            )
    except (StoreError, TimeoutError) as exc:
        why = f"no answer within {connect_timeout:g} s" if isinstance(exc, TimeoutError) else str(exc)
        print(f"muster daemon: cannot use NATS at {', '.join(cfg.describe()['nats']['urls'])}: {why}", file=sys.stderr)
        return 1
    api_client: Any = None
    try:
        metrics = DaemonMetrics()
        if cfg.leader_backend == "lease" or not cfg.simulated_cluster:
            api_client = await _kubernetes(cfg)
        elector: Elector
        if cfg.leader_backend == "none":
            elector = SoleElector(cfg.identity)
        elif cfg.leader_backend == "lease":
            from muster.daemon.k8s.lease import LeaseElector

            elector = LeaseElector(api_client, cfg.lease_namespace, cfg.lease_name, cfg.identity, cfg.leader_ttl)
        else:
            elector = KvElector(store.js, holder=cfg.identity, bucket=cfg.leader_bucket, ttl=cfg.leader_ttl)
        standby: list[Standby] = []
        if cfg.simulated_cluster:
            from muster.demo.simcluster import SimulatedCluster, block_rack_nodes

            nodes = block_rack_nodes(*parse_shape(cfg.simulated_cluster))

            def simulated(state: Any) -> Cluster:
                return SimulatedCluster(nodes, state)

            cluster: ClusterFactory = simulated
        else:
            from muster.daemon.cluster import KubeCluster

            clusters = KubeCluster.factory(
                api_client,
                scheduler_name=cfg.scheduler_name,
                pod_conditions=cfg.pod_conditions,
                workload_status=cfg.workload_status,
                bind_connections=cfg.bind_connections,
                report=cfg.events,
            )
            cluster, standby = clusters, [clusters.standby]  # a standby watches too: a takeover starts warm
        services: list[Service] = []
        if cfg.utilization_url:
            from muster.daemon.utilization import UtilizationScraper

            scraper = UtilizationScraper(
                cfg.utilization_url, source=cfg.utilization_source, interval=cfg.utilization_interval
            )
            services.append(scraper.run)
        from muster.daemon.warmstart import SnapshotStart, StartingPoint, stream_snapshots

        start: StartingPoint | None = await stream_snapshots(store)
        if cfg.archive_location:
            from muster.daemon.archiving import ArchiveStart, Sealer, SealerOptions
            from muster.events.archive import open_archive

            archive = await open_archive(cfg.archive_location, store.js)
            sealing = SealerOptions(
                cfg.archive_segment_events,
                cfg.archive_interval,
                tuple(cfg.archive_consumers),
                cfg.retention_window,
                cfg.archive_state_every,
            )
            services.append(Sealer(store, archive, sealing).run)
            # the stream's past may be purged: a replica folds archive and stream as one log
            snapshots = start.snapshots.backend if isinstance(start, SnapshotStart) else None
            start = ArchiveStart(store, archive, snapshots)
        loop = SchedulerLoop(
            store, elector=elector, cluster=cluster, metrics=metrics, services=services, standby=standby, start=start
        )
        if not await _serve_loop(cfg, loop, store, metrics):
            return 1
    finally:
        with anyio.move_on_after(5, shield=True):
            if api_client is not None:
                await api_client.close()
            await store.close()
    log.info("stopped")
    return 0


async def _serve_loop(cfg: Any, loop: Any, store: Any, metrics: Any) -> bool:
    """Run the loop and its endpoints until it stops; False when the log has a hole (the follower said which)."""
    import functools
    import threading

    import anyio
    import structlog

    from muster.daemon.endpoints import serve_http
    from muster.events.store import LogHole

    log = structlog.get_logger("muster.daemon")
    hole = False
    try:
        async with anyio.create_task_group() as tg:
            if threading.current_thread() is threading.main_thread():
                tg.start_soon(_stop_on_signal, loop)
            if cfg.health_port is not None or cfg.metrics_port is not None:
                http = functools.partial(
                    serve_http, loop, metrics.registry, health_port=cfg.health_port, metrics_port=cfg.metrics_port
                )
                ports = await tg.start(http)
                log.info("serving http", ports=ports)
            if cfg.ui_port is not None:
                from muster.ui.server import serve_stream

                dashboard = functools.partial(
                    serve_stream, store, shared=loop, host=cfg.ui_host, port=cfg.ui_port, token_file=cfg.ui_token_file
                )
                log.info("serving the dashboard", host=cfg.ui_host, port=await tg.start(dashboard))
            await loop.run()
            tg.cancel_scope.cancel()
    except* LogHole:
        log.error("stopped: a replica does not fold past a hole in its log")
        hole = True
    return not hole


async def _kubernetes(cfg: Any) -> Any:
    import os

    from kubernetes_asyncio import config as kube_config
    from kubernetes_asyncio.client import ApiClient

    from muster.daemon.config import ConfigError

    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST") and not cfg.kubeconfig:
            kube_config.load_incluster_config()  # type: ignore[no-untyped-call]
        else:
            await kube_config.load_kube_config(config_file=cfg.kubeconfig)
    except Exception as exc:
        raise ConfigError(
            f"no Kubernetes configuration ({type(exc).__name__}: {exc}); use --kubeconfig, or --simulated-cluster"
        ) from None
    return ApiClient()


async def _stop_on_signal(loop: Any) -> None:
    import anyio
    import structlog

    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
        async for signum in received:
            structlog.get_logger("muster.daemon").info("stopping", signal=signal.Signals(signum).name)
            loop.stop()
            return
