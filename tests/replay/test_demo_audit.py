"""`muster audit` re-derives every decision of a `muster demo` log (real daemon, emulated Kubernetes, idle reclaim)."""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.demo.harness import DemoOptions, DemoResult, run_demo
from muster.events.embedded import EmbeddedNats
from muster.events.store import EventStore
from muster.replay.audit import AuditReport, audit
from muster.replay.source import NatsLog


async def _audited_demo(options: DemoOptions) -> tuple[DemoResult, AuditReport]:
    """Run the demo, then audit its log on its own store."""
    result = await run_demo(options)
    with EmbeddedNats(result.store_dir, port=result.port):
        store = await EventStore.connect(f"nats://127.0.0.1:{result.port}", stream=result.stream, create=False)
        try:
            report = await audit(NatsLog(store))
        finally:
            await store.close()
    return result, report


def _shown(report: AuditReport) -> list[tuple[int, list[str], list[str]]]:
    return [(b.first_seq, [str(e) for e in b.recorded], [str(e) for e in b.derived]) for b in report.differences[:3]]


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_audit_of_a_demo_log_finds_no_difference(tmp_path: Path) -> None:
    """A demo run (preemptions, idle reclaim, pods slow to leave their nodes) audits with 0 differing decisions."""
    result, report = await _audited_demo(DemoOptions(directory=tmp_path / "demo", duration=25, speed=4, live=False))
    assert result.by_type["JobAdmitted"] > 10 and result.by_type["JobPreempted"] > 0
    assert report.differ == 0, _shown(report)
    assert report.identical >= result.by_type["JobAdmitted"] + result.by_type["JobPreempted"]


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_audit_of_a_demo_log_with_reservations_finds_no_difference(tmp_path: Path) -> None:
    """A demo run whose teams reserve room for their heads audits with 0 differing decisions, reservations too."""
    options = DemoOptions(directory=tmp_path / "demo", duration=25, speed=4, live=False, reserve_after=8)
    result, report = await _audited_demo(options)
    assert result.by_type["ReservationMade"] > 0 and result.by_type["JobAdmitted"] > 10
    assert report.differ == 0, _shown(report)
    assert report.identical >= result.by_type["JobAdmitted"] + result.by_type["ReservationMade"]
