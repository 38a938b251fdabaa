"""The billing subscriber on a real embedded NATS JetStream: exact numbers, exactly once, bad input skipped.

The log is the hand-computed one of tests/projections/test_billing_ledger.py
(repeated here so each suite reads on its own).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import anyio
import nats
import pytest
import yaml

from muster.daemon.billing import BillingMetrics, BillingSubscriber, NoCrash, SubscriberOptions
from muster.daemon.billing_store import LedgerDB, LedgerError
from muster.events.codec import encode
from muster.events.embedded import EmbeddedNats, free_port
from muster.events.store import EventStore
from muster.events.types import (
    Event,
    GpuUtilizationSampled,
    JobAdmitted,
    JobCancelled,
    JobFinished,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    NodeAdded,
    PodSet,
    QueueConfigured,
)
from muster.projections.billing import fold_billing, skip_bad
from muster.projections.chargeback import build_report
from muster.projections.ledger import HOUR, new_billing_state
from muster.projections.ratecard import parse_rate_card

T0 = 472_222 * HOUR
GIB = 1 << 30
A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
LABEL = "nvidia.com/gpu.product"
RATES = {
    "versions": [
        {
            "version": "v1",
            "effective_from": T0,
            "gpu_hour": {A100: 2, H100: 4},
            "cpu_core_hour": 0.05,
            "memory_gib_hour": 0.01,
            "borrowed_premium": 1.5,
            "priority_discounts": {"scavenger": 0.5},
        },
        {"version": "v2", "effective_from": T0 + 7200, "gpu_hour": {A100: 2, H100: 5}, "cpu_core_hour": 0.05}
        | {"memory_gib_hour": 0.01, "borrowed_premium": 1.5, "priority_discounts": {"scavenger": 0.5}},
    ]
}


def _pods(count: int, gpu: int, cpu: int = 0, mem_gib: int = 0) -> list[PodSet]:
    req = {"gpu": gpu} | ({"cpu": cpu * 1000, "memory": mem_gib * GIB} if cpu else {})
    return [PodSet(name="worker", count=count, requests=req)]


def scripted_log() -> list[Event]:
    two_on_b = {"worker-0": "node-b", "worker-1": "node-b"}
    return [
        QueueConfigured(at=T0 - 100, name="team-a", nominal={"gpu": 8}),
        QueueConfigured(at=T0 - 100, name="team-b", nominal={"gpu": 8}),
        NodeAdded(at=T0, node="node-a", labels={LABEL: A100}, capacity={"gpu": 8}),
        NodeAdded(at=T0, node="node-b", labels={LABEL: H100}, capacity={"gpu": 8}),
        JobSubmitted(at=T0, job="j1", queue="team-a", podsets=_pods(1, 4, 8, 64)),
        JobAdmitted(at=T0, job="j1", queue="team-a", placement={"worker-0": "node-a"}),
        JobStarted(at=T0 + 60, job="j1"),
        GpuUtilizationSampled(at=T0 + 600, job="j1", gpu=0.5),
        GpuUtilizationSampled(at=T0 + 1800, job="j1", gpu=1.0),
        JobSubmitted(at=T0 + 1800, job="j2", queue="team-b", podsets=_pods(2, 4, 8, 64)),
        JobAdmitted(at=T0 + 1800, job="j2", queue="team-b", placement=two_on_b, borrowed={"gpu": 4}),
        JobFinished(at=T0 + 3600, job="j1"),
        JobSubmitted(at=T0 + 3600, job="j3", queue="team-b", priority_class="scavenger", podsets=_pods(1, 2)),
        JobAdmitted(at=T0 + 3600, job="j3", queue="team-b", placement={"worker-0": "node-a"}),
        JobPreempted(at=T0 + 5400, job="j2", preemptor=None, reason="ReclaimWithinCohort", lost_gpu_seconds=7200),
        JobCancelled(at=T0 + 5400, job="j3"),
        JobAdmitted(at=T0 + 7200, job="j2", queue="team-b", placement=two_on_b),
        GpuUtilizationSampled(at=T0 + 7200, job="j2", gpu=0.25),
        JobFinished(at=T0 + 9000, job="j2"),
    ]


BAD = b'{"type": "JobAdmitted", "at": "yesterday"'


async def publish(store: EventStore, items: Sequence[Event | bytes]) -> list[int]:
    """Append events (and raw bad bytes) in order; returns their stream sequences."""
    seqs = []
    for item in items:
        if isinstance(item, bytes):
            ack = await store.js.publish(f"{store.prefix}.bad.x", item, stream=store.stream)
            seqs.append(ack.seq)
        else:
            seqs.extend(await store.append([item]))
    return seqs


def ledger_url(db: Path | str) -> str:
    """A ledger URL: a path is an SQLite file."""
    return db if isinstance(db, str) else f"sqlite:///{db}"


def dump(db: Path | str) -> dict[str, Any]:
    """Everything the ledger holds, for equality checks."""
    with LedgerDB.open(ledger_url(db)) as db:
        usage, capacity, queues = db.read_window()
        return {
            "usage": usage,
            "capacity": capacity,
            "queues": queues,
            "jobs": db.jobs(),
            "skipped": db.skipped(),
            "seq": db.applied_seq(),
        }


class Crash(Exception):
    """What a kill -9 would do, at a chosen point."""


@dataclass
class CrashAt:
    """Raises Crash the `nth` time the subscriber reaches `point`."""

    point: str
    nth: int
    hits: int = 0
    fired: bool = False

    def _hit(self, point: str) -> None:
        if point == self.point:
            self.hits += 1
            if self.hits == self.nth:
                self.fired = True
                raise Crash(point)

    def after_fetch(self, seqs: Sequence[int]) -> None:
        self._hit("after_fetch")

    def after_write(self, seq: int) -> None:
        self._hit("after_write")

    def after_ack(self, seq: int) -> None:
        self._hit("after_ack")


@dataclass
class Process:
    """One incarnation of the subscriber process: its own NATS connection and database handle."""

    url: str
    stream: str
    db_path: Path | str
    """An SQLite file, or a ledger URL."""
    hooks: Any = field(default_factory=NoCrash)
    batch: int = 3
    from_stream_start: bool = False

    async def run_once(self) -> BillingSubscriber:
        nc = await nats.connect(self.url)
        ledger = LedgerDB.open(ledger_url(self.db_path))
        options = SubscriberOptions(
            stream=self.stream,
            durable="billing",
            batch=self.batch,
            fetch_timeout=0.5,
            hooks=self.hooks,
            from_stream_start=self.from_stream_start,
        )
        sub = BillingSubscriber(nc.jetstream(), ledger, options, BillingMetrics())
        try:
            with anyio.fail_after(20):
                await sub.start()
                await sub.run(once=True)
            return sub
        finally:
            # no close(): a crashed process does not unsubscribe or ack, its connection just goes away
            await nc.close()
            ledger.close()


async def test_scripted_log_through_nats_gives_the_hand_computed_ledger(
    store: EventStore, nats_url: str, tmp_path: Path
) -> None:
    """Allocated, used, idle, borrowed and lost GPU-hours and costs per queue match the hand figures."""
    await publish(store, scripted_log())
    sub = await Process(nats_url, store.stream, tmp_path / "l.db", batch=100).run_once()
    assert sub.tracker.seq == len(scripted_log())
    with LedgerDB.open(f"sqlite:///{tmp_path / 'l.db'}") as db:
        usage, capacity, queues = db.read_window()
    report = build_report(
        usage, capacity, queues, start=T0, end=T0 + 3 * HOUR, rates=parse_rate_card(RATES), share_idle="nominal"
    )
    rows = {r.key: r for r in report.rows}
    a, b = rows["team-a"], rows["team-b"]
    assert (a.allocated_gpu_hours, a.used_gpu_hours, a.idle_gpu_hours, a.cost) == (
        Decimal(4),
        Decimal("2.666667"),
        Decimal("0.666667"),
        Decimal("9.04"),
    )
    assert (b.allocated_gpu_hours, b.borrowed_gpu_hours, b.lost_gpu_hours) == (Decimal(13), Decimal(4), Decimal(2))
    assert (b.used_gpu_hours, b.idle_gpu_hours, b.cost) == (Decimal(1), Decimal(3), Decimal("64.12"))
    assert report.idle_capacity.unallocated_gpu_hours == Decimal(23)
    assert (a.idle_share_cost, b.idle_share_cost) == (Decimal(31), Decimal(31))
    assert b.rate_versions == ["v1", "v2"]
    assert sub.metrics.gpu_hours.labels(queue="team-b", kind="lost")._value.get() == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("seed", "backend"),
    [(1, "sqlite"), (2, "sqlite"), (3, "sqlite"), (4, "sqlite"), (5, "postgresql"), (6, "postgresql")],
)
async def test_crashes_at_random_points_then_restart_count_every_event_once(
    store: EventStore, nats_url: str, tmp_path: Path, seed: int, backend: str, request: pytest.FixtureRequest
) -> None:
    """Killing the subscriber between fetch, write and ack, and restarting, gives the ledger of one clean pass
    (on SQLite and on a real PostgreSQL)."""
    crashy: Path | str = tmp_path / "crashy.db" if backend == "sqlite" else request.getfixturevalue("postgres_url")
    log: list[Event | bytes] = [*scripted_log()]
    log.insert(9, BAD)
    await publish(store, log)
    url = nats_url

    await Process(url, store.stream, tmp_path / "clean.db").run_once()
    # the clean pass used the durable; the crashing runs start over with their own ledger and consumer
    await store.js.delete_consumer(store.stream, "billing")

    rng = random.Random(seed)
    points = ("after_fetch", "after_write", "after_ack")
    schedule = [CrashAt(rng.choice(points), rng.randint(1, 4)) for _ in range(6)]
    fired = 0
    for hooks in [*schedule, NoCrash()]:
        try:
            await Process(url, store.stream, crashy, hooks=hooks).run_once()
        except Crash:
            fired += 1
    assert fired >= 3
    assert dump(crashy) == dump(tmp_path / "clean.db")
    assert dump(tmp_path / "clean.db")["seq"] == len(log)


async def test_malformed_event_is_skipped_reported_and_acked(store: EventStore, nats_url: str, tmp_path: Path) -> None:
    """Bad bytes are recorded with their sequence, counted, and the ledger equals the fold of the good events."""
    log: list[Event | bytes] = [*scripted_log()]
    log.insert(5, BAD)
    seqs = await publish(store, log)
    bad_seq = seqs[5]
    sub = await Process(nats_url, store.stream, tmp_path / "l.db", batch=4).run_once()
    assert sub.metrics.skipped._value.get() == 1
    ledger = dump(tmp_path / "l.db")
    assert [s for s, _ in ledger["skipped"]] == [bad_seq]
    assert "invalid JobAdmitted" in ledger["skipped"][0][1] or "not JSON" in ledger["skipped"][0][1]

    expected = new_billing_state()
    for seq, item in zip(seqs, log, strict=True):
        if isinstance(item, bytes):
            skip_bad(expected, seq, "bad")
        else:
            fold_billing([(seq, item)], expected)
    assert ledger["usage"] == sorted(expected.ledger.usage.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2]))
    assert ledger["seq"] == seqs[-1]
    # nothing left for the consumer: the bad message was acked too
    info = await _acks_settled(store, "billing")
    assert (info.num_ack_pending, info.num_pending) == (0, 0)


async def test_a_number_past_the_databases_integers_is_skipped_not_a_crash_loop(
    store: EventStore, nats_url: str, tmp_path: Path
) -> None:
    """A job asking for 10**20 GPUs is skipped and recorded with its sequence; the rest is billed, restarts too."""
    huge = JobSubmitted(at=T0 + 1800, job="huge", queue="team-a", podsets=_pods(1, 10**20))
    log: list[Event | bytes] = [*scripted_log()]
    log.insert(10, huge)
    log.insert(9, BAD)  # in the same batch of 4: counted once, though the batch is folded twice
    seqs = await publish(store, log)
    sub = await Process(nats_url, store.stream, tmp_path / "l.db", batch=4).run_once()
    assert sub.metrics.skipped._value.get() == 2
    ledger = dump(tmp_path / "l.db")
    assert [s for s, _ in ledger["skipped"]] == [seqs[9], seqs[11]]
    assert "cannot be stored" in ledger["skipped"][1][1]
    expected = new_billing_state()
    for seq, item in zip(seqs, log, strict=True):
        if item is huge or isinstance(item, bytes):
            skip_bad(expected, seq, "skipped")
        else:
            fold_billing([(seq, item)], expected)
    assert ledger["usage"] == sorted(expected.ledger.usage.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2]))
    assert ledger["seq"] == seqs[-1]
    again = await Process(nats_url, store.stream, tmp_path / "l.db", batch=4).run_once()  # a restart starts fine
    assert again.tracker.seq == seqs[-1] and dump(tmp_path / "l.db") == ledger


async def test_redelivered_messages_are_acked_and_ignored(store: EventStore, nats_url: str, tmp_path: Path) -> None:
    """Messages written to the ledger but not acked come back after ack_wait and change nothing."""
    await publish(store, scripted_log())
    nc = await nats.connect(nats_url)
    ledger = LedgerDB.open(f"sqlite:///{tmp_path / 'l.db'}")
    hooks = CrashAt("after_write", 1)
    options = SubscriberOptions(stream=store.stream, durable="billing", batch=50, ack_wait=1.0, hooks=hooks)
    sub = BillingSubscriber(nc.jetstream(), ledger, options, BillingMetrics())
    try:
        await sub.start()
        with pytest.raises(Crash):
            await sub.step()  # folded and written, never acked
        before = dump(tmp_path / "l.db")
        with anyio.fail_after(30):
            while sub.metrics.redelivered._value.get() < len(scripted_log()):
                await sub.step()
        assert dump(tmp_path / "l.db") == before
        info = await _acks_settled(store, "billing")
        assert info.num_ack_pending == 0
    finally:
        await sub.close()
        await nc.close()
        ledger.close()


async def test_a_ledger_ahead_of_its_stream_is_refused(store: EventStore, nats_url: str, tmp_path: Path) -> None:
    """Pointing a ledger at a stream shorter than its cursor (a recreated stream) fails instead of skipping events."""
    await publish(store, scripted_log()[:5])
    await Process(nats_url, store.stream, tmp_path / "l.db").run_once()
    empty = f"{store.stream}E"
    await store.js.add_stream(name=empty, subjects=[f"{store.prefix}e.>"])
    try:
        with pytest.raises(LedgerError, match="recreated"):
            await Process(nats_url, empty, tmp_path / "l.db").run_once()
    finally:
        await store.js.delete_stream(empty)


async def test_a_ledger_whose_next_events_were_purged_is_refused_unless_asked(
    store: EventStore, nats_url: str, tmp_path: Path
) -> None:
    """A new ledger on a stream purged up to seq 6 (an archive's window, a lost emptyDir ledger) is refused, naming
    the events it would miss; `from_stream_start` bills from seq 6 on, knowingly."""
    await publish(store, scripted_log())
    await store.js.purge_stream(store.stream, seq=6)
    with pytest.raises(LedgerError, match=r"now starts at 6: events 1 to 5 left it .*--from-stream-start"):
        await Process(nats_url, store.stream, tmp_path / "new.db").run_once()

    sub = await Process(nats_url, store.stream, tmp_path / "new.db", from_stream_start=True).run_once()
    assert sub.tracker.seq == len(scripted_log()) and sub.tracker.applied == len(scripted_log()) - 5


async def test_nats_restart_mid_run_is_waited_out(own_nats: EmbeddedNats, tmp_path: Path) -> None:
    """A server restart, and the durable consumer deleted mid-run, are waited out: the ledger equals one fold."""
    events = scripted_log()
    store = await EventStore.connect(own_nats.url)
    nc = await nats.connect(own_nats.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    ledger = LedgerDB.open(f"sqlite:///{tmp_path / 'l.db'}")
    options = SubscriberOptions(stream=store.stream, durable="billing", batch=2, fetch_timeout=0.2)
    sub = BillingSubscriber(nc.jetstream(), ledger, options, BillingMetrics())
    stop = anyio.Event()
    try:
        await store.append(events[:8])
        await sub.start()
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: sub.run(stop=stop))
                await _until(lambda: sub.tracker.seq >= 4)
                await own_nats.arestart()
                await store.append(events[8:12])
                await _until(lambda: sub.tracker.seq == 12)
                # an operator deletes the durable consumer under the running subscriber
                await store.js.delete_consumer(store.stream, "billing")
                await store.append(events[12:])
                await _until(lambda: sub.tracker.seq == len(events))
                stop.set()
    finally:
        await sub.close()
        await nc.close()
        await store.close()
        ledger.close()
    expected = fold_billing(enumerate(events, start=1)).ledger
    ledger_rows = dump(tmp_path / "l.db")
    assert dict(ledger_rows["usage"]) == expected.usage
    assert dict(ledger_rows["capacity"]) == expected.capacity


async def test_cli_run_with_helm_config_serves_metrics_and_stops_on_sigterm(
    store: EventStore, nats_url: str, tmp_path: Path
) -> None:
    """`muster billing run --config` (the chart's file) catches up, serves /metrics and /readyz, exits 0 on SIGTERM,
    and logs as the file's `log` section says: JSON lines (it ignored the section and wrote structlog's default)."""
    await publish(store, scripted_log())
    metrics_port, health_port = free_port(), free_port()
    config = {
        "nats": {"url": nats_url, "stream": store.stream, "subject_prefix": store.prefix},
        "billing": {"consumer": "billing-cli", "data_dir": str(tmp_path / "data")},
        "http": {"metrics_port": metrics_port, "health_port": health_port},
        "log": {"level": "info", "format": "json"},
    }
    (tmp_path / "billing.yaml").write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "muster.cli", "billing", "run", "--config", str(tmp_path / "billing.yaml")]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    with open(tmp_path / "stderr.log", "wb") as err:  # noqa: ASYNC230 - the child writes to a real file
        proc = await anyio.open_process(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
    async with proc:
        try:
            body = ""
            # the applied sequence is set before the batch is acked, the lag after: wait for both
            caught_up = ("muster_billing_applied_sequence 19.0", "muster_billing_lag_events 0.0")
            with anyio.fail_after(60):
                while not all(line in body for line in caught_up):
                    await anyio.sleep(0.2)
                    body = await _get(metrics_port, "/metrics")
            assert 'muster_billing_gpu_hours_total{kind="allocated",queue="team-a"} 4.0' in body
            assert 'muster_billing_gpu_hours_total{kind="lost",queue="team-b"} 2.0' in body
            assert (await _get(health_port, "/readyz")).startswith("HTTP/1.0 200")
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(15):
                code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
    assert code == 0
    lines = (tmp_path / "stderr.log").read_text().splitlines()
    logged = [json.loads(line) for line in lines if line.startswith("{")]
    assert any(r.get("event") == "billing.stopped" and r.get("level") == "info" for r in logged), lines
    assert dump(tmp_path / "data" / "billing.db")["seq"] == 19
    info = await _acks_settled(store, "billing-cli")
    assert info.num_ack_pending == 0


async def _acks_settled(store: EventStore, durable: str) -> Any:
    """The consumer's info once the server has processed the acks already sent (they are fire-and-forget)."""
    info = await store.js.consumer_info(store.stream, durable)
    with anyio.move_on_after(30):  # returns as soon as they are in; a busy CI box can take seconds
        while info.num_ack_pending:
            await anyio.sleep(0.05)
            info = await store.js.consumer_info(store.stream, durable)
    return info


async def _until(condition: Callable[[], bool]) -> None:
    while True:
        if condition():
            return
        await anyio.sleep(0.02)


async def _get(port: int, path: str) -> str:
    try:
        async with await anyio.connect_tcp("127.0.0.1", port) as s:
            await s.send(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
            chunks = []
            with anyio.fail_after(5):
                while True:
                    try:
                        chunks.append(await s.receive())
                    except anyio.EndOfStream:
                        break
            return b"".join(chunks).decode()
    except OSError:
        return ""


def test_encoded_bad_bytes_really_fail_to_decode() -> None:
    """The BAD payload used above is refused by the codec (else the skip tests would prove nothing)."""
    from muster.events.codec import DecodeError, decode

    with pytest.raises(DecodeError):
        decode(BAD)
    assert decode(encode(scripted_log()[0])) == scripted_log()[0]
