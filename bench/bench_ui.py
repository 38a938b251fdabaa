"""How fast the dashboard loads over a 1,000,000-event log (not a test; prints numbers).

The log is `bench_events.realistic_events` (512 nodes in 8 blocks x 8 racks,
16 queues, overlapping job lifecycles), held in memory as stored bytes, as a
`muster ui --log FILE` holds it. The dashboard (`muster.ui`) folds it once
(cluster state, billing ledger, a checkpoint without the ended jobs every
`--every` events, a billing checkpoint every 5,000) and then serves it.
Measured, each as wall time and the CPU time of this process (server and
client: the machine may be shared, CPU time is what the dashboard costs):

  start       the first fold, until the pages answer (once per server start)
  http        each page's JSON, live and as of a past point (the worst one: just
              before a checkpoint, a checkpoint to restore and `every - 1`
              events to fold), then another page at that point and a point
              1,000 events on (the last past state folded forward), jumps far
              from the last point, and the static files a first visit loads;
              median of `--trials`; target <= 1 s
  warm start  a second start with a stored snapshot 20,000 events before the end
              (what the sidecar keeps): until the live pages answer, and until
              the books behind them (chargeback, stories) have caught up
  shared fold what the dashboard adds to the daemon's fold (CPU): a fold of the log
              alone, the same fold with a feed sharing it (`Feed.share`), and the
              books the feed then reads behind it; before, the daemon's
              dashboard folded the whole log a second time
  browser     with Debian's chromium (`muster.ui.browser`) and playwright: from
              navigation to the page drawn, live and after moving the time field
              to the past point; target <= 1 s (skipped without chromium)

Exit status 1 when a target is missed.

Usage: python bench/bench_ui.py [--events 1000000] [--every 5000] [--trials 3] [--no-browser] [--no-warm] [--no-shared]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import logging
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp
import anyio
import anyio.lowlevel
import structlog
from bench_events import realistic_events

from muster.events.codec import encode
from muster.projections.cluster import evolve
from muster.projections.state import ClusterState
from muster.replay.heap import no_gc
from muster.replay.points import Point
from muster.replay.snapshots import Snapshots
from muster.replay.snapshotstores import MemorySnapshots
from muster.replay.source import MemoryLog
from muster.ui.browser import CHROMIUM, headless_page
from muster.ui.feed import Feed
from muster.ui.moments import EVERY
from muster.ui.server import serve

TARGET = 1.0


def row(what: str, seconds: float, cpu: float | None = None, extra: str = "") -> bool:
    """One printed measurement: wall time against the target, and the process's CPU time (server and client)."""
    ok = seconds <= TARGET
    spent = f"{cpu * 1000:6.0f} ms CPU" if cpu is not None else " " * 13
    print(f"{what:<52} {seconds * 1000:7.0f} ms {spent}  {extra:<10} {'OK (<= 1 s)' if ok else 'OVER 1 s'}", flush=True)
    return ok


async def get(http: aiohttp.ClientSession, url: str) -> tuple[float, float, int]:
    """Wall and CPU seconds for one GET of `url`, and the body's size."""
    t0, c0 = time.perf_counter(), time.process_time()
    async with http.get(url) as r:
        body = await r.read()
        assert r.status == 200, (url, r.status, body[:200])
    return time.perf_counter() - t0, time.process_time() - c0, len(body)


async def median(trials: int, measure: Any) -> tuple[float, float, int]:
    """The median wall and CPU time of `trials` measurements, and the last size."""
    results = [await measure() for _ in range(trials)]
    return statistics.median(r[0] for r in results), statistics.median(r[1] for r in results), results[-1][2]


PAGES = ("cluster", "queues", "jobs", "job", "chargeback")


async def over_http(base: str, past: int, job: str, every: int, trials: int) -> bool:
    ok = True
    path = {name: f"jobs/{job}" if name == "job" else name for name in PAGES}
    async with aiohttp.ClientSession() as http:

        async def first_visit() -> tuple[float, float, int]:
            wall = cpu = 0.0
            for asset in ("/", "/static/app.js", "/static/style.css"):
                w, c, _ = await get(http, base + asset)
                wall, cpu = wall + w, cpu + c
            return wall, cpu, 0

        wall, cpu, _ = await median(trials, first_visit)
        ok &= row("http  first visit: index, script, style", wall, cpu)
        for name in PAGES:
            url = f"{base}/api/{path[name]}"

            async def cold(url: str = url) -> tuple[float, float, int]:
                await get(http, f"{base}/api/queues?at=1")  # the last past moment far behind: a checkpoint it is
                return await get(http, f"{url}?at={past}")

            wall, cpu, size = await median(trials, lambda url=url: get(http, url))
            ok &= row(f"http  {name} (live)", wall, cpu, f"{size / 1e3:,.0f} kB")
            wall, cpu, size = await median(trials, cold)
            ok &= row(f"http  {name} (seq {past:,}: checkpoint + {every - 1:,})", wall, cpu, f"{size / 1e3:,.0f} kB")
        await get(http, f"{base}/api/queues?at={past}")
        wall, cpu, _ = await get(http, f"{base}/api/cluster?at={past}")
        ok &= row("http  cluster, same point as the last page", wall, cpu)
        wall, cpu, _ = await get(http, f"{base}/api/cluster?at={past + 1000}")
        ok &= row("http  cluster, slider 1,000 events on", wall, cpu)
        for seq in (2, past // 3, past + past // 2):  # jumps far from the last point, each from its checkpoint
            wall, cpu, _ = await get(http, f"{base}/api/cluster?at={seq}")
            ok &= row(f"http  cluster, far jump to seq {seq:,}", wall, cpu)
    return ok


async def in_browser(base: str, past: int, job: str) -> bool:
    ok = True
    async with headless_page() as page, aiohttp.ClientSession() as http:
        for name in PAGES:
            kind = "jobs" if name == "job" else name
            await page.goto("about:blank")
            t0 = time.perf_counter()
            await page.goto(f"{base}/#/{f'jobs/{job}' if name == 'job' else name}")
            await page.wait_for_selector(f"main[data-page='{kind}']", timeout=60_000)
            live = time.perf_counter() - t0
            await get(http, f"{base}/api/queues?at=1")  # cold: from a checkpoint
            t0 = time.perf_counter()
            await page.locator("[data-testid=at]").fill(str(past))
            await page.locator("[data-testid=at]").press("Enter")
            await page.wait_for_selector(f"main[data-page='{kind}'][data-seq='{past}']", timeout=60_000)
            travelled = time.perf_counter() - t0
            ok &= row(f"browser {name}: open (live)", live)
            ok &= row(f"browser {name}: time field to seq {past:,}", travelled)
    return ok


async def main_async(args: argparse.Namespace) -> bool:
    t0 = time.perf_counter()
    events = realistic_events(args.events)
    raws = [encode(e) for e in events]
    jobs = [e.job for e in events if type(e).__name__ == "JobSubmitted"]
    del events
    gc.collect()
    gc.freeze()
    print(
        f"log: {len(raws):,} events ({sum(len(r) for r in raws) / 1e6:.0f} MB), {len(jobs):,} jobs; "
        f"generated in {time.perf_counter() - t0:.1f} s; {os.cpu_count()} CPUs",
        flush=True,
    )
    feed = Feed(MemoryLog(raws, "memory"), every=args.every)
    ok = True
    async with anyio.create_task_group() as tg:
        t0, c0 = time.perf_counter(), time.process_time()
        port = await tg.start(functools.partial(serve, feed, port=0))
        await feed.ready.wait()
        started, cpu = time.perf_counter() - t0, time.process_time() - c0
        kept = sum(len(c.data) for c in feed.past.checkpoints) / 1e6
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
        print(
            f"{'start: fold, checkpoints, billing':<52} {started:7.1f} s  {cpu:6.1f} s CPU  "
            f"{len(feed.past.checkpoints)} checkpoints ({kept:,.0f} MB), {len(feed.past.ended):,} ended jobs kept; "
            f"max RSS {rss:,.0f} MB",
            flush=True,
        )
        base = f"http://127.0.0.1:{port}"
        past = (len(raws) // 2 // args.every + 1) * args.every - 1  # the most events after a checkpoint
        # a job page folds the job's lifetime: take the last job submitted before the past point
        submissions = feed.books.submissions
        job = max((j for j in jobs if submissions[j] < past), key=lambda j: submissions[j])
        print(f"job page: {job} ({feed.state.jobs[job].status} at the end), submitted at seq {submissions[job]:,}")
        ok &= await over_http(base, past, job, args.every, args.trials)
        if args.no_browser:
            pass
        elif not await anyio.Path(CHROMIUM).exists():
            print("browser: skipped (no /usr/bin/chromium; apt-get install chromium)", flush=True)
        else:
            ok &= await in_browser(base, past, job)
        tg.cancel_scope.cancel()
    if not args.no_warm:
        await warm_start(MemoryLog(raws, "memory"), feed, args.every)
    if not args.no_shared:
        await shared_fold(MemoryLog(raws, "memory"), args.every)
    return ok


class Folder:
    """A fold of the log that calls its listeners after each event, as the daemon's `LogFollower` does."""

    def __init__(self, source: MemoryLog) -> None:
        self.source = source
        self.state = ClusterState()
        self.folded_seq = 0
        self.ready = False
        self.listeners: list[Any] = []

    def on_fold(self, callback: Any) -> None:
        self.listeners.append(callback)

    async def run(self) -> None:
        async for batch in self.source.batches(1, await self.source.last_seq()):
            with no_gc():
                for seq, ev in batch:
                    evolve(self.state, ev)
                    self.folded_seq = seq
                    for listener in self.listeners:
                        listener(seq, ev, True)
            await anyio.lowlevel.checkpoint()
        self.ready = True


async def shared_fold(log: MemoryLog, every: int) -> None:
    """What the dashboard adds to a daemon's fold: the fold alone, then with a feed sharing it, then the books."""
    alone = Folder(log)
    c0 = time.process_time()
    await alone.run()
    fold_cpu = time.process_time() - c0
    del alone
    folder = Folder(log)
    feed = Feed(log, every=every)
    feed.share(folder)
    c0 = time.process_time()
    await folder.run()
    shared_cpu = time.process_time() - c0
    c0 = time.process_time()
    async with anyio.create_task_group() as tg:
        tg.start_soon(feed.run)
        await feed.books.ready.wait()
        tg.cancel_scope.cancel()
    books_cpu = time.process_time() - c0
    print(
        f"{'shared fold (the daemon): the fold alone':<52} {fold_cpu:7.1f} s CPU\n"
        f"{'  the fold with the dashboard observing it':<52} {shared_cpu:7.1f} s CPU "
        f"(+{shared_cpu - fold_cpu:.1f} s: checkpoints, ended jobs, history)\n"
        f"{'  the books behind it (billing fold, own read)':<52} {books_cpu:7.1f} s CPU",
        flush=True,
    )


async def warm_start(log: MemoryLog, folded: Feed, every: int) -> None:
    """A second start over the same log with a stored snapshot 20,000 events before its end (a sidecar's).

    The live pages answer once the tail is folded; the books (billing, the
    stories' index) fill in behind from the start of the log.
    """
    snapshots = Snapshots(MemorySnapshots(), log)
    end = await log.last_seq()
    state = await folded.state_at(Point(seq=end - 20_000))
    await snapshots.write(state.state, state.seq, verified_from=0)
    feed = Feed(log, every=every, snapshots=snapshots)
    async with anyio.create_task_group() as tg:
        t0, c0 = time.perf_counter(), time.process_time()
        tg.start_soon(feed.run)
        await feed.ready.wait()
        live, live_cpu = time.perf_counter() - t0, time.process_time() - c0
        await feed.books.ready.wait()
        books, books_cpu = time.perf_counter() - t0, time.process_time() - c0
    print(
        f"{'start from a snapshot 20,000 events back: live':<52} {live:7.1f} s  {live_cpu:6.1f} s CPU\n"
        f"{'  then the books (chargeback, stories) behind':<52} {books:7.1f} s  {books_cpu:6.1f} s CPU",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--every", type=int, default=EVERY)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--no-browser", action="store_true", help="HTTP timings only")
    ap.add_argument("--no-warm", action="store_true", help="no second start from a stored snapshot")
    ap.add_argument("--no-shared", action="store_true", help="no measure of a feed sharing another fold")
    args = ap.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    return 0 if asyncio.run(main_async(args)) else 1


if __name__ == "__main__":
    sys.exit(main())
