"""Applying decisions to Kubernetes, idempotently: bindings for admissions, evictions for preemptions.

`Applier.apply(event) -> ApplyResult` never raises for Kubernetes trouble.

- `JobAdmitted`: bind every pod of the gang to its decided node (pods/binding),
  after fitting a pod admitted on flavors to them (`_fit_flavor`): their
  label, their taints' tolerations (pods may gain tolerations) and, for a pod
  that carries muster's scheduling gate, their node labels as nodeSelector
  with the gate lifted in the same patch (a pod's nodeSelector may only grow,
  and only while it is gated; the decided node carries those labels).
  A pod already on the decided node counts as done (no request, or a 409
  naming that node); a pod on another node is a conflict; a pod that is gone
  ends the job with JobFailed. An admission of a job with no gang here yet (a
  new leader's relist missing a pod its controller makes again) is kept in
  `awaiting` and bound once the gang is whole; if its pods never come,
  reconciliation ends the job (`reconciling.judge`). Bindings are sent only once every pod of the
  gang exists, so a partial gang is never bound by this code. A slot whose pod
  succeeded before a preemption took it (`GangView.finished`) is done: nothing
  is bound there. A gang left
  partly bound (its leader killed between bindings) is completed when the
  admission is applied again, also if its bound pods already succeeded on
  their decided nodes (their share of the run is done; failing the job would
  leave its other pods pending forever).
- `JobPreempted`: evict every pod of the victim but those that succeeded
  (`gangruns.evicted`: they hold no node, and a new leader reads their slots as
  done from them) through the Eviction API with the pod's own
  terminationGracePeriodSeconds. 404 means already gone (fine),
  429 (a PodDisruptionBudget) and 5xx/timeouts are retried with backoff. A
  victim whose pods no controller recreates (bare pods, a pod group) ends with
  JobFailed: requeued, it would be readmitted for pods that never come back.
- `rebind(job, placement)`: the admission of a gang applied again when pods took over
  slots of it (an Indexed Job's next indexes, `gangruns.take_successors`).
- `ready(event)`: the bounded wait for an admission's pods, which a caller may
  run before taking a slot of its own concurrency limit.
- `JobRejected`: nothing to change in the cluster; the gang is forgotten so
  its pods' later deletion reports nothing.
- `JobCancelled` by a user (`muster cancel`): the workload is stopped as its
  kind expects (`cancelling`) and the gang forgotten.
- Anything else: nothing to do (`skipped`).

Applying the same event twice has no second effect: bindings answer 409 with
the same node, evictions answer 404 or mark an already-marked pod.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import anyio
import structlog

from muster.daemon.k8s import cancelling
from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.errors import Conflict, KubeError, NotFound
from muster.daemon.k8s.pods import FLAVOR_GATE, FLAVOR_LABEL, Owner, PodInfo
from muster.daemon.k8s.watching import Backoff
from muster.daemon.slots import Slots
from muster.events.types import Event, JobAdmitted, JobCancelled, JobId, JobPreempted, JobRejected
from muster.projections.flavors import PodFit

__all__ = ["Applier", "ApplyResult", "GangView", "InFlight", "Outcome"]

log = structlog.get_logger("muster.k8s.apply")

Outcome = Literal["applied", "noop", "skipped", "conflict", "failed", "error"]
_ASSIGNED = re.compile(r'already assigned to node "?([^"\s]+)"?')


@dataclass(frozen=True)
class ApplyResult:
    """What applying one decision did.

    `ok` is True for applied/noop/skipped. `events` are facts found on the way
    (a JobFailed for a gang whose pod vanished); `KubernetesAdapter.apply` has
    already pushed them to its sink.
    """

    ok: bool
    outcome: Outcome
    detail: str = ""
    events: tuple[Event, ...] = ()
    pods: dict[str, str] = field(default_factory=dict)
    """Per pod `namespace/name`: what happened to it (bound, already-bound, evicted, gone, conflict: ...)."""


class GangView(Protocol):
    """The adapter's knowledge of gangs (`gangs.Gangs` implements it)."""

    def pods_of(self, job: JobId) -> dict[str, PodInfo] | None: ...

    def job_known(self, job: JobId) -> bool: ...

    def complete(self, job: JobId) -> bool: ...

    def sizing(self) -> bool: ...

    def ended(self, job: JobId) -> bool: ...

    def finished(self, job: JobId) -> set[str]: ...

    def evicting(self, job: JobId) -> list[PodInfo]: ...

    def recreates(self, job: JobId) -> bool: ...

    def fail(self, job: JobId, reason: str, at: int) -> list[Event]: ...

    def forget(self, job: JobId) -> None: ...

    def owner_of(self, job: JobId) -> Owner | None: ...


async def _pause() -> None:
    await anyio.sleep(0.05)


class InFlight:
    """Requests of one kind in flight, and a wait for a lull in them (reports give way to bindings)."""

    def __init__(self, lull_seconds: float = 0.2) -> None:
        self.count = 0
        self.lull_seconds = lull_seconds
        self._none = anyio.Event()
        self._none.set()
        self._some = anyio.Event()
        self._ended = float("-inf")
        """When the last one in flight ended (anyio.current_time)."""

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        self.count += 1
        if self.count == 1:
            self._none = anyio.Event()
            self._some.set()
        try:
            yield
        finally:
            self.count -= 1
            if self.count == 0:
                self._ended = anyio.current_time()
                self._some = anyio.Event()
                self._none.set()

    async def lull(self) -> None:
        """Return once none has been in flight for `lull_seconds` (at once if none was for that long).

        Admissions come one decision after another: between two gangs' bindings there is a
        moment with none in flight, which is not yet the end of the burst.
        """
        while True:
            await self._none.wait()
            left = self._ended + self.lull_seconds - anyio.current_time()
            if left <= 0:
                return
            with anyio.move_on_after(left):
                await self._some.wait()
                continue
            return


class Applier:
    def __init__(
        self,
        client: KubeClient,
        gangs: GangView,
        *,
        changed: Callable[[], Awaitable[None]] = _pause,
        backoff: Backoff | None = None,
        deadline_seconds: float = 60.0,
        pod_wait_seconds: float = 10.0,
        concurrency: int = 64,
        clock: Callable[[], float] = time.time,
        flavor_fits: Callable[[Mapping[str, Mapping[str, str]]], Mapping[str, PodFit]] | None = None,
    ) -> None:
        """`flavor_fits(flavors)`: per podset admitted on flavors (`JobAdmitted.flavors`), what its pods
        get at binding."""
        self.client = client
        self._flavor_fits = flavor_fits
        self.gangs = gangs
        self._changed = changed
        self.backoff = backoff or Backoff(initial=0.1, maximum=5.0)
        self.deadline_seconds = deadline_seconds
        self.pod_wait_seconds = pod_wait_seconds
        # one limit per kind: a burst of evictions (a lost rack) never queues new gangs' bindings
        self._bind_limit = Slots(concurrency)
        self._evict_limit = Slots(concurrency)
        self.binding = InFlight()
        """Bindings in flight (queued or sent): what users wait for, which reports give way to."""
        self._clock = clock
        self.awaiting: set[JobId] = set()
        """Admitted jobs whose admission found no gang of theirs here (`_bind_gang`): bound once it is whole."""

    async def apply(self, event: Event) -> ApplyResult:
        if isinstance(event, JobAdmitted):
            return await self._admit(event)
        if isinstance(event, JobPreempted):
            return await self._evict(event)
        if isinstance(event, JobRejected):
            self.gangs.forget(event.job)
            return ApplyResult(True, "skipped", "rejected: nothing to change in the cluster")
        if isinstance(event, JobCancelled) and cancelling.by_user(event):
            pods, owner = self.gangs.pods_of(event.job) or {}, self.gangs.owner_of(event.job)
            self.gangs.forget(event.job)
            return ApplyResult(True, "applied", await cancelling.stop(self.client, owner, pods))
        return ApplyResult(True, "skipped", f"{type(event).__name__} changes nothing in the cluster")

    # ------------------------------------------------------------ admission

    async def ready(self, event: Event) -> None:
        """Wait, at most `pod_wait_seconds`, until the pods `event` binds exist; at once for anything else.

        Replacement pods of a preempted gang may still be on their way; and a new leader's
        adapter knows a gang only once its owner's size is fetched (re-applied admissions).
        The caller waits here holding no slot of its concurrency limit: a gang whose pods
        are slow to come stalls nobody else's bindings.
        """
        if not isinstance(event, JobAdmitted):
            return
        job = event.job

        def waiting() -> bool:
            gangs = self.gangs
            return not gangs.ended(job) and not gangs.complete(job) and (gangs.job_known(job) or gangs.sizing())

        if not waiting():
            return  # the common case, at once: no timeout scope to set up for every admission
        with anyio.move_on_after(self.pod_wait_seconds):
            while waiting():
                await self._changed()

    async def _admit(self, event: JobAdmitted) -> ApplyResult:
        await self.ready(event)  # at once when the caller already waited
        return await self._bind_gang(event.job, event.placement, self._fits(event.flavors or {}))

    async def rebind(
        self, job: JobId, placement: Mapping[str, str], flavors: Mapping[str, Mapping[str, str]] | None = None
    ) -> ApplyResult:
        """Bind the pods that took over slots of `job`'s admitted gang (an Indexed Job's next indexes).

        The admission applied again: pods already on their nodes (or done there) count as done,
        so only the successors are bound, fitted to the gang's `flavors` as its first pods were
        (a successor is a new pod: without the flavor's tolerations and node selector it would
        not stay on the flavor's node).
        """
        if not self.gangs.complete(job):
            return ApplyResult(True, "skipped", "the gang is not whole (preempted, or a pod on its way)")
        return await self._bind_gang(job, placement, self._fits(flavors or {}))

    def _fits(self, flavors: Mapping[str, Mapping[str, str]]) -> Mapping[str, PodFit]:
        """Per podset admitted on `flavors`, what its pods get at binding (nothing without flavors)."""
        return self._flavor_fits(flavors) if self._flavor_fits is not None and flavors else {}

    async def _bind_gang(
        self, job: JobId, placement: Mapping[str, str], fits: Mapping[str, PodFit] | None = None
    ) -> ApplyResult:
        if self.gangs.ended(job):
            return ApplyResult(True, "skipped", "the job already ended")
        pods = self.gangs.pods_of(job)
        if pods is None:
            # No gang of this job here yet: a new leader's relist found a pod missing that its controller makes
            # again, or its owner is still being read. It is bound once its gang is whole (`awaiting`, the adapter's
            # `_bind_successors`); pods gone for good end the job by reconciliation's one rule (`reconciling.judge`).
            # Skipped and forgotten, the job held its quota for ever with its pods unbound.
            self.awaiting.add(job)
            return ApplyResult(True, "skipped", "no gang of this job in the cluster yet: bound once its pods are there")
        done = self.gangs.finished(job)
        if done:  # pods that succeeded before a preemption took them: their share of the run is over
            placement = {name: node for name, node in placement.items() if name not in done}
        missing = sorted(set(placement) - set(pods))
        gone = [
            name
            for name in sorted(placement)
            if name in pods and not pods[name].active
            if not (pods[name].ran and pods[name].node == placement[name])
        ]
        if missing or gone:
            reason = f"pods gone before binding: {', '.join(missing + gone)}"
            events = self.gangs.fail(job, reason, int(self._clock()))
            return ApplyResult(False, "failed", reason, tuple(events))

        results: dict[str, str] = {}
        deadline = anyio.current_time() + self.deadline_seconds

        async def bind(name: str, pod: PodInfo, node: str) -> None:
            with self.binding.running():
                async with self._bind_limit:
                    fit = (fits or {}).get(name.rpartition("-")[0])
                    results[pod.key] = await self._bind_one(pod, node, deadline, fit)

        if len(placement) == 1:  # a gang of one: no task group to set up for it
            [(name, node)] = placement.items()
            await bind(name, pods[name], node)
        else:
            async with anyio.create_task_group() as tg:
                for name, node in sorted(placement.items()):
                    tg.start_soon(bind, name, pods[name], node)

        outcomes = set(results.values())
        if any(r == "gone" for r in outcomes):
            gone_keys = sorted(k for k, r in results.items() if r == "gone")
            reason = f"pods deleted before binding: {', '.join(gone_keys)}"
            events = self.gangs.fail(job, reason, int(self._clock()))
            return ApplyResult(False, "failed", reason, tuple(events), results)
        conflicts = sorted(f"{k} ({r})" for k, r in results.items() if r.startswith("conflict"))
        if conflicts:
            return ApplyResult(False, "conflict", "bound elsewhere: " + ", ".join(conflicts), (), results)
        errors = sorted(f"{k} ({r})" for k, r in results.items() if r.startswith("error"))
        if errors:
            return ApplyResult(False, "error", "binding failed: " + ", ".join(errors), (), results)
        if all(r == "already-bound" for r in outcomes):
            return ApplyResult(True, "noop", "every pod was already on its node", (), results)
        return ApplyResult(True, "applied", f"bound {len(results)} pods", (), results)

    async def _bind_one(self, pod: PodInfo, node: str, deadline: float, fit: PodFit | None = None) -> str:
        if pod.node:
            return "already-bound" if pod.node == node else f"conflict: on {pod.node}"

        async def bind() -> str:
            try:
                if fit is not None or pod.flavor_gate:
                    await self._fit_flavor(pod, fit)
                await self.client.bind(pod.namespace, pod.name, node)
                return "bound"
            except Conflict as exc:
                m = _ASSIGNED.search(exc.message)
                if m is not None:
                    return "already-bound" if m.group(1) == node else f"conflict: on {m.group(1)}"
                return f"conflict: {exc.message}"
            except NotFound:
                return "gone"

        return await self._retrying(bind, deadline, "binding failed, retrying", pod=pod.key, node=node)

    async def _fit_flavor(self, pod: PodInfo, fit: PodFit | None) -> None:
        """Give a pod what its flavors ask (`fit`; None: no flavors) and lift muster's gate, in one merge patch.

        Read first: a merge patch replaces lists (the pod's own tolerations and other gates stay in
        them), and the nodeSelector may only gain keys (one the pod already has is left as it is)."""
        obj = await self.client.get_pod(pod.namespace, pod.name)
        spec = obj.get("spec") or {}
        labels = (obj.get("metadata") or {}).get("labels") or {}
        patch_spec: dict[str, Any] = {}
        patch: dict[str, Any] = {}
        if fit is not None:
            if fit.label and labels.get(FLAVOR_LABEL) != fit.label:
                patch["metadata"] = {"labels": {FLAVOR_LABEL: fit.label}}
            have = list(spec.get("tolerations") or [])
            missing = [t for t in fit.tolerations if t not in have]
            if missing:
                patch_spec["tolerations"] = have + missing
        gates = list(spec.get("schedulingGates") or [])
        others = [g for g in gates if not (isinstance(g, dict) and g.get("name") == FLAVOR_GATE)]
        if len(others) < len(gates):
            selector = spec.get("nodeSelector") or {}
            added = {k: v for k, v in (fit.node_selector if fit else {}).items() if k not in selector}
            if added:
                patch_spec["nodeSelector"] = added
            patch_spec["schedulingGates"] = others or None
        if patch_spec:
            patch["spec"] = patch_spec
        if patch:
            await self.client.patch_pod(pod.namespace, pod.name, patch)

    async def _retrying(self, op: Callable[[], Awaitable[str]], deadline: float, retrying: str, **context: str) -> str:
        """`op()`'s outcome, retrying what the API says is worth retrying until `deadline`.

        Backoff grows per attempt; a 429's Retry-After is honoured as a floor.
        A permanent error, or a retry that would end past the deadline, is an
        `error: ...` outcome: the caller reports it, nothing raises.
        """
        attempt = 0
        while True:
            try:
                return await op()
            except KubeError as exc:
                if not exc.retryable:
                    return f"error: {exc.message}"
                delay = self.backoff.delay(attempt, exc.delay if exc.status == 429 else None)
                attempt += 1
                if anyio.current_time() + delay > deadline:
                    return f"error: {exc.message}"
                log.info(retrying, **context, status=exc.status, error=exc.message, delay=round(delay, 3))
                await anyio.sleep(delay)

    # ------------------------------------------------------------ preemption

    async def _evict(self, event: JobPreempted) -> ApplyResult:
        victims = self.gangs.evicting(event.job)
        if not victims:
            return ApplyResult(True, "noop", "no pods of this job in the cluster")
        results: dict[str, str] = {}
        deadline = anyio.current_time() + self.deadline_seconds

        async def evict(pod: PodInfo) -> None:
            async with self._evict_limit:
                results[pod.key] = await self._evict_one(pod, deadline)

        async with anyio.create_task_group() as tg:
            for pod in victims:
                tg.start_soon(evict, pod)
        errors = sorted(f"{k} ({r})" for k, r in results.items() if r.startswith("error"))
        if errors:
            return ApplyResult(False, "error", "eviction failed: " + ", ".join(errors), (), results)
        ended: tuple[Event, ...] = ()
        if not self.gangs.recreates(event.job):
            # bare pods, a pod group: nothing brings them back, so requeueing the job would only
            # readmit a gang that can never bind (issue 11's storm after a node loss)
            reason = f"evicted ({event.reason}) and nothing recreates its pods"
            ended = tuple(self.gangs.fail(event.job, reason, int(self._clock())))
        if all(r == "gone" for r in results.values()):
            return ApplyResult(True, "noop", "every pod was already gone", ended, results)
        return ApplyResult(True, "applied", f"evicted {len(results)} pods", ended, results)

    async def _evict_one(self, pod: PodInfo, deadline: float) -> str:
        async def evict() -> str:
            try:
                await self.client.evict(pod.namespace, pod.name, grace_seconds=pod.grace_seconds)
                return "evicted"
            except NotFound:
                return "gone"

        return await self._retrying(evict, deadline, "eviction refused, retrying", pod=pod.key)
