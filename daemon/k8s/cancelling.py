"""Stopping the workload of a job a user cancelled (`muster cancel`), as its kind expects.

A user's cancel (`daemon.cancels.by_user`) stops the workload; the adapter's own
`WorkloadDeleted` cancellations need nothing (the workload is already gone).

- A kind that can be suspended is suspended: a Job or JobSet (`spec.suspend`), a Kubeflow
  job (`spec.runPolicy.suspend`). Its controller deletes the pods and keeps the object, so
  the user can still read its status and logs, and delete it when done.
- Any other gang (labelled pod groups, bare pods, Volcano or coscheduling PodGroups): its
  pods are deleted. The PodGroup object itself is left alone. A labelled pod group's controller
  (an operator's object, of a kind muster cannot suspend) may make them again: the log names it
  (`JobSubmitted.controller`), so the pods it makes after the cancel are left alone, unbound, and
  told why, by this leader and the next (`controllers`).

Stopping twice is harmless: suspending a suspended owner changes nothing and a pod already
gone answers 404.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from muster.daemon.cancels import by_user
from muster.daemon.k8s.client import KubeClient
from muster.daemon.k8s.errors import NotFound
from muster.daemon.k8s.owners import API, api_of
from muster.daemon.k8s.pods import Owner, PodInfo

__all__ = ["by_user", "stop", "suspend_patch"]

_SUSPEND_SPEC: dict[str, Any] = {"spec": {"suspend": True}}
_SUSPEND_RUN_POLICY: dict[str, Any] = {"spec": {"runPolicy": {"suspend": True}}}
_POD_GROUPS = frozenset(k for k in API if k not in ("Job", "JobSet", "MPIJob"))


def suspend_patch(owner: Owner) -> dict[str, Any] | None:
    """The merge patch that suspends `owner`, or None for a kind that cannot be suspended."""
    if owner.kind in ("Job", "JobSet"):
        return _SUSPEND_SPEC
    if owner.kind in ("Pod", "Gang") or owner.kind in _POD_GROUPS:
        return None
    return _SUSPEND_RUN_POLICY  # MPIJob and the other Kubeflow jobs


async def stop(client: KubeClient, owner: Owner | None, pods: Mapping[str, PodInfo]) -> str:
    """Suspend the owner, or delete the gang's pods; returns what was done (for the log)."""
    patch = suspend_patch(owner) if owner is not None else None
    if owner is not None and patch is not None:
        try:
            await client.patch_owner(api_of(owner), owner.namespace, owner.name, patch)
        except NotFound:
            return f"{owner.source} is gone"
        return f"suspended {owner.source}"
    deleted = 0
    for pod in sorted(pods.values(), key=lambda p: p.key):
        try:
            await client.delete_pod(pod.namespace, pod.name)
            deleted += 1
        except NotFound:
            continue
    return f"deleted {deleted} pod(s)"
