"""Run every benchmark of bench/ in turn at modest sizes and print their numbers (`make bench`; not a test).

Each script runs in its own process with the arguments below: small enough for a
laptop or a shared CI box (a few minutes in all), large enough for its numbers to
mean something. The shapes the README's targets are measured at (a 1,000,000-event
log, 10,000 nodes, 50,000 jobs) take far longer: run a script by hand for those, or
pass `--full` for every script's own defaults.

Exit status 1 only when a script crashed (a traceback, or a status other than 0 and 1);
a script that ran and reported a missed target (exit 1) is listed as `missed`.

Usage: python bench/run_all.py [--only NAME,...] [--full] [--list]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

BENCHES: dict[str, tuple[str, list[str]]] = {
    "events": ("bench_events.py", ["--events", "20000", "--fenced", "500", "--trials", "1"]),
    "sim": ("bench_sim.py", ["--only", "a,b", "--jobs-scale", "0.05"]),
    "billing": ("bench_billing.py", ["--events", "50000"]),
    "replay": ("bench_replay.py", ["--events", "50000", "--every", "5000"]),
    "daemon": ("bench_daemon.py", ["--nodes", "100", "--rate", "50", "--seconds", "5"]),
    "k8s": ("bench_k8s.py", ["--nodes", "100", "--gangs", "20", "--pods", "4"]),
    "k8s-real": ("bench_k8s_real.py", ["--nodes", "100", "--pods", "400", "--sizes", "1,8,32", "--trials", "1"]),
    "reliability": ("reliability.py", ["--quick"]),
    "node_loss": ("bench_node_loss.py", ["--nodes", "100", "--gangs", "40", "--delete", "20"]),
    "ui": ("bench_ui.py", ["--events", "100000", "--every", "10000", "--trials", "1"]),
    "starvation": ("bench_starvation.py", ["--jobs", "3000"]),
}
"""name -> (script, its modest arguments)."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help=f"comma-separated names among {', '.join(BENCHES)} (default: all)")
    parser.add_argument("--full", action="store_true", help="each script's own default sizes (long: tens of minutes)")
    parser.add_argument("--list", action="store_true", help="print the commands and run nothing")
    args = parser.parse_args()
    names = list(BENCHES) if not args.only else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(f"run_all: unknown bench {unknown[0]!r} (known: {', '.join(BENCHES)})", file=sys.stderr)
        return 2
    results: list[tuple[str, str, float]] = []
    for name in names:
        script, modest = BENCHES[name]
        command = [sys.executable, str(HERE / script), *([] if args.full else modest)]
        shown = " ".join(["python", f"bench/{script}", *command[2:]])
        if args.list:
            print(shown)
            continue
        print(f"\n==== {name}: {shown}", flush=True)
        t0 = time.perf_counter()
        crashed = False
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                crashed = crashed or line.startswith("Traceback (most recent call last)")
                print(line, end="", flush=True)
        code = proc.returncode
        verdict = "ok" if code == 0 else "crashed" if crashed or code != 1 else "missed"
        results.append((name, verdict, time.perf_counter() - t0))
    if args.list:
        return 0
    print("\n==== summary (missed: the script ran and reported a target missed, which small sizes and a busy")
    print("     machine make likely; the README's figures are measured at full size on a quiet one)")
    for name, verdict, seconds in results:
        print(f"{name:<12} {verdict:<8} {seconds:8.1f} s")
    return 1 if any(verdict == "crashed" for _, verdict, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())
