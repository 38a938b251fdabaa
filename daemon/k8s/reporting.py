"""Feedback where users look: Kubernetes Events on a gang's pods and workload, and the PodScheduled condition.

`kubectl describe pod` (and `kubectl get events`) must answer "why is my pod pending":

- an admission applied: Normal `Admitted` on every pod (its node, and the gang's nodes)
  and on the workload (Job, JobSet, Kubeflow job);
- a preemption: Warning `Preempted` with its reason and preemptor;
- a job that waits (`JobInadmissible`, which the core writes only when its reason
  changes): Normal `Waiting` with the core's reason, and on every unbound pod the
  condition `PodScheduled=False`, reason `Unschedulable`, message `muster: <reason>`,
  as kube-scheduler sets it (the cluster autoscaler reads it too: see deploy/README.md;
  `pod_conditions=False` turns it off);
- a rejection: Warning `Rejected` with why.

Aggregation as client-go's event correlator does it: an Event is named by its object,
reason and message, so the same report again increments that Event's `count` instead of
adding one (no flood from a gang of 256 pods waiting for the same reason).

Invariants:
- Reporting never delays or fails the application of a decision: reports are queued
  (bounded; what overflows is dropped, logged and counted in `dropped`) and written by
  one task with at most `concurrency` requests in flight. API errors are logged, never
  raised; nothing is retried but an Event that exists already (409: count it).
"""

from __future__ import annotations

import datetime
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import structlog
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.errors import Conflict, KubeError
from muster.daemon.k8s.gangs import Owner, PodInfo
from muster.daemon.k8s.owners import api_of
from muster.events.types import Event, JobAdmitted, JobInadmissible, JobPreempted, JobRejected

__all__ = ["Report", "Reporter", "reports_for"]

log = structlog.get_logger("muster.k8s.report")

COMPONENT = "muster"
MAX_MESSAGE = 1024


@dataclass(frozen=True)
class Target:
    """An object an Event is about."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""


@dataclass(frozen=True)
class Report:
    """One Event to write (and, for a waiting pod, its PodScheduled condition)."""

    target: Target
    type: str
    reason: str
    message: str
    unschedulable: bool = False


def _workload(owner: Owner) -> Target | None:
    if owner.kind in ("Pod", "Gang"):
        return None
    api = api_of(owner)
    return Target(api.api_version, api.kind, owner.namespace, owner.name, owner.uid)


def _pod(p: PodInfo) -> Target:
    return Target("v1", "Pod", p.namespace, p.name, p.uid)


def _nodes(placement: dict[str, str]) -> str:
    nodes = sorted(set(placement.values()))
    shown = ", ".join(nodes[:8]) + (f" and {len(nodes) - 8} more" if len(nodes) > 8 else "")
    return shown


def reports_for(event: Event, pods: dict[str, PodInfo], owner: Owner | None) -> list[Report]:
    """What to tell users about `event` (pure): Events on the pods (gang pod name -> pod) and the workload."""
    by_pod: list[tuple[Target, str]] = []
    if isinstance(event, JobAdmitted):
        where = _nodes(dict(event.placement))
        gang = f"gang {event.job} ({len(event.placement)} pods) admitted by muster onto {where}"
        for name, p in sorted(pods.items()):
            node = event.placement.get(name)
            by_pod.append((_pod(p), f"assigned {p.namespace}/{p.name} to {node}; {gang}"))
        kind, reason, workload_message = "Normal", "Admitted", gang
    elif isinstance(event, JobPreempted):
        by = f" for {event.preemptor}" if event.preemptor else ""
        message = f"evicted by muster ({event.reason}){by}; the gang {event.job} waits to be admitted again"
        by_pod = [(_pod(p), message) for _, p in sorted(pods.items())]
        kind, reason, workload_message = "Warning", "Preempted", message
    elif isinstance(event, JobInadmissible):
        message = f"muster: {event.reason}"
        out = [
            Report(_pod(p), "Normal", "Waiting", message, unschedulable=not p.node and p.active)
            for _, p in sorted(pods.items())
        ]
        workload = _workload(owner) if owner is not None else None
        if workload is not None:
            out.append(Report(workload, "Normal", "Waiting", message))
        return out
    elif isinstance(event, JobRejected):
        message = f"muster rejected the gang {event.job}: {event.reason}"
        by_pod = [(_pod(p), message) for _, p in sorted(pods.items())]
        kind, reason, workload_message = "Warning", "Rejected", message
    else:
        return []
    out = [Report(target, kind, reason, message) for target, message in by_pod]
    workload = _workload(owner) if owner is not None else None
    if workload is not None:
        out.append(Report(workload, kind, reason, workload_message))
    return out


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_name(report: Report) -> str:
    """The Event's name: the same object, reason and message give the same name (aggregation)."""
    key = f"{report.target.kind}/{report.target.name}/{report.target.uid}/{report.reason}/{report.message}"
    return f"{report.target.name[:200]}.muster.{hashlib.sha256(key.encode()).hexdigest()[:12]}"


class Reporter:
    def __init__(
        self,
        client: KubeClient,
        *,
        pod_conditions: bool = True,
        concurrency: int = 4,
        buffer: int = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.pod_conditions = pod_conditions
        self._limit = anyio.Semaphore(concurrency)  # taken by the reader, given back by the writer task
        self._buffer = buffer
        self._send: MemoryObjectSendStream[Report] | None = None
        """Open while `run` runs; reports before or after are dropped."""
        self._clock = clock
        self.dropped = 0
        self.written = 0

    def report(self, reports: list[Report]) -> None:
        """Queue `reports`; never waits (what does not fit, or comes while `run` is not running, is dropped)."""
        for r in reports:
            if self._send is None:
                return
            try:
                self._send.send_nowait(r)
            except anyio.WouldBlock:
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.warning("reports dropped: the API is slower than the decisions", dropped=self.dropped)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        send, receive = anyio.create_memory_object_stream[Report](max_buffer_size=self._buffer)
        try:
            async with anyio.create_task_group() as tg, send, receive:
                self._send = send
                task_status.started()
                async for report in receive:
                    await self._limit.acquire()
                    tg.start_soon(self._write, report)
        finally:
            self._send = None

    async def _write(self, report: Report) -> None:
        try:
            await self._event(report)
            if report.unschedulable and self.pod_conditions:
                await self._condition(report)
            self.written += 1
        except KubeError as exc:
            log.info("report not written", kind=report.target.kind, name=report.target.name, error=exc.message)
        except Exception:
            # a bug here must not end the adapter: reports are feedback, not state
            log.exception("writing a report failed", kind=report.target.kind, name=report.target.name)
        finally:
            self._limit.release()

    async def _event(self, report: Report) -> None:
        t = report.target
        name, now = event_name(report), _now()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": t.namespace},
            "involvedObject": {
                "apiVersion": t.api_version,
                "kind": t.kind,
                "namespace": t.namespace,
                "name": t.name,
                **({"uid": t.uid} if t.uid else {}),
            },
            "type": report.type,
            "reason": report.reason,
            "message": report.message[:MAX_MESSAGE],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.client.create_event(t.namespace, body)
        except Conflict:
            # the same report again: count it on the Event there is (a lost race only undercounts)
            existing = await self.client.read_event(t.namespace, name)
            count = existing.get("count")
            count = count + 1 if isinstance(count, int) else 2
            await self.client.patch_event(t.namespace, name, {"count": count, "lastTimestamp": now})

    async def _condition(self, report: Report) -> None:
        t = report.target
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": report.message[:MAX_MESSAGE],
            "lastTransitionTime": _now(),
        }
        await self.client.patch_pod_status(t.namespace, t.name, {"status": {"conditions": [condition]}})
