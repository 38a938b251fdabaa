"""Feedback where users look: Events, the PodScheduled condition, and the gang's status on its workload.

`kubectl describe pod` (and `kubectl get events`) must answer "why is my pod pending":

- a job that waits (`JobInadmissible`, which the core writes only when its reason
  changes): Normal `Waiting` with the core's reason on its pods and workload, and on
  every unbound pod the condition `PodScheduled=False`, reason `Unschedulable`, message
  `muster: <reason>`, as kube-scheduler sets it (the cluster autoscaler reads it too: see
  deploy/README.md; `pod_conditions=False` turns it off);
- an admission applied: Normal `Admitted` with the gang's nodes, once per gang as
  kube-scheduler's aggregation would leave it: on the workload (Job, JobSet, Kubeflow
  job, PodGroup), or on the first pod of a gang that has none; on the other pods only if
  they were told something before (they waited): their binding says the rest;
- a binding the API server refused: Warning `FailedScheduling` and `PodScheduled=False`,
  reason `SchedulerError`, on the pods it left unbound;
- a preemption: Warning `Preempted` with its reason and preemptor; a rejection: Warning
  `Rejected` with why;
- pods whose owner is gone, or cannot be one gang (a PodGroup's `minMember: 0`, a kind the
  cluster does not serve), left alone: Warning `Ignored` on them with why, and the status `Ignored`;
- pods a pod group's controller made after its user cancelled its job, left alone
  (`controllers.Stopped`): Warning `Cancelled` on them and on the controller, and the group's
  status `Cancelled` on them (no PodScheduled condition: no node is to be added for them).

The gang's status (`Admitted`, `Pending` with the core's reason, `Preempted`, `Rejected`)
is written where a user looks for it, only when it changes: the annotations
`muster.dev/status` and `muster.dev/status-message` on a Job, JobSet or Kubeflow job
(`workload_status`), and the pod condition `muster.dev/Admitted` on the pods of a pod
group or a lone pod (`pod_conditions`), which have no such object of their own.

Aggregation as client-go's event correlator does it: an Event is named by its object,
reason and message, so the same report again increments that Event's `count` instead of
adding one (no flood from a gang of 256 pods waiting for the same reason).

Invariants:
- Reporting never delays or fails the application of a decision: reports are queued
  (bounded; what overflows is dropped, logged and counted in `dropped`) and written by
  one task with at most `concurrency` requests in flight, each after a lull in the
  bindings (`give_way`, waited for at most `give_way_seconds`): they share the API server. API errors are logged, never
  raised; nothing is retried but an Event that exists already (409: count it).
- Reports about one object are written in the order they were made (a write waits for the one
  before it on that object): a gang's `Preempted` status never lands before its `Admitted`.
- What it remembers (which objects were told what) is bounded by `memory` objects; a
  new leader's reporter starts blank and goes by what the pods show of earlier leaders'
  reports (`PodInfo.told`, `PodInfo.shown`): a pod told it waits hears of its admission,
  and a pod group's status turns Admitted, also across a change of leader.
"""

from __future__ import annotations

import datetime
import hashlib
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import anyio
import structlog
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.controllers import Stopped
from muster.daemon.k8s.errors import Conflict, KubeError
from muster.daemon.k8s.owners import api_of
from muster.daemon.k8s.pods import POD_GROUPS, STATUS_CONDITION, UNOWNED, Owner, PodInfo
from muster.events.types import Event, JobAdmitted, JobInadmissible, JobPreempted, JobRejected

__all__ = ["Report", "Reporter", "binding_failed", "controller_stopped", "pods_ignored", "reports_for"]

log = structlog.get_logger("muster.k8s.report")

COMPONENT = "muster"
MAX_MESSAGE = 1024
STATUS_ANNOTATION = "muster.dev/status"
STATUS_MESSAGE_ANNOTATION = "muster.dev/status-message"


@dataclass(frozen=True)
class Target:
    """An object a report is about; `plural` names where a workload is served (for its status)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""
    plural: str = ""


@dataclass(frozen=True)
class Report:
    """One Event to write, and what goes with it on the same object.

    `scheduled`: a pod's PodScheduled=False reason (`Unschedulable`, `SchedulerError`);
    `status`: the gang's status (see the module docstring); `quiet`: write it only to an
    object told something before (an Admitted pod that had been told it waits). `told` and
    `shown` are what the object itself shows of earlier reports (a pod: `PodInfo.told`,
    `PodInfo.shown`), which a new leader's reporter, blank, goes by.
    """

    target: Target
    type: str
    reason: str
    message: str
    scheduled: str = ""
    status: str = ""
    quiet: bool = False
    told: bool = False
    shown: tuple[str, str] | None = None


def _workload(owner: Owner) -> Target | None:
    if owner.kind in UNOWNED:
        return None
    api = api_of(owner)
    return Target(api.api_version, api.kind, owner.namespace, owner.name, owner.uid, api.plural)


def _pod(p: PodInfo) -> Target:
    return Target("v1", "Pod", p.namespace, p.name, p.uid)


def _nodes(placement: dict[str, str]) -> str:
    nodes = sorted(set(placement.values()))
    shown = ", ".join(nodes[:8]) + (f" and {len(nodes) - 8} more" if len(nodes) > 8 else "")
    return shown


def reports_for(event: Event, pods: dict[str, PodInfo], owner: Owner | None) -> list[Report]:
    """What to tell users about `event` (pure): reports on the pods (gang pod name -> pod) and the workload."""
    workload = _workload(owner) if owner is not None else None
    # the gang's status goes on its pods: no object of a pod group's is muster's to annotate
    on_pods = owner is None or owner.kind in POD_GROUPS
    ordered = [p for _, p in sorted(pods.items())]
    if isinstance(event, JobAdmitted):
        where = _nodes(dict(event.placement))
        gang = f"gang {event.job} ({len(event.placement)} pods) admitted by muster onto {where}"
        out = [
            Report(
                _pod(p),
                "Normal",
                "Admitted",
                f"assigned {p.namespace}/{p.name} to {event.placement.get(name)}; {gang}",
                status="Admitted" if on_pods else "",
                quiet=workload is not None or i > 0,
                told=p.told,
                shown=p.shown,
            )
            for i, (name, p) in enumerate(sorted(pods.items()))
        ]
        if workload is not None:
            out.append(Report(workload, "Normal", "Admitted", gang, status="" if on_pods else "Admitted"))
        return out
    if isinstance(event, JobPreempted):
        by = f" for {event.preemptor}" if event.preemptor else ""
        message = f"evicted by muster ({event.reason}){by}; the gang {event.job} waits to be admitted again"
        kind, reason, status, scheduled = "Warning", "Preempted", "Preempted", False
    elif isinstance(event, JobInadmissible):
        message = f"muster: {event.reason}"
        kind, reason, status, scheduled = "Normal", "Waiting", "Pending", True
    elif isinstance(event, JobRejected):
        message = f"muster rejected the gang {event.job}: {event.reason}"
        kind, reason, status, scheduled = "Warning", "Rejected", "Rejected", False
    else:
        return []
    out = [
        Report(
            _pod(p),
            kind,
            reason,
            message,
            scheduled="Unschedulable" if scheduled and not p.node and p.active else "",
            status=status if on_pods else "",
            told=p.told,
            shown=p.shown,
        )
        for p in ordered
    ]
    if workload is not None:
        out.append(Report(workload, kind, reason, message, status="" if on_pods else status))
    return out


def binding_failed(pods: dict[str, PodInfo], owner: Owner | None, outcomes: dict[str, str]) -> list[Report]:
    """Reports for an admission whose bindings the API server refused (`outcomes`: pod key -> outcome)."""
    out = []
    for _, p in sorted(pods.items()):
        outcome = outcomes.get(p.key, "")
        if p.node or outcome in ("", "bound", "already-bound"):
            continue
        message = f"muster: binding {p.namespace}/{p.name} failed: {outcome}"
        out.append(Report(_pod(p), "Warning", "FailedScheduling", message, scheduled="SchedulerError"))
    workload = _workload(owner) if owner is not None else None
    if out and workload is not None:
        failed = ", ".join(r.target.name for r in out[:5]) + (f" and {len(out) - 5} more" if len(out) > 5 else "")
        out.append(Report(workload, "Warning", "FailedScheduling", f"muster: binding failed for {failed}"))
    return out


def controller_stopped(stopped: Stopped, pods: Iterable[PodInfo]) -> list[Report]:
    """Reports for pods left alone because their controller's job was cancelled by its user: a Warning
    `Cancelled` on each (and the pod group's status `Cancelled`) and on the controller. No PodScheduled
    condition: the cluster autoscaler must not add nodes for pods that are not to run."""
    c = stopped.controller
    message = (
        f"muster: the job {stopped.job} of {c.kind}/{c.namespace}/{c.name} was cancelled by its user; the pods it"
        " makes are not scheduled (delete it, or make it again, to run it again)"
    )
    out = [
        Report(_pod(p), "Warning", "Cancelled", message, status="Cancelled", told=p.told, shown=p.shown)
        for p in sorted(pods, key=lambda p: p.key)
    ]
    out.append(Report(Target(c.api_version, c.kind, c.namespace, c.name, c.uid), "Warning", "Cancelled", message))
    return out


def pods_ignored(why: str, pods: Iterable[PodInfo]) -> list[Report]:
    """Reports for pods left alone because their owner is gone or cannot be one gang (`Gangs.ignored`): a
    Warning `Ignored` saying why on each, and the status `Ignored` (no PodScheduled: no node is to be added)."""
    message = f"muster: {why}; this pod is not scheduled"
    return [
        Report(_pod(p), "Warning", "Ignored", message, status="Ignored", told=p.told, shown=p.shown)
        for p in sorted(pods, key=lambda p: p.key)
    ]


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
        workload_status: bool = True,
        concurrency: int = 4,
        buffer: int = 10_000,
        memory: int = 100_000,
        give_way: Callable[[], Awaitable[None]] | None = None,
        give_way_seconds: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`give_way()` returns when the work reports yield to is done (bindings in flight); a report
        waits for it at most `give_way_seconds` after it was queued."""
        self.client = client
        self.pod_conditions = pod_conditions
        self.workload_status = workload_status
        self._limit = anyio.Semaphore(concurrency)  # taken by the reader, given back by the writer task
        self._buffer = buffer
        self._send: MemoryObjectSendStream[tuple[float, Report]] | None = None
        """Open while `run` runs; reports before or after are dropped."""
        self._clock = clock
        self._memory = memory
        self._give_way = give_way
        self._give_way_seconds = give_way_seconds
        self._told: dict[Target, str] = {}
        """Objects told something (their last reason): a quiet report goes only to them."""
        self._status: dict[Target, tuple[str, str]] = {}
        """The status (and its message) last written on each object."""
        self._writing: dict[Target, anyio.Event] = {}
        """Per object, when the last write queued for it ends (the next one about it waits for that)."""
        self.dropped = 0
        self.written = 0
        self.unwritten = 0
        """Reports queued and not yet written (or given up on): 0 once feedback has caught up."""

    def report(self, reports: list[Report]) -> None:
        """Queue `reports`; never waits (what does not fit, or comes while `run` is not running, is dropped).

        Decides here, in the order reports come, what is worth writing: a quiet report only to an
        object told something before, a status only when it changes (and a pod's first status is
        never Admitted: its binding says that).
        """
        for r in reports:
            if self._send is None:
                return
            if r.quiet and r.target not in self._told and not r.told:
                continue
            _remember(self._told, r.target, r.reason, self._memory)
            if r.status:
                said = self._status.get(r.target, r.shown)
                if said == (r.status, r.message) or (
                    said is None and r.target.kind == "Pod" and r.status == "Admitted"
                ):
                    r = replace(r, status="")
                else:
                    _remember(self._status, r.target, (r.status, r.message), self._memory)
            try:
                self._send.send_nowait((anyio.current_time(), r))
                self.unwritten += 1
            except anyio.WouldBlock:
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.warning("reports dropped: the API is slower than the decisions", dropped=self.dropped)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        send, receive = anyio.create_memory_object_stream[tuple[float, Report]](max_buffer_size=self._buffer)
        try:
            async with anyio.create_task_group() as tg, send, receive:
                self._send = send
                task_status.started()
                async for queued, report in receive:
                    if self._give_way is not None:
                        # the API server's CPU is shared: a binding a user waits for goes first, but
                        # no report waits longer than give_way_seconds since it was queued
                        with anyio.move_on_after(queued + self._give_way_seconds - anyio.current_time()):
                            await self._give_way()
                    await self._limit.acquire()
                    before, done = self._writing.get(report.target), anyio.Event()
                    self._writing[report.target] = done
                    tg.start_soon(self._write, report, before, done)
        finally:
            self._send = None

    async def _write(self, report: Report, before: anyio.Event | None, done: anyio.Event) -> None:
        try:
            if before is not None:
                await before.wait()
            await self._event(report)
            if report.target.kind == "Pod":
                await self._conditions(report)
            elif report.status and self.workload_status and report.target.plural:
                await self._annotate(report)
            self.written += 1
        except KubeError as exc:
            log.info("report not written", kind=report.target.kind, name=report.target.name, error=exc.message)
        except Exception:
            # a bug here must not end the adapter: reports are feedback, not state
            log.exception("writing a report failed", kind=report.target.kind, name=report.target.name)
        finally:
            self.unwritten -= 1
            done.set()
            if self._writing.get(report.target) is done:
                del self._writing[report.target]
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

    async def _conditions(self, report: Report) -> None:
        """PodScheduled=False and the gang's status on a pod, in one patch (conditions merge by type)."""
        if not self.pod_conditions:
            return
        t, now, message = report.target, _now(), report.message[:MAX_MESSAGE]
        conditions = []
        if report.scheduled:
            conditions.append(
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": report.scheduled,
                    "message": message,
                    "lastTransitionTime": now,
                }
            )
        if report.status:
            conditions.append(
                {
                    "type": STATUS_CONDITION,
                    "status": "True" if report.status == "Admitted" else "False",
                    "reason": report.status,
                    "message": message,
                    "lastTransitionTime": now,
                }
            )
        if conditions:
            await self.client.patch_pod_status(t.namespace, t.name, {"status": {"conditions": conditions}})

    async def _annotate(self, report: Report) -> None:
        t = report.target
        group, _, version = t.api_version.rpartition("/")
        notes = {STATUS_ANNOTATION: report.status, STATUS_MESSAGE_ANNOTATION: report.message[:MAX_MESSAGE]}
        await self.client.annotate(group, version, t.plural, t.namespace, t.name, notes)


def _remember(memory: dict[Target, Any], target: Target, value: Any, limit: int) -> None:
    """Set `memory[target]`, most recent last; past `limit` objects the oldest is forgotten."""
    memory.pop(target, None)
    memory[target] = value
    if len(memory) > limit:
        del memory[next(iter(memory))]
