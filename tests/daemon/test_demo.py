"""`muster demo`: the whole system in one command, ending on its own with a summary and a log to replay."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import anyio
import pytest

from muster.events.embedded import EmbeddedNats
from muster.events.store import EventStore

MUSTER = str(Path(sys.executable).parent / "muster")


@pytest.mark.slow
def test_demo_runs_for_its_duration_prints_the_summary_and_leaves_a_replayable_log(tmp_path):
    """`muster demo --duration 10` ends by itself; its stream holds submissions, admissions and completions."""
    directory = tmp_path / "demo"
    proc = subprocess.run(
        # 10 s at the default speed submit ~30 gangs (~20 when the box is busy): enough for the counts below
        [MUSTER, "demo", "--duration", "10", "--dir", str(directory)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "muster demo done after" in out
    events = int(re.search(r"([\d,]+) events on stream MUSTER", out).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert "muster replay --nats nats://127.0.0.1:" in out and "muster audit" in out
    port = int(re.search(r"-p (\d+) -sd", out).group(1))  # type: ignore[union-attr]

    async def read() -> Counter[str]:
        store = await EventStore.connect(f"nats://127.0.0.1:{port}", stream="MUSTER", create=False)
        try:
            return Counter(type(s.event).__name__ for s in await store.read())
        finally:
            await store.close()

    # serve the demo's store again, as the printed command does
    with EmbeddedNats(directory / "nats", port=port):
        counts = anyio.run(read)
    assert sum(counts.values()) == events
    assert counts["JobSubmitted"] > 10 and counts["JobAdmitted"] > 10 and counts["JobFinished"] > 0
    assert counts["LeaderElected"] == 1 and counts["NodeAdded"] == 64
    assert (directory / "daemon.log").read_text().count('"event": "leading"') == 1


def test_demo_refuses_a_folder_it_did_not_make(tmp_path):
    """A non-empty folder without the demo's marker is never wiped: exit 2 with the reason."""
    (tmp_path / "precious.txt").write_text("keep me")
    proc = subprocess.run(
        [MUSTER, "demo", "--duration", "1", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2
    assert "was not made by muster demo" in proc.stderr
    assert (tmp_path / "precious.txt").read_text() == "keep me"
