"""The Kubernetes adapter: cluster changes in as muster events, decisions out as bindings and evictions.

    adapter = KubernetesAdapter(api_client)
    async with anyio.create_task_group() as tg:
        await tg.start(adapter.run, sink)      # returns once the initial lists are in the sink
        result = await adapter.apply(decision) # JobAdmitted -> bindings, JobPreempted -> evictions

Two watchers (nodes, pods) and the owner lookups feed one queue; one task
translates it in order and hands each batch of events to `sink`. `apply`
pushes the facts it discovers (a JobFailed for a pod that vanished) through
the same sink.

Invariants:
- `sink` is called by one task at a time, in the order things happened.
- `run` reports started only after the initial lists of nodes and pods were
  translated and pushed, so a caller that starts deciding then sees the
  whole cluster.
- Kubernetes errors never escape `run` (they are retried with backoff, see
  `watching`); an exception from `sink` does, and ends `run`.
- What users should see of a decision (Events, a waiting pod's PodScheduled
  condition) is queued once it is applied and written by its own task
  (`reporting`): feedback never delays a binding.
- A pod that takes over a slot of an admitted gang (a Job's next index, `gangruns.take_successors`)
  is bound where the log placed that slot (`_rebind`): the admission applied again, no decision
  of its own; without a view of the log it waits. That binding is handed to `reapply` (in the
  daemon: the `DecisionApplier`, `cluster.Reapplying`), so it waits for the lease and for the
  job's earlier decisions like any binding; an adapter run alone (no `reapply`) binds at once.
  So is an admission applied while its job had no gang here (`Applier.awaiting`: a new leader's
  relist missing a pod its controller makes again), once the gang is whole.
- With a view of the log (`state`), `run` reconciles it with the cluster
  (`reconciling`) before it reports started, and then every `reconcile_seconds`:
  a job whose workload went while no adapter watched is ended on the log.
- When the log's flavors change (`flavors_changed`), the nodes are judged again at once: a node
  tainted for a flavor applied after the node was seen turns schedulable with no change to it.
- A replica's standing watch (`mirroring.Mirror`), when it runs, stands in for the lists: a new
  term starts from the objects it holds, without a request.
- The work of a (re)list is cut into pieces that give the event loop back in
  between (the lease is refreshed on it): lists come in pages, at most
  `batch_limit` objects are translated at a time, and at most `lookups` owner
  lookups are in flight (gangs the log knows need none); many owners of one kind
  and namespace wanted at once are read with one paged list (`list_owners_at`; the reads: `lookups`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import TypeAlias

import anyio
import structlog
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectSendStream
from kubernetes_asyncio.client import ApiClient

from muster.daemon.cluster import Reapply
from muster.daemon.k8s.applying import Applier, ApplyResult
from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.deletions import WorkloadCheck
from muster.daemon.k8s.lookups import Lookups, NamespaceQueue, OwnerSize
from muster.daemon.k8s.mirroring import Mirror
from muster.daemon.k8s.objects import DEFAULT_TOLERATED_TAINTS
from muster.daemon.k8s.pods import Owner, PodInfo
from muster.daemon.k8s.reconciling import find_vanished, live_jobs, read_owner
from muster.daemon.k8s.reporting import Reporter, binding_failed, controller_stopped, pods_ignored, reports_for
from muster.daemon.k8s.translating import Translator
from muster.daemon.k8s.watching import Backoff, Synced, WatchEvent, watch_objects
from muster.events.types import Event, JobAdmitted, JobId, JobPreempted
from muster.projections.flavors import binding
from muster.projections.state import ClusterState

__all__ = ["KubernetesAdapter", "Sink"]

log = structlog.get_logger("muster.k8s")
_std_log = logging.getLogger("muster.k8s")

Sink = Callable[[list[Event]], Awaitable[None]]
RESOURCES = ("nodes", "pods")


def _int(text: str) -> int:
    # resourceVersions are opaque strings; etcd-backed servers give integers, which is all this needs.
    try:
        return int(text)
    except ValueError:
        return 0


def _version(obj: dict[str, object], current: int) -> int:
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return max(current, _int(str(rv))) if rv else current


_Item: TypeAlias = WatchEvent | Synced | OwnerSize | NamespaceQueue


_APPLIED = (JobAdmitted, JobPreempted)
"""Decisions reported only when applying them changed the cluster (a re-applied one says nothing new)."""


class KubernetesAdapter:
    def __init__(
        self,
        api_client: ApiClient,
        *,
        scheduler_name: str = "muster",
        state: Callable[[], ClusterState] | None = None,
        tolerated_taints: frozenset[str] = DEFAULT_TOLERATED_TAINTS,
        clock: Callable[[], float] = time.time,
        backoff: Backoff | None = None,
        watch_seconds: int = 300,
        apply_deadline_seconds: float = 60.0,
        pod_wait_seconds: float = 10.0,
        batch_limit: int = 500,
        request_seconds: float = 30.0,
        bind_connections: int = 32,
        lookups: int = 32,
        list_owners_at: int = 64,
        page_size: int = 500,
        reconcile_seconds: float = 60.0,
        report: bool = True,
        pod_conditions: bool = True,
        workload_status: bool = True,
        namespace_queues: bool = True,
        mirror: Mirror | None = None,
    ) -> None:
        """`state`, when given, is the fold of the log; the first batch then writes only what the log lacks.

        `report`: write Kubernetes Events about decisions (`reporting`); `pod_conditions`: also set
        `PodScheduled=False` on the pods of a waiting gang (and a pod group's status on its pods);
        `workload_status`: the gang's status as annotations on its Job, JobSet or Kubeflow job.
        `namespace_queues`: a gang naming no queue takes its namespace's `muster.dev/default-queue`
        (one `get` per namespace). `mirror`: the replica's standing watch (`mirroring`), which the
        adapter starts from instead of listing when it runs. `list_owners_at`: owners of one kind and
        namespace wanted at once from which one list replaces a GET each (a relist, a burst of new Jobs);
        fewer are fetched one by one (a list reads every object of that kind there).
        `bind_connections`: bindings go over that many pipelined connections of their own
        (`pipelining`); 0: through the ApiClient's session like every other request.
        """
        self.client = KubeClient(api_client, request_seconds=request_seconds, bind_connections=bind_connections)
        self.translator = Translator(
            scheduler_name=scheduler_name,
            tolerated_taints=tolerated_taints,
            state=state,
            namespace_queues=namespace_queues,
        )
        self.scheduler_name = scheduler_name
        self._state = state
        self._reconcile_seconds = reconcile_seconds
        self.reporter: Reporter | None = None
        self._clock = clock
        self._backoff = backoff or Backoff()
        self._watch_seconds = watch_seconds
        self._batch_limit = batch_limit
        self._page_size = page_size
        self._lookups = anyio.CapacityLimiter(lookups)
        """Owner lookups in flight at most: a relist finding many new gangs must not flood the loop."""
        self._reads = Lookups(
            self.client, limiter=self._lookups, backoff=self._backoff, page_size=page_size, list_at=list_owners_at
        )
        self._lock = anyio.Lock()
        self._changed = anyio.Event()
        self._sink: Sink | None = None
        self._flavors = anyio.Event()
        self._synced = anyio.Event()
        self._versions: dict[str, int] = {}
        self._mirror = mirror
        self.reapply: Callable[[Reapply], None] | None = None
        """Where bindings of successor pods go (the daemon's applier); None: bound at once."""
        self.applier = Applier(
            self.client,
            self.translator.gangs,
            changed=self._wait_changed,
            backoff=Backoff(initial=self._backoff.initial, maximum=min(5.0, self._backoff.maximum)),
            deadline_seconds=apply_deadline_seconds,
            pod_wait_seconds=pod_wait_seconds,
            clock=clock,
            flavor_fits=(lambda flavors: binding(state(), flavors)) if state is not None else None,
        )
        if report:
            self.reporter = Reporter(
                self.client,
                pod_conditions=pod_conditions,
                workload_status=workload_status,
                give_way=self.applier.binding.lull,
                clock=clock,
            )

    # ------------------------------------------------------------ public

    async def run(self, sink: Sink, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Watch the cluster and push translated events to `sink` until cancelled."""
        try:
            await self._run(sink, task_status=task_status)
        finally:
            await self.client.aclose()

    async def _run(self, sink: Sink, *, task_status: TaskStatus[None]) -> None:
        send, receive = anyio.create_memory_object_stream[_Item](max_buffer_size=self._batch_limit)
        async with anyio.create_task_group() as tg, receive, send:
            if self.reporter is not None:
                await tg.start(self.reporter.run)
            for resource in RESOURCES:
                tg.start_soon(self._pump, resource, send.clone())
            synced: set[str] = set()
            versions: dict[str, int] = {}
            started = False
            while True:
                batch = [await receive.receive()]
                while len(batch) < self._batch_limit:
                    try:
                        batch.append(receive.receive_nowait())
                    except anyio.WouldBlock:
                        break
                async with self._lock:
                    at = int(self._clock())
                    for item in batch:
                        if isinstance(item, Synced):
                            synced.add(item.resource)
                            versions[item.resource] = max(versions.get(item.resource, 0), _int(item.resource_version))
                            continue
                        if isinstance(item, WatchEvent):
                            versions[item.resource] = _version(item.obj, versions.get(item.resource, 0))
                        try:
                            self._translate(item, at)
                        except Exception:
                            # Bad input never stops the adapter: report the object and go on.
                            log.exception("object skipped", item=repr(item)[:500])
                    if not started and not synced.issuperset(RESOURCES):
                        continue
                    events = self.translator.flush(at)
                    for problem in self.translator.problems:
                        log.warning("bad object skipped in part", problem=problem)
                    self.translator.problems.clear()
                    gangs = self.translator.gangs
                    self._reads.start(tg, gangs.owners_to_fetch(), gangs.namespaces_to_fetch(), send)
                    self._bind_successors(tg)
                    for check in self.translator.gangs.deletions:
                        tg.start_soon(self._read_workload, check, sink, tg)
                    self.translator.gangs.deletions.clear()
                    self._tell_stopped()
                    if events:
                        await sink(events)
                    # Only now are these versions "pushed" (see caught_up).
                    self._versions = dict(versions)
                    self._notify()
                if not started:
                    started = True
                    await self.reconcile(sink)
                    self._sink = sink
                    self._synced.set()
                    log.info("cluster synced", nodes=len(self.translator.node_names()))
                    tg.start_soon(self._reconcile_every, sink)
                    tg.start_soon(self._judge_nodes_when_flavors_change)
                    task_status.started()

    async def apply(self, event: Event) -> ApplyResult:
        """Apply one decision (see `applying`); facts found on the way go to the sink of `run`.

        Waits for `run` to have synced, so decisions are applied against a known cluster.
        """
        await self._wait_synced()
        job = getattr(event, "job", None)
        gangs = self.translator.gangs
        # who to tell, taken before applying (an eviction takes the pods away)
        pods, owner = (gangs.pods_of(job) or {}, gangs.owner_of(job)) if job is not None else ({}, None)
        result = await self.applier.apply(event)
        if self.reporter is not None and (result.outcome == "applied" or not isinstance(event, _APPLIED)):
            self.reporter.report(reports_for(event, pods, owner))
        if isinstance(event, JobAdmitted):
            self._binding_failed(event.job, result, pods, owner)
        await self._push(result.events)
        # an admission bound as decided is the common case, hundreds a second: the log and the
        # muster_applied_decisions metric hold it; a line each was ~6% of the daemon's CPU in gangs of one,
        # and even a filtered-out debug call builds a logger (structlog's lazy proxy): ask the level first
        routine = result.ok and isinstance(event, JobAdmitted)
        if routine and not _std_log.isEnabledFor(logging.DEBUG):
            return result
        (log.debug if routine else log.info)(
            "applied",
            type=type(event).__name__,
            job=getattr(event, "job", None),
            outcome=result.outcome,
            detail=result.detail,
        )
        return result

    async def reconcile(self, sink: Sink | None = None) -> list[Event]:
        """Compare the log's live jobs with the cluster and end those whose workload is gone (see `reconciling`).

        Returns the events pushed to `sink` (the sink of `run` when None). Without a view of the log: only the
        pod groups a pod was deleted from (`Gangs.settle_deletions`).
        """
        sink = sink or self._sink
        if sink is None:
            return []
        gangs = self.translator.gangs
        async with self._lock:
            # pod groups that lost some waiting pods, not all, since the last pass: a pod deleted out of one
            now = int(self._clock())
            settled = gangs.settle_deletions(now)
            if settled:
                settled += self.translator.flush(now)
                await sink(settled)
        if self._state is None:
            return settled
        jobs = live_jobs(self._state().jobs.values())  # taken now: the log folds on while owners are read
        verdicts = await find_vanished(
            self.client, jobs, gangs.may_hold, int(self._clock()), limiter=self._lookups, tracked=gangs.tracked
        )
        if not verdicts:
            return settled
        async with self._lock:
            events: list[Event] = []
            for verdict in verdicts:
                events += gangs.vanished(verdict.job, verdict.remaining, verdict.event, verdict.resized)
                reason = getattr(verdict.event, "reason", "")
                log.info("workload gone or resized; ending its job", job=verdict.job, reason=reason)
            events += self.translator.flush(int(self._clock()))
            if events:
                await sink(events)
        return settled + events

    def _tell_stopped(self) -> None:
        """Say why pods are left alone: a controller's whose job its user cancelled (`controllers.Stopped`), and
        those whose owner is gone or cannot be one gang (`Gangs.ignored`)."""
        gangs = self.translator.gangs
        for run in gangs.stopped:
            c = run.stopped.controller
            log.info(
                "pods of a cancelled job's controller left alone",
                job=run.stopped.job,
                controller=f"{c.kind}/{c.namespace}/{c.name}",
                pods=len(run.pods),
            )
            if self.reporter is not None:
                self.reporter.report(controller_stopped(run.stopped, run.pods))
        gangs.stopped.clear()
        for left in gangs.ignored:
            if self.reporter is not None:
                self.reporter.report(pods_ignored(left.why, left.pods))
        gangs.ignored.clear()

    def _bind_successors(self, tg: TaskGroup) -> None:
        """Bind the pods that took over slots of admitted gangs (`Gangs.rebind`), and those of an admission applied
        before its gang was here, now whole (`Applier.awaiting`): through `reapply` in a daemon."""
        gangs = self.translator.gangs
        awaiting = self.applier.awaiting
        for job in sorted(awaiting):
            if gangs.ended(job):
                awaiting.discard(job)
            elif gangs.complete(job):
                awaiting.discard(job)
                gangs.rebind.add(job)
        for job in sorted(gangs.rebind):
            if self.reapply is not None:
                self.reapply(Reapply(job, "Successors", functools.partial(self._rebind, job)))
            else:
                tg.start_soon(self._rebind, job)
        gangs.rebind.clear()

    async def _read_workload(self, check: WorkloadCheck, sink: Sink, tg: TaskGroup) -> None:
        """Someone deleted a pod of a job: read its owner, which tells a deleted workload (WorkloadDeleted) from a
        pod deleted out of one, which its owner makes again (see `Gangs.workload_read`)."""
        read = await read_owner(self.client, check.owner, check.owned_by, self._lookups)
        async with self._lock:
            at = int(self._clock())
            events = self.translator.gangs.workload_read(check.job, read, at)
            events += self.translator.flush(at)
            if events:
                await sink(events)
            self._bind_successors(tg)  # a bound run's replacement already there took the deleted pod's slot
            # An admission waiting for the gang's pods (`ready`) learns that a replacement already there took
            # the deleted pod's place, or that the job ended: else it waits for a pod change, or its timeout.
            self._notify()

    async def _rebind(self, job: JobId) -> ApplyResult:
        """Bind the pods that took over slots of `job`'s admitted gang (`gangruns.take_successors`), as placed."""
        known = self._state().jobs.get(job) if self._state is not None else None
        if known is None or known.status != "admitted":
            log.warning("pods wait unbound: the log has no admission of their job here", job=job)
            return ApplyResult(True, "skipped", "the log has no admission of this job")
        gangs = self.translator.gangs
        pods, owner = gangs.pods_of(job) or {}, gangs.owner_of(job)
        result = await self.applier.rebind(job, known.placement, known.flavors)
        self._binding_failed(job, result, pods, owner)
        await self._push(result.events)
        log.info("successors bound", job=job, outcome=result.outcome, detail=result.detail)
        return result

    def _binding_failed(self, job: JobId, result: ApplyResult, pods: dict[str, PodInfo], owner: Owner | None) -> None:
        """Tell the pods a refused binding left unbound (PodScheduled=False, SchedulerError)."""
        if self.reporter is not None and result.outcome in ("conflict", "error"):
            log.warning("binding refused", job=job, detail=result.detail)
            self.reporter.report(binding_failed(pods, owner, result.pods))

    async def _push(self, found: tuple[Event, ...]) -> None:
        """Push facts found while applying, with what they changed (evictions and failures change what
        muster's own pods hold: reserved capacity)."""
        if not found and not self.translator.changed:
            return  # a binding as decided: nothing to write, no lock to wait for behind the watch's writes
        async with self._lock:
            events = list(found) + self.translator.flush(int(self._clock()))
            if events and self._sink is not None:
                await self._sink(events)

    def flavors_changed(self) -> None:
        """The log folded a `FlavorConfigured`: which node taints muster tolerates may have changed."""
        self.translator.flavors_changed = True
        self._flavors.set()

    async def _judge_nodes_when_flavors_change(self) -> None:
        # no watch event may come for minutes (nodes heartbeat through Leases): flush without one
        while True:
            await self._flavors.wait()
            self._flavors = anyio.Event()
            await self._push(())

    async def _reconcile_every(self, sink: Sink) -> None:
        while True:
            await anyio.sleep(self._reconcile_seconds)
            await self.reconcile(sink)

    async def ready(self, event: Event) -> None:
        """Wait (bounded) until `event` can be applied: an admission's pods exist (see `Applier.ready`)."""
        await self._wait_synced()
        await self.applier.ready(event)

    def resource_version(self, resource: str) -> int:
        """The newest resourceVersion of `resource` ("nodes", "pods") translated and pushed so far (0: none)."""
        return self._versions.get(resource, 0)

    async def caught_up(self, resource: str, resource_version: int) -> None:
        """Wait until the changes of `resource` up to `resource_version` are translated and pushed."""
        while self.resource_version(resource) < resource_version:
            await self._wait_changed()

    # ------------------------------------------------------------ internals

    def _translate(self, item: WatchEvent | OwnerSize | NamespaceQueue, at: int) -> None:
        if isinstance(item, NamespaceQueue):
            self.translator.on_namespace_queue(item.namespace, item.queue, at)
            return
        if isinstance(item, OwnerSize):
            self.translator.on_owner_size(item.owner, item.sizing, at)
            return
        if item.resource == "nodes":
            self.translator.on_node(item)
        else:
            self.translator.on_pod(item, at)

    async def _wait_synced(self) -> None:
        # anyio's wait yields to the event loop even when the event is set: twice per admission, for nothing
        if not self._synced.is_set():
            await self._synced.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def _wait_changed(self) -> None:
        await self._changed.wait()

    async def _pump(self, resource: str, send: MemoryObjectSendStream[_Item]) -> None:
        """Feed `resource`'s changes to the queue: from the replica's mirror when it runs, else a list and watch."""
        if self._mirror is not None and self._mirror.running:
            stream: AsyncGenerator[WatchEvent | Synced, None] = self._mirror.subscribe(resource)
        else:
            stream = watch_objects(
                self.client,
                resource,
                backoff=self._backoff,
                server_seconds=self._watch_seconds,
                page_size=self._page_size,
            )
        listing = True
        async with send, aclosing(stream):
            async for item in stream:
                if listing:
                    # `run` flushes nothing before every list ended: with no checkpoint per object while there
                    # is room, a mirror's snapshot reaches it in batches instead of one by one
                    listing = not isinstance(item, Synced)
                    with contextlib.suppress(anyio.WouldBlock):
                        send.send_nowait(item)
                        continue
                await send.send(item)
