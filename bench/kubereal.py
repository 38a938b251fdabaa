"""Driving a real kube-apiserver from a bench: start it, and act as its missing controllers (not a test).

Shared by the benches that run the whole daemon against `../shared/k8s/start`
(bench_node_loss.py, bench_k8s_real.py). The server has no kubelets and no
controllers, so the bench creates Ready nodes (status patched, `not-ready`
taint removed) and the pods a Job controller or a user would create.
The tests' equivalent is tests/k8s/conftest.py and kubekit.py (pytest fixtures,
one namespace per test); a bench needs neither pytest nor per-test cleanup.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from kubernetes_asyncio.client import ApiClient, BatchV1Api, Configuration, CoreV1Api
from kubernetes_asyncio.config import load_kube_config

from muster.daemon.k8s import manifests as m
from muster.events.embedded import EmbeddedNats

ROOT = Path(__file__).resolve().parents[1]
START = ROOT.parent / "shared" / "k8s" / "start"
MERGE = "application/merge-patch+json"
LOAD_FLAGS = "--max-requests-inflight=2000 --max-mutating-requests-inflight=1000"
"""The defaults (400/200) answer a busy scheduler with 429s."""


def start_server(folder: Path) -> subprocess.Popen[bytes]:
    """Run `../shared/k8s/start folder` (its own process group) until it prints `ready`; stop it with SIGTERM."""
    env = dict(os.environ, APISERVER_EXTRA=os.environ.get("APISERVER_EXTRA", LOAD_FLAGS))
    proc = subprocess.Popen(["bash", str(START), str(folder)], stdout=subprocess.PIPE, env=env, start_new_session=True)
    assert proc.stdout is not None
    out = b""
    deadline = time.monotonic() + 90
    while b"ready" not in out.splitlines():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"the API server did not start: {out!r}")
        if select.select([proc.stdout], [], [], 1.0)[0]:
            out += os.read(proc.stdout.fileno(), 4096)
    return proc


def runqueue_seconds(pid: int) -> float:
    """Seconds the threads of process `pid` have waited for a CPU while runnable (/proc/PID/task/*/schedstat):
    time lost to the other processes of a loaded machine, not to waiting for an answer."""
    total = 0
    for task in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(task.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


@dataclass(frozen=True)
class Server:
    """The running kube-apiserver and etcd (one process group): what they cost, what they were asked."""

    proc: subprocess.Popen[bytes]

    def _stats(self) -> list[list[str]]:
        """The /proc stat fields after the command of every process of the server's group."""
        out = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue  # ended meanwhile
            if int(fields[2]) == self.proc.pid:  # state ppid pgrp ...
                out.append([entry.name, *fields])
        return out

    def cpu_seconds(self) -> float:
        """CPU seconds used so far by every process of the server's group (the script, etcd, kube-apiserver)."""
        # after the pid and the command: state ppid pgrp session ... utime (12th) stime (13th)
        return sum(int(f[12]) + int(f[13]) for f in self._stats()) / os.sysconf("SC_CLK_TCK")

    def runqueue_seconds(self) -> float:
        """Seconds the server's threads have waited for a CPU while runnable (see `runqueue_seconds`)."""
        return sum(runqueue_seconds(int(f[0])) for f in self._stats())

    async def requests(self, api: ApiClient) -> Counter[str]:
        """Requests the API server has answered so far, by `VERB resource[/subresource]` (its
        `apiserver_request_total` metric; the bench's own requests count too)."""
        headers: dict[str, str] = {}
        await api.update_params_for_auth(headers, [], ["BearerToken"])
        async with api.rest_client.pool_manager.get(f"{api.configuration.host}/metrics", headers=headers) as resp:
            text = await resp.text()
        counts: Counter[str] = Counter()
        for line in text.splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels_text, _, value = line[len("apiserver_request_total{") :].rpartition("} ")
            labels = dict(part.split("=", 1) for part in labels_text.split('",') if "=" in part)
            labels = {k: v.strip('"') for k, v in labels.items()}
            what = labels.get("resource", "") + ("/" + labels["subresource"] if labels.get("subresource") else "")
            counts[f"{labels.get('verb', '')} {what}"] += int(float(value))
        return counts


@contextlib.asynccontextmanager
async def servers(pool: int | None = None) -> AsyncIterator[tuple[ApiClient, str, Server]]:
    """A fresh API server and nats-server for one bench: an admin ApiClient (`pool` connections), the NATS
    URL, and the API server's processes."""
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp) / "kube")
        nats = EmbeddedNats(Path(tmp) / "nats", stop_timeout=5)
        nats.start()
        try:
            config = Configuration()
            await load_kube_config(
                config_file=str(Path(tmp) / "kube" / "admin.kubeconfig"), client_configuration=config
            )
            if pool is not None:
                config.connection_pool_maxsize = pool
            async with ApiClient(config) as api:
                yield api, nats.url, Server(server)
        finally:
            nats.stop()
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)


async def gather(limit: int, calls: list[Callable[[], Awaitable[Any]]]) -> None:
    """Await every call, at most `limit` at once."""
    sem = anyio.Semaphore(limit)

    async def one(call: Callable[[], Awaitable[Any]]) -> None:
        async with sem:
            await call()

    async with anyio.create_task_group() as tg:
        for call in calls:
            tg.start_soon(one, call)


async def namespace(core: CoreV1Api, name: str) -> None:
    """A namespace with the `default` ServiceAccount that no controller manager creates here."""
    await core.create_namespace({"metadata": {"name": name}})
    await core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})


async def make_node(core: CoreV1Api, name: str, gpus: int) -> None:
    """A Ready node, as its kubelet registers it and the node lifecycle controller clears its taint."""
    obj = m.node(name, gpus=gpus)
    status = obj.pop("status")
    await core.create_node(obj)
    await core.patch_node_status(name, {"status": status}, _content_type=MERGE)
    await core.patch_node(name, {"spec": {"taints": None}}, _content_type=MERGE)


async def make_gang(api: ApiClient, ns: str, name: str, pods: int, bare: bool, queue: str = "q") -> list[str]:
    """A gang of one-GPU pods: a labelled pod group (`bare`) or a Job and the pods its controller would create."""
    core, batch = CoreV1Api(api), BatchV1Api(api)
    if bare:
        labels = {"muster.dev/gang": name, "muster.dev/gang-size": str(pods), "muster.dev/queue": queue}
        objs = [m.pod(f"{name}-{i}", ns, gpus=1, labels=labels, grace_seconds=0) for i in range(pods)]
    else:
        manifest = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "parallelism": pods,
                "completions": pods,
                "completionMode": "Indexed",
                "template": {
                    "spec": {
                        "schedulerName": "muster",
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "busybox"}],
                    }
                },
            },
        }
        job = api.sanitize_for_serialization(await batch.create_namespaced_job(ns, manifest))
        objs = m.job_pods(job, gpus=1, grace_seconds=0, labels={"muster.dev/queue": queue})
    for obj in objs:
        await core.create_namespaced_pod(ns, obj)
    return [o["metadata"]["name"] for o in objs]


async def bound(core: CoreV1Api, ns: str, selector: str = "") -> dict[str, str]:
    """Pod name -> node ("" while pending) in `ns` (a bench sharing the daemon's process lists only what it must)."""
    pods = await core.list_namespaced_pod(ns, label_selector=selector)
    return {p.metadata.name: p.spec.node_name or "" for p in pods.items}
