"""Fixtures of the real API server tier: one kube-apiserver + etcd per session, a namespace per test.

- `kube_server` (session): runs `../shared/k8s/start DIR` (beside the repository, as CI lays it
  out; `$MUSTER_K8S_START` overrides), waits for `ready`, stops it with SIGTERM at the end.
  Skipped, saying why, where the script or its binaries are absent.
- `api` (function): an admin ApiClient; `user_api` the same as the user `tester` (no rights
  until a test binds some).
- `ns` (function): a fresh namespace with its `default` ServiceAccount (no controller manager
  creates it); its pods, the test's nodes and cluster-wide objects it made are deleted after
  the test, so tests sharing the server do not see each other's nodes or pods.
- `kube` (function): `Kube`, the helpers a test uses to act as the controllers and kubelets
  that do not run here (see kubekit.py).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from kubekit import Kube
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.config import load_kube_config

ROOT = Path(__file__).resolve().parents[2]
START = Path(os.environ.get("MUSTER_K8S_START") or ROOT.parent / "shared" / "k8s" / "start")
READY_SECONDS = 90.0


@dataclass(frozen=True)
class KubeServer:
    """A running kube-apiserver: its folder, kubeconfigs and port."""

    dir: Path
    admin_kubeconfig: Path
    user_kubeconfig: Path
    port: int


def _missing() -> str | None:
    """Why the real API server cannot run here, or None."""
    if not START.is_file():
        return f"no real API server: {START} is absent (it is ../shared/k8s/start beside the repository)"
    for binary in ("kube-apiserver", "etcd"):
        path = START.parent / "bin" / binary
        if not (path.is_file() and os.access(path, os.X_OK)):
            return f"no real API server: {path} is absent or not executable"
    for tool in ("bash", "openssl", "curl"):  # what the start script calls
        if shutil.which(tool) is None:
            return f"no real API server: {START} needs {tool}, which is not on PATH"
    return None


@pytest.fixture(scope="session")
def kube_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeServer]:
    """One real kube-apiserver + etcd for the session (no kubelets, no controllers)."""
    why = _missing()
    if why is not None:
        pytest.skip(why)
    folder = tmp_path_factory.mktemp("kube") / "server"
    proc = subprocess.Popen(
        ["bash", str(START), str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: a hard stop below reaches etcd and the apiserver too
    )
    assert proc.stdout is not None
    output = b""
    deadline = time.monotonic() + READY_SECONDS
    try:
        while b"ready" not in output.splitlines():
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                raise RuntimeError(f"the API server did not start: {output.decode(errors='replace')[-2000:]}")
            readable, _, _ = select.select([proc.stdout], [], [], min(left, 1.0))
            if readable:
                chunk = os.read(proc.stdout.fileno(), 4096)
                output += chunk
        env = dict(line.split("=", 1) for line in (folder / "env").read_text().split())
        yield KubeServer(
            dir=folder,
            admin_kubeconfig=folder / "admin.kubeconfig",
            user_kubeconfig=folder / "user.kubeconfig",
            port=int(env["K8S_PORT"]),
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        proc.stdout.close()


async def client_for(kubeconfig: Path) -> ApiClient:
    """An ApiClient for `kubeconfig` (close it, or use `async with`)."""
    config = Configuration()
    await load_kube_config(config_file=str(kubeconfig), client_configuration=config)
    return ApiClient(config)


@pytest.fixture
async def api(kube_server: KubeServer) -> AsyncIterator[ApiClient]:
    """An ApiClient of the admin (system:masters)."""
    async with await client_for(kube_server.admin_kubeconfig) as client:
        yield client


@pytest.fixture
async def user_api(kube_server: KubeServer) -> AsyncIterator[ApiClient]:
    """An ApiClient of the user `tester`, who has no rights until a test binds some."""
    async with await client_for(kube_server.user_kubeconfig) as client:
        yield client


@pytest.fixture
async def kube(api: ApiClient) -> AsyncIterator[Kube]:
    """A fresh namespace (with its default ServiceAccount) and the helpers to act as controllers and kubelets."""
    kit = Kube(api, f"t-{uuid.uuid4().hex[:10]}")
    with anyio.fail_after(30):
        await kit.create_namespace()
    try:
        yield kit
    finally:
        with anyio.move_on_after(30, shield=True):
            await kit.cleanup()


@pytest.fixture
def ns(kube: Kube) -> str:
    """The test's namespace."""
    return kube.ns
