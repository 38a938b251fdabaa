"""How fast the dashboard loads over a 1,000,000-event log (not a test; prints numbers).

The log is `bench_events.realistic_events` (512 nodes in 8 blocks x 8 racks,
16 queues, overlapping job lifecycles), held in memory as stored bytes, as a
`muster ui --log FILE` holds it. The dashboard (`muster.ui`) folds it once
(cluster state, billing ledger, a snapshot and a billing checkpoint every
`--every` events) and then serves it. Measured:

  start       the first fold, until the pages answer (once per server start)
  http        each page's JSON, live and as of a past point (the worst one: just
              before a snapshot, `every - 1` events to fold), plus the static files
              a first visit loads; median of `--trials`; target <= 1 s
  browser     with Debian's chromium (/usr/bin/chromium) and playwright: from
              navigation to the page drawn, live and after moving the time field
              to the past point; target <= 1 s (skipped without chromium)

Exit status 1 when a target is missed.

Usage: python bench/bench_ui.py [--events 1000000] [--every 50000] [--trials 3] [--no-browser]
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


async def timed_get(http: aiohttp.ClientSession, url: str, trials: int) -> tuple[float, int]:
    """Median seconds of `trials` GETs of `url`, and the body's size."""
    times, size = [], 0
    for _ in range(trials):
        t0 = time.perf_counter()
        async with http.get(url) as r:
            body = await r.read()
            assert r.status == 200, (url, r.status, body[:200])
        times.append(time.perf_counter() - t0)
        size = len(body)
    return statistics.median(times), size


async def over_http(base: str, past: int, job: str, trials: int) -> bool:
    ok = True
    async with aiohttp.ClientSession() as http:
        first = 0.0
        for path in ("/", "/static/app.js", "/static/style.css"):
            seconds, _ = await timed_get(http, base + path, trials)
            first += seconds
        ok &= row("http  first visit: index, script, style", first)
        for page in ("cluster", "queues", "jobs", f"jobs/{job}", "chargeback"):
            for at, label in (("", "live"), (f"?at={past}", f"seq {past:,}")):
                seconds, size = await timed_get(http, f"{base}/api/{page}{at}", trials)
                name = "job" if page.startswith("jobs/") else page
                ok &= row(f"http  {name} ({label})", seconds, f"{size / 1e3:,.0f} kB")
    return ok


async def in_browser(base: str, past: int, job: str) -> bool:
    from playwright.async_api import async_playwright

    ok = True
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            for name in ("cluster", "queues", "jobs", f"jobs/{job}", "chargeback"):
                kind = name.split("/")[0]
                await page.goto("about:blank")
                t0 = time.perf_counter()
                await page.goto(f"{base}/#/{name}")
                await page.wait_for_selector(f"main[data-page='{kind}']", timeout=60_000)
                live = time.perf_counter() - t0
                t0 = time.perf_counter()
                await page.locator("[data-testid=at]").fill(str(past))
                await page.locator("[data-testid=at]").press("Enter")
                await page.wait_for_selector(f"main[data-page='{kind}'][data-seq='{past}']", timeout=60_000)
                travelled = time.perf_counter() - t0
                label = "job" if kind == "jobs" and "/" in name else kind
                ok &= row(f"browser {label}: open (live)", live)
                ok &= row(f"browser {label}: time field to seq {past:,}", travelled)
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
        ok &= await over_http(base, past, job, args.trials)
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
    ap.add_argument("--every", type=int, default=50_000)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--no-browser", action="store_true", help="HTTP timings only")
    args = ap.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    return 0 if asyncio.run(main_async(args)) else 1


if __name__ == "__main__":
    sys.exit(main())
