"""Why a pending job waits, in the numbers the scheduler saw, and what would have to change for it to run.

Pure (a state in, numbers and sentences out; no clock): for a job at a state,
`quota_numbers` (queue usage, nominal, what the cohort could give, the
shortfall), `capacity_numbers` (the best topology domain and its room) and, for
a job still pending, `blockers`: its position in its queue and the jobs ahead,
the quota and capacity it lacks, reservations, and whether preemption could
make room (the core's own search, `assignment.victim_search`, on a throwaway
cycle). A pending job of a queue with flavors gets its numbers per flavor it
may take (quota keyed `gpu@h100`, capacity on each flavor's nodes). The story of a
job (`story`) reads a waiting job's numbers from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from muster.events.types import PodSet
from muster.projections.configuration import carries
from muster.projections.flavors import MARKER, gpu_flavors, placement_request, quota_asks, unassigned
from muster.projections.queueing import STRICT_FIFO
from muster.projections.resources import fmt
from muster.projections.state import ClusterState, JobState, Reservation
from muster.replay.points import duration
from muster.replay.views import queue_order

if TYPE_CHECKING:
    from muster.projections.cycle import Cycle
    from muster.projections.topology import TopologyIndex


def quota_numbers(state: ClusterState, job: JobState) -> dict[str, Any]:
    """Per quota-limited resource of the job: queue usage, nominal, what the cohort could give, the shortfall."""
    from muster.projections.quota import QuotaTree

    out: dict[str, Any] = {}
    queue = state.queues.get(job.queue)
    if queue is None:
        return out
    tree = QuotaTree(state)
    node = tree.queues.get(job.queue)
    if node is None:
        return out
    allow_borrow = state.preemptible(job)
    asks = quota_asks(state, job)
    for r in sorted(asks):
        need = asks[r]
        if need <= 0 or r not in queue.nominal:
            continue
        used = queue.usage.get(r, 0)
        available = tree.available(node, r)
        if not allow_borrow:
            available = min(available, queue.nominal[r] - used)
        out[r] = {
            "requested": need,
            "used": used,
            "nominal": queue.nominal[r],
            "available": max(0, available),
            "short": max(0, need - max(0, available)),
            "borrowing_limit": (queue.borrowing_limit or {}).get(r),
        }
    return out


def capacity_numbers(state: ClusterState, job: JobState) -> list[dict[str, Any]]:
    """Per podset: the topology level it must (or would like to) fit in, and the best domain there."""
    from muster.projections.topology import TopologyIndex

    topo = TopologyIndex(state)
    out: list[dict[str, Any]] = []
    for ps in job.podsets:
        on: list[str | None] = [*gpu_flavors(state, job, ps)] or [None]
        out.extend(_podset_capacity(topo, job, ps, flavor) for flavor in on)
    return out


def _podset_capacity(topo: TopologyIndex, job: JobState, ps: PodSet, flavor: str | None) -> dict[str, Any]:
    """A podset's capacity numbers, on `flavor`'s nodes (None: on the nodes its placement may take)."""
    level = None
    required = False
    if ps.topology is not None and ps.topology.required:
        level, required = ps.topology.required, True
    elif ps.topology is not None and ps.topology.preferred:
        level = ps.topology.preferred
    depth = topo.level_depth(level) if level is not None else None
    gpu = ps.requests.get("gpu", 0)
    item: dict[str, Any] = {"podset": ps.name, "pods": ps.count, "per_pod": dict(ps.requests)}
    if flavor is not None:
        item["flavor"] = flavor
        req: Mapping[str, int] = {**ps.requests, MARKER + flavor: 1}
        free = topo.gpu_free_on(flavor)
    else:
        req = placement_request(job, ps.name, ps.requests, topo.tainted)
        free = topo.root.free.get("gpu", 0)
    total = sum(topo.slots(d, req, ps.count) for d in topo.by_level[0]) if topo.by_level[0] else 0
    item["cluster_free_gpus"] = max(0, free)
    item["cluster_room_pods"] = min(total, ps.count) if ps.count else 0
    if required and depth is not None:
        doms = topo.by_level[depth - 1]
        best = None
        best_key: tuple[int, int] | None = None
        for d in doms:
            key = (topo.slots(d, req, ps.count), d.free.get("gpu", 0))
            if best_key is None or key > best_key:
                best, best_key = d, key
        item["level"] = level
        if best is not None and best_key is not None:
            item["best_domain"] = "/".join(best.path)
            item["best_room_pods"] = best_key[0]
            item["best_free_gpus"] = max(0, best_key[1])
            missing = max(0, ps.count - best_key[0])
            item["missing_gpus"] = missing * gpu
    else:
        item["level"] = level
        item["missing_gpus"] = max(0, ps.count - item["cluster_room_pods"]) * gpu
    return item


def numbers_text(state: ClusterState, job: JobState) -> str:
    """A short account of what blocks a job now: quota and capacity in numbers."""
    parts = []
    for r, q in quota_numbers(state, job).items():
        text = f"queue {job.queue} uses {q['used']:,} of {q['nominal']:,} nominal {r}"
        if q["short"]:
            text += f", {q['available']:,} more available to it, {q['requested']:,} asked: short by {q['short']:,}"
        parts.append(text)
    for c in capacity_numbers(state, job):
        if c.get("best_domain") is not None:
            parts.append(
                f"best {c['level']} {c['best_domain']} has {c['best_free_gpus']:,} free GPUs "
                f"(room for {c['best_room_pods']} of {c['pods']} pods)"
            )
        else:
            parts.append(
                f"{c['cluster_free_gpus']:,} GPUs free {_where(c)} (room for {c['cluster_room_pods']} of "
                f"{c['pods']} pods)"
            )
    return "; ".join(parts)


def _where(capacity: dict[str, Any]) -> str:
    """Where a podset's capacity numbers were counted: in the cluster, or on a flavor's nodes."""
    return f"on flavor {capacity['flavor']}'s nodes" if "flavor" in capacity else "in the cluster"


def blockers(state: ClusterState, job: JobState) -> dict[str, Any]:
    """Why a pending job waits now, in numbers, and what would have to change for it to run."""
    order = queue_order(state, job.queue)
    pos = next((i for i, j in enumerate(order, start=1) if j.id == job.id), None)
    ahead = [{"job": j.id, "gpus": j.gpus, "priority": state.priority_of(j)} for j in order[: (pos or 1) - 1]]
    quota = quota_numbers(state, job)
    capacity = capacity_numbers(state, job)
    changes: list[str] = []
    for r, q in quota.items():
        if not q["short"]:
            continue
        limit = q["nominal"] + q["borrowing_limit"] if q["borrowing_limit"] is not None else None
        if q["requested"] > q["nominal"] and not state.preemptible(job):
            changes.append(
                f"quota: a non-preemptible job never borrows; {job.queue}'s nominal {r} must grow from "
                f"{q['nominal']:,} to at least {q['used'] + q['requested']:,}"
            )
        elif limit is not None and q["requested"] > limit:
            changes.append(
                f"quota: it asks {q['requested']:,} {r}, more than {job.queue} may ever use ({limit:,}); "
                "the queue's nominal quota or borrowing limit must grow"
            )
        else:
            # a non-preemptible job never borrows: past its nominal quota, its own queue's jobs hold what
            # it waits for, and the cohort's finishing would not let it in
            own = not state.preemptible(job) and q["used"] + q["requested"] > q["nominal"]
            who = "jobs of its queue" if own else "jobs of its queue or cohort"
            changes.append(
                f"quota: {q['short']:,} more {r} must be free for {job.queue} (it uses {q['used']:,} of "
                f"{q['nominal']:,} nominal; {q['available']:,} available to it now, {q['requested']:,} needed): "
                f"{who} must finish, or its quota grow"
            )
    for c in capacity:
        if not c.get("missing_gpus"):
            continue
        if c.get("best_domain") is not None:
            changes.append(
                f"capacity: no {c['level']} has room for {c['pods']} pods of {fmt(c['per_pod'])}; the best, "
                f"{c['best_domain']}, has {c['best_free_gpus']:,} free GPUs (room for {c['best_room_pods']}): "
                f"{c['missing_gpus']:,} more GPUs must be free there"
            )
        else:
            changes.append(
                f"capacity: there is room {_where(c)} for {c['cluster_room_pods']} of {c['pods']} pods of "
                f"{fmt(c['per_pod'])}: {c['missing_gpus']:,} more GPUs must be free on schedulable nodes"
                + (f" of flavor {c['flavor']}" if "flavor" in c else "")
                + _unschedulable_room(state, c)
            )
    tried = list(dict.fromkeys(c["flavor"] for c in capacity if "flavor" in c))
    if len(tried) > 1 and changes:
        # the lines below are per flavor, and a flavored job needs only one of them to come true
        changes.insert(
            0, f"flavors: it may run on any one of {', '.join(tried)}: what one of them lacks below is enough"
        )
    queue_state = state.queues.get(job.queue)
    if queue_state is not None and queue_state.queueing_strategy == STRICT_FIFO and pos is not None and pos > 1:
        changes.insert(
            0,
            f"strict_fifo: {order[0].id}, the head of {job.queue}, must be admitted first "
            "(no job behind it is admitted while it waits)",
        )
    reservation = state.reservations.get(job.id)
    if reservation is not None:
        changes.insert(0, f"{reservation_text(reservation, state.now)}: no job that would delay it is placed there")
    others = [o for o in sorted(state.reservations.values(), key=lambda o: o.job) if o.job != job.id]
    for other in others:
        if job.max_runtime is None:
            verdict = "a job without a limit never backfills"
        elif other.expected_start is not None and state.now + job.max_runtime <= other.expected_start:
            verdict = "its limit ends in time to use it"
        else:
            verdict = "its limit ends too late to use it"
        changes.append(f"reserved room: {', '.join(other.nodes)} held for {other.job}; {verdict}")
    victims = _victims(state, job)
    reclaimed_at = victims.get("idle_reclaimed_at")
    if reclaimed_at is not None:
        changes.append(
            f"preemption: reclaimed for idleness at {reclaimed_at} ({duration(state.now - reclaimed_at)} ago): "
            "it evicts no one while it borrows, until it runs again (it waits for free room, or for its queue "
            "to be within nominal quota)"
        )
    elif victims.get("victims"):
        changes.append(
            "preemption: evicting "
            + ", ".join(v["job"] for v in victims["victims"])
            + " would make room; the next scheduling cycle does so"
        )
    elif victims.get("policy") == "Never":
        changes.append(f"preemption: {job.queue}'s policy lets it evict nothing (within_queue and cohort: Never)")
    elif victims.get("candidate_gpus") is not None and (quota or capacity) and changes:
        changes.append(
            f"preemption cannot help: the jobs its policy may evict hold {victims['candidate_gpus']:,} GPUs, "
            "not enough to make room"
        )
    changes.extend(_idle_room(state, job))
    if not changes:
        changes.append(
            "nothing visible blocks it now: it should be admitted by the next scheduling cycle "
            f"(last reason: {job.reason or 'none recorded'})"
        )
    return {
        "position": pos,
        "queue_length": len(order),
        "ahead": ahead,
        "reason": job.reason,
        "quota": quota,
        "capacity": capacity,
        "preemption": victims,
        "reservation": reservation_data(reservation) if reservation is not None else None,
        "what_would_have_to_change": changes,
    }


IDLE_SHOWN = 5
"""How many idle jobs `explain` names (a busy cluster may have dozens)."""


def _idle_room(state: ClusterState, job: JobState) -> list[str]:
    """The running jobs idle reclaim may take back (spec, Idle reclamation): idle, preemptible and, with
    `only_borrowing`, admitted on borrowed quota while their queue still borrows. Whether one is
    reclaimed for this job the cycle judges when it is due (this job must come before it and need
    its room), so the line says when it may be, not that it will."""
    policy = state.idle_reclaim
    if policy is None:
        return []
    from muster.projections.quota import QuotaTree

    tree = QuotaTree(state)
    out = []
    for other in sorted(state.jobs.values(), key=lambda j: (j.idle_since or 0, j.seq)):
        if other.id == job.id or other.status != "admitted" or other.idle_since is None:
            continue
        if not state.preemptible(other):
            continue
        if policy.only_borrowing and not (other.borrowed and tree.is_borrowing(other.queue)):
            continue
        due = other.idle_since + policy.after
        when = f"in {duration(due - state.now)}" if due > state.now else "now"
        out.append(
            f"idle reclaim: {other.id} ({other.queue}, {other.gpus} GPUs) has been idle for "
            f"{duration(state.now - other.idle_since)}; it may be reclaimed {when}, for a waiting job that "
            "comes before it and needs its room"
        )
    if len(out) > IDLE_SHOWN:
        # the longest idle first: those are reclaimed first
        more = len(out) - IDLE_SHOWN
        out = [*out[:IDLE_SHOWN], f"idle reclaim: {more} more idle job{'s' if more != 1 else ''} may be reclaimed"]
    return out


def _unschedulable_room(state: ClusterState, capacity: dict[str, Any]) -> str:
    """`; n0 (cordoned) would hold a pod`: nodes that take no pods now but have the room for one of the
    podset's (an operator reading "no room" looks at the nodes and sees free GPUs there)."""
    per_pod = capacity["per_pod"]
    flavor = state.flavors.get(capacity["flavor"]) if "flavor" in capacity else None
    found: list[str] = []
    for name in sorted(state.nodes):
        node = state.nodes[name]
        if node.schedulable or (flavor is not None and not carries(node.labels, flavor.node_labels)):
            continue
        room = {k: v - node.used.get(k, 0) - node.reserved.get(k, 0) for k, v in node.capacity.items()}
        if all(room.get(k, 0) >= v for k, v in per_pod.items() if v > 0):
            why = "down" if not node.ready else "cordoned" if node.cordoned else "unschedulable"
            found.append(f"{name} ({why})")
    if not found:
        return ""
    shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    return f"; {shown} would hold a pod but take{'s' if len(found) == 1 else ''} none now"


def reservation_text(r: Reservation, now: int) -> str:
    """`reserved b1/r3 since 1h 02m; waiting for 3 jobs to end, expected in 1h 08m`."""
    where = r.domain or ", ".join(r.nodes[:6]) + (f" +{len(r.nodes) - 6} more" if len(r.nodes) > 6 else "")
    text = f"reserved {where}"
    if now > r.since:
        text += f" since {duration(now - r.since)} ago"
    n = len(r.waits_for)
    if not n:
        return text + "; its room is free (it waits for quota)"
    ends = [f"{w.job} {_end_text(w.end, now)}" for w in r.waits_for[:5]]
    more = f" +{n - 5} more" if n > 5 else ""
    text += f"; waiting for {n} job{'s' if n != 1 else ''} to end ({', '.join(ends)}{more})"
    if r.expected_start is None:
        unlimited = sum(1 for w in r.waits_for if w.end is None)
        if not unlimited:
            return text + " (start unknown)"
        if n == 1:
            return text + ", which has no declared limit (start unknown)"
        which = "none has a" if unlimited == n else f"{unlimited} of them have no"
        return text + f", {which} declared limit (start unknown)"
    if r.expected_start <= now:
        return text + f", expected {duration(now - r.expected_start)} ago"
    return text + f", expected in {duration(r.expected_start - now)}"


def _end_text(end: int | None, now: int) -> str:
    if end is None:
        return "with no limit"
    return f"in {duration(end - now)}" if end > now else "now"


def reservation_data(r: Reservation) -> dict[str, Any]:
    return {
        "nodes": list(r.nodes),
        "domain": r.domain,
        "since": r.since,
        "expected_start": r.expected_start,
        "waits_for": [{"job": w.job, "expected_end": w.end} for w in r.waits_for],
    }


def _victims(state: ClusterState, job: JobState) -> dict[str, Any]:
    """What the core's own victim search finds for the job now (on a cycle that is undone)."""
    from muster.projections.eviction import evicts_nothing

    queue = state.queues.get(job.queue)
    if queue is None:
        return {}
    if evicts_nothing(queue.preemption) and not state.fair_sharing:
        return {"policy": "Never"}
    from muster.projections.assignment import victim_search
    from muster.projections.cycle import Cycle
    from muster.projections.index import index_of

    try:
        idx = index_of(state)
        cycle = Cycle(state, idx, state.now)
        try:
            if _idle_borrowing(cycle, job):
                # the rule lets it evict no one (`eviction.Preemptor.idle_borrowing`): say why
                return {"victims": [], "candidate_gpus": 0, "idle_reclaimed_at": job.idle_reclaimed_at}
            result = victim_search(cycle, job, state.preemptible(job))
        finally:
            cycle.finish()
    except Exception as exc:  # explaining must not fail on a state the core finds odd
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "victims": [{"job": v.job.id, "queue": v.job.queue, "reason": v.reason} for v in result.victims],
        "candidate_gpus": result.candidate_gpus,
    }


def _idle_borrowing(cycle: Cycle, job: JobState) -> bool:
    """Whether the eviction rule lets `job` evict no one because it was reclaimed for idleness and
    borrows, judged as the core's victim search judges it: a pending job of a queue with flavors on
    each flavor the search looks for victims on (its quota is keyed `gpu@FLAVOR`: judged on its plain
    requests, such a job never borrows), and the rule holds when it holds on all of them."""
    from muster.projections.assignment import choose
    from muster.projections.preemption import find_victims, preemptor_rule

    if job.idle_reclaimed_at is None:
        return False
    if not unassigned(cycle.state, job):
        return preemptor_rule(cycle, job).idle_borrowing
    allow = cycle.state.preemptible(job)
    choice = choose(cycle, job, allow, lambda on: bool(find_victims(cycle, on, allow).victims))
    if choice.admit is not None or not choice.preempt:
        return False
    return all(preemptor_rule(cycle, on).idle_borrowing for on in choice.preempt)
