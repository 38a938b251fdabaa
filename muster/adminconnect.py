"""Connecting the commands that append (`queues apply`, `submit`, `cancel`, `hold`, `release`) to the log.

They read the same config file as the daemon (`--config`: the chart's
admin.yaml, with its `nats` block: url, stream, subject_prefix, inbox_prefix,
auth and TLS files), `MUSTER_*` variables and flags (`--creds` and `--tls-*`
as every command reads them, `replay.natsconnect.flag_options`), and open the
event store without holding a connection longer than the command.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


class CommandFailed(Exception):
    """The command cannot go on; the reason was printed. `code` is the exit status."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def add_nats_arguments(parser: argparse.ArgumentParser) -> None:
    from muster.replay.natsconnect import add_connection_arguments

    add_connection_arguments(parser)
    # the metavars the commands that read the log show for the same flags (`replay.natsconnect`)
    parser.add_argument(
        "--nats", metavar="URL", help="NATS URL(s), comma-separated (default: $NATS_URL or nats://127.0.0.1:4222)"
    )
    parser.add_argument("--stream", metavar="NAME", help="JetStream stream of the log (default MUSTER)")
    parser.add_argument("--subject-prefix", metavar="PREFIX", help="subject prefix of the log (default muster)")
    parser.add_argument(
        "--connect-timeout", metavar="SECONDS", type=float, default=15.0, help="seconds to reach NATS (default 15)"
    )


async def open_store(args: argparse.Namespace, *, command: str, create: bool = True) -> Any:
    """An EventStore per the config and flags; prints why and raises CommandFailed (2: config, 1: NATS) if not."""
    import anyio

    from muster.daemon.config import ConfigError, load_config, nats_connect_options
    from muster.daemon.logs import configure_logging
    from muster.events.store import EventStore, StoreError
    from muster.replay.natsconnect import ConfigProblem, flag_options

    configure_logging("warning", "console")  # the command's own output is the answer; logs only for trouble
    try:
        cfg = load_config(
            args.config,
            overrides={"nats": {"url": args.nats, "stream": args.stream, "subject_prefix": args.subject_prefix}},
        )
        options = nats_connect_options(cfg) | flag_options(args)
    except (ConfigError, ConfigProblem) as exc:
        print(f"muster {command}: {exc}", file=sys.stderr)
        raise CommandFailed(2) from None
    from muster.events.store import url_problem

    for url in cfg.nats_urls:
        problem = url_problem(url)
        if problem is not None:
            print(f"muster {command}: {problem}", file=sys.stderr)
            raise CommandFailed(2)
    try:
        with anyio.fail_after(args.connect_timeout):
            return await EventStore.connect(
                cfg.nats_urls,
                stream=cfg.stream,
                prefix=cfg.subject_prefix,
                create=create,
                name=f"muster-{command.replace(' ', '-')}",
                **options,
            )
    except (StoreError, TimeoutError) as exc:
        if isinstance(exc, TimeoutError):
            from muster.events.wire import redact

            where = ", ".join(redact(u) for u in cfg.nats_urls)  # never a password in a message
            why = f"no answer from {where} within {args.connect_timeout:g} s"
        else:
            why = str(exc)
        print(f"muster {command}: cannot use NATS: {why}", file=sys.stderr)
        raise CommandFailed(1) from None
