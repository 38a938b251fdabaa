"""What kube-apiserver's objects and answers look like, as the emulator (`emulator`) writes them.

Pure functions of their inputs, shared by the emulator's storage, its serving methods and its
watch streams (`history`): the kind of each resource muster uses, the `Status` body of an
answer, the optimistic-concurrency check of a write, a JSON merge patch, equality-only
selectors, and the timestamps the server stamps.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Mapping
from typing import Any

import kmock
from kmock._internal.rendering import Response  # exported by kmock, but not in its __all__

Obj = dict[str, Any]
"""A Kubernetes object as JSON."""
TRUE = ("true", "True", "1")
"""A boolean query parameter's values taken as true (`watch=true` and `watch=True` both watch)."""

KINDS = {
    "pods": "Pod",
    "nodes": "Node",
    "jobs": "Job",
    "jobsets": "JobSet",
    "pytorchjobs": "PyTorchJob",
    "bindings": "Binding",
    "events": "Event",
    "namespaces": "Namespace",
    "leases": "Lease",
}
"""Plural -> kind, for the resources muster uses (others: the plural, singular and capitalised)."""


def answer(code: int, reason: str, message: str, *, details: Obj | None = None) -> Response:
    """A `Status` answer with `code` (a failure from 400 on), as the API server gives for errors and subresources."""
    body = {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
    if details:
        body["details"] = details
    return Response(status=code, payload=body)


def stale(res: kmock.resource, name: str, body: Obj, old: Obj) -> Response | None:
    """A 409 when a write names a resourceVersion the stored object no longer has (optimistic concurrency)."""
    want = (body.get("metadata") or {}).get("resourceVersion")
    if want and str(want) != old["metadata"].get("resourceVersion"):
        return answer(409, "Conflict", f'Operation cannot be fulfilled on {res.plural} "{name}": object modified')
    return None


def timestamp() -> str:
    """Now, as the API server stamps it (creationTimestamp, deletionTimestamp, lastTransitionTime)."""
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Obj, patch: Mapping[str, Any]) -> Obj:
    """JSON merge patch (RFC 7386): dicts merge, None removes, anything else replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


def selected(obj: Obj, labels: str, fields: str) -> bool:
    """Equality-only label and field selectors (`a=b,c!=d`), which is all muster uses."""
    meta = obj.get("metadata") or {}
    for expr, source in ((labels, "labels"), (fields, "fields")):
        for term in filter(None, (t.strip() for t in expr.split(","))):
            negate = "!=" in term
            key, _, want = term.replace("!=", "=").replace("==", "=").partition("=")
            if source == "labels":
                have = (meta.get("labels") or {}).get(key)
            else:
                node: Any = obj
                for part in key.split("."):
                    node = node.get(part) if isinstance(node, dict) else None
                have = node if node is not None else ""
            if (str(have) == want) == negate:
                return False
    return True
