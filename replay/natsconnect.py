"""How the replay commands connect to NATS: the daemon's config file, credentials and TLS flags.

Role: the one reading of connection settings. `connect_options` turns a config's `nats`
block (inbox prefix, auth and TLS files) into `nats.connect` keywords for every client:
the daemon (`daemon.config.nats_connect_options`, which the appending commands use too),
`muster billing run`, and the commands that read the log through
`replay.source.open_source` (replay, explain, audit, whatif, jobs, queues, snapshot), whose
`--config FILE` is read by `read_config` (url, stream, subject_prefix and identity too).
`flag_options` reads the credential and TLS flags of every command: `--creds FILE` (a NATS
.creds file) and `--tls-ca/--tls-cert/--tls-key` override the config's. A file that cannot
be read or used is a `ConfigProblem` (exit 2), named with its path.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class ConfigProblem(Exception):
    """The config file or the files it names cannot be used (exit 2)."""


def add_connection_arguments(g: Any) -> None:
    """`--config`, `--creds` and the TLS files (on an argument group or parser)."""
    g.add_argument(
        "--config",
        metavar="FILE",
        help="a muster config file (the daemon's, or the chart's admin.yaml): connect with its `nats` block "
        "(url, stream, inbox prefix, auth, TLS files)",
    )
    add_credential_arguments(g)


def add_credential_arguments(g: Any) -> None:
    """`--creds` and the TLS files, read by `flag_options` (`billing run` has its own `--config`)."""
    g.add_argument("--creds", metavar="FILE", help="NATS user credentials file (.creds)")
    g.add_argument("--tls-ca", metavar="FILE", help="CA bundle to verify the NATS server (enables TLS)")
    g.add_argument("--tls-cert", metavar="FILE", help="client certificate (mutual TLS; with --tls-key)")
    g.add_argument("--tls-key", metavar="FILE", help="client key of --tls-cert")


def _readable(path: str, label: str) -> None:
    """Raise ConfigProblem `label: why` unless the file can be opened for reading."""
    try:
        open(path, "rb").close()
    except OSError as exc:
        raise ConfigProblem(f"{label}: {exc.strerror or exc}") from None


def _tls_context(ca: str | None, cert: str | None, key: str | None, what: str) -> Any:
    import ssl

    for path in (ca, cert, key):
        if path:
            _readable(path, f"{what}: {path}")
    try:
        ctx = ssl.create_default_context(cafile=ca)
        if cert:
            ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigProblem(f"{what}: {exc}") from None
    return ctx


def settings_of(args: argparse.Namespace) -> NatsSettings:
    """The connection the arguments ask for: `--config`'s `nats` block, then the flags (`--subject-prefix`,
    credentials and TLS files) over it."""
    config = getattr(args, "config", None)
    out = read_config(config) if config else NatsSettings()
    out.prefix = getattr(args, "subject_prefix", None) or out.prefix
    out.options.update(flag_options(args))
    return out


def flag_options(args: argparse.Namespace) -> dict[str, Any]:
    """`nats.connect` keywords of `--creds` and `--tls-*` (they override the config file's), checked.

    The one reading of these flags, for the commands that read the log and
    those that append to it (`muster.adminconnect`).
    """
    out: dict[str, Any] = {}
    creds = getattr(args, "creds", None)
    if creds:
        _readable(creds, f"--creds {creds}")
        out["user_credentials"] = creds
    ca, cert, key = (getattr(args, f, None) for f in ("tls_ca", "tls_cert", "tls_key"))
    if key and not cert:
        raise ConfigProblem("--tls-key goes with --tls-cert")
    if ca or cert:
        out["tls"] = _tls_context(ca, cert, key, "--tls-ca/--tls-cert")
    return out


@dataclass
class NatsSettings:
    """What `--config` says about connecting (the daemon's `nats` block) and who this replica is."""

    urls: list[str] | None = None
    stream: str | None = None
    prefix: str | None = None
    identity: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


def _read_secret(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError as exc:
        raise ConfigProblem(f"nats credentials: cannot read {path}: {exc.strerror or exc}") from None


def read_yaml(path: str) -> dict[str, Any]:
    """A config file's top-level mapping: the one reading of muster's config files (the daemon's too)."""
    import yaml

    from muster.replay.specreader import malformed

    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
    except OSError as exc:
        raise ConfigProblem(f"{path}: {exc.strerror or exc}") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise ConfigProblem(malformed(path, exc)) from None
    if not isinstance(doc, dict):
        raise ConfigProblem(f"{path}: expected a mapping at the top")
    return doc


def read_config(path: str) -> NatsSettings:
    """The `nats` block of a daemon config file, as connect options (the same reading as the daemon's)."""
    doc = read_yaml(path)
    nats_cfg = doc.get("nats") or {}
    if not isinstance(nats_cfg, dict):
        raise ConfigProblem(f"{path}: `nats` must be a mapping")
    out = NatsSettings(
        identity=str(doc["identity"]) if doc.get("identity") else None, options=connect_options(nats_cfg)
    )
    url = nats_cfg.get("url")
    if url:
        out.urls = [u.strip() for u in (url if isinstance(url, list) else str(url).split(",")) if str(u).strip()]
    if nats_cfg.get("stream"):
        out.stream = str(nats_cfg["stream"])
    if nats_cfg.get("subject_prefix"):
        out.prefix = str(nats_cfg["subject_prefix"])
    return out


def connect_options(nats_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """`nats.connect` keywords of a config's `nats` block: the identity's inbox, auth and TLS files (read now)."""
    if not isinstance(nats_cfg, Mapping):
        raise ConfigProblem("`nats` must be a mapping")
    opts: dict[str, Any] = {}
    if nats_cfg.get("inbox_prefix"):
        # the identity's own inbox: accounts.conf lets it receive replies only there
        opts["inbox_prefix"] = str(nats_cfg["inbox_prefix"])
    auth = nats_cfg.get("auth") or {}
    tls = nats_cfg.get("tls") or {}
    if not isinstance(auth, Mapping) or not isinstance(tls, Mapping):
        raise ConfigProblem("nats.auth and nats.tls must be mappings")
    if "username_file" in auth or "password_file" in auth:
        if "username_file" not in auth or "password_file" not in auth:
            raise ConfigProblem("nats.auth: username_file and password_file go together")
        opts["user"] = _read_secret(auth["username_file"])
        opts["password"] = _read_secret(auth["password_file"])
    if "token_file" in auth:
        opts["token"] = _read_secret(auth["token_file"])
    if "creds_file" in auth:
        opts["user_credentials"] = str(auth["creds_file"])
    if "nkey_seed_file" in auth:
        opts["nkeys_seed"] = str(auth["nkey_seed_file"])
    if tls:
        opts["tls"] = _tls_context(tls.get("ca_file"), tls.get("cert_file"), tls.get("key_file"), "nats.tls")
        if tls.get("server_name"):
            opts["tls_hostname"] = str(tls["server_name"])
    return opts
