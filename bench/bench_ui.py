"""How fast the dashboard loads over a 1,000,000-event log (not a test; prints numbers).

The log is `bench_events.realistic_events` (512 nodes in 8 blocks x 8 racks,
16 queues, overlapping job lifecycles), held in memory as stored bytes, as a
`muster ui --log FILE` holds it. The dashboard (`muster.ui`) folds it once
(cluster state, billing ledger, a snapshot and a billing checkpoint every
`--every` events) and then serves it. Measured:

  start       the first fold, until the pages answer (once per server start)
  http        each page's JSON, live and as of a past point (the worst one: just
              before a snapshot, a snapshot to decode and `every - 1` events to
              fold), then another page at that point and a point 1,000 events on
              (no snapshot: the last past state folded forward), plus the static
              files a first visit loads; median of `--trials`; target <= 1 s
  browser     with Debian's chromium (/usr/bin/chromium) and playwright: from
              navigation to the page drawn, live and after moving the time field
              to the past point; target <= 1 s (skipped without chromium)

Exit status 1 when a target is missed.

Usage: python bench/bench_ui.py [--events 1000000] [--every 25000] [--trials 3] [--no-browser]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp
import anyio
import structlog
from bench_events import realistic_events

from muster.events.codec import encode
from muster.replay.source import MemoryLog
from muster.ui.feed import Feed
from muster.ui.server import serve

TARGET = 1.0
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def row(what: str, seconds: float, extra: str = "") -> bool:
    ok = seconds <= TARGET
    print(f"{what:<44} {seconds * 1000:8.0f} ms  {extra:<24} {'OK (<= 1 s)' if ok else 'OVER 1 s'}", flush=True)
    return ok


async def get(http: aiohttp.ClientSession, url: str) -> tuple[float, int]:
    """Seconds for one GET of `url`, and the body's size."""
    t0 = time.perf_counter()
    async with http.get(url) as r:
        body = await r.read()
        assert r.status == 200, (url, r.status, body[:200])
    return time.perf_counter() - t0, len(body)


async def median(trials: int, measure: Any) -> tuple[float, int]:
    results = [await measure() for _ in range(trials)]
    return statistics.median(r[0] for r in results), results[-1][1]


PAGES = ("cluster", "queues", "jobs", "job", "chargeback")


async def over_http(base: str, past: int, job: str, every: int, trials: int) -> bool:
    ok = True
    path = {name: f"jobs/{job}" if name == "job" else name for name in PAGES}
    async with aiohttp.ClientSession() as http:

        async def first_visit() -> tuple[float, int]:
            total = 0.0
            for asset in ("/", "/static/app.js", "/static/style.css"):
                total += (await get(http, base + asset))[0]
            return total, 0

        ok &= row("http  first visit: index, script, style", (await median(trials, first_visit))[0])
        for name in PAGES:
            url = f"{base}/api/{path[name]}"

            async def cold(url: str = url) -> tuple[float, int]:
                await get(http, f"{base}/api/queues?at=1")  # the last past moment far behind: a snapshot it is
                return await get(http, f"{url}?at={past}")

            seconds, size = await median(trials, lambda url=url: get(http, url))
            ok &= row(f"http  {name} (live)", seconds, f"{size / 1e3:,.0f} kB")
            seconds, size = await median(trials, cold)
            ok &= row(f"http  {name} (seq {past:,}: snapshot + {every - 1:,})", seconds, f"{size / 1e3:,.0f} kB")
        await get(http, f"{base}/api/queues?at={past}")
        seconds, _ = await get(http, f"{base}/api/cluster?at={past}")
        ok &= row("http  cluster, same point as the last page", seconds)
        seconds, _ = await get(http, f"{base}/api/cluster?at={past + 1000}")
        ok &= row("http  cluster, slider 1,000 events on", seconds)
    return ok


async def in_browser(base: str, past: int, job: str) -> bool:
    from playwright.async_api import async_playwright

    ok = True
    async with async_playwright() as pw, aiohttp.ClientSession() as http:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            for name in PAGES:
                kind = "jobs" if name == "job" else name
                await page.goto("about:blank")
                t0 = time.perf_counter()
                await page.goto(f"{base}/#/{f'jobs/{job}' if name == 'job' else name}")
                await page.wait_for_selector(f"main[data-page='{kind}']", timeout=60_000)
                live = time.perf_counter() - t0
                await get(http, f"{base}/api/queues?at=1")  # cold: from a snapshot
                t0 = time.perf_counter()
                await page.locator("[data-testid=at]").fill(str(past))
                await page.locator("[data-testid=at]").press("Enter")
                await page.wait_for_selector(f"main[data-page='{kind}'][data-seq='{past}']", timeout=60_000)
                travelled = time.perf_counter() - t0
                ok &= row(f"browser {name}: open (live)", live)
                ok &= row(f"browser {name}: time field to seq {past:,}", travelled)
        finally:
            await browser.close()
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
        t0 = time.perf_counter()
        port = await tg.start(functools.partial(serve, feed, port=0))
        await feed.ready.wait()
        started = time.perf_counter() - t0
        snaps = len(await feed.snapshots.catalog())
        print(f"{'start: fold, snapshots, billing checkpoints':<44} {started:8.1f} s   {snaps} snapshots", flush=True)
        base = f"http://127.0.0.1:{port}"
        past = (len(raws) // 2 // args.every + 1) * args.every - 1  # the most events after a snapshot
        # a job page folds the job's lifetime: take the last job submitted before the past point
        job = max((j for j in jobs if feed.submissions[j] < past), key=lambda j: feed.submissions[j])
        print(f"job page: {job} ({feed.state.jobs[job].status} at the end), submitted at seq {feed.submissions[job]:,}")
        ok &= await over_http(base, past, job, args.every, args.trials)
        if args.no_browser:
            pass
        elif not await anyio.Path(CHROMIUM).exists():
            print("browser: skipped (no /usr/bin/chromium; apt-get install chromium)", flush=True)
        else:
            ok &= await in_browser(base, past, job)
        tg.cancel_scope.cancel()
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--every", type=int, default=25_000)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--no-browser", action="store_true", help="HTTP timings only")
    args = ap.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    return 0 if asyncio.run(main_async(args)) else 1


if __name__ == "__main__":
    sys.exit(main())
