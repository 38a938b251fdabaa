"""`muster demo`: muster end to end on a laptop (embedded NATS, emulated 512-GPU cluster, the real daemon).

Runs for `--duration` seconds (default 60) or until Ctrl-C, shows live
progress, then prints the event count and the commands to replay, explain,
audit and bill the log it wrote. `make demo` runs it. Top-level imports stay
light.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=60.0, help="seconds to run (default 60)")
    parser.add_argument("--speed", type=float, default=4.0, help="run jobs and arrivals this many times faster (4)")
    parser.add_argument("--rate", type=float, default=1.0, help="gangs submitted per second at speed 1 (1.0)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the workload (default 1)")
    parser.add_argument("--dir", default=".muster-demo", help="folder for the NATS store and logs (.muster-demo)")
    parser.add_argument("--no-live", action="store_true", help="no live view, only the summary")
    parser.add_argument("--ui-port", type=int, default=8321, help="web dashboard port on 127.0.0.1 (default 8321)")
    parser.add_argument("--no-ui", action="store_true", help="no web dashboard")


def run(args: argparse.Namespace) -> int:
    import anyio

    from muster.daemon.logs import configure_logging
    from muster.demo.harness import DemoDirError, DemoOptions, prepare_dir, run_demo

    if args.duration <= 0 or args.speed <= 0 or args.rate <= 0:
        print("muster demo: --duration, --speed and --rate must be positive", file=sys.stderr)
        return 2
    if importlib.util.find_spec("kmock") is None:
        print("muster demo: needs the Kubernetes API double kmock, an extra: pip install 'muster-scheduler[demo]'")
        return 2
    if not 0 <= args.ui_port < 65536:
        print(f"muster demo: --ui-port {args.ui_port} is not a port number", file=sys.stderr)
        return 2
    directory = Path(args.dir)
    options = DemoOptions(
        directory=directory,
        duration=args.duration,
        speed=args.speed,
        rate=args.rate,
        seed=args.seed,
        live=not args.no_live,
        ui_port=None if args.no_ui else args.ui_port,
    )
    try:
        prepare_dir(directory)
        log_file = open(directory / "daemon.log", "w", encoding="utf-8")  # noqa: SIM115 - closed below
    except DemoDirError as exc:
        print(f"muster demo: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"muster demo: {directory}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        configure_logging("info", "json", stream=log_file)
        result = anyio.run(run_demo, options)
    finally:
        log_file.close()
    print_summary(result, directory)
    return 0


def muster_command() -> str:
    """How this shell runs muster: `muster` when PATH finds this very script, else its path
    (`.venv/bin/muster` after `make demo`, which does not put the venv on PATH)."""
    import shutil

    script = Path(sys.executable).parent / "muster"
    found = shutil.which("muster")
    if not script.exists():
        return "muster" if found else f"{sys.executable} -m muster.cli"
    if found and Path(found).resolve() == script.resolve():
        return "muster"
    try:
        return str(script.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(script.absolute())


def print_summary(result: object, directory: Path) -> None:
    from muster.demo.harness import DemoResult
    from muster.events.embedded import find_nats_server

    assert isinstance(result, DemoResult)
    how = "stopped by Ctrl-C" if result.interrupted else "done"
    print()
    print(f"muster demo {how} after {result.elapsed:.0f} s: {result.events:,} events on stream {result.stream}")
    interesting = (
        "JobSubmitted",
        "JobAdmitted",
        "JobPreempted",
        "JobStarted",
        "JobFinished",
        "JobInadmissible",
        "GpuUtilizationSampled",
    )
    counts = ", ".join(f"{name} {result.by_type[name]:,}" for name in interesting if result.by_type[name])
    others = sum(n for name, n in result.by_type.items() if name not in interesting)
    print(f"  {counts}, other {others:,}")
    print(f"  {result.submitted_gangs} gangs submitted, {result.replaced_pods} evicted pods replaced")
    print(f"  {result.scrapes} scrapes of the fake dcgm-exporter, {result.by_type['GpuUtilizationSampled']:,} samples")
    print(f"  daemon log: {directory / 'daemon.log'}    NATS store: {result.store_dir}")
    try:
        binary = str(find_nats_server())
    except Exception:
        binary = "nats-server"
    url = f"nats://127.0.0.1:{result.port}"
    source = f"--nats {url} --stream {result.stream}"
    muster = muster_command()
    print()
    print("Replay, explain and audit it (serve the demo's store again first):")
    print(f"  {binary} -js -a 127.0.0.1 -p {result.port} -sd {result.store_dir} &")
    print(f"  {muster} replay {source} --running")
    if result.sample_job:
        print(f"  {muster} explain {source} '{result.sample_job}'")
    print(f"  {muster} audit {source}")
    print(f"  {muster} ui {source} --rates {directory / 'rates.yaml'}    # the web dashboard, at any point of the log")
    if result.rates is not None:
        db = f"sqlite:///{directory / 'billing.db'}"
        print()
        print("Bill it (allocated vs used GPU-hours per queue, with the demo's rate card):")
        print(f"  {muster} billing run {source} --db {db} --once")
        rates, plot = directory / "rates.yaml", directory / "billing.png"
        print(f"  {muster} billing report --db {db} --rates {rates} --plot {plot}")
