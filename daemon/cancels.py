"""What a user's cancel is: a `JobCancelled` whose reason starts `Cancelled:` (what `muster cancel` writes).

A user's cancel obliges the cluster to stop the job's workload (`k8s.cancelling`); the
adapter's own cancellations (`WorkloadDeleted`) need nothing, the workload is already gone.
Kept apart from the Kubernetes adapter so that a term's start can ask it without loading
the Kubernetes client (a second or more of imports on the event loop of a daemon without it).
"""

from __future__ import annotations

from muster.events.types import JobCancelled

__all__ = ["USER_CANCEL", "by_user", "user_cancelled"]

USER_CANCEL = "Cancelled:"
"""The reason prefix `muster cancel` writes (`muster.controlcli`)."""


def by_user(event: JobCancelled) -> bool:
    """Whether the cancellation came from a user, so the cluster's workload must be stopped."""
    return user_cancelled(event.reason)


def user_cancelled(reason: str) -> bool:
    """Whether a cancelled job's reason (`JobCancelled.reason`, kept as `JobState.reason`) is a user's cancel."""
    return reason.startswith(USER_CANCEL)
