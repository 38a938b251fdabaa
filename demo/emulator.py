"""A Kubernetes API server double for tests and `muster demo`, on kmock's KubernetesEmulator.

kmock serves the HTTP, records every request (`emulator.requests`, the DSL
views for assertions) and keeps the objects (`emulator.objects`). This
subclass answers like kube-apiserver where muster depends on it (see
/work/shared/notes/kubernetes-api-facts.md):

- Every change gets the next value of one global resourceVersion (as etcd's
  revision); lists carry the current one; a watch from version V replays the
  changes after V, then follows (`history`). `watch=true` and `watch=True` both watch.
- `limit` pages a list: the answer carries a `continue` token for the rest of
  the same snapshot (every page has the snapshot's resourceVersion); a token
  older than the last `expire()` answers 410 Gone.
- `expire()` compacts the history: watches from older versions, and the
  watches open now, answer 410 Gone (an ERROR event in the stream), so the
  client must relist. `close_watches()` ends open streams without error (`history`).
- `pods/binding` sets `spec.nodeName` and the PodScheduled condition (201),
  409 "pod N is already assigned to node M" when bound; `pods/eviction`
  deletes an unbound pod at once, and a bound one at once with grace 0 or
  otherwise marks it (deletionTimestamp, DisruptionTarget) for its kubelet to
  confirm, as DELETE of a bound pod with a grace period does.
- Pod creation defaults what the API server defaults: phase Pending,
  schedulerName default-scheduler, terminationGracePeriodSeconds 30, uid.
- `fail(...)` injects faults ahead of everything else: an error status or a
  delay (longer than the client's timeout, it is a timeout), N times.
  kmock's own DSL works too (`emulator['post', ...] << 500`): user reactions
  take precedence over these built-in (fallback) answers.

The synchronous helpers (`put_object`, `patch_object`, `remove_object`, `get_object`,
`list_objects`) change
objects exactly as API calls would (versions, watch events), for test setup.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal.rendering import Response  # exported by kmock, but not in its __all__
from kubernetes_asyncio.client import ApiClient, Configuration

from muster.demo.apiobjects import KINDS, TRUE, Obj, answer, merge_patch, selected, stale, timestamp
from muster.demo.history import Change, History

__all__ = ["Fault", "KubeEmulator", "running"]


@dataclass
class Fault:
    """Answer matching requests with `status` (after `delay` seconds), `times` times."""

    method: str | None = None
    resource: str | None = None
    """The plural, e.g. `pods`."""
    subresource: str | None = None
    name: str | None = None
    watch: bool | None = None
    status: int | None = 500
    delay: float = 0.0
    times: int = 1
    message: str = "injected fault"

    def matches(self, request: kmock.Request) -> bool:
        if self.times <= 0:
            return False
        if self.method is not None and str(request.method.value).upper() != self.method.upper():
            return False
        plural = request.resource.plural if request.resource is not None else None
        if self.resource is not None and plural != self.resource:
            return False
        if self.subresource is not None and request.subresource != self.subresource:
            return False
        if self.name is not None and request.name != self.name:
            return False
        watching = request.params.get("watch") in TRUE
        return self.watch is None or self.watch == watching


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """kmock's KubernetesEmulator with resource versions, watch replay, 410, binding, eviction, faults."""

    history_limit: int = 100_000
    """Changes kept for watch replay; older ones are compacted (watches from before them get 410)."""
    bookmark_seconds: float = 5.0
    keep_requests: int | None = None
    """Keep only this many recorded requests (a long demo); None keeps all (tests assert on them)."""

    _history: History = attrs.field(init=False)
    """The resourceVersion, the changes kept for watch replay and the watches (`history`)."""
    _faults: list[Fault] = attrs.field(factory=list, init=False)
    _names: Any = attrs.field(factory=itertools.count, init=False)
    _builtin_reactions: int = attrs.field(default=0, init=False)
    _pages: dict[str, tuple[int, list[Obj]]] = attrs.field(factory=dict, init=False)
    """Continue token -> (snapshot resourceVersion, the snapshot's remaining items)."""
    _tokens: Any = attrs.field(factory=itertools.count, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._history = History(self.history_limit, self.bookmark_seconds)
        self.fallback[self._is_post_sub("binding")] << self._serve_binding
        self.fallback[self._is_post_sub("eviction")] << self._serve_eviction
        self.fallback[self._is_put] << self._serve_replace
        self._builtin_reactions = len(self._payloads)

    # ------------------------------------------------------------ public helpers

    @property
    def resource_version(self) -> int:
        return self._history.rv

    def put_object(self, resource: str, obj: Obj) -> Obj:
        """Create or replace an object as the API would (new version, ADDED/MODIFIED for watchers)."""
        res = kmock.resource(resource)
        meta = obj.setdefault("metadata", {})
        ns = meta.get("namespace")
        old = self._get(res, ns, meta.get("name", ""))
        if old is None:
            return self._create(res, ns, obj)
        merged = copy.deepcopy(obj)
        merged["metadata"] = {**old["metadata"], **meta}
        return self._record(res, ns, meta["name"], "MODIFIED", merged)

    def patch_object(self, resource: str, namespace: str | None, name: str, patch: Mapping[str, Any]) -> Obj:
        res = kmock.resource(resource)
        old = self._get(res, namespace, name)
        if old is None:
            raise KeyError(f"{resource} {namespace}/{name} does not exist")
        return self._record(res, namespace, name, "MODIFIED", merge_patch(copy.deepcopy(old), patch))

    def remove_object(self, resource: str, namespace: str | None, name: str) -> None:
        res = kmock.resource(resource)
        if self._get(res, namespace, name) is not None:
            self._delete(res, namespace, name)

    def get_object(self, resource: str, namespace: str | None, name: str) -> Obj | None:
        obj = self._get(kmock.resource(resource), namespace, name)
        return copy.deepcopy(obj) if obj is not None else None

    def list_objects(self, resource: str, namespace: str | None = None) -> list[Obj]:
        res = kmock.resource(resource)
        return [copy.deepcopy(o) for o in self._list(res, namespace)]

    def expire(self) -> None:
        """Compact all history: every version clients hold is now too old (410), open watches end with 410."""
        self._history.expire()
        self._pages.clear()

    def close_watches(self) -> None:
        """End every open watch stream cleanly (clients reconnect from their last version)."""
        self._history.close_watches()

    def fail(
        self,
        method: str | None = None,
        resource: str | None = None,
        subresource: str | None = None,
        *,
        name: str | None = None,
        watch: bool | None = None,
        status: int | None = 500,
        delay: float = 0.0,
        times: int = 1,
        message: str = "injected fault",
    ) -> Fault:
        """Inject a fault for the next `times` matching requests; `status=None` only delays."""
        fault = Fault(method, resource, subresource, name, watch, status, delay, times, message)
        self._faults.append(fault)
        return fault

    # ------------------------------------------------------------ storage

    def _key(self, res: kmock.resource, ns: str | None, name: str) -> tuple[kmock.resource, str | None, str]:
        return (res, ns, name)

    def _get(self, res: kmock.resource, ns: str | None, name: str) -> Obj | None:
        key = self._key(res, ns, name)
        if key not in self._objects:
            return None
        obj = self._objects[key]
        return None if obj.deleted else obj.raw

    def _list(self, res: kmock.resource, ns: str | None) -> list[Obj]:
        out = []
        for (r, n, _), obj in self._objects.items():
            if r == res and (ns is None or n == ns) and not obj.deleted:
                out.append(obj.raw)
        return out

    def _record(self, res: kmock.resource, ns: str | None, name: str, kind: str, obj: Obj) -> Obj:
        rv = self._history.next_version()
        obj.setdefault("metadata", {})["resourceVersion"] = str(rv)
        key = self._key(res, ns, name)
        if kind == "DELETED":
            self._objects[key].delete()
        elif key in self._objects:
            self._objects[key].history.append(obj)
        else:
            self._objects[key] = obj
        snapshot = copy.deepcopy(obj)
        self._history.record(Change(rv, res, ns, name, kind, snapshot))
        return copy.deepcopy(snapshot)

    def _create(self, res: kmock.resource, ns: str | None, obj: Obj) -> Obj:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{next(self._names):05d}"
        if ns is not None:
            meta["namespace"] = ns
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", timestamp())
        meta.pop("deletionTimestamp", None)
        kind = KINDS.get(res.plural or "", (res.plural or "").rstrip("s").capitalize())
        obj.setdefault("kind", kind)
        obj.setdefault("apiVersion", f"{res.group}/{res.version}" if res.group else str(res.version))
        if res.plural == "pods" and not res.group:
            spec = obj.setdefault("spec", {})
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        return self._record(res, ns, meta["name"], "ADDED", obj)

    def _delete(self, res: kmock.resource, ns: str | None, name: str) -> Obj:
        obj = copy.deepcopy(self._get(res, ns, name) or {})
        return self._record(res, ns, name, "DELETED", obj)

    def _graceful_delete(self, res: kmock.resource, ns: str | None, name: str, grace: int | None, *, why: str) -> Obj:
        """Delete now, or mark for the kubelet to finish (a bound pod with a grace period)."""
        obj = self._get(res, ns, name)
        assert obj is not None
        is_pod = res.plural == "pods" and not res.group
        bound = is_pod and bool((obj.get("spec") or {}).get("nodeName"))
        if grace is None and is_pod:
            grace = int((obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
        finalizers = (obj.get("metadata") or {}).get("finalizers")
        if (bound and grace) or finalizers:
            if (obj.get("metadata") or {}).get("deletionTimestamp"):
                return copy.deepcopy(obj)
            marked = copy.deepcopy(obj)
            marked["metadata"]["deletionTimestamp"] = timestamp()
            marked["metadata"]["deletionGracePeriodSeconds"] = grace or 0
            if why == "eviction":
                conditions = marked.setdefault("status", {}).setdefault("conditions", [])
                conditions.append(
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "EvictionByEvictionAPI",
                        "message": "Eviction API: evicting",
                        "lastTransitionTime": timestamp(),
                    }
                )
            return self._record(res, ns, name, "MODIFIED", marked)
        return self._delete(res, ns, name)

    # ------------------------------------------------------------ request routing

    @staticmethod
    def _is_post_sub(sub: str) -> Any:
        def check(request: kmock.Request) -> bool:
            return request.resource is not None and request.method == kmock.method.POST and request.subresource == sub

        return check

    @staticmethod
    def _is_put(request: kmock.Request) -> bool:
        return request.resource is not None and request.method == kmock.method.PUT and request.name is not None

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        for fault in self._faults:
            if fault.matches(request):
                fault.times -= 1
                if fault.delay:
                    await asyncio.sleep(fault.delay)
                if fault.status is not None:
                    reason = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}
                    body = {
                        "apiVersion": "v1",
                        "kind": "Status",
                        "metadata": {},
                        "status": "Failure",
                        "code": fault.status,
                        "reason": reason.get(fault.status, "Fault"),
                        "message": fault.message,
                    }
                    headers = {"Retry-After": "0"} if fault.status == 429 else None
                    return aiohttp.web.json_response(body, status=fault.status, headers=headers)
                break
        if self.keep_requests is not None and len(self._requests) > 2 * self.keep_requests:
            del self._requests[: -self.keep_requests]
        # kmock matches a request against each reaction by scanning every request recorded so far,
        # which grows without bound; the built-in answers are routed directly unless a test added
        # reactions of its own (those must see the requests first).
        serve = self._route(request) if len(self._payloads) == self._builtin_reactions else None
        if serve is not None:
            response: Response = await serve(request)
            return await response(request)
        # Skip KubernetesEmulator._handle: its bookkeeping is replaced by the serving methods below.
        return await super(kmock.KubernetesEmulator, self)._handle(request)

    def _route(self, request: kmock.Request) -> Any:
        if request.resource is None or not request.resource.plural:
            return None
        method = str(request.method.value).upper()
        if method == "GET":
            if request.params.get("watch") in TRUE:
                return self._serve_watch
            return self._serve_list if request.name is None else self._serve_fetch
        if method == "POST":
            if request.name is None:
                return self._serve_create
            return {"binding": self._serve_binding, "eviction": self._serve_eviction}.get(request.subresource or "")
        if request.name is None:
            return None
        return {"PATCH": self._serve_update, "PUT": self._serve_replace, "DELETE": self._serve_delete}.get(method)

    # ------------------------------------------------------------ serving (kmock fallbacks)

    async def _serve_list(self, request: kmock.Request) -> Response:
        if request.params.get("watch") in TRUE:
            return await self._serve_watch(request)
        assert request.resource is not None
        token = request.params.get("continue", "")
        if token:
            snapshot = self._pages.pop(token, None)
            if snapshot is None:
                return answer(410, "Expired", "The provided continue parameter is too old for a consistent list")
            rv, items = snapshot
        else:
            labels = request.params.get("labelSelector", "")
            fields = request.params.get("fieldSelector", "")
            rv = self._history.rv
            items = [o for o in self._list(request.resource, request.namespace) if selected(o, labels, fields)]
            items.sort(key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"].get("name") or ""))
        meta: Obj = {"resourceVersion": str(rv)}
        try:
            limit = int(request.params.get("limit") or 0)
        except ValueError:
            limit = 0
        if 0 < limit < len(items):
            items, rest = items[:limit], items[limit:]
            token = f"{rv}-{next(self._tokens)}"
            self._pages[token] = (rv, rest)  # stored objects are replaced on change, never mutated
            while len(self._pages) > 64:  # abandoned lists
                del self._pages[next(iter(self._pages))]
            meta["continue"] = token
            meta["remainingItemCount"] = len(rest)
        kind = KINDS.get(request.resource.plural or "", "Object")
        return Response(
            status=200,
            payload={"kind": f"{kind}List", "apiVersion": "v1", "metadata": meta, "items": items},
        )

    async def _serve_watch(self, request: kmock.Request) -> Response:  # type: ignore[override]
        return Response(status=200, payload=self._history.watch(request, self._list))

    async def _serve_fetch(self, request: kmock.Request) -> Response:
        assert request.resource is not None and request.name is not None
        obj = self._get(request.resource, request.namespace, request.name)
        if obj is None:
            return answer(404, "NotFound", f'{request.resource.plural} "{request.name}" not found')
        return Response(status=200, payload=copy.deepcopy(obj))

    async def _serve_create(self, request: kmock.Request) -> Response:
        assert request.resource is not None
        body = request.data if isinstance(request.data, dict) else None
        if body is None:
            return answer(400, "BadRequest", "the body must be a JSON object")
        meta = body.setdefault("metadata", {})
        ns = request.namespace or meta.get("namespace")
        name = meta.get("name")
        if name and self._get(request.resource, ns, name) is not None:
            return answer(409, "AlreadyExists", f'{request.resource.plural} "{name}" already exists')
        if not name and not meta.get("generateName"):
            return answer(422, "Invalid", "metadata.name or metadata.generateName is required")
        return Response(status=201, payload=self._create(request.resource, ns, body))

    async def _serve_update(self, request: kmock.Request) -> Response:
        assert request.resource is not None and request.name is not None
        res, ns, name = request.resource, request.namespace, request.name
        old = self._get(res, ns, name)
        if old is None:
            return answer(404, "NotFound", f'{res.plural} "{name}" not found')
        patch = request.data
        if not isinstance(patch, dict):
            return answer(415, "UnsupportedMediaType", "only merge patches (JSON objects) are supported")
        if (conflict := stale(res, name, patch, old)) is not None:
            return conflict
        if request.subresource == "status":
            patch = {"status": patch.get("status") or {}}
        new = merge_patch(copy.deepcopy(old), patch)
        released = not (new["metadata"].get("finalizers") or []) and new["metadata"].get("deletionTimestamp")
        if released and (res.plural != "pods" or res.group):
            return Response(status=200, payload=self._delete(res, ns, name))
        return Response(status=200, payload=self._record(res, ns, name, "MODIFIED", new))

    async def _serve_replace(self, request: kmock.Request) -> Response:
        assert request.resource is not None and request.name is not None
        res, ns, name = request.resource, request.namespace, request.name
        old = self._get(res, ns, name)
        body = request.data if isinstance(request.data, dict) else None
        if old is None or body is None:
            return answer(404, "NotFound", f'{res.plural} "{name}" not found')
        if (conflict := stale(res, name, body, old)) is not None:
            return conflict
        if request.subresource == "status":
            new = copy.deepcopy(old)
            new["status"] = body.get("status") or {}
        else:
            new = copy.deepcopy(body)
            new["metadata"] = {**old["metadata"], **(body.get("metadata") or {})}
        return Response(status=200, payload=self._record(res, ns, name, "MODIFIED", new))

    async def _serve_delete(self, request: kmock.Request) -> Response:
        assert request.resource is not None and request.name is not None
        res, ns, name = request.resource, request.namespace, request.name
        if self._get(res, ns, name) is None:
            return answer(404, "NotFound", f'{res.plural} "{name}" not found')
        grace: int | None = None
        body = request.data if isinstance(request.data, dict) else {}
        for value in (request.params.get("gracePeriodSeconds"), body.get("gracePeriodSeconds")):
            if value is not None:
                grace = int(value)
        return Response(status=200, payload=self._graceful_delete(res, ns, name, grace, why="delete"))

    async def _serve_binding(self, request: kmock.Request) -> Response:
        assert request.resource is not None and request.name is not None
        res, ns, name = request.resource, request.namespace, request.name
        pod = self._get(res, ns, name)
        if pod is None:
            return answer(404, "NotFound", f'pods "{name}" not found')
        body = request.data if isinstance(request.data, dict) else {}
        node = str((body.get("target") or {}).get("name") or "")
        if not node:
            return answer(422, "Invalid", "binding target.name is required")
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound:
            return answer(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": '
                f'pod {name} is already assigned to node "{bound}"',
            )
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            return answer(
                409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": pod is being deleted'
            )
        new = copy.deepcopy(pod)
        new.setdefault("spec", {})["nodeName"] = node
        conditions = [c for c in new.setdefault("status", {}).get("conditions", []) if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": timestamp()})
        new["status"]["conditions"] = conditions
        self._record(res, ns, name, "MODIFIED", new)
        return answer(201, "", "")

    async def _serve_eviction(self, request: kmock.Request) -> Response:
        assert request.resource is not None and request.name is not None
        res, ns, name = request.resource, request.namespace, request.name
        if self._get(res, ns, name) is None:
            return answer(404, "NotFound", f'pods "{name}" not found')
        body = request.data if isinstance(request.data, dict) else {}
        options = body.get("deleteOptions") or {}
        grace = options.get("gracePeriodSeconds")
        self._graceful_delete(res, ns, name, int(grace) if grace is not None else None, why="eviction")
        return answer(201, "", "")


@asynccontextmanager
async def running(emulator: KubeEmulator | None = None) -> AsyncIterator[tuple[KubeEmulator, ApiClient]]:
    """Serve `emulator` (a new one by default) on a local port; yield it and an ApiClient pointed at it."""
    emu = emulator if emulator is not None else KubeEmulator()
    async with emu, kmock.Server(emu) as server:
        config = Configuration(host=str(server.url).rstrip("/"))
        api = ApiClient(config)
        try:
            yield emu, api
        finally:
            emu.close_watches()
            await api.close()
