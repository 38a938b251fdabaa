"""Reservations through the daemon on a real API server, read back as a user would with `muster explain`."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
from kubekit import Kube, eventually, log_of, running_daemon
from kubernetes_asyncio.client import ApiClient

from muster.events.store import EventStore
from muster.events.types import JobSubmitted, QueueConfigured, QueueName, ReservationMade


async def test_a_reserved_gangs_explain_from_the_daemons_log_shows_its_reservation(
    api: ApiClient, kube: Kube, store: EventStore, nats_url: str, tmp_path: Path
) -> None:
    """A gang too big for the room two running jobs leave gets a reservation from the daemon, and `muster explain`
    on the daemon's stream says where it is reserved, which jobs it waits for, and why its start is unknown."""
    await store.append([QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 32}, reserve_after=0)])
    for name in ("n1", "n2"):
        await kube.node(name, gpus=8)
    async with running_daemon(store, api):
        for name in ("small-a", "small-b"):
            _, pods = await kube.job(name, 1, gpus=6)
            await eventually(lambda pods=pods: kube.pod_node(pods[0]["metadata"]["name"]))
        await kube.job("big", 2, gpus=8)
        await eventually(lambda: _reserved(store))
    [big] = [s for s in await log_of(store, JobSubmitted) if "/big-" in s.job]
    [made] = await log_of(store, ReservationMade)
    assert made.job == big.job
    config = tmp_path / "admin.yaml"  # the chart's admin.yaml names the log's stream and prefix so
    config.write_text(f"nats: {{url: '{nats_url}', stream: {store.stream}, subject_prefix: {store.prefix}}}\n")
    flags = ["--config", str(config)]
    done = await anyio.run_process([sys.executable, "-m", "muster.cli", "explain", big.job, *flags], check=False)
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    assert "reserved " in out and "waiting for 2 jobs to end" in out, out
    assert "none has a declared limit (start unknown)" in out, out  # neither small job declares one
    assert all(node in out for node in made.nodes) or made.domain in out, out


async def _reserved(store: EventStore) -> bool:
    return bool(await log_of(store, ReservationMade))
