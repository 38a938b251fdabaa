"""The few Kubernetes API calls muster makes, as raw JSON, with errors already classified.

Every call goes through kubernetes-asyncio with `_preload_content=False`:
the binding and eviction subresources answer with a `Status` object the
generated models cannot decode, and raw dicts are several times cheaper than
models for the list+watch traffic of a large cluster. The price is that the
library no longer raises on error statuses, so `_call` checks them and maps
every failure into `errors.KubeError` subclasses. Nothing else in the adapter
sees a library exception. Bindings, the hot path, skip the generated method and
post through the library's HTTP client (`_post`): same session, host, TLS and
credentials, without its per-call parameter handling; its body is encoded by
msgspec and its answer (the pod's binding echoed back) is not decoded; with
`bind_connections`, bindings go over a pool of pipelined HTTP/1.1 connections of
their own (`pipelining`) instead of the library's session. JSON
is decoded by msgspec too (2-3x the standard library's speed on pod objects,
the bulk of a watch).

Invariants:
- Every response is released (or closed, for an abandoned watch stream).
- A watch stream yields whole JSON events, however the bytes were chunked.
"""

from __future__ import annotations

import os
import urllib.request
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec
from kubernetes_asyncio.client import ApiClient, BatchV1Api, CoreV1Api, CustomObjectsApi

from muster.daemon.k8s.errors import KubeError, NotFound, PermanentError, from_exception, from_status
from muster.daemon.k8s.pipelining import PipelinedPool, ssl_context_of

__all__ = ["KubeClient", "call_json"]

Obj = dict[str, Any]
Page = tuple[list[Obj], str]
"""One page of a list: its objects and the list's resourceVersion."""
MERGE_PATCH = "application/merge-patch+json"
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


async def call_json(
    fn: Callable[..., Awaitable[Any]], *args: Any, decode: bool = True, **kwargs: Any
) -> tuple[int, Any]:
    """Call a kubernetes-asyncio API method raw: (status, decoded JSON body), or a KubeError on any failure.

    `decode=False`: the body of a success is not read into objects (the status and None).
    """
    try:
        resp = await fn(*args, _preload_content=False, **kwargs)
    except Exception as exc:
        raise from_exception(exc) from exc
    try:
        try:
            body = await resp.read()
        except Exception as exc:
            raise from_exception(exc) from exc
        if not 200 <= resp.status <= 299:
            raise from_status(resp.status, body, retry_after=resp.headers.get("Retry-After"))
        if not decode:
            return resp.status, None
        try:
            data = _decode(body) if body else {}
        except ValueError as exc:
            raise from_status(502, f"undecodable answer: {body[:200]!r}") from exc
        return resp.status, data
    finally:
        resp.release()


def skip_environment_lookups(api_client: ApiClient) -> bool:
    """Stop the HTTP session reading proxy settings and ~/.netrc for every request, where there are none.

    kubernetes-asyncio opens its aiohttp session with `trust_env=True`, so each request first
    looks for a proxy and a netrc entry, in two worker-thread hops: on a loaded machine that
    was half the client's CPU per binding (bench/bench_k8s_real.py). Where the environment
    names no proxy and there is no netrc file, those lookups find nothing, so turning them
    off changes nothing else. Returns whether they were turned off.
    """
    session = getattr(getattr(api_client, "rest_client", None), "pool_manager", None)
    netrc = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    if session is None or not hasattr(session, "_trust_env") or urllib.request.getproxies() or os.path.exists(netrc):
        return False
    session._trust_env = False  # the session's only switch for them; aiohttp reads it per request
    return True


class KubeClient:
    """Raw-JSON access to nodes, pods, owners, bindings and evictions."""

    def __init__(self, api_client: ApiClient, *, request_seconds: float = 30.0, bind_connections: int = 0) -> None:
        """`bind_connections`: bind over that many pipelined connections (`pipelining`; 0: the library's
        session). Not through a proxy, which the pool does not speak to."""
        self.api_client = api_client
        self.core = CoreV1Api(api_client)
        self.batch = BatchV1Api(api_client)
        self.custom = CustomObjectsApi(api_client)
        self.request_seconds = request_seconds
        self._timeout = aiohttp.ClientTimeout(total=request_seconds)
        """One timeout object for every request (the library would build one per call from the seconds)."""
        skip_environment_lookups(api_client)
        self._plurals: dict[tuple[str, str], str] = {}
        """(apiVersion, kind) -> the namespaced resource serving it, as discovery said (`get_kind`)."""
        self._binds: PipelinedPool | None = None
        rest = getattr(api_client, "rest_client", None)
        host = api_client.configuration.host
        if bind_connections > 0 and host and rest is not None and not rest.proxy:
            self._binds = PipelinedPool(
                host,
                connections=bind_connections,
                ssl_context=ssl_context_of(api_client.configuration),
                server_hostname=rest.server_hostname,
                request_seconds=request_seconds,
            )

    async def aclose(self) -> None:
        """Close the connections of our own (the ApiClient's session is its owner's to close)."""
        if self._binds is not None:
            await self._binds.aclose()

    async def _call(self, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> tuple[int, Any]:
        """Call `fn` and return (status, decoded JSON body); raise a KubeError on any failure."""
        kwargs.setdefault("_request_timeout", self._timeout)
        return await call_json(fn, *args, **kwargs)

    # ------------------------------------------------------------ list + watch

    def _lister(self, resource: str) -> Callable[..., Awaitable[Any]]:
        if resource == "nodes":
            return self.core.list_node
        if resource == "pods":
            return self.core.list_pod_for_all_namespaces
        raise ValueError(f"unsupported resource {resource!r}")

    async def list(self, resource: str) -> tuple[list[Obj], str]:
        """All objects of `resource` ("nodes" or "pods") and the list's resourceVersion."""
        _, data = await self._call(self._lister(resource))
        items = data.get("items") or []
        rv = str((data.get("metadata") or {}).get("resourceVersion") or "")
        return [i for i in items if isinstance(i, dict)], rv

    async def list_pages(self, resource: str, *, page_size: int | None) -> AsyncGenerator[Page, None]:
        """The objects of `resource` page by page (`limit` + `continue`), each page with the list's resourceVersion.

        Pages keep every decode small: one answer holding a large cluster's pods
        is seconds of JSON parsing that holds the event loop (and the GIL).
        An expired continue token raises `ResourceGone` (relist).
        """
        async for page in self._pages(self._lister(resource), page_size=page_size):
            yield page

    async def list_namespaced(
        self, group: str, version: str, plural: str, namespace: str, *, page_size: int | None
    ) -> AsyncGenerator[Page, None]:
        """The objects of a Job or custom resource kind in `namespace`, page by page (see `list_pages`)."""
        if (group, plural) == ("batch", "jobs"):
            pages = self._pages(self.batch.list_namespaced_job, namespace, page_size=page_size)
        else:
            lister = self.custom.list_namespaced_custom_object
            pages = self._pages(lister, group, version, namespace, plural, page_size=page_size)
        async for page in pages:
            yield page

    async def _pages(
        self, lister: Callable[..., Awaitable[Any]], *args: Any, page_size: int | None
    ) -> AsyncGenerator[Page, None]:
        token = ""
        while True:
            kwargs: dict[str, Any] = {}
            if page_size:
                kwargs["limit"] = page_size
            if token:
                kwargs["_continue"] = token
            _, data = await self._call(lister, *args, **kwargs)
            items = data.get("items") or []
            meta = data.get("metadata") or {}
            yield [i for i in items if isinstance(i, dict)], str(meta.get("resourceVersion") or "")
            token = str(meta.get("continue") or "")
            if not token:
                return

    async def watch(self, resource: str, resource_version: str, *, server_seconds: int) -> AsyncGenerator[Obj, None]:
        """Raw watch events after `resource_version` until the server ends the stream.

        Raises KubeError for an error status, and for an ERROR event in the stream
        (a 410 there becomes `ResourceGone`).
        """
        try:
            resp = await self._lister(resource)(
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=server_seconds,
                _preload_content=False,
                # No total timeout: the stream lives for `server_seconds`; a silent
                # connection is caught by the read timeout instead.
                _request_timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=self.request_seconds, sock_read=server_seconds + 30
                ),
            )
        except Exception as exc:
            raise from_exception(exc) from exc
        try:
            if resp.status != 200:
                body = await resp.read()
                raise from_status(resp.status, body, retry_after=resp.headers.get("Retry-After"))
            buffer = b""
            try:
                async for chunk in resp.content.iter_any():
                    *lines, buffer = (buffer + chunk).split(b"\n")
                    for line in lines:
                        if line.strip():
                            yield _decode_event(line)
            except KubeError:
                raise
            except Exception as exc:
                raise from_exception(exc) from exc
            if buffer.strip():
                yield _decode_event(buffer)
        finally:
            resp.close()

    # ------------------------------------------------------------ owners

    async def get_job(self, namespace: str, name: str) -> Obj:
        _, data = await self._call(self.batch.read_namespaced_job, name, namespace)
        return dict(data)

    async def get_custom(self, group: str, version: str, namespace: str, plural: str, name: str) -> Obj:
        _, data = await self._call(self.custom.get_namespaced_custom_object, group, version, namespace, plural, name)
        return dict(data)

    async def get_kind(self, api_version: str, kind: str, namespace: str, name: str) -> Obj:
        """A namespaced object of any kind (a pod group's controller, an operator's own); its resource is found
        by discovery, once per apiVersion. Raises NotFound when the object is gone. A kind the server does not
        serve (a typo, a CRD not installed or deleted) is a PermanentError: nobody can say whether the object
        exists, which is not the same as knowing it is gone."""
        base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        if (api_version, kind) not in self._plurals:
            try:
                _, found = await self._call(self._get, base)
            except NotFound as exc:
                raise PermanentError(f"the server does not serve {api_version}", status=404) from exc
            for r in found.get("resources") or [] if isinstance(found, dict) else []:
                if isinstance(r, dict) and r.get("namespaced") and "/" not in str(r.get("name")):
                    self._plurals[(api_version, str(r.get("kind")))] = str(r.get("name"))
        plural = self._plurals.get((api_version, kind))
        if plural is None:
            raise PermanentError(f"{api_version} serves no namespaced kind {kind}", status=404)
        path = f"{base}/namespaces/{quote(namespace, safe='')}/{plural}/{quote(name, safe='')}"
        _, data = await self._call(self._get, path)
        return dict(data)

    def _get(self, path: str, **kwargs: Any) -> Awaitable[Any]:
        """GET `path` through the library's session and credentials (what its generated methods do)."""
        call: Callable[..., Awaitable[Any]] = self.api_client.call_api
        return call(
            path,
            "GET",
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            **kwargs,
        )

    async def patch_owner(self, api: Any, namespace: str, name: str, patch: Obj) -> None:
        """Merge-patch an owner object (`owners.OwnerApi` says where it is served)."""
        await self.merge_patch(api.group, api.version, api.plural, namespace, name, patch)

    async def annotate(self, group: str, version: str, plural: str, namespace: str, name: str, notes: Obj) -> None:
        """Set annotations on a workload object (a merge patch of its metadata: nothing else changes)."""
        await self.merge_patch(group, version, plural, namespace, name, {"metadata": {"annotations": notes}})

    async def merge_patch(self, group: str, version: str, plural: str, namespace: str, name: str, patch: Obj) -> None:
        """A JSON merge patch of a Job or a custom object.

        The content type is forced: for a dict the client would pick a JSON patch for
        custom objects (which wants a list) and a strategic merge for Jobs; a JSON merge
        patch means the same to every kind, custom resources included."""
        if (group, plural) == ("batch", "jobs"):
            await self._call(self.batch.patch_namespaced_job, name, namespace, patch, _content_type=MERGE_PATCH)
        else:
            await self._call(
                self.custom.patch_namespaced_custom_object,
                *(group, version, namespace, plural, name, patch),
                _content_type=MERGE_PATCH,
            )

    # ------------------------------------------------------------ effects

    async def bind(self, namespace: str, name: str, node: str) -> None:
        """Bind the pod to `node` (201). A 409 raises `Conflict` whose message names the pod's node."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/binding"
        if self._binds is None:
            await self._call(self._post, path, _encode(body), decode=False)
            return
        answer = await self._binds.post(path, _encode(body), await self._headers())
        if not 200 <= answer.status <= 299:
            raise from_status(answer.status, answer.body, retry_after=answer.headers.get("retry-after"))

    async def _headers(self) -> dict[str, str]:
        """The headers of a JSON request: the ApiClient's defaults (User-Agent) and its credentials."""
        client = self.api_client
        headers = {**client.default_headers, "Accept": "application/json", "Content-Type": "application/json"}
        await client.update_params_for_auth(headers, [], ["BearerToken"])
        return headers

    async def _post(self, path: str, body: bytes, *, _preload_content: bool, _request_timeout: Any) -> Any:
        """POST the JSON `body` to `path` through the ApiClient's session (its host, TLS, proxy and
        credentials) but neither through the generated method's parameter handling, which was a tenth
        of the daemon's CPU per binding (bench/bench_k8s_real.py), nor through the REST client's, which
        encodes the body again: bindings are the hot path."""
        client = self.api_client
        rest = client.rest_client
        headers = await self._headers()
        extra: dict[str, Any] = {}
        # what the REST client passes on besides the request itself
        if rest.proxy:
            extra["proxy"] = rest.proxy
        if rest.proxy_headers:
            extra["proxy_headers"] = rest.proxy_headers
        if rest.server_hostname:
            extra["server_hostname"] = rest.server_hostname
        url = f"{client.configuration.host}{path}"
        return await rest.pool_manager.request(
            "POST", url, headers=headers, data=body, timeout=_request_timeout, **extra
        )

    async def evict(self, namespace: str, name: str, *, grace_seconds: int | None) -> None:
        """Ask the Eviction API to delete the pod (PodDisruptionBudgets may answer 429)."""
        body: Obj = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        if grace_seconds is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_seconds}
        await self._call(self.core.create_namespaced_pod_eviction, name, namespace, body)

    async def get_pod(self, namespace: str, name: str) -> Obj:
        _, data = await self._call(self.core.read_namespaced_pod, name, namespace)
        return dict(data)

    async def patch_pod(self, namespace: str, name: str, patch: Obj) -> None:
        """A merge patch of the pod (e.g. its tolerations, which may only grow)."""
        await self._call(self.core.patch_namespaced_pod, name, namespace, patch, _content_type=MERGE_PATCH)

    async def patch_pod_status(self, namespace: str, name: str, patch: Obj) -> Obj:
        _, data = await self._call(self.core.patch_namespaced_pod_status, name, namespace, patch)
        return dict(data)

    async def create_event(self, namespace: str, body: Obj) -> None:
        await self._call(self.core.create_namespaced_event, namespace, body)

    async def read_event(self, namespace: str, name: str) -> Obj:
        _, data = await self._call(self.core.read_namespaced_event, name, namespace)
        return dict(data)

    async def patch_event(self, namespace: str, name: str, patch: Obj) -> None:
        await self._call(self.core.patch_namespaced_event, name, namespace, patch)

    async def delete_pod(self, namespace: str, name: str, *, grace_seconds: int | None = None) -> None:
        kwargs: dict[str, Any] = {}
        if grace_seconds is not None:
            kwargs["grace_period_seconds"] = grace_seconds
        await self._call(self.core.delete_namespaced_pod, name, namespace, **kwargs)


def _decode_event(line: bytes) -> Obj:
    try:
        event = _decode(line)
    except ValueError as exc:
        raise from_status(502, f"undecodable watch event: {line[:200]!r}") from exc
    if not isinstance(event, dict):
        raise from_status(502, f"watch event is not an object: {line[:200]!r}")
    if event.get("type") == "ERROR":
        status = event.get("object") or {}
        code = status.get("code") if isinstance(status, dict) else None
        raise from_status(int(code) if isinstance(code, int) else 500, status)
    return event
