"""Debian's headless chromium, driven by playwright: the browser the dashboard's tests and bench load it in.

Role: one home for the browser's path and launch flags, so that
`tests/ui/test_browser.py` and `bench/bench_ui.py` measure and check the same
browser. playwright is a development dependency: it is imported only when a
page is opened.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
"""No sandbox (tests run as root in containers), no GPU, and nothing that talks to the network by itself."""


@contextlib.asynccontextmanager
async def headless_page(width: int = 1400, height: int = 900) -> AsyncIterator[Any]:
    """A blank page of a new headless chromium (`CHROMIUM`), closed with the browser on exit."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=list(ARGS))
        try:
            yield await browser.new_page(viewport={"width": width, "height": height})
        finally:
            await browser.close()
