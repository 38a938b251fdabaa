"""A simulated kubelet for every node: runs bound pods for their `muster.dev/runtime`, confirms deletions.

Against any API server (the emulator in tests and `muster demo`), it watches
pods and:
- marks a bound Pending pod Running (Ready, startTime);
- after its `muster.dev/runtime` annotation (seconds, divided by `speed`),
  marks it Succeeded, or Failed when `muster.dev/sim-outcome: Failed`; a pod
  without the annotation runs until it is deleted;
- finishes the deletion of a pod marked for deletion (an eviction or a
  graceful delete of a bound pod) as a kubelet does once its containers stop.

Invariants: each pod (by uid) is started once and ended once; an effect on a
pod that has meanwhile gone (404) is dropped; API errors are retried by the
next event or timer, never raised.
"""

from __future__ import annotations

import datetime
import heapq
from collections.abc import Callable, Container
from contextlib import aclosing
from typing import Any

import anyio
import structlog
from anyio.abc import TaskStatus
from kubernetes_asyncio.client import ApiClient

from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.errors import KubeError, NotFound
from muster.daemon.k8s.pods import RUNTIME_ANNOTATION
from muster.daemon.k8s.watching import Backoff, Synced, WatchEvent, watch_objects

__all__ = ["OUTCOME_ANNOTATION", "SimulatedKubelet"]

log = structlog.get_logger("muster.k8s.kubelet")

OUTCOME_ANNOTATION = "muster.dev/sim-outcome"
Obj = dict[str, Any]


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _conditions(pod: Obj, ready: bool) -> list[Obj]:
    keep = [
        c
        for c in (pod.get("status") or {}).get("conditions") or []
        if isinstance(c, dict) and c.get("type") not in ("Ready", "ContainersReady", "Initialized")
    ]
    state = "True" if ready else "False"
    now = _now()
    return [
        *keep,
        {"type": "Initialized", "status": "True", "lastTransitionTime": now},
        {"type": "ContainersReady", "status": state, "lastTransitionTime": now},
        {"type": "Ready", "status": state, "lastTransitionTime": now},
    ]


class SimulatedKubelet:
    def __init__(
        self,
        api_client: ApiClient,
        *,
        speed: float = 1.0,
        nodes: Container[str] | None = None,
        clock: Callable[[], float] = anyio.current_time,
        backoff: Backoff | None = None,
    ) -> None:
        """`nodes` limits it to pods on those nodes (default: every node); `speed` > 1 runs pods faster."""
        self.client = KubeClient(api_client)
        self.speed = speed
        self.nodes = nodes
        self._clock = clock
        self._backoff = backoff or Backoff(initial=0.1, maximum=2.0)
        self._started: set[str] = set()
        self._ended: set[str] = set()
        self._deleted: set[str] = set()
        self._timers: list[tuple[float, str, str, str, str]] = []
        """(due, uid, namespace, name, phase) heap."""
        self._wake = anyio.Event()
        self.started_pods = 0
        self.ended_pods = 0

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._timer_loop)
            started = False
            stream = watch_objects(self.client, "pods", backoff=self._backoff)
            async with aclosing(stream) as events:
                async for item in events:
                    if isinstance(item, Synced):
                        if not started:
                            started = True
                            task_status.started()
                        continue
                    if isinstance(item, WatchEvent) and item.type != "DELETED":
                        await self._on_pod(item.obj)

    async def _on_pod(self, pod: Obj) -> None:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        uid, ns, name = str(meta.get("uid") or ""), str(meta.get("namespace") or ""), str(meta.get("name") or "")
        node = spec.get("nodeName")
        if not node or (self.nodes is not None and node not in self.nodes):
            return
        if meta.get("deletionTimestamp"):
            if uid not in self._deleted:
                self._deleted.add(uid)
                if not await self._effect(self.client.delete_pod(ns, name, grace_seconds=0), ns, name):
                    self._deleted.discard(uid)
            return
        phase = status.get("phase") or "Pending"
        if phase == "Pending" and uid not in self._started:
            self._started.add(uid)
            patch = {"status": {"phase": "Running", "startTime": _now(), "conditions": _conditions(pod, True)}}
            if await self._effect(self.client.patch_pod_status(ns, name, patch), ns, name):
                self.started_pods += 1
                self._schedule(pod, uid, ns, name)
            else:
                self._started.discard(uid)
        elif phase == "Running" and uid not in self._started:
            # Running before this kubelet started: its clock starts now.
            self._started.add(uid)
            self._schedule(pod, uid, ns, name)

    def _schedule(self, pod: Obj, uid: str, ns: str, name: str) -> None:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        runtime = annotations.get(RUNTIME_ANNOTATION)
        try:
            seconds = float(runtime) if runtime is not None else None
        except ValueError:
            seconds = None
        if seconds is None:
            return
        phase = "Failed" if annotations.get(OUTCOME_ANNOTATION) == "Failed" else "Succeeded"
        heapq.heappush(self._timers, (self._clock() + seconds / self.speed, uid, ns, name, phase))
        self._wake.set()

    async def _timer_loop(self) -> None:
        while True:
            self._wake = anyio.Event()
            if not self._timers:
                await self._wake.wait()
                continue
            due = self._timers[0][0]
            delay = due - self._clock()
            if delay > 0:
                with anyio.move_on_after(delay):
                    await self._wake.wait()
                continue
            _, uid, ns, name, phase = heapq.heappop(self._timers)
            if uid in self._ended or uid in self._deleted:
                continue
            self._ended.add(uid)
            await self._finish(uid, ns, name, phase)

    async def _finish(self, uid: str, ns: str, name: str, phase: str) -> None:
        try:
            pod = await self.client.get_pod(ns, name)
        except KubeError:
            return
        meta = pod.get("metadata") or {}
        if meta.get("uid") != uid or meta.get("deletionTimestamp"):
            return
        exit_code = 1 if phase == "Failed" else 0
        terminated = {"exitCode": exit_code, "reason": "Completed" if not exit_code else "Error"}
        patch = {
            "status": {
                "phase": phase,
                "conditions": _conditions(pod, False),
                "containerStatuses": [
                    {
                        "name": c.get("name", "main"),
                        "ready": False,
                        "state": {"terminated": dict(terminated)},
                    }
                    for c in (pod.get("spec") or {}).get("containers") or [{"name": "main"}]
                    if isinstance(c, dict)
                ],
            }
        }
        if await self._effect(self.client.patch_pod_status(ns, name, patch), ns, name):
            self.ended_pods += 1

    async def _effect(self, call: Any, ns: str, name: str) -> bool:
        try:
            await call
            return True
        except NotFound:
            return False
        except KubeError as exc:
            log.warning("kubelet effect failed", pod=f"{ns}/{name}", error=exc.message)
            return False
