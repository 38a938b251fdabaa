"""Leader-gated snapshot writing: every daemon replica's sidecar follows the log, only the leader's writes.

`muster snapshot --follow --leader BUCKET/KEY --holder NAME` reads the
daemon's leader key (a NATS KV entry holding the holder's name) before each
due snapshot. Runs on the embedded nats-server; waits are deadlines that
return as soon as the awaited due point is reported, never fixed sleeps.
"""

from __future__ import annotations

import contextlib
import functools
import json
import secrets
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import nats
import pytest
from anyio.streams.memory import MemoryObjectSendStream
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue
from replaykit import STORY, sim

from muster.cli import main
from muster.events.embedded import EmbeddedNats
from muster.events.store import EventStore, subject_for
from muster.events.types import LeaderElected, NodeAdded, NodeName
from muster.projections.cluster import fold
from muster.replay.points import Point
from muster.replay.rebuild import state_at
from muster.replay.snapshotcodec import SnapshotMeta
from muster.replay.snapshots import Snapshots
from muster.replay.snapshotstores import NatsSnapshots
from muster.replay.snapshotwriter import KvLeaderGate, LeaderGate, LogLeaderGate, write_snapshots
from muster.replay.source import NatsLog

EVENTS = sim(STORY).events  # 22 events: due points 5, 10, 15, 20 with every=5
ME = "muster-7d9f-b"
OTHER = "muster-7d9f-a"
WAIT = 30.0
"""Deadline for a due point to be reported: it comes within a second, but a busy 2-core CI box can delay it."""


@pytest.fixture
async def leader_kv(store: EventStore) -> AsyncIterator[tuple[str, KeyValue]]:
    """A fresh leader bucket (as the daemon's KvElector creates it, without a TTL here), deleted after the test."""
    bucket = f"leader-{uuid.uuid4().hex[:10]}"
    kv = await store.js.create_key_value(KeyValueConfig(bucket=bucket, history=1))
    try:
        yield bucket, kv
    finally:
        await store.js.delete_key_value(bucket)


@pytest.fixture
async def snaps(store: EventStore) -> AsyncIterator[Snapshots]:
    """The stream's snapshot bucket (STREAM-snapshots), empty, deleted after the test."""
    backend = await NatsSnapshots.open(store.js, f"{store.stream}-snapshots", create=True)
    assert backend is not None
    try:
        yield Snapshots(backend, NatsLog(store))
    finally:
        await store.js.delete_object_store(f"{store.stream}-snapshots")


async def test_the_gate_opens_only_while_the_key_names_the_holder(
    store: EventStore, leader_kv: tuple[str, KeyValue]
) -> None:
    """No bucket, no key, another holder's name or a resigned (deleted) key all mean "do not write"."""
    bucket, kv = leader_kv
    missing = KvLeaderGate(store.js, ME, bucket=f"absent-{uuid.uuid4().hex[:8]}")
    assert not await missing.allows() and "no one holds" in missing.why_not()
    gate = KvLeaderGate(store.js, ME, bucket=bucket)
    assert not await gate.allows()
    await kv.put("leader", OTHER.encode())
    assert not await gate.allows() and OTHER in gate.why_not()
    await kv.put("leader", ME.encode())
    assert await gate.allows()
    await kv.delete("leader")
    assert not await gate.allows()


Due = tuple[int, SnapshotMeta | None]


def _follower(store: EventStore, snaps: Snapshots, gate: LeaderGate, send: MemoryObjectSendStream[Due]) -> Any:
    """`write_snapshots(follow=True, every=5)` with the gate, sending each due point (meta None: skipped)."""
    return functools.partial(
        write_snapshots,
        NatsLog(store),
        snaps,
        every=5,
        follow=True,
        store=store,
        gate=gate,
        progress=lambda seq, meta: send.send_nowait((seq, meta)),
    )


async def test_a_follower_keeps_following_but_writes_nothing(
    store: EventStore, leader_kv: tuple[str, KeyValue], snaps: Snapshots
) -> None:
    """With the leader key held by another replica, `--follow` folds past every due point and writes no snapshot."""
    bucket, kv = leader_kv
    await kv.put("leader", OTHER.encode())
    await store.append(EVENTS[:8])
    send, due = anyio.create_memory_object_stream[Due](20)
    async with send, due, anyio.create_task_group() as tg:
        tg.start_soon(_follower(store, snaps, KvLeaderGate(store.js, ME, bucket=bucket), send))
        with anyio.fail_after(WAIT):  # returns as soon as each due point is reported
            assert await due.receive() == (5, None)
            await store.append(EVENTS[8:])
            assert [await due.receive() for _ in range(3)] == [(10, None), (15, None), (20, None)]
        tg.cancel_scope.cancel()
    assert await snaps.catalog() == []


async def test_a_new_leader_writes_from_the_next_multiple(
    store: EventStore, leader_kv: tuple[str, KeyValue], snaps: Snapshots
) -> None:
    """Once the leader key names this holder, the follower writes at the next multiple of N, and stops on losing it."""
    bucket, kv = leader_kv
    await kv.put("leader", OTHER.encode())
    await store.append(EVENTS[:8])
    send, due = anyio.create_memory_object_stream[Due](20)
    async with send, due, anyio.create_task_group() as tg:
        tg.start_soon(_follower(store, snaps, KvLeaderGate(store.js, ME, bucket=bucket), send))
        with anyio.fail_after(WAIT):
            assert await due.receive() == (5, None)
            await kv.put("leader", ME.encode())  # the handover: this replica's daemon won the lease
            await store.append(EVENTS[8:16])
            seq, meta = await due.receive()
            assert seq == 10 and meta is not None and meta.seq == 10
            seq, meta = await due.receive()
            assert seq == 15 and meta is not None
            await kv.delete("leader")  # resigned: the next due point is left alone
            await store.append(EVENTS[16:])
            assert await due.receive() == (20, None)
        tg.cancel_scope.cancel()
    catalog = await snaps.catalog()
    assert [m.seq for m in catalog] == [10, 15] and all(m.is_verified for m in catalog)
    replayed = await state_at(NatsLog(store), Point(seq=17), snaps)
    assert replayed.snapshot is not None and replayed.snapshot.seq == 15
    assert replayed.state == fold(EVENTS[:17])


async def test_the_cli_gates_on_the_leader_key_and_defaults_the_holder_to_the_pod_name(
    store: EventStore, leader_kv: tuple[str, KeyValue], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`muster snapshot --leader B/leader` writes nothing for another holder, and everything once $POD_NAME holds it."""
    bucket, kv = leader_kv
    await store.append(EVENTS)
    await kv.put("leader", OTHER.encode())
    monkeypatch.delenv("MUSTER_IDENTITY", raising=False)
    monkeypatch.setenv("POD_NAME", ME)
    url = store.nc.connected_url.geturl() if store.nc.connected_url else ""
    argv = ["snapshot", "--nats", url, "--stream", store.stream, "--every", "5", "--leader", f"{bucket}/leader"]
    try:
        out = await anyio.to_thread.run_sync(_run_json, [*argv, "--holder", "someone-else"])
        assert out["written"] == [] and out["skipped"] == [5, 10, 15, 20]
        await kv.put("leader", ME.encode())
        out = await anyio.to_thread.run_sync(_run_json, argv)  # the holder is $POD_NAME
        assert out["written"] == [5, 10, 15, 20] and out["skipped"] == []
        assert await anyio.to_thread.run_sync(main, [*argv[:-1], "bad bucket/leader"]) == 2
    finally:
        await store.js.delete_object_store(f"{store.stream}-snapshots")


def _run_json(argv: list[str]) -> dict[str, object]:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main([*argv, "--output", "json"])
    assert code == 0, buf.getvalue()
    doc: dict[str, object] = json.loads(buf.getvalue())
    return doc


# ---------------------------------------------------------------- as the chart runs it, under accounts.conf

ROOT = Path(__file__).resolve().parents[2]
DAEMON_PASSWORD = secrets.token_hex(12)
PASSWORDS = {
    "MUSTER_DAEMON_PASSWORD": DAEMON_PASSWORD,
    "MUSTER_ADMIN_PASSWORD": secrets.token_hex(12),
    "MUSTER_BILLING_PASSWORD": secrets.token_hex(12),
    "SUBMIT_TEAM_A_PASSWORD": secrets.token_hex(12),
    "SUBMIT_TEAM_B_PASSWORD": secrets.token_hex(12),
    "MUSTER_SYS_PASSWORD": secrets.token_hex(12),
}
DAEMON = {"user": "muster-daemon", "password": DAEMON_PASSWORD, "inbox_prefix": "_INBOX.muster-daemon"}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    """A nats-server running deploy/nats/accounts.conf unchanged, passwords from its environment."""
    workdir = tmp_path_factory.mktemp("nats-accounts")
    shutil.copy(ROOT / "deploy" / "nats" / "accounts.conf", workdir / "accounts.conf")
    (workdir / "server.conf").write_text("max_payload: 2MB\ninclude ./accounts.conf\n")
    with pytest.MonkeyPatch.context() as mp:
        for name, value in PASSWORDS.items():
            mp.setenv(name, value)
        srv = EmbeddedNats(workdir / "js", config_file=workdir / "server.conf", probe_options=DAEMON).start()
    try:
        yield srv
    finally:
        srv.stop()


def _daemon_config(tmp_path: Path, url: str) -> Path:
    """The chart's config.yaml for user/password auth, with its Secret files (deploy/helm/muster/_helpers.tpl)."""
    (tmp_path / "username").write_text("muster-daemon\n")
    (tmp_path / "password").write_text(DAEMON_PASSWORD + "\n")
    config = {
        "nats": {
            "url": url,
            "stream": "MUSTER",
            "subject_prefix": "muster",
            "inbox_prefix": "_INBOX.muster-daemon",
            "auth": {"username_file": str(tmp_path / "username"), "password_file": str(tmp_path / "password")},
        },
        "leader_election": {"backend": "nats-kv", "kv_bucket": "muster-leader", "ttl_seconds": 10},
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


async def test_the_chart_sidecar_command_works_as_the_daemon_identity(
    secured: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sidecar's command, with the daemon's config and identity under accounts.conf, reads and writes snapshots."""
    nc = await nats.connect(secured.url, **DAEMON)
    store = await EventStore.connect(nc, stream="MUSTER")
    try:
        config_kinds = ("queue", "cohort", "priorityclass", "scheduler")  # the admin's subjects, not the daemon's
        events = [e for e in EVENTS if subject_for(e).split(".")[1] not in config_kinds]
        await store.append(events)
        kv = await store.js.create_key_value(KeyValueConfig(bucket="muster-leader", ttl=60, history=1))
        await kv.put("leader", b"muster-pod-0")
        monkeypatch.setenv("POD_NAME", "muster-pod-0")
        monkeypatch.delenv("MUSTER_IDENTITY", raising=False)
        argv = [
            "snapshot",
            "--config",
            str(_daemon_config(tmp_path, secured.url)),
            "--every",
            "5",
            "--leader",
            "muster-leader/leader",
        ]
        first = await anyio.to_thread.run_sync(_run_json, argv)
        assert first["written"] == [5, 10, 15]
        node = next(e for e in events if isinstance(e, NodeAdded))
        more = [msgspec.structs.replace(node, node=NodeName(f"late-{i}"), at=2000) for i in range(5)]
        await store.append(more)  # the log grows; the next run starts from the verified snapshot at 15
        second = await anyio.to_thread.run_sync(_run_json, argv)
        assert second["started_from"] == "the verified snapshot at seq 15" and second["written"] == [20]
    finally:
        await store.close()
        await nc.close()


async def test_the_sidecar_waits_for_its_stream_then_writes_as_leader(nats_url: str, tmp_path: Path) -> None:
    """`muster snapshot --config --follow --leader` started before the stream exists waits for it, then writes."""
    import subprocess
    import sys

    stream, prefix = f"T{uuid.uuid4().hex[:12]}", f"t{uuid.uuid4().hex[:12]}"
    bucket = f"leader-{uuid.uuid4().hex[:10]}"
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"nats": {"url": nats_url, "stream": stream, "subject_prefix": prefix}}))
    argv = ["snapshot", "--config", str(config), "--follow", "--every", "5", "--leader", f"{bucket}/leader"]
    argv += ["--holder", ME]
    command = [sys.executable, "-c", "import sys; from muster.cli import main; sys.exit(main(sys.argv[1:]))", *argv]
    process = await anyio.open_process(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    store: EventStore | None = None
    try:
        assert process.stderr is not None and process.stdout is not None
        err = b""
        with anyio.fail_after(WAIT):  # returns once the sidecar reported the missing stream
            while b"yet" not in err:
                err += await process.stderr.receive()
        assert stream.encode() in err
        store = await EventStore.connect(nats_url, stream=stream, prefix=prefix)
        kv = await store.js.create_key_value(KeyValueConfig(bucket=bucket, history=1))
        await kv.put("leader", ME.encode())
        await store.append(EVENTS)
        out = b""
        with anyio.fail_after(WAIT):  # returns once the fourth snapshot is reported
            while out.count(b"wrote the snapshot") < 4:
                try:
                    out += await process.stdout.receive()
                except anyio.EndOfStream:  # it ended: say how, with what it printed
                    err += b"".join([chunk async for chunk in process.stderr])
                    raise AssertionError(
                        f"the sidecar exited ({await process.wait()}): {(out + err).decode()}"
                    ) from None
        assert [line.split()[-3] for line in out.decode().splitlines() if "wrote" in line] == ["5", "10", "15", "20"]
        backend = await NatsSnapshots.open(store.js, f"{stream}-snapshots", create=False)
        assert backend is not None
        assert [m.seq for m in await Snapshots(backend, NatsLog(store)).catalog()] == [5, 10, 15, 20]
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have ended by itself
            process.terminate()
        with anyio.move_on_after(10, shield=True):
            await process.wait()
        await process.aclose()
        if store is not None:
            with anyio.move_on_after(10, shield=True):
                await store.js.delete_object_store(f"{stream}-snapshots")
                await store.js.delete_key_value(bucket)
                await store.delete_stream()
                await store.close()


async def test_with_the_log_gate_only_the_replica_the_log_names_writes(store: EventStore, snaps: Snapshots) -> None:
    """`--log-leader`: a snapshot falls due and is written only once the log's last LeaderElected names the holder."""
    await store.append([*EVENTS[:4], LeaderElected(at=1, epoch=1, holder=OTHER), *EVENTS[4:8]])
    send, due = anyio.create_memory_object_stream[Due](20)
    gate = LogLeaderGate(ME)
    async with send, due, anyio.create_task_group() as tg:
        tg.start_soon(_follower(store, snaps, gate, send))
        with anyio.fail_after(WAIT):
            assert await due.receive() == (5, None)
            assert OTHER in gate.why_not()
            await store.append([LeaderElected(at=2, epoch=2, holder=ME), *EVENTS[8:12]])
            seq, meta = await due.receive()
        tg.cancel_scope.cancel()
    assert seq == 10 and meta is not None
    assert [m.seq for m in await snaps.catalog()] == [10]
