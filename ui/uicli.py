"""`muster ui`: the web dashboard over a log (a JSONL file, or a stream it follows live).

Serves http://127.0.0.1:8321/ by default until Ctrl-C. `--host 0.0.0.0` (any
address beyond this machine) needs a bearer token: `--token-file FILE` or
`$MUSTER_UI_TOKEN`. `--rates FILE` prices the Chargeback page with a rate
card (`muster billing report --rates`). With stored snapshots (`--snapshots`,
or the stream's bucket) the live pages answer once the log after the newest
one is folded; the chargeback and job pages once the billing fold, which reads
the log from its start behind them, has caught up. Exit status 2 on bad arguments, a log
that cannot be opened or a dashboard that would be exposed without a token.
Top-level imports stay light (the CLI imports every command).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

DEFAULT_PORT = 8321


def add_arguments(p: argparse.ArgumentParser) -> None:
    from muster.replay.cliargs import add_snapshot_arguments, add_source_arguments

    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--token-file", metavar="FILE", help="bearer token the browser must give (default $MUSTER_UI_TOKEN)")
    p.add_argument("--rates", metavar="FILE", help="rate card YAML pricing the Chargeback page")
    p.add_argument(
        "--snapshot-every",
        type=int,
        default=5_000,
        metavar="N",
        help="keep a checkpoint every N events in memory for time travel (default 5,000)",
    )
    add_source_arguments(p)
    add_snapshot_arguments(p)


def run(args: argparse.Namespace) -> int:
    from muster.replay.cliutil import UsageError, open_snapshots, run_command

    async def body(source: Any, store: Any) -> int:
        import functools

        import anyio

        from muster.ui.feed import Feed
        from muster.ui.server import serve

        token, rates = _settings(args)
        snapshots = await open_snapshots(args, source, store)
        feed = Feed(source, store, every=args.snapshot_every, snapshots=snapshots, verify=args.verify)
        async with anyio.create_task_group() as tg:
            try:
                port = await tg.start(
                    functools.partial(serve, feed, host=args.host, port=args.port, token=token, rates=rates)
                )
            except OSError as exc:
                raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
            host = f"[{args.host}]" if ":" in args.host else args.host
            print(f"muster ui: serving {source.name} on http://{host}:{port}/ (Ctrl-C stops)", flush=True)
        return 0

    code: int = run_command(args, body, "ui")
    return code


def _settings(args: argparse.Namespace) -> tuple[str | None, Any]:
    """The token and rate card the arguments name; UsageError (exit 2) on anything unusable."""
    from muster.replay.cliutil import UsageError
    from muster.ui.server import exposure_problem, read_token

    if args.snapshot_every < 1:
        raise UsageError("--snapshot-every must be at least 1")
    if not 0 <= args.port < 65536:
        raise UsageError(f"--port {args.port} is not a port number")
    try:
        token = read_token(args.token_file, os.environ.get("MUSTER_UI_TOKEN"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"--token-file: {getattr(exc, 'strerror', None) or exc}") from None
    problem = exposure_problem(args.host, token)
    if problem is not None:
        raise UsageError(problem)
    rates = None
    if args.rates:
        rates = load_rates(args.rates)
    return token, rates


def load_rates(path: str) -> Any:
    """A rate card file, checked; UsageError naming the problem."""
    import yaml

    from muster.projections.ratecard import RateCardError, parse_rate_card
    from muster.replay.cliutil import UsageError
    from muster.replay.specreader import malformed

    try:
        with open(path, encoding="utf-8") as f:
            return parse_rate_card(yaml.safe_load(f))
    except OSError as exc:
        raise UsageError(f"--rates {path}: {exc.strerror or exc}") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise UsageError(f"--rates {malformed(path, exc)}") from None
    except RateCardError as exc:
        raise UsageError(f"--rates {path}: {exc}") from None
