"""A fake dcgm-exporter for `muster demo`: the demo's GPU utilization, served as a real exporter serves it.

In a cluster, dcgm-exporter runs on every GPU node and serves Prometheus text
at `/metrics`: one series per GPU, labelled with the pod (`pod`, `namespace`,
`container`) its container was given (kubelet's pod-resources API), empty
labels for a GPU nobody holds. muster's `UtilizationScraper` reads that text.
The demo has no GPUs, so this module plays every node's exporter from one
HTTP endpoint, and the demo points the real scraper at it: the scrape, the
pod-to-job mapping, the rate limit and the `GpuUtilizationSampled` events are
exactly production's.

What it reports, at each scrape, from the emulated cluster as it is then:
- for every Ready node, `gpus` series (`nvidia.com/gpu` allocatable), numbered
  0..n-1 in the order of the Running pods bound there (sorted by name);
- a GPU held by a Running pod reports `utilization(pod)` (0..1, the workload's
  profile for the pod's gang), spread by at most ±5 % of it per GPU so that GPUs
  of one gang differ a little, as real ones do; a free GPU, and a GPU of a pod
  the profile does not know, reports 0;
- both `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (ratio) and `DCGM_FI_DEV_GPU_UTIL`
  (integer percent), as an exporter with profiling metrics enabled does.

Invariants: deterministic for the same pods (no clock, no random state); a
pod's GPUs never exceed its node's count (extra ones are not reported); it
only reads the emulator, never changes it.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

__all__ = ["ENGINE_ACTIVE", "GPU_UTIL", "FakeDcgm", "serving"]

ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
MODEL_LABEL = "nvidia.com/gpu.product"
Obj = dict[str, Any]


def _gpus(resources: Any) -> int:
    try:
        return int(str((resources or {}).get("nvidia.com/gpu", 0)))
    except ValueError:
        return 0


def _ready(node: Obj) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions if isinstance(c, dict))


def _pod_gpus(pod: Obj) -> int:
    containers = (pod.get("spec") or {}).get("containers") or []
    return sum(_gpus((c.get("resources") or {}).get("limits")) for c in containers if isinstance(c, dict))


def _spread(pod: str, gpu: int) -> float:
    """A fixed factor in [0.95, 1.05] per (pod, GPU): GPUs of a gang are close, not identical."""
    digest = hashlib.blake2b(f"{pod}/{gpu}".encode(), digest_size=2).digest()
    return 0.95 + 0.1 * int.from_bytes(digest, "big") / 0xFFFF


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class FakeDcgm:
    """Renders every node's dcgm-exporter metrics from the emulated cluster's nodes and pods."""

    def __init__(
        self,
        nodes: Callable[[], list[Obj]],
        pods: Callable[[], list[Obj]],
        utilization: Callable[[Obj], float | None],
    ) -> None:
        """`nodes`/`pods` list the current objects; `utilization(pod)` is its gang's profile (None: unknown)."""
        self.nodes = nodes
        self.pods = pods
        self.utilization = utilization
        self.scrapes = 0

    def series(self) -> list[tuple[Obj, float]]:
        """(labels, engine-active ratio) of every GPU of every Ready node."""
        by_node: dict[str, list[Obj]] = {}
        for pod in self.pods():
            meta = pod.get("metadata") or {}
            node = (pod.get("spec") or {}).get("nodeName")
            if node and (pod.get("status") or {}).get("phase") == "Running" and not meta.get("deletionTimestamp"):
                by_node.setdefault(str(node), []).append(pod)
        out: list[tuple[Obj, float]] = []
        for node in sorted(self.nodes(), key=lambda n: str((n.get("metadata") or {}).get("name"))):
            meta = node.get("metadata") or {}
            name = str(meta.get("name") or "")
            if not name or not _ready(node):
                continue
            count = _gpus((node.get("status") or {}).get("allocatable"))
            model = str((meta.get("labels") or {}).get(MODEL_LABEL, "")).replace("-", " ")
            holders: list[tuple[Obj, float]] = []
            for pod in sorted(by_node.get(name, []), key=lambda p: str(p["metadata"].get("name"))):
                pod_meta = pod["metadata"]
                key = f"{pod_meta.get('namespace') or 'default'}/{pod_meta.get('name')}"
                base = self.utilization(pod)
                for i in range(_pod_gpus(pod)):
                    labels = {"pod": str(pod_meta.get("name")), "namespace": str(pod_meta.get("namespace") or "")}
                    labels["container"] = "main"
                    value = 0.0 if base is None else min(1.0, max(0.0, base * _spread(key, i)))
                    holders.append((labels, value))
            free: tuple[Obj, float] = ({"pod": "", "namespace": "", "container": ""}, 0.0)
            for gpu in range(count):
                held, value = holders[gpu] if gpu < len(holders) else free
                labels = {
                    "gpu": str(gpu),
                    "UUID": f"GPU-{hashlib.blake2b(f'{name}/{gpu}'.encode(), digest_size=8).hexdigest()}",
                    "device": f"nvidia{gpu}",
                    "modelName": model,
                    "Hostname": name,
                    **held,
                }
                out.append((labels, value))
        return out

    def render(self) -> str:
        """The Prometheus text exposition an exporter serves at /metrics."""
        self.scrapes += 1
        series = self.series()
        lines: list[str] = []
        for metric, help_text in (
            (GPU_UTIL, "GPU utilization (in %)."),
            (ENGINE_ACTIVE, "Ratio of time the graphics engine is active."),
        ):
            lines.append(f"# HELP {metric} {help_text}")
            lines.append(f"# TYPE {metric} gauge")
            for labels, value in series:
                text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
                shown = str(round(value * 100)) if metric == GPU_UTIL else f"{value:.6f}"
                lines.append(f"{metric}{{{text}}} {shown}")
        return "\n".join(lines) + "\n"


@asynccontextmanager
async def serving(exporter: FakeDcgm, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Serve `exporter` at http://host:PORT/metrics on a free port; yields that URL."""
    import anyio
    from aiohttp import web

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=exporter.render(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    # bind first, so the URL is known before anything scrapes it (no picked-port race)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        port = sock.getsockname()[1]
        await web.SockSite(runner, sock).start()
        yield f"http://{host}:{port}/metrics"
    finally:
        with anyio.move_on_after(2, shield=True):
            await runner.cleanup()
        sock.close()
