"""`muster snapshot [--every N] [--verify] [--follow [--leader BUCKET/KEY | --log-leader]] [--list]`.

One shot: start from the nearest trusted snapshot (checking unverified ones
on the way; with --verify, every snapshot from the start of the log), fold
to the end of the log and write a snapshot whenever the sequence crosses a
multiple of N. Snapshots written here are verified by construction (folded
from a trusted point). With --follow (a stream only) it keeps following the
log and writing, printing a line per due point. Snapshots go to the object
store bucket STREAM-snapshots (or --snapshots), or to a directory for a file
log (--snapshots DIR).

Production (the Helm chart's `snapshots` sidecar, one per daemon replica):
`muster snapshot --config /etc/muster/config.yaml --follow --every 50000
--leader muster-leader/leader --holder $(POD_NAME)`. `--config` reads the
`nats` block of the daemon's config file (url, stream, subject_prefix,
inbox_prefix, auth and TLS files), so the sidecar connects as the daemon
does. `--leader` gates the writes on the daemon's leader election: a
snapshot is written only if, when it falls due, the leader key names
`--holder` (default: $MUSTER_IDENTITY, the config's `identity`, $POD_NAME,
then the host name, the daemon's own order without its pid). `--log-leader`
gates them on the log instead: the last `LeaderElected` folded names
`--holder` (the chart's choice with the Lease backend, whose lease is no KV
key; it works with either). Every replica folds; the leader's writes. A double write at a handover is harmless:
snapshots are keyed by sequence and verified on load.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field
from typing import Any

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_KEY = re.compile(r"^[-/_=.A-Za-z0-9]+$")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from muster.replay.cliargs import add_source_arguments

    add_source_arguments(p)
    # resolved in run(): a flag, else the config's nats.stream, else $MUSTER_STREAM or MUSTER
    p.set_defaults(stream=None)
    p.add_argument(
        "--config",
        metavar="FILE",
        help="the daemon's config file: connect with its `nats` block (url, stream, inbox prefix, auth, TLS files)",
    )
    p.add_argument("--snapshots", metavar="WHERE", help="bucket (NATS; default STREAM-snapshots) or directory (--log)")
    p.add_argument("--every", type=int, default=50_000, metavar="N", help="a snapshot every N events (default 50000)")
    p.add_argument("--format", choices=["msgpack+zlib", "msgpack", "json"], default="msgpack+zlib")
    p.add_argument("--verify", action="store_true", help="check every existing snapshot against a fold from the start")
    p.add_argument("--follow", action="store_true", help="keep following the stream and writing snapshots")
    p.add_argument(
        "--leader",
        metavar="BUCKET[/KEY]",
        help="write only while this KV key of the daemon's leader election names --holder "
        "(e.g. muster-leader/leader; KEY defaults to leader)",
    )
    p.add_argument(
        "--log-leader",
        action="store_true",
        help="write only while the log's current leader (its last LeaderElected) is --holder (either election backend)",
    )
    p.add_argument(
        "--holder",
        metavar="NAME",
        help="this replica's name in the leader key (default: $MUSTER_IDENTITY, the config's identity, "
        "$POD_NAME, the host name)",
    )
    p.add_argument("--list", action="store_true", help="only list the snapshots")
    p.add_argument("--output", choices=["table", "json"], default="table")


class ConfigProblem(Exception):
    """The config file or the files it names cannot be used (exit 2)."""


def parse_leader(spec: str) -> tuple[str, str]:
    """`BUCKET` or `BUCKET/KEY` (KEY defaults to the daemon's `leader`)."""
    from muster.events.leases import LEADER_KEY

    bucket, _, key = spec.partition("/")
    key = key or LEADER_KEY
    if not _NAME.match(bucket) or not _KEY.match(key) or key.startswith(".") or key.endswith("."):
        raise ValueError(f"--leader {spec!r}: expected BUCKET or BUCKET/KEY (a KV bucket name and key)")
    return bucket, key


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


def read_config(path: str) -> NatsSettings:
    """The `nats` block of a daemon config file, as connect options (the same reading as the daemon's)."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
    except OSError as exc:
        raise ConfigProblem(f"{path}: {exc.strerror or exc}") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise ConfigProblem(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigProblem(f"{path}: expected a mapping at the top")
    nats_cfg = doc.get("nats") or {}
    if not isinstance(nats_cfg, dict):
        raise ConfigProblem(f"{path}: `nats` must be a mapping")
    out = NatsSettings(identity=str(doc["identity"]) if doc.get("identity") else None)
    url = nats_cfg.get("url")
    if url:
        out.urls = [u.strip() for u in (url if isinstance(url, list) else str(url).split(",")) if str(u).strip()]
    if nats_cfg.get("stream"):
        out.stream = str(nats_cfg["stream"])
    if nats_cfg.get("subject_prefix"):
        out.prefix = str(nats_cfg["subject_prefix"])
    opts = out.options
    if nats_cfg.get("inbox_prefix"):
        # the identity's own inbox: accounts.conf lets it receive replies only there
        opts["inbox_prefix"] = str(nats_cfg["inbox_prefix"])
    auth = nats_cfg.get("auth") or {}
    tls = nats_cfg.get("tls") or {}
    if not isinstance(auth, dict) or not isinstance(tls, dict):
        raise ConfigProblem(f"{path}: nats.auth and nats.tls must be mappings")
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
        import ssl

        try:
            ctx = ssl.create_default_context(cafile=tls.get("ca_file"))
            if tls.get("cert_file"):
                ctx.load_cert_chain(tls["cert_file"], tls.get("key_file"))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigProblem(f"nats.tls: {exc}") from None
        opts["tls"] = ctx
        if tls.get("server_name"):
            opts["tls_hostname"] = str(tls["server_name"])
    return out


def default_holder(settings: NatsSettings | None) -> str:
    """The daemon's identity order: $MUSTER_IDENTITY, the config's identity, $POD_NAME, the host name."""
    import socket

    return (
        os.environ.get("MUSTER_IDENTITY")
        or (settings.identity if settings is not None else None)
        or os.environ.get("POD_NAME")
        or socket.gethostname()
    )


def run(args: argparse.Namespace) -> int:
    import sys

    from muster.replay.cliutil import UsageError, run_command

    if args.every < 1:
        print("muster snapshot: --every must be at least 1", file=sys.stderr)
        return 2
    leader: tuple[str, str] | None = None
    settings: NatsSettings | None = None
    try:
        if args.leader:
            leader = parse_leader(args.leader)
        if args.config:
            if args.log:
                raise ConfigProblem("--config connects to NATS; it does not go with --log")
            settings = read_config(args.config)
    except (ValueError, ConfigProblem) as exc:
        print(f"muster snapshot: {exc}", file=sys.stderr)
        return 2
    if args.stream is None:
        args.stream = (settings.stream if settings else None) or os.environ.get("MUSTER_STREAM", "MUSTER")
    holder = args.holder or default_holder(settings)

    async def body(source: Any, store: Any) -> int:
        from muster.replay.cliutil import dump_json, open_snapshots

        if store is None and not args.snapshots:
            raise UsageError("a file log keeps its snapshots in a directory: add --snapshots DIR")
        if args.follow and store is None:
            raise UsageError("--follow needs a stream (--nats/--stream), not a file")
        if leader is not None and store is None:
            raise UsageError("--leader needs a stream (--nats/--stream): the leader key is in NATS")
        if leader is not None and args.log_leader:
            raise UsageError("--leader and --log-leader are two gates: give one")
        snapshots = await open_snapshots(args, source, store, create=not args.list)
        if snapshots is None:
            print(f"no snapshots for {source.name}")
            return 0
        if args.list:
            metas = await snapshots.catalog()
            if args.output == "json":
                from muster.replay.snapshots import describe

                dump_json([describe(m) for m in metas])
            else:
                render_list(metas)
            return 0
        from muster.replay.snapshots import KvLeaderGate, LeaderGate, LogLeaderGate, SnapshotMeta, write_snapshots

        gate: LeaderGate | None = None
        if leader is not None:
            gate = KvLeaderGate(store.js, holder, bucket=leader[0], key=leader[1])
        elif args.log_leader:
            gate = LogLeaderGate(holder)

        def progress(seq: int, meta: SnapshotMeta | None) -> None:
            if meta is not None and meta.format != args.format:
                print(
                    f"muster snapshot: seq {seq:,}: the state holds a number past {args.format}'s 64-bit integers "
                    f"(a job the scheduler rejects); written as {meta.format}",
                    file=sys.stderr,
                )
            if not args.follow:
                return  # the summary says it all
            if args.output == "json":
                import json

                line: dict[str, Any] = {"seq": seq, "written": meta is not None}
                if meta is None and gate is not None:
                    line["reason"] = gate.why_not()
                print(json.dumps(line), flush=True)
            elif meta is not None:
                print(f"{source.name}: wrote the snapshot at seq {seq:,} ({meta.jobs:,} jobs)", flush=True)
            else:
                why = gate.why_not() if gate is not None else "not allowed"
                print(f"{source.name}: seq {seq:,} left to the leader: {why}", flush=True)

        if args.follow and args.output == "table":
            gating = f", while {leader[0]}/{leader[1]} names {holder!r}" if leader is not None else ""
            if args.log_leader:
                gating = f", while the log's leader is {holder!r}"
            print(f"{source.name}: following, a snapshot every {args.every:,} events{gating}", flush=True)
        doc = await write_snapshots(
            source,
            snapshots,
            every=args.every,
            fmt=args.format,
            verify=args.verify,
            follow=args.follow,
            store=store,
            gate=gate,
            progress=progress,
        )
        if args.output == "json":
            dump_json(doc)
        else:
            skipped = f", left {len(doc['skipped'])} to the leader" if doc["skipped"] else ""
            print(
                f"{source.name}: at seq {doc['seq']:,}; wrote {len(doc['written'])} snapshot(s)"
                + (f" (seq {', '.join(str(s) for s in doc['written'])})" if doc["written"] else "")
                + skipped
                + f", checked {len(doc['checked'])} against the fold ({len(doc['verified'])} newly verified), "
                f"discarded {len(doc['discarded'])}; "
                f"started from {doc['started_from']}, folded {doc['folded']:,} events in {doc['seconds']:.2f}s"
            )
        return 0

    if settings is not None:
        return _run_with_config(args, settings, body)
    code: int = run_command(args, body, "snapshot")
    return code


def _run_with_config(args: argparse.Namespace, settings: NatsSettings, body: Any) -> int:
    """Like `run_command`, connecting with the config's credentials, TLS and inbox prefix."""
    import sys

    import anyio
    from nats.errors import Error as NatsError

    from muster.events.store import EventStore, StoreError, StoreUnreachable
    from muster.replay.cliutil import UsageError, _quiet_logs, stderr_bad
    from muster.replay.source import NatsLog

    _quiet_logs()

    async def main() -> int:
        urls = args.nats or settings.urls
        kwargs: dict[str, Any] = {"prefix": settings.prefix} if settings.prefix else {}
        attempt = 0
        while True:
            try:
                store = await EventStore.connect(
                    urls,
                    stream=args.stream,
                    create=False,
                    on_bad=stderr_bad,
                    name="muster-snapshot",
                    **kwargs,
                    **settings.options,
                )
                break
            except (StoreError, OSError) as exc:
                if not args.follow:
                    unreachable = isinstance(exc, (StoreUnreachable, OSError))
                    raise (StoreUnreachable if unreachable else StoreError)(
                        f"cannot open stream {args.stream}: {exc}"
                    ) from None
                # a sidecar may start before NATS answers or before its daemon created the stream:
                # wait for them rather than crash-loop
                attempt += 1
                wait = min(30.0, 0.5 * 2.0**attempt)
                print(
                    f"muster snapshot: cannot open stream {args.stream} yet ({exc}); trying again in {wait:g} s",
                    file=sys.stderr,
                    flush=True,
                )
                await anyio.sleep(wait)
        try:
            code: int = await body(NatsLog(store), store)
            return code
        finally:
            with anyio.move_on_after(5, shield=True):
                await store.close()

    try:
        return anyio.run(main)
    except (StoreError, UsageError) as exc:
        print(f"muster snapshot: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, StoreUnreachable) else 2
    except NatsError as exc:  # e.g. a request the identity may not make times out: say so, no traceback
        print(f"muster snapshot: NATS: {type(exc).__name__} {exc}", file=sys.stderr)
        return 1


def _size(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def render_list(metas: list[Any]) -> None:
    from rich.table import Table

    from muster.replay.cliutil import add_row, console

    con = console()
    t = Table(title="Snapshots", title_justify="left")
    for col in ("seq", "at", "jobs", "format", "size", "verified", "written"):
        t.add_column(col, justify="right" if col in ("seq", "at", "jobs", "size") else "left")
    for m in metas:
        verified = "yes" if m.is_verified else "no"
        if m.is_verified and m.verified_from is not None:
            verified += f" (from {m.verified_from})"
        add_row(t, f"{m.seq:,}", m.at, f"{m.jobs:,}", m.format, _size(m.size), verified, m.written)
    con.print(t)
