"""A gang whose owner runs another number of pods at once now: the rules, over one `Gang`.

No I/O and no state beyond the `Gang` given (as `gangruns`): `gangs.Gangs` asks these when a pod
comes, when its owner is read (`set_size`, `workload_read`) and when reconciliation finds a job
gone (`vanished`), and turns their answers into events.

Invariants:
- A waiting gang whose owner's size changed (a Job's parallelism, a PodGroup's minMember) ends
  `Resized` and its pods are submitted again at the new size as a later run (`resized_to`,
  `take_size`), as Kueue makes a changed Job's Workload again before admission: a Job scaled down
  would otherwise wait for the pod its controller deleted, and the pods of one scaled up beyond
  its gang would wait unbound.
- An admitted gang keeps its size: the log holds its placement. A bound run scaled down goes on
  without the pods its owner deleted and ends when the others do (`shrink`); a pod its owner makes
  beyond an admitted run waits unbound and is told why, once (`beyond_admitted`).
- A waiting gang asks for its owner's size again, once a run, when a pod beyond its size comes
  that replaces none of its own (`wants_recount`): its owner may run more pods at once now.
"""

from __future__ import annotations

from collections.abc import Callable

from muster.daemon.k8s.gangruns import Gang, KnownJob
from muster.daemon.k8s.owners import Sizing
from muster.daemon.k8s.pods import UNOWNED, Owner, PodInfo
from muster.events.types import JobCancelled, JobId

__all__ = ["RESIZED", "beyond_admitted", "resized", "resized_to", "shrink", "take_size", "wants_recount", "was_resized"]

RESIZED = "Resized"
"""The reason of a waiting job ended because its owner's size changed (`resized`): its pods run as a new job."""

OnLog = Callable[[JobId], KnownJob | None]
"""What the log says of a job (None: not on it, or no view of the log)."""


def resized_to(gang: Gang, sizing: Sizing | None, on_log: OnLog) -> int | None:
    """The owner's new size when `gang` waits for its admission and `sizing` changes it; None when the size is
    the same or the gang no longer waits (admitted, bound, started: the log holds its placement; it keeps it)."""
    size = sizing.size if sizing is not None else None
    if size is None or size < 1 or size == gang.size or gang.job_id is None or gang.done or gang.started:
        return None
    if any(gang.pods[key].node for key in gang.mapping.values() if key in gang.pods):
        return None
    known = on_log(gang.job_id)
    if known is not None and known.status != "pending":
        return None
    return size


def resized(job: JobId, owner: Owner, size: int, was: int, at: int) -> JobCancelled:
    """How a waiting job ends whose owner runs `size` pods at once now, not `was` (`Gangs._resized`,
    `reconciling.judge`)."""
    why = f"{RESIZED}: {owner.workload} runs {size} pods at once now, not {was}"
    return JobCancelled(at=at, job=job, reason=f"{why}; its pods are submitted again as a new job")


def was_resized(known: KnownJob) -> bool:
    """Whether the log's job ended `Resized`: it had its owner's old size, and its pods run at another as a later
    job (a relisting leader sizes them by a lookup, not from the log)."""
    return known.status == "cancelled" and known.reason.startswith(RESIZED)


def take_size(gang: Gang, sizing: Sizing) -> None:
    """`gang` takes the owner's new size once its job ended `Resized`: its pods are a later run, submitted again
    when that many are there (`Gangs._evaluate`: a done gang's next run; one never matched to the log's job, as a
    relisting leader with too few of its pods, is a later run from the start)."""
    assert sizing.size is not None
    gang.size, gang.losing, gang.recount = sizing.size, "", False
    if gang.owner.kind == "Job":
        gang.completions = max(sizing.size, sizing.completions or 0)
    if gang.job_id is None:
        gang.later_run = True
    else:
        gang.done = True


def shrink(gang: Gang, sizing: Sizing | None) -> bool:
    """Whether a bound run lost pods because its owner was scaled down (the Job controller deleted the pods past
    its parallelism): it runs on without them (`Gang.shrunk`) and finishes when the others do; the log keeps
    its admitted share until then. Its owner makes no replacement, so the gang waits for none."""
    now = sizing.size if sizing is not None else None
    if now is None or not 0 < now < (gang.size or 0) or not gang.vacated:
        return False
    gang.shrunk.update(gang.vacated)
    gang.vacated.clear()
    if gang.owner.kind == "Job" and sizing is not None:
        gang.completions = max(now, sizing.completions or 0)
    gang.losing = ""
    return True


def wants_recount(gang: Gang, info: PodInfo) -> bool:
    """Whether `info`, a pod new to a waiting run, beyond its size and replacing none of its pods, asks for the
    owner's size again (once a run: `Gang.recount`; `Gangs.set_size` resizes the gang)."""
    if gang.recount or gang.size is None or len(gang.pods) <= gang.size or gang.owner.kind in UNOWNED:
        return False
    if gang.job_id is None or gang.done or gang.started or gang.requeued or gang.losing:
        return False
    if info.active and info.uid not in gang.retired and info.key not in gang.mapping.values():
        gang.recount = True
        return True
    return False


def beyond_admitted(gang: Gang, info: PodInfo, on_log: OnLog) -> str | None:
    """Why `info` waits, when it is a pod new to an admitted run in no slot of it (a running Job's parallelism
    raised), once per pod (`Gang.beyond`); None otherwise. The run keeps the size it was admitted at
    (`resized_to` leaves an admitted gang alone), so the pod waits unbound: told why instead of left Pending
    with no word."""
    if gang.job_id is None or gang.done or gang.requeued or gang.losing or not info.active or info.node:
        return None
    if info.uid in gang.retired or info.uid in gang.beyond or info.key in gang.mapping.values():
        return None
    known = on_log(gang.job_id)
    if not (gang.started or (known is not None and known.status == "admitted")):
        return None  # waiting: a pod beyond its size asks for its owner's size again instead (`wants_recount`)
    gang.beyond.add(info.uid)
    return (
        f"job {gang.job_id} runs at the size it was admitted with ({gang.size} pods): a gang is admitted whole,"
        f" once, so pods {gang.owner.workload} makes beyond it wait (to run at its new size, create it again)"
    )
