"""A long log, written fast: millions of events on a stream and a verified snapshot near its end.

What a cluster's log looks like after months: a few thousand jobs running on
hundreds of nodes, and millions of GPU utilization samples (one per job every
scrape). The head (configuration, nodes, a leader's term and its admissions)
is decided by the real core and appended through the store; the bulk of
samples is folded here as it is generated and published pre-encoded on one
raw connection without waiting for acknowledgements (throttled on the
stream's end), which stores millions of messages in tens of seconds. A
snapshot is written where the chart's sidecar would have (at a multiple of
`every`), verified by construction (this fold started from the empty
state); after it come a tail of samples and `pending` jobs that a leader
can admit at once, so "deciding" has something to decide.

A log of 10 M events takes minutes to write on a loaded machine, so
`kept_long_log` writes it once into a folder (the nats-server's store and a
`longlog.json` naming its shape and the fold's version) and later runs copy that folder: a run
appends (the new leader's term, its admissions), so it never runs on the
kept copy itself.

Used by reliability.py (the warm-start row); not a script of its own.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio
import anyio.to_thread

from muster.demo.simcluster import block_rack_nodes
from muster.events.codec import encode
from muster.events.embedded import EmbeddedNats
from muster.events.store import EventStore, subject_for
from muster.events.types import (
    Event,
    GpuUtilizationSampled,
    JobId,
    JobSubmitted,
    LeaderElected,
    PodSet,
    QueueConfigured,
    QueueName,
    SchedulerConfigured,
)
from muster.projections.cluster import evolve
from muster.projections.scheduler import decide
from muster.projections.state import ClusterState
from muster.replay.snapshotcodec import fingerprint
from muster.replay.snapshots import Snapshots
from muster.replay.snapshotstores import NatsSnapshots, default_bucket
from muster.replay.source import NatsLog

LONG_LOG_CLUSTER = "4x5x25x8"
"""The log's nodes, as `muster daemon --simulated-cluster` spells them: 4 blocks x 5 racks x 25 nodes x 8 GPUs."""


@dataclass(frozen=True)
class LongLog:
    snapshot_seq: int
    end: int
    pending: tuple[str, ...]
    """Jobs submitted after the snapshot, with room to run: a leader's first cycle admits them."""
    seconds: float
    """Time it took to write the log and the snapshot."""


async def write_into(store: EventStore, *, events: int) -> LongLog:
    """`write_long_log` on `store`'s stream, its snapshots where the daemon looks for the sidecar's."""
    backend = await NatsSnapshots.open(store.js, default_bucket(store.stream), create=True)
    assert backend is not None
    return await write_long_log(store, Snapshots(backend, NatsLog(store)), events=events)


async def kept_long_log(kept: Path, work: Path, *, events: int, stream: str, prefix: str) -> LongLog:
    """A copy in `work` of the long log of `events` events kept in `kept` (written there first if absent).

    `work` becomes the store dir of a nats-server holding `stream`; `kept` is only read once written.
    """
    shape = kept / "longlog.json"
    # the snapshot is only used by the fold that wrote it (snapshotcodec.fingerprint): a kept log of another
    # version would be folded from its first event, so it is written again
    wanted = {"events": events, "stream": stream, "prefix": prefix, "fingerprint": fingerprint()}
    if not shape.exists() or {k: json.loads(shape.read_text()).get(k) for k in wanted} != wanted:
        shutil.rmtree(kept, ignore_errors=True)
        with EmbeddedNats(kept / "nats", stop_timeout=60) as server:
            async with await EventStore.connect(server.url, stream=stream, prefix=prefix, duplicate_window=10) as es:
                long = await write_into(es, events=events)
        shape.write_text(json.dumps({**wanted, **asdict(long)}))
    recorded = json.loads(shape.read_text())
    await anyio.to_thread.run_sync(lambda: shutil.copytree(kept / "nats", work, ignore=_server_log))
    return LongLog(recorded["snapshot_seq"], recorded["end"], tuple(recorded["pending"]), recorded["seconds"])


def _server_log(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if n == "nats-server.log"]


def _job(name: str) -> JobSubmitted:
    return JobSubmitted(
        at=2, job=JobId(name), queue=QueueName("q"), podsets=[PodSet(name="w", count=1, requests={"gpu": 1})]
    )


async def write_long_log(
    store: EventStore,
    snapshots: Snapshots,
    *,
    events: int,
    every: int = 50_000,
    running: int = 1_000,
    pending: int = 100,
    tail: int = 20_000,
) -> LongLog:
    """`events` events on `store`'s (empty) stream; a snapshot at the last multiple of `every` `tail` before the end."""
    started = time.perf_counter()
    nodes = block_rack_nodes(*(int(n) for n in LONG_LOG_CLUSTER.split("x")))  # 500 nodes, 4,000 GPUs
    state = ClusterState()
    head: list[Event] = [
        SchedulerConfigured(at=0, levels=["muster.dev/block", "muster.dev/rack"]),
        QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 8 * len(nodes)}),
        *nodes,
        LeaderElected(at=1, epoch=1, holder="earlier-leader"),
        *[_job(f"run-{i:05d}") for i in range(running)],
    ]
    for ev in head:
        evolve(state, ev)
    decisions = decide(state, 2)
    for ev in decisions:
        evolve(state, ev)
    await store.append([*head, *decisions])
    seq = await store.last_seq()
    # the bulk: every running job sampled in turn, the same `at` (time does not matter to the fold)
    samples = [GpuUtilizationSampled(at=3, job=JobId(f"run-{i:05d}"), gpu=0.5 + (i % 50) / 100) for i in range(running)]
    wire = [(subject_for(ev, store.prefix), encode(ev)) for ev in samples]
    snapshot_at = max(every, (events - tail) // every * every)
    seq = await _publish(store, samples, wire, state, first=seq + 1, last=snapshot_at)
    await snapshots.write(state, seq, verified_from=0)
    jobs = tuple(f"late-{i:04d}" for i in range(pending))
    await store.append([_job(name) for name in jobs])
    last = max(events, await store.last_seq() + 1)
    end = await _publish(store, samples, wire, ClusterState(), first=await store.last_seq() + 1, last=last)
    return LongLog(snapshot_at, end, jobs, time.perf_counter() - started)


async def _publish(
    store: EventStore,
    samples: list[GpuUtilizationSampled],
    wire: list[tuple[str, bytes]],
    state: ClusterState,
    *,
    first: int,
    last: int,
    ahead: int = 200_000,
) -> int:
    """Publish samples as sequences first..last, folding each into `state`; returns `last` once all are stored."""
    conn = await store.open_wire()
    try:
        n = len(samples)
        for seq in range(first, last + 1):
            i = seq % n
            evolve(state, samples[i])
            conn.publish(*wire[i])
            if seq % 10_000 == 0:
                await conn.flush()
                # let JetStream keep up: a bounded backlog of unacknowledged messages
                while seq - await store.last_seq() > ahead:  # noqa: ASYNC110 - no event for the stream's end
                    await anyio.sleep(0.05)
        await conn.flush()
    finally:
        await conn.close()
    with anyio.fail_after(120):
        while (stored := await store.last_seq()) < last:  # noqa: ASYNC110 - polled stream end
            await anyio.sleep(0.05)
    if stored != last:
        raise RuntimeError(f"the stream ends at {stored}, not {last}: something else wrote to it")
    return last
