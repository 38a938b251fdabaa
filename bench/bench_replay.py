"""Replay to a point of a 1,000,000-event log, with and without snapshots (not a test; prints numbers).

The log is `bench_events.realistic_events` (cluster setup, then overlapping job
lifecycles: submissions, admissions onto nodes, starts, GPU utilization
samples, preemptions, finishes), held in memory as stored bytes and appended
to an embedded nats-server. For each source it measures `rebuild.state_at`:

  no snapshots     fold from the start to the end, and to the middle
  write            `muster snapshot --every N` (one fold, a snapshot per N events)
  snapshots        to the end, to the middle, to just before a snapshot (worst
                   case: N-1 events after the nearest one), to a time point;
                   target <= 5 s to any point
  status views     `muster jobs` (live, and --all) and `muster queues` at the end: the
                   snapshot + tail, the rows and the table, as the commands do them
                   (goal: well under a second)
  first load       the daemon's writer leaves snapshots unverified: the first
                   load checks one interval by folding it, later loads do not

Every state is checked against the state the full fold held at that point.

Every row prints wall seconds and this process's CPU seconds (the machine is shared).

Usage: python bench/bench_replay.py [--events 1000000] [--every 50000] [--skip-nats]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import structlog
from bench_events import realistic_events

from muster.events.codec import decode, encode
from muster.events.embedded import EmbeddedNats
from muster.events.store import EventStore
from muster.projections.cluster import evolve
from muster.projections.state import ClusterState
from muster.replay import jobscli, queuesviewcli
from muster.replay.heap import no_gc
from muster.replay.points import Point
from muster.replay.rebuild import state_at
from muster.replay.snapshotcodec import encode_state
from muster.replay.snapshots import Snapshots
from muster.replay.snapshotstores import MemorySnapshots, NatsSnapshots
from muster.replay.snapshotwriter import Snapshotter, write_snapshots
from muster.replay.source import LogSource, MemoryLog, NatsLog
from muster.replay.status import STATES, JobFilter
from muster.replay.watching import Printer, build

TARGET = 5.0


def reference(events: list[Any], points: list[int]) -> dict[int, bytes]:
    """The encoded state of the plain fold at each point (to check every replay)."""
    out: dict[int, bytes] = {}
    state = ClusterState()
    wanted = set(points)
    with no_gc():
        for i, ev in enumerate(events, start=1):
            evolve(state, ev)
            if i in wanted:
                out[i] = encode_state(state, "msgpack")
    return out


def row(source: str, what: str, seconds: float, cpu: float, folded: int, extra: str = "", target: bool = False) -> None:
    """One measurement: wall seconds, then this process's CPU seconds (the machine is shared)."""
    mark = ""
    if target:
        mark = "  OK (<= 5 s)" if seconds <= TARGET else "  OVER 5 s"
    print(
        f"{source:<7} {what:<44} {seconds:7.2f} s {cpu:7.2f} cpu-s  {folded:>9,} events folded  {extra}{mark}",
        flush=True,
    )


async def measure(
    source: LogSource,
    name: str,
    snapshots: Snapshots,
    n: int,
    every: int,
    refs: dict[int, bytes],
    time_point: tuple[int, int],
) -> None:
    mid = n // 2
    worst = (mid // every + 1) * every - 1
    # no snapshots
    for label, seq in (("no snapshots, to the end", n), ("no snapshots, to the middle", mid)):
        c0 = time.process_time()
        r = await state_at(source, Point(seq=seq))
        cpu = time.process_time() - c0
        assert encode_state(r.state, "msgpack") == refs[seq], label
        rates = f"{r.folded / r.seconds:,.0f} events/s, {r.folded / max(cpu, 1e-9):,.0f} per cpu-s"
        row(name, label, r.seconds, cpu, r.folded, rates)
    # write snapshots (verified by construction)
    t0, c0 = time.perf_counter(), time.process_time()
    doc = await write_snapshots(source, snapshots, every=every)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    metas = await snapshots.catalog()
    size = sum(m.size for m in metas)
    row(
        name,
        f"write snapshots every {every:,}",
        seconds,
        cpu,
        doc["folded"],
        f"{len(metas)} snapshots, {size / 1e6:.1f} MB stored, last {metas[-1].size / 1e6:.1f} MB",
    )
    for label, seq in (
        ("snapshots, to the end", n),
        ("snapshots, to the middle", mid),
        (f"snapshots, worst case (seq {worst:,})", worst),
    ):
        c0 = time.process_time()
        r = await state_at(source, Point(seq=seq), snapshots)
        cpu = time.process_time() - c0
        assert encode_state(r.state, "msgpack") == refs[seq], label
        row(name, label, r.seconds, cpu, r.folded, f"from seq {r.snapshot.seq if r.snapshot else 0:,}", target=True)
    await status_views(source, name, snapshots, worst)
    t, seq = time_point
    c0 = time.process_time()
    r = await state_at(source, Point(time=t), snapshots)
    cpu = time.process_time() - c0
    assert r.seq == seq and encode_state(r.state, "msgpack") == refs[seq]
    row(name, f"snapshots, to time @{t} (seq {seq:,})", r.seconds, cpu, r.folded, target=True)


def _jobs_view(flt: JobFilter) -> Any:
    """`muster jobs`' view of a replayed state with this filter (its document and rows)."""

    def view(replayed: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        doc = jobscli.document(replayed, flt)
        return doc, doc["jobs"]

    return view


async def status_views(source: LogSource, name: str, snapshots: Snapshots, worst: int) -> None:
    """`muster jobs` and `muster queues` as the commands run them: the state (snapshot + tail), the
    view's rows (`watching.build`), and the table printed (into /dev/null).

    At the end of the log (on a snapshot) and at the worst point (N-1 events after one)."""
    views = (
        ("jobs", _jobs_view(JobFilter()), jobscli.render),
        ("jobs --all", _jobs_view(JobFilter(states=frozenset(STATES))), jobscli.render),
        ("queues", queuesviewcli.view, queuesviewcli.render),
    )
    with open(os.devnull, "w") as null:  # noqa: ASYNC230 (the null device does not block)
        for label, view, table in views:
            for where, point in (("end", Point()), ("worst", Point(seq=worst))):
                t0, c0 = time.perf_counter(), time.process_time()
                r = await state_at(source, point, snapshots)
                c1 = time.process_time()
                doc, rows = build(view, r)
                c2 = time.process_time()
                with Printer("table", False, key="name", out=null) as printer:
                    printer.show(doc, rows, table)
                gc.unfreeze()  # the bench goes on with other states
                seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
                # CPU time too: on a shared machine the wall time is mostly the others' load
                extra = f"{len(rows):,} rows; cpu-s: rows {c2 - c1:.2f}, table {time.process_time() - c2:.2f}"
                row(name, f"muster {label} ({where}), snapshots", seconds, cpu, r.folded, extra)


async def first_load(source: LogSource, name: str, snapshots: Snapshots, n: int, every: int) -> None:
    """A daemon-written (unverified) snapshot: the first load verifies it against the previous one."""
    metas = await snapshots.catalog()
    last = metas[-1]
    await snapshots.backend.delete(last.name)
    # re-write the newest one as the daemon's writer would: unverified
    from muster.replay.snapshots import fold_range

    base = await snapshots.nearest(max_seq=last.seq - 1)
    await fold_range(source, base.state, base.seq + 1, last.seq)
    writer = Snapshotter(snapshots, every)
    writer.last = base.seq
    await writer.maybe_snapshot(base.state, last.seq)
    c0 = time.process_time()
    r = await state_at(source, Point(seq=n), snapshots)
    row(
        name,
        "snapshots, first load of an unverified one",
        r.seconds,
        time.process_time() - c0,
        r.folded,
        f"+{r.verify_folded:,} to verify",
        target=True,
    )
    c0 = time.process_time()
    r = await state_at(source, Point(seq=n), snapshots)
    row(
        name,
        "snapshots, the same load again (now verified)",
        r.seconds,
        time.process_time() - c0,
        r.folded,
        target=True,
    )


async def main_async(args: argparse.Namespace) -> None:
    n = args.events
    every = args.every
    t0 = time.perf_counter()
    events = realistic_events(n)
    raws = [encode(e) for e in events]
    mid = n // 2
    worst = (mid // every + 1) * every - 1
    t_point = events[int(n * 0.7)].at
    t_seq = max(i for i, e in enumerate(events, start=1) if e.at <= t_point)
    refs = reference(events, [n, mid, worst, t_seq])
    jobs = len({e.job for e in events if hasattr(e, "job")})
    # a replaying process holds the stored bytes, not a million decoded events: drop them, so the
    # collector's full passes cost what they would cost there
    del events
    gc.collect()
    gc.freeze()
    print(
        f"log: {n:,} events ({sum(len(r) for r in raws) / 1e6:.0f} MB), {jobs:,} jobs; "
        f"generated in {time.perf_counter() - t0:.1f} s; {os.cpu_count()} CPUs",
        flush=True,
    )
    memory = MemoryLog(raws, "memory")
    await measure(memory, "memory", Snapshots(MemorySnapshots(), memory), n, every, refs, (t_point, t_seq))
    snaps = Snapshots(MemorySnapshots(), memory)
    await write_snapshots(memory, snaps, every=every)
    await first_load(memory, "memory", snaps, n, every)
    if args.skip_nats:
        return
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedNats(Path(tmp) / "nats", stop_timeout=10)
        server.start()
        try:
            store = await EventStore.connect(server.url, stream="BENCH", prefix="bench")
            try:
                t0 = time.perf_counter()
                for i in range(0, n, 50_000):
                    await store.append([decode(r) for r in raws[i : i + 50_000]])
                print(f"nats    appended {n:,} events in {time.perf_counter() - t0:.1f} s", flush=True)
                log = NatsLog(store)
                backend = await NatsSnapshots.open(store.js, "BENCH-snapshots", create=True)
                assert backend is not None
                snaps = Snapshots(backend, log)
                await measure(log, "nats", snaps, n, every, refs, (t_point, t_seq))
                await first_load(log, "nats", snaps, n, every)
            finally:
                await store.close()
        finally:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--every", type=int, default=50_000)
    ap.add_argument("--skip-nats", action="store_true")
    args = ap.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
