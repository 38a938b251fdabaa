"""`muster audit` re-derives every decision of a `muster demo` log (real daemon, emulated Kubernetes, idle reclaim)."""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.demo.harness import DemoOptions, DemoResult, run_demo
from muster.events.embedded import EmbeddedNats
from muster.events.store import EventStore
from muster.events.types import Event, JobCancelled, JobPreempted
from muster.replay.audit import AuditReport, audit
from muster.replay.source import NatsLog


async def _audited_demo(options: DemoOptions) -> tuple[DemoResult, AuditReport, list[Event]]:
    """Run the demo, then audit its log on its own store; the log too."""
    result = await run_demo(options)
    with EmbeddedNats(result.store_dir, port=result.port):
        store = await EventStore.connect(f"nats://127.0.0.1:{result.port}", stream=result.stream, create=False)
        try:
            report = await audit(NatsLog(store))
            events = [s.event for s in await store.read()]
        finally:
            await store.close()
    return result, report, events


def _shown(report: AuditReport) -> list[tuple[int, list[str], list[str]]]:
    return [(b.first_seq, [str(e) for e in b.recorded], [str(e) for e in b.derived]) for b in report.differences[:3]]


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_audit_of_a_demo_log_finds_no_difference(tmp_path: Path) -> None:
    """A demo run (preemptions, idle reclaim, pods slow to leave their nodes, reconciliation passes) audits with 0
    differing decisions, and no pass takes a gang running on its replacement pods for gone."""
    options = DemoOptions(directory=tmp_path / "demo", duration=25, speed=4, live=False, reconcile_seconds=5)
    result, report, events = await _audited_demo(options)
    assert result.by_type["JobAdmitted"] > 10 and result.by_type["JobPreempted"] > 0
    assert any(isinstance(e, JobPreempted) and e.reason == "IdleReclaim" for e in events)
    # the demo's workload never deletes a gang: its controller replaces every evicted pod
    assert not [e.job for e in events if isinstance(e, JobCancelled)]
    assert report.differ == 0, _shown(report)
    assert report.identical >= result.by_type["JobAdmitted"] + result.by_type["JobPreempted"]


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_audit_of_a_demo_log_with_reservations_finds_no_difference(tmp_path: Path) -> None:
    """A demo run whose teams reserve room for their heads audits with 0 differing decisions, reservations too."""
    options = DemoOptions(directory=tmp_path / "demo", duration=25, speed=4, live=False, reserve_after=8)
    result, report, _ = await _audited_demo(options)
    assert result.by_type["ReservationMade"] > 0 and result.by_type["JobAdmitted"] > 10
    assert report.differ == 0, _shown(report)
    assert report.identical >= result.by_type["JobAdmitted"] + result.by_type["ReservationMade"]
