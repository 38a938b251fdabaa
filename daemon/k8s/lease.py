"""Leader election on a Kubernetes Lease (coordination.k8s.io/v1): the `Elector` for `leader_election.backend: lease`.

One Lease object names the holder. A candidate reads it (get) and takes it
when it does not exist (create), is released (no `holderIdentity`), already
names this holder, or has not changed for `leaseDurationSeconds` of the
candidate's *own* monotonic clock since the candidate saw it change (as
client-go does: clocks of different machines are never compared, and the
wall-clock `renewTime` in the object is informational). Taking an existing
Lease is a replace carrying the observed `resourceVersion`, so of two
candidates the second gets 409 Conflict and stays a standby. The holder
renews every `ttl / 5` by replace with the resourceVersion of its own last
write; a 409 means someone else wrote the Lease: the lease is lost.
`resign()` writes the Lease back without a holder (again by resourceVersion)
so a standby takes it at its next poll. The chart's Role allows exactly
get, create and update of this one Lease; nothing else is called.

Invariants (those of `leader.KvElector`):
- `leading()` is a local, conservative judgement: True only until
  `ttl * VALIDITY` seconds (monotonic clock) after the send of the last
  successful create/replace. Any other candidate waits at least
  `leaseDurationSeconds >= ttl` after it *received* the last change, which
  came after that send, so a holder that was paused or cut off stops
  believing it leads before anyone else can take the Lease.
- The elector never overwrites a Lease someone else holds: every write
  carries the resourceVersion it was decided on, and a held Lease is only
  taken once expired by the rule above. A resign releases only our own.
- API errors (5xx, timeouts, refused connections, garbage) never escape
  `run`: they are logged, and the holder simply stops believing it leads when
  its validity runs out.
- After a resign this elector does not campaign for `ttl` seconds, so a
  standby gets the Lease rather than the replica that just gave it up.
- The lease alone is not authority over the log: the loop appends a fenced
  `LeaderElected` with a new epoch and only decides once it is folded.
"""

from __future__ import annotations

import copy
import datetime
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import structlog
from anyio.abc import TaskStatus
from kubernetes_asyncio.client import ApiClient, CoordinationV1Api

from muster.daemon.k8s.client import call_json
from muster.daemon.k8s.errors import Conflict, KubeError, NotFound, from_status
from muster.daemon.leader import VALIDITY, HeldLease

__all__ = ["LeaseElector"]

log = structlog.get_logger("muster.leader")

Obj = dict[str, Any]


def _micro_time() -> str:
    """Now as a Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _spec(lease: Obj) -> Obj:
    spec = lease.get("spec")
    return spec if isinstance(spec, dict) else {}


def _holder(lease: Obj) -> str:
    holder = _spec(lease).get("holderIdentity")
    return holder if isinstance(holder, str) else ""


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


class LeaseElector(HeldLease):
    """Hold one coordination.k8s.io/v1 Lease `namespace/name` as `holder`, for `ttl` seconds per renewal."""

    def __init__(
        self,
        api: ApiClient,
        namespace: str,
        name: str,
        holder: str,
        ttl: float = 10.0,
        *,
        on_change: Callable[[], None] | None = None,
        request_seconds: float | None = None,
    ) -> None:
        super().__init__(holder, ttl, on_change)
        self.api = CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.duration = max(1, math.ceil(ttl))
        """`leaseDurationSeconds` we write: whole seconds, never shorter than the TTL we judge ourselves by."""
        self.request_seconds = request_seconds if request_seconds is not None else ttl * VALIDITY
        """Per-request timeout; an answer later than the validity window could not be used anyway."""
        self.lease: Obj | None = None
        """The Lease as our last successful write left it, while we hold it."""
        self.acquired_at = 0.0
        """When (monotonic) the write that last won the lease was sent."""
        self._quiet_until = 0.0
        self._resigning = False
        self._writing = anyio.Lock()
        """Held by every write while holding: a resign uses the resourceVersion of the last renewal."""

    def holds(self) -> bool:
        return self.lease is not None

    def _drop(self) -> None:
        self.lease = None

    # ------------------------------------------------------------ running

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Campaign, then hold the lease, forever (until cancelled)."""
        task_status.started()
        while True:
            if self.lease is None:
                if anyio.current_time() >= self._quiet_until:
                    await self._campaign()
                if self.lease is None:
                    await anyio.sleep(self.campaign_delay())
            else:
                # at least a beat between attempts, so failing renewals near the end of validity do not spin
                left = self.valid_until - anyio.current_time() - 0.05
                await anyio.sleep(max(self.ttl / 50, min(self.refresh_every, left)))
                await self._renew()

    async def _call(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Obj:
        """Call the API; the decoded Lease, or a KubeError (the `client.KubeClient` classification)."""
        _, data = await call_json(fn, *args, _request_timeout=self.request_seconds)
        if not isinstance(data, dict) or not isinstance(data.get("metadata"), dict):
            raise from_status(502, f"not a Lease: {json.dumps(data)[:200]}")
        return data

    def _observe_lease(self, lease: Obj) -> None:
        """Remember when the Lease last changed, by our own clock (any write changes its resourceVersion)."""
        seen = json.dumps([lease["metadata"].get("resourceVersion"), _spec(lease)], sort_keys=True, default=str)
        self._observe(seen, max(1, _int(_spec(lease).get("leaseDurationSeconds"), self.duration)))

    async def _campaign(self) -> None:
        try:
            current: Obj | None = await self._call(self.api.read_namespaced_lease, self.name, self.namespace)
        except NotFound:
            current = None
        except KubeError as exc:
            log.info("leader campaign failed", lease=self.name, error=f"{type(exc).__name__}: {exc}")
            return
        now = _micro_time()
        if current is None:
            body: Obj = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {
                    "holderIdentity": self.holder,
                    "leaseDurationSeconds": self.duration,
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                },
            }
            args: tuple[Any, ...] = (self.namespace, body)
            fn: Callable[..., Awaitable[Any]] = self.api.create_namespaced_lease
        else:
            if not current["metadata"].get("resourceVersion"):
                # a replace without one would be unconditional: it could overwrite a holder's renewal
                log.warning("leader lease has no resourceVersion; not taking it", lease=self.name)
                return
            self._observe_lease(current)
            holder = _holder(current)
            if holder and holder != self.holder and not self.lapsed():
                return  # someone holds it and has renewed within its duration, as far as we have seen
            spec = _spec(current)
            body = copy.deepcopy(current)
            body["spec"] = {
                **spec,
                "holderIdentity": self.holder,
                "leaseDurationSeconds": self.duration,
                "renewTime": now,
            }
            if holder != self.holder:
                body["spec"]["acquireTime"] = now
                body["spec"]["leaseTransitions"] = _int(spec.get("leaseTransitions"), 0) + 1
            # the observed resourceVersion stays in body.metadata: the replace is refused if anyone wrote since
            args = (self.name, self.namespace, body)
            fn = self.api.replace_namespaced_lease
        sent = anyio.current_time()
        try:
            won = await self._call(fn, *args)
        except Conflict:
            log.info("leader lease taken by another candidate", lease=self.name)
            return
        except KubeError as exc:
            log.info("leader campaign failed", lease=self.name, error=f"{type(exc).__name__}: {exc}")
            return
        self._observe_lease(won)
        self.lease = won
        self.acquired_at = sent
        log.info(
            "leader lease won",
            holder=self.holder,
            lease=f"{self.namespace}/{self.name}",
            resource_version=won["metadata"].get("resourceVersion"),
            previous=_holder(current) if current is not None else None,
        )
        self._won(sent)

    async def _renew(self) -> None:
        async with self._writing:
            lease, valid_until = self.lease, self.valid_until
            if lease is None:
                return  # resigned or lost while we slept
            if not lease["metadata"].get("resourceVersion"):
                log.warning("leader lease written back without a resourceVersion; giving it up", lease=self.name)
                self._lose()
                return
            body = copy.deepcopy(lease)
            body["spec"] = {**_spec(lease), "holderIdentity": self.holder, "renewTime": _micro_time()}
            sent = anyio.current_time()
            try:
                renewed = await self._call(self.api.replace_namespaced_lease, self.name, self.namespace, body)
            except Conflict:
                log.warning("leader lease lost", holder=self.holder, lease=self.name)
                self._lose()
                return
            except KubeError as exc:
                if not self._resigning and anyio.current_time() >= self.valid_until:
                    log.warning(
                        "leader lease expired while the API server did not answer",
                        error=f"{type(exc).__name__}: {exc}",
                    )
                    self._lose()
                return
            self._observe_lease(renewed)
            if self.lease is not lease:
                return  # dropped meanwhile (a resign that gave up waiting for this write): never resurrect it
            if _holder(renewed) != self.holder:
                log.warning("leader lease lost", holder=self.holder, now=_holder(renewed))
                self._lose()
                return
            self.lease = renewed
            if self._resigning:
                return  # resign waits for this write and releases from its resourceVersion
            if sent >= valid_until:
                # we were frozen past our own validity; the loop may have judged the term over, and it
                # has to start a new one anyway: give the lease up cleanly instead of resuming silently
                log.warning("leader lease refreshed after it lapsed locally; resigning", holder=self.holder)
                self._lose()
                self._quiet_until = anyio.current_time() + self.ttl
                await self._release(renewed)
                return
            self._renewed(sent)

    async def _release(self, lease: Obj) -> None:
        body = copy.deepcopy(lease)
        spec = _spec(lease)
        if spec.get("holderIdentity") != self.holder:
            return
        now = _micro_time()
        body["spec"] = {k: v for k, v in spec.items() if k != "holderIdentity"}
        # as client-go's ReleaseOnCancel: no holder, a 1 s duration, the times of the release
        body["spec"].update(leaseDurationSeconds=1, acquireTime=now, renewTime=now)
        try:
            await self._call(self.api.replace_namespaced_lease, self.name, self.namespace, body)
            log.info("leader lease released", holder=self.holder, lease=self.name)
        except KubeError as exc:  # not ours any more (409), or the API is gone: its duration does it
            log.info("leader lease not released", error=f"{type(exc).__name__}: {exc}")

    async def resign(self) -> None:
        """Give the lease up (write it back without a holder, if it is still ours) and stand aside for `ttl`."""
        self._quiet_until = anyio.current_time() + self.ttl
        self.valid_until = 0.0  # stop believing at once, even while waiting for an in-flight renewal
        self._resigning = True
        try:
            with anyio.move_on_after(2, shield=True):
                async with self._writing:
                    lease = self.lease
                    self._lose()
                    if lease is not None:
                        await self._release(lease)
        finally:
            self._resigning = False
            if self.lease is not None:  # the release timed out while waiting for the lock
                self._lose()
