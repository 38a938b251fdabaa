"""What a flavored job's queue and podsets alone give its flavor assignment: its `Plan`, worked out once per class.

A flavored job waits through many tries, each judging every flavor (`assignment.choose`); what
does not depend on the cycle's view is the same for every try of every job of its class (same
queue, same podsets), so it is kept on the index per class (`SchedulerIndex.flavor_plans`) and
rebuilt with it:

- the podset-groups to give flavors (`Slot`: one podset's part of one resource group of its
  queue, with the group's flavors the podset may take), in the order they are assigned;
- the first podset-group on each of its flavors with nothing chosen before it (`Trial`): its
  requests, the whole gang's, and what they ask of that flavor's quota (`quotawords`);
- whether a podset asks for a resource no resource group covers (then the gang is inadmissible);
- the requests that place its jobs in the admission order.

A function of the folded state's queue and job only, so replay, audit and a new leader plan alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

import msgspec

from muster.events.types import PodSet
from muster.projections import flavors
from muster.projections.configuration import flavored_requests
from muster.projections.flavors import Flavors
from muster.projections.quotawords import quota_asked
from muster.projections.state import JobState, QueueState

if TYPE_CHECKING:
    from muster.projections.cycle import Cycle


class Trial(NamedTuple):
    """The gang's first podset-group on one flavor, with nothing chosen before it: what judging it reads
    that only the job's podsets and its queue's quota give (`plan_of`)."""

    chosen: Flavors
    requests: dict[str, int]
    """The requests of the podsets judged with it, keyed as the quota."""
    whole: dict[str, int]
    """The whole gang's requests on `chosen` (`flavors.view`'s)."""
    asked: tuple[tuple[str, int], ...]
    """What `requests` asks of the flavor's quota (`quotawords.words_of`' `asked`)."""
    quota: tuple[tuple[str, int, int | None], ...]
    """Per key of `asked`: its nominal quota and borrowing limit (`quotawords.words_of`' `quota`)."""
    words: dict[tuple[bool, str | None], tuple[str, tuple[str, ...]]]
    """`quotawords.words_of` of `asked` by (leave to borrow, limit reached), as they are asked for."""


class Slot(NamedTuple):
    """One podset's part of one resource group of its queue: one flavor gives it all of `covered`."""

    podset: PodSet
    upto: int
    """How many podsets of the gang are judged with it (itself and those before it)."""
    covered: list[str]
    """The group's resources the podset asks for."""
    allowed: list[str]
    """The group's flavors, in order, the podset may take."""


class Plan(NamedTuple):
    """What `assignment.choose` reads of a job that is the same for every try of every job of its class (its
    queue's resource groups and its podsets): worked out once per class and index (`SchedulerIndex.flavor_plans`),
    since a flavored job is tried again and again while it waits."""

    uncovered: str
    slots: list[Slot]
    first: dict[str, Trial]
    """Per flavor of the first podset-group, in order."""
    order: Mapping[str, int]
    """The requests that place its jobs in the admission order (`flavors.order_requests`)."""


def plan_of(cycle: Cycle, job: JobState, queue: QueueState) -> Plan:
    """The job's `Plan` (kept per class: jobs of one class have the same queue and podsets)."""
    idx = cycle.idx
    group = idx.group_of.get(job.id)
    known = idx.flavor_plans.get(group) if group is not None else None
    if known is not None:
        return known
    uncovered = flavors.uncovered(queue, job.podsets)
    slots = [] if uncovered else _slots(job, queue)
    first: dict[str, Trial] = {}
    if slots:
        slot = slots[0]
        for f in slot.allowed:
            chosen = {slot.podset.name: dict.fromkeys(slot.covered, f)}
            requests = flavored_requests(job.podsets[: slot.upto], chosen)
            whole = flavored_requests(job.podsets, chosen)
            first[f] = Trial(chosen, requests, whole, *quota_asked(queue, requests, f), {})
    plan = Plan(uncovered, slots, first, flavors.order_requests(cycle.state, job))
    if group is not None:
        idx.flavor_plans[group] = plan
    return plan


def order_requests(cycle: Cycle, job: JobState) -> Mapping[str, int]:
    """`flavors.order_requests` of a job on the cycle's view: a pending flavored job's from its class's `Plan`
    (the order key of a waiting job is asked for again at every change of its quota tree)."""
    if not flavors.unassigned(cycle.state, job):
        return job.requests  # on its flavors, or in a plain queue: as `flavors.order_requests`
    if cycle.idx.group_of.get(job.id) is None:
        return flavors.order_requests(cycle.state, job)  # no class to keep a plan for: worked out for itself
    return plan_of(cycle, job, cycle.state.queues[job.queue]).order


def on_trial(job: JobState, trial: Trial) -> JobState:
    """`flavors.view(job, trial.chosen)`, with the requests the plan worked out."""
    return msgspec.structs.replace(
        job, flavors={ps: dict(c) for ps, c in trial.chosen.items()}, requests=dict(trial.whole)
    )


def _slots(job: JobState, queue: QueueState) -> list[Slot]:
    """The podset-groups of a job to give flavors to, in the order they are assigned."""
    out: list[Slot] = []
    for i, ps in enumerate(job.podsets):
        for group in queue.resource_groups:
            covered = flavors.covered(group, ps.requests)
            if covered:
                out.append(Slot(ps, i + 1, covered, flavors.allowed(group, ps.flavors)))
    return out


def complete(chosen: Flavors, slots: list[Slot]) -> Flavors:
    """`chosen`, with every podset-group it leaves open on its first allowed flavor."""
    out = {ps: dict(c) for ps, c in chosen.items()}
    for slot in slots:
        if not slot.allowed:
            continue
        mine = out.setdefault(slot.podset.name, {})
        if slot.covered[0] not in mine:
            mine.update(dict.fromkeys(slot.covered, slot.allowed[0]))
    return out
