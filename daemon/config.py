"""The daemon's configuration: the YAML file the Helm chart mounts, `MUSTER_*` environment variables, flags.

Later sources win: file < environment < flags. The file's keys are those of
deploy/README.md ("The configuration files the pods read"); an environment
variable names a key as `MUSTER_<SECTION>_<KEY>` (`MUSTER_NATS_URL`,
`MUSTER_LEADER_ELECTION_TTL_SECONDS`, `MUSTER_HTTP_METRICS_PORT`, ...), its
value read as YAML (so `9090` is a number). `MUSTER_IDENTITY` (else
`POD_NAME`, else host and pid) names this replica in leader election; with
`leader_election.backend: lease` the Lease is `lease_namespace`/`lease_name`
(default: the pod's namespace, `$POD_NAMESPACE` or the service account's file,
and `muster-leader`).

Credentials are never in the configuration itself: it names files (mounted
from Secrets), read only when connecting. `describe()` is what may be logged.
"""

from __future__ import annotations

import copy
import os
import re
import socket
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from muster.events.leases import LEADER_NAME
from muster.events.store import Retention

__all__ = ["ConfigError", "DaemonConfig", "load_config", "nats_connect_options"]

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
"""The pod's namespace, as Kubernetes mounts it with the service account token."""

LOG_LEVELS = ("debug", "info", "warning", "error")
"""What `log.level` (`--log-level`) may be."""
LOG_FORMATS = ("json", "console")


def log_settings(section: Any, default_format: str = "json") -> tuple[str, str]:
    """A config file's `log` section as (level, format), checked: ConfigError naming what may be written.

    The one reading of it, for the daemon and the billing subscriber (the chart writes it for both).
    """
    section = section if isinstance(section, Mapping) else {}
    level = str(section.get("level", "info")).lower()
    fmt = str(section.get("format", default_format)).lower()
    if fmt not in LOG_FORMATS:
        raise ConfigError(f"log.format must be json or console, not {fmt!r}")
    if level not in LOG_LEVELS:
        # logging.getLevelName("LOUD") is no level: the process logged at info, saying nothing of the typo
        raise ConfigError(f"log.level must be one of {', '.join(LOG_LEVELS)}, not {level!r}")
    return level, fmt


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

SECTIONS = ("leader_election", "kubernetes", "utilization", "http", "nats", "log", "ui", "archive", "retention")
_TOP_KEYS = {*SECTIONS, "queues_file", "identity", "simulated_cluster"}

KEYS: dict[str, frozenset[str]] = {
    "nats": frozenset({"url", "stream", "subject_prefix", "inbox_prefix", "max_event_bytes", "auth", "tls"}),
    "nats.auth": frozenset({"username_file", "password_file", "token_file", "nkey_seed_file", "creds_file"}),
    "nats.tls": frozenset({"ca_file", "cert_file", "key_file", "server_name"}),
    "leader_election": frozenset({"backend", "ttl_seconds", "kv_bucket", "lease_name", "lease_namespace"}),
    "kubernetes": frozenset(
        {
            "scheduler_name",
            "namespaces",
            "kubeconfig",
            "pod_conditions",
            "events",
            "workload_status",
            "bind_connections",
        }
    ),
    "utilization": frozenset({"url", "source", "interval_seconds"}),
    "http": frozenset({"health_port", "metrics_port"}),
    "log": frozenset({"level", "format"}),
    "billing": frozenset({"consumer", "data_dir"}),
    "ui": frozenset({"port", "host", "token_file"}),
    "archive": frozenset(
        {"directory", "bucket", "segment_events", "interval_seconds", "consumers", "state_every_events"}
    ),
    "retention": frozenset({"max_age_seconds", "max_bytes", "ceiling_factor"}),
}
"""The keys each section of a config file may hold (deploy/README.md); a typo is an error, not a default."""


def check_keys(data: Mapping[str, Any], path: str, top: Collection[str] = frozenset(_TOP_KEYS)) -> None:
    """Raise ConfigError naming the first key of the file no muster command reads, and the valid ones."""

    def fail(where: str, key: object, valid: Collection[str]) -> ConfigError:
        return ConfigError(f"{path}: unknown key {where}{key!s} (valid: {', '.join(sorted(valid))})")

    for key in data:
        if key not in top:
            raise fail("", key, top)
    for section, allowed in sorted(KEYS.items()):
        head, _, sub = section.partition(".")
        value = data.get(head)
        if sub:
            value = value.get(sub) if isinstance(value, Mapping) else None
        if not isinstance(value, Mapping):
            continue  # absent, or a wrong type the typed views report
        for key in value:
            if key not in allowed:
                raise fail(f"{section}.", key, allowed)


class ConfigError(ValueError):
    """The configuration cannot be used (exit status 2)."""


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def read_file(path: str | None) -> dict[str, Any]:
    """The config file's mapping (`replay.natsconnect.read_yaml`, every command's reading), {} without one."""
    from muster.replay.natsconnect import ConfigProblem, read_yaml

    if not path:
        return {}
    try:
        return read_yaml(path)
    except ConfigProblem as exc:
        raise ConfigError(str(exc)) from None


def from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """`MUSTER_<SECTION>_<KEY>=value` as a nested mapping."""
    out: dict[str, Any] = {}
    for name, raw in sorted(env.items()):
        if not name.startswith("MUSTER_"):
            continue
        rest = name[len("MUSTER_") :].lower()
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        for section in sorted(SECTIONS, key=len, reverse=True):
            if rest.startswith(section + "_"):
                out.setdefault(section, {})[rest[len(section) + 1 :]] = value
                break
        else:
            if rest in _TOP_KEYS:
                out[rest] = value
    return out


@dataclass
class DaemonConfig:
    raw: dict[str, Any] = field(default_factory=dict)
    """The merged configuration (file, environment, flags)."""
    unknown: list[str] = field(default_factory=list)
    """Top-level keys of the file this daemon does not read (none: `check_keys` refuses them)."""

    def section(self, name: str) -> dict[str, Any]:
        value = self.raw.get(name) or {}
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: expected a mapping, not {value!r}")
        return value

    def get(self, section: str, key: str, default: Any = None) -> Any:
        value = self.section(section).get(key)
        return default if value is None or value == "" else value

    # ------------------------------------------------------------ typed views

    @property
    def nats_urls(self) -> list[str]:
        url = str(self.get("nats", "url", os.environ.get("NATS_URL") or "nats://127.0.0.1:4222"))
        return [u.strip() for u in url.split(",") if u.strip()]

    @property
    def stream(self) -> str:
        return str(self.get("nats", "stream", "MUSTER"))

    @property
    def subject_prefix(self) -> str:
        return str(self.get("nats", "subject_prefix", "muster"))

    @property
    def identity(self) -> str:
        value = self.raw.get("identity") or os.environ.get("POD_NAME")
        return str(value) if value else f"{socket.gethostname()}-{os.getpid()}"

    @property
    def leader_backend(self) -> str:
        return str(self.get("leader_election", "backend", "nats-kv"))

    @property
    def leader_ttl(self) -> float:
        return self._number("leader_election", "ttl_seconds", 10.0, minimum=0.5)

    @property
    def leader_bucket(self) -> str:
        return str(self.get("leader_election", "kv_bucket", LEADER_NAME))

    @property
    def lease_name(self) -> str:
        """The coordination.k8s.io Lease of `backend: lease` (the chart's Role names exactly this one)."""
        return str(self.get("leader_election", "lease_name", LEADER_NAME))

    @property
    def lease_namespace(self) -> str:
        """The Lease's namespace: the config's, else the pod's own ($POD_NAMESPACE, the service account's file)."""
        value = self.get("leader_election", "lease_namespace") or os.environ.get("POD_NAMESPACE")
        if not value:
            try:
                with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as f:
                    value = f.read().strip()
            except OSError:
                value = ""
        return str(value) if value else "default"

    @property
    def scheduler_name(self) -> str:
        return str(self.get("kubernetes", "scheduler_name", "muster"))

    @property
    def pod_conditions(self) -> bool:
        """Set PodScheduled=False with muster's reason on a waiting gang's pods (kubernetes.pod_conditions)."""
        return bool(self.get("kubernetes", "pod_conditions", True))

    @property
    def events(self) -> bool:
        """Write Kubernetes Events about decisions on gangs' pods and workloads (kubernetes.events)."""
        return bool(self.get("kubernetes", "events", True))

    @property
    def bind_connections(self) -> int:
        """Keep-alive connections that carry bindings, pipelined (kubernetes.bind_connections; 0: the client's own)."""
        return int(self._number("kubernetes", "bind_connections", 32, minimum=0))

    @property
    def workload_status(self) -> bool:
        """Annotate a gang's Job, JobSet or Kubeflow job with its status (kubernetes.workload_status)."""
        return bool(self.get("kubernetes", "workload_status", True))

    @property
    def namespaces(self) -> list[str]:
        value = self.get("kubernetes", "namespaces", [])
        return [str(v) for v in value] if isinstance(value, list) else [str(value)]

    @property
    def kubeconfig(self) -> str | None:
        value = self.get("kubernetes", "kubeconfig")
        return str(value) if value else None

    @property
    def utilization_url(self) -> str:
        return str(self.get("utilization", "url", ""))

    @property
    def utilization_source(self) -> str:
        return str(self.get("utilization", "source", "prometheus"))

    @property
    def utilization_interval(self) -> float:
        return self._number("utilization", "interval_seconds", 60.0, minimum=1.0)

    @property
    def health_port(self) -> int | None:
        return self._port("health_port")

    @property
    def metrics_port(self) -> int | None:
        return self._port("metrics_port")

    @property
    def ui_port(self) -> int | None:
        """The web dashboard's port (`muster ui` in the daemon); None: not served."""
        return self._port("port", section="ui")

    @property
    def ui_host(self) -> str:
        return str(self.get("ui", "host", "127.0.0.1"))

    @property
    def ui_token_file(self) -> str | None:
        value = self.get("ui", "token_file")
        return str(value) if value else None

    @property
    def archive_location(self) -> str | None:
        """Where the leader seals the stream's past: `archive.bucket` (a JetStream object store, as
        `nats-object:BUCKET`) or `archive.directory`; None: no sealer."""
        bucket, directory = self.get("archive", "bucket"), self.get("archive", "directory")
        if bucket and directory:
            raise ConfigError("archive: set directory or bucket, not both")
        return f"nats-object:{bucket}" if bucket else str(directory) if directory else None

    @property
    def archive_segment_events(self) -> int:
        return int(self._number("archive", "segment_events", 10_000, minimum=1))

    @property
    def archive_state_every(self) -> int:
        """Events between the states sealed with segments (a replay of the archive folds at most this many more)."""
        return int(self._number("archive", "state_every_events", 50_000, minimum=1))

    @property
    def archive_interval(self) -> float:
        return self._number("archive", "interval_seconds", 30.0, minimum=0.01)

    @property
    def archive_consumers(self) -> list[str]:
        """Durable consumers whose ack floor sealing never passes (default: billing's, `muster-billing`)."""
        value = self.get("archive", "consumers", ["muster-billing"])
        return [str(v) for v in value] if isinstance(value, list) else [str(value)]

    @property
    def retention_max_age(self) -> float:
        """Seconds the stream keeps a message: older sealed ones are purged by the sealer (0: no limit)."""
        return self._number("retention", "max_age_seconds", 0.0, minimum=0.0)

    @property
    def retention_max_bytes(self) -> int:
        """Bytes the stream keeps: the sealer purges sealed messages beyond them (0: no limit)."""
        return int(self._number("retention", "max_bytes", 0, minimum=0))

    @property
    def retention_ceiling_factor(self) -> float:
        """The stream's own JetStream limits are the window times this: they drop messages, sealed or
        not, only when no sealer has purged for that long."""
        return self._number("retention", "ceiling_factor", 10.0, minimum=1.0)

    @property
    def retention_window(self) -> Retention:
        """What the stream keeps: the window the leader's sealer purges to."""
        return Retention(self.retention_max_age, self.retention_max_bytes)

    @property
    def retention_ceiling(self) -> Retention:
        """The stream's own limits when the daemon creates it: the window times `ceiling_factor`."""
        factor = self.retention_ceiling_factor
        return Retention(self.retention_max_age * factor, int(self.retention_max_bytes * factor))

    @property
    def log_level(self) -> str:
        return str(self.get("log", "level", "info")).lower()

    @property
    def log_format(self) -> str:
        return str(self.get("log", "format", "json")).lower()

    @property
    def simulated_cluster(self) -> str | None:
        value = self.raw.get("simulated_cluster")
        return str(value) if value else None

    def _number(self, section: str, key: str, default: float, minimum: float) -> float:
        value = self.get(section, key, default)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{section}.{key}: {value!r} is not a number") from None
        if number < minimum:
            raise ConfigError(f"{section}.{key}: must be at least {minimum}, not {number}")
        return number

    def _port(self, key: str, section: str = "http") -> int | None:
        value = self.get(section, key)
        if value is None:
            return None
        try:
            port = int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{section}.{key}: {value!r} is not a port number") from None
        if not 0 <= port < 65536:
            raise ConfigError(f"{section}.{key}: {port} is not a port number")
        return port

    def check(self) -> None:
        """Fail early, with a sentence, on what cannot work."""
        if self.leader_backend not in ("nats-kv", "lease", "none"):
            raise ConfigError(
                f"leader_election.backend {self.leader_backend!r} is not supported (use nats-kv, lease or none)"
            )
        if self.leader_backend == "lease" and not _DNS_SUBDOMAIN.fullmatch(self.lease_name):
            raise ConfigError(f"leader_election.lease_name {self.lease_name!r} is not a valid Kubernetes object name")
        if self.utilization_url and self.utilization_source not in ("prometheus", "exporter"):
            raise ConfigError(f"utilization.source must be prometheus or exporter, not {self.utilization_source!r}")
        log_settings({"level": self.log_level, "format": self.log_format})
        if self.ui_port is not None:
            from muster.ui.server import exposure_problem, read_token

            try:
                token = read_token(self.ui_token_file, None)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"ui.token_file: {getattr(exc, 'strerror', None) or exc}") from None
            problem = exposure_problem(self.ui_host, token)
            if problem is not None:
                raise ConfigError(f"ui: {problem}")
        # the typed views raise ConfigError on values they cannot read
        _ = (self.leader_ttl, self.utilization_interval, self.health_port, self.metrics_port, self.namespaces)
        _ = self.bind_connections
        _ = (self.archive_segment_events, self.archive_interval, self.archive_state_every)
        _ = (self.retention_window, self.retention_ceiling)
        if (self.retention_max_age or self.retention_max_bytes) and not self.archive_location:
            raise ConfigError("retention: a bounded stream needs an archive, or its past is lost to replay")

    def describe(self) -> dict[str, Any]:
        """What may be logged: credentials appear only as the paths of their files."""
        nats = self.section("nats")
        auth = nats.get("auth") or {}
        return {
            "identity": self.identity,
            "nats": {
                "urls": [_without_userinfo(u) for u in self.nats_urls],
                "stream": self.stream,
                "subject_prefix": self.subject_prefix,
                "auth": sorted(k for k in auth if k.endswith("_file")) if isinstance(auth, dict) else [],
                "tls": bool(nats.get("tls")),
            },
            "leader_election": self._describe_election(),
            "kubernetes": {
                "scheduler_name": self.scheduler_name,
                "namespaces": self.namespaces,
                "pod_conditions": self.pod_conditions,
                "events": self.events,
                "workload_status": self.workload_status,
                "bind_connections": self.bind_connections,
            },
            "utilization": {"url": _without_userinfo(self.utilization_url), "source": self.utilization_source},
            "http": {"health_port": self.health_port, "metrics_port": self.metrics_port},
            "ui": {"port": self.ui_port, "host": self.ui_host, "token": bool(self.ui_token_file)},
            "archive": {"location": self.archive_location, "consumers": self.archive_consumers},
            "retention": {
                "max_age_seconds": self.retention_max_age,
                "max_bytes": self.retention_max_bytes,
                "ceiling_factor": self.retention_ceiling_factor,
            },
            "simulated_cluster": self.simulated_cluster,
        }

    def _describe_election(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.leader_backend, "ttl_seconds": self.leader_ttl}
        if self.leader_backend == "lease":
            out["lease"] = f"{self.lease_namespace}/{self.lease_name}"
        elif self.leader_backend == "nats-kv":
            out["kv_bucket"] = self.leader_bucket
        return out


def _without_userinfo(url: str) -> str:
    """A URL with any `user:password@` removed."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    host = rest.split("/", 1)
    if "@" in host[0]:
        host[0] = "***@" + host[0].rsplit("@", 1)[1]
    return f"{scheme}://{'/'.join(host)}"


def load_config(
    path: str | None, *, env: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None
) -> DaemonConfig:
    """Merge the file, the environment and the flags' `overrides` (nested like the file; None = not given)."""
    merged = read_file(path)
    check_keys(merged, str(path))
    unknown = sorted(set(merged) - _TOP_KEYS)
    merged = _deep_merge(merged, from_env(os.environ if env is None else env))
    merged = _deep_merge(merged, _prune(overrides or {}))
    cfg = DaemonConfig(merged, unknown)
    cfg.check()
    return cfg


def _prune(value: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in value.items():
        if isinstance(v, Mapping):
            sub = _prune(v)
            if sub:
                out[key] = sub
        elif v is not None:
            out[key] = v
    return out


def nats_connect_options(cfg: DaemonConfig) -> dict[str, Any]:
    """`nats.connect` keywords for the config's auth and TLS files (`replay.natsconnect`, every client's reading)."""
    from muster.replay.natsconnect import ConfigProblem, connect_options

    try:
        return connect_options(cfg.section("nats"))
    except ConfigProblem as exc:
        raise ConfigError(str(exc)) from None
