"""`evolve`, the fold that builds the cluster state the scheduler reads (`projections.state`).

`evolve(state, event) -> state` applies one event and holds no policy: it
records what the event says. Rules (who may run, who is preempted, which spec
is invalid) live in `scheduler.decide`. For speed the state is mutated in place
and returned; callers that need the old state keep a snapshot
(`snapshot.encode_state`). This module folds the jobs' lives (submission,
admission, preemption, the end) and the reservations; the configuration
(nodes, queues, flavors, cohorts, classes) is folded by `configuration`.

Invariants:
- Deterministic: the same events in the same order give equal states.
- Robust: an event that does not fit the state (an unknown job or node, a
  decision of a deposed leader's epoch, a duplicate submission, a user's
  control event for another queue's job: `foreign_control`) leaves the state
  as it was and is counted in `state.skipped`.
- Usage per node and per queue is the sum of the requests of admitted jobs.
"""

from __future__ import annotations

from collections.abc import Mapping

from muster.events.types import (
    AnyEvent,
    CycleSettled,
    Event,
    GpuUtilizationSampled,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobHeld,
    JobInadmissible,
    JobPreempted,
    JobRejected,
    JobReleased,
    JobStarted,
    JobSubmitted,
    LeaderElected,
    NodeAdded,
    NodeUpdated,
    PodSet,
    ReservationMade,
    ReservationReleased,
    SubmissionRejected,
)
from muster.projections import configuration
from muster.projections.configuration import flavored_requests
from muster.projections.fencing import fenced, newer_leader
from muster.projections.state import (
    DEFAULT_IDLE_THRESHOLD,
    TERMINAL,
    ClusterState,
    JobState,
    JobStatus,
    QueueState,
    RefusedSubmission,
    Reservation,
    podset_of,
    reservation_of,
    skip,
)

# ---------------------------------------------------------------- evolve


def _podset_requests(podsets: list[PodSet]) -> dict[str, int]:
    out: dict[str, int] = {}
    for ps in podsets:
        for k, v in ps.requests.items():
            out[k] = out.get(k, 0) + v * ps.count
    return out


def node_pods(podsets: list[PodSet], placement: Mapping[str, str]) -> list[tuple[str, int, dict[str, int]]]:
    """A placement grouped by node and podset, in order of first appearance: (node, pods, one pod's requests).

    A caller adds `pods * request` per group instead of one request per pod,
    inserting resource keys in the order a pod-by-pod sum would. A pod of no
    known podset requests nothing. The request dicts are the job's own: read only.
    """
    if len(podsets) == 1:
        req = podsets[0].requests
        counts: dict[str, int] = {}
        for node in placement.values():
            counts[node] = counts.get(node, 0) + 1
        return [(node, n, req) for node, n in counts.items()]
    per_podset = {ps.name: ps.requests for ps in podsets}
    groups: dict[tuple[str, str], int] = {}
    for pod, node in placement.items():
        key = (node, podset_of(pod))
        groups[key] = groups.get(key, 0) + 1
    return [(node, n, per_podset.get(name, {})) for (node, name), n in groups.items()]


def _placement_matches(podsets: list[PodSet], placement: Mapping[str, str]) -> bool:
    """Whether the placement names exactly the gang's pods `PODSET-INDEX`.

    Sizes are compared first, so the names are only listed once they are known to be
    no more than the placement holds: a gang claimed far larger (or smaller) than
    the one submitted, e.g. 2**40 pods, is refused without allocating per pod.
    """
    counts: dict[str, int] = {}
    for ps in podsets:
        counts[ps.name] = max(counts.get(ps.name, 0), ps.count)
    if len(placement) != sum(c for c in counts.values() if c > 0):
        return False
    # as many distinct keys as expected names: equal sets iff each name is there
    for name, count in counts.items():
        for i in range(count):
            if f"{name}-{i}" not in placement:
                return False
    return True


def _occupy(state: ClusterState, job_id: str, node_name: str, pods: int, req: Mapping[str, int]) -> None:
    """Count `pods` pods of the job, each requesting `req`, in the node's usage (the inverse of `_release`)."""
    node = state.nodes[node_name]
    used = node.used
    for k, v in req.items():
        used[k] = used.get(k, 0) + v * pods
    node.jobs[job_id] = node.jobs.get(job_id, 0) + pods
    state.dirty_nodes.add(node_name)


def _release(state: ClusterState, job: JobState) -> None:
    """Give back the job's node and queue usage."""
    nodes = state.nodes
    for node_name, pods, req in node_pods(job.podsets, job.placement):
        node = nodes.get(node_name)
        if node is None:
            continue
        used = node.used
        for k, v in req.items():
            used[k] = used.get(k, 0) - v * pods
        gpus = req.get("gpu", 0) * pods
        if gpus:
            state.node_gpus_freed[node_name] = state.node_gpus_freed.get(node_name, 0) + gpus
        n = node.jobs.get(job.id, 0) - pods
        if n > 0:
            node.jobs[job.id] = n
        else:
            node.jobs.pop(job.id, None)
        state.dirty_nodes.add(node_name)
    queue = state.queues.get(job.queue)
    if queue is not None:
        usage = queue.usage
        moved = state.queue_released.setdefault(job.queue, {})
        for k, v in job.requests.items():
            usage[k] = usage.get(k, 0) - v
            moved[k] = moved.get(k, 0) + v
        state.dirty_queues.add(job.queue)
    state.gpus_freed += job.gpus
    if job.flavors:
        job.flavors = {}
        job.requests = _podset_requests(job.podsets)
    job.placement = {}
    job.borrowed = {}
    job.utilization = None
    job.idle_since = None
    state.released += 1
    state.dirty_jobs.add(job.id)


def _reservation_moved(state: ClusterState, job_id: str) -> None:
    """A reservation's holder left (ended, held) or came back: what it holds back changes (see `reservations`)."""
    res = state.reservations.get(job_id)
    if res is not None:
        _room_opened(state, res)


def _room_opened(state: ClusterState, res: Reservation) -> None:
    """Room a reservation held back may be seen by every job again: the jobs parked on placement that it
    could serve are woken as by GPUs freed on its nodes, counted per node too, as a release counts them
    (a flavored job waits on its flavor's nodes); at most what it held: waking early is harmless, late is not."""
    held = 0
    for node in res.nodes:
        need = res.needs.get(node) if res.needs else None
        if need is None:
            n = state.nodes.get(node)
            need = n.capacity if n is not None else {}
        gpus = need.get("gpu", 0)
        if gpus:
            state.node_gpus_freed[node] = state.node_gpus_freed.get(node, 0) + gpus
            state.dirty_nodes.add(node)  # the index reads the per-node counts of the nodes that changed
        held += gpus
    state.gpus_freed += max(1, held)


def _borrowing(queue: QueueState) -> bool:
    return any(v > queue.nominal[r] for r, v in queue.usage.items() if r in queue.nominal)


def _count_decision(state: ClusterState, cycle: int) -> None:
    if cycle > state.cycle:
        state.cycle = cycle
        state.cycle_decisions = 1
    elif cycle == state.cycle:
        state.cycle_decisions += 1


def _fenced(state: ClusterState, epoch: int) -> bool:
    if fenced(epoch, state.epoch):
        state.fenced += 1
        return True
    return False


def _on_node(state: ClusterState, ev: NodeAdded | NodeUpdated) -> ClusterState:
    """A node's facts (`configuration`); a node that appears under the name of a removed one holds again
    what the jobs still admitted there hold.

    A node removed and added back (a Node object deleted and re-created) before any cycle evicted its jobs
    (`NodeFailure`) leaves them admitted on it, their pods possibly still running. Counting them keeps usage
    per node the sum of the admitted jobs' requests: without it the node looked empty (another gang could be
    placed over them) and their end took their requests off it again (usage below zero).
    """
    back = ev.node in state.departed and ev.node not in state.nodes
    configuration.on_node(state, ev)
    if back:
        state.departed.discard(ev.node)
        for job in state.jobs.values():  # rare (a node back before its jobs were evicted): no index for it
            if job.status == "admitted" and ev.node in job.placement.values():
                for node_name, pods, req in node_pods(job.podsets, job.placement):
                    if node_name == ev.node:
                        _occupy(state, job.id, node_name, pods, req)
    return state


def _on_submitted(state: ClusterState, ev: JobSubmitted) -> ClusterState:
    if ev.job in state.jobs:
        # the job on the log stays as it is; the core answers the newcomer (`duplicates`)
        state.refused.append(RefusedSubmission(job=ev.job, queue=ev.queue, at=ev.at))
        return skip(state)
    state.submitted += 1
    state.places += 1
    state.jobs[ev.job] = JobState(
        id=ev.job,
        queue=ev.queue,
        priority_class=ev.priority_class,
        podsets=ev.podsets,
        runtime=ev.runtime,
        checkpoint_every=ev.checkpoint_every,
        seq=state.submitted,
        order_seq=state.places,
        submitted_at=ev.at,
        pods=ev.pods,
        requests=_podset_requests(ev.podsets),
        source=ev.source,
        max_runtime=ev.max_runtime,
        controller=ev.controller or None,
    )
    state.dirty_jobs.add(ev.job)
    return state


def _on_admitted(state: ClusterState, ev: JobAdmitted) -> ClusterState:
    if _fenced(state, ev.epoch):
        return state
    job = state.jobs.get(ev.job)
    if job is None or job.status != "pending":
        return skip(state)
    nodes = state.nodes
    # a placement that is not exactly the submitted gang is invalid, however large the claim
    if not _placement_matches(job.podsets, ev.placement):
        return skip(state)
    groups = node_pods(job.podsets, ev.placement)
    if any(g[0] not in nodes for g in groups):
        return skip(state)
    for node_name, pods, req in groups:
        _occupy(state, job.id, node_name, pods, req)
    if ev.flavors:
        job.flavors = {ps: dict(chosen) for ps, chosen in ev.flavors.items()}
        job.requests = flavored_requests(job.podsets, job.flavors)
    queue = state.queues.get(job.queue)
    if queue is not None:
        usage = queue.usage
        was_borrowing = _borrowing(queue)
        moved = state.queue_consumed.setdefault(job.queue, {})
        for k, v in job.requests.items():
            usage[k] = usage.get(k, 0) + v
            moved[k] = moved.get(k, 0) + v
        if not was_borrowing and _borrowing(queue):
            state.borrow_starts[job.queue] = state.borrow_starts.get(job.queue, 0) + 1
        state.dirty_queues.add(job.queue)
    job.status = "admitted"
    job.placement = dict(ev.placement)
    job.borrowed = dict(ev.borrowed)
    job.admitted_at = ev.at
    if job.first_admitted_at is None:
        job.first_admitted_at = ev.at
    job.reason = ""
    job.utilization = None
    job.idle_since = None
    job.nominated = False
    job.evicted_by = None
    job.idle_reclaimed_at = None
    _count_decision(state, ev.cycle)
    state.dirty_jobs.add(job.id)
    _reservation_moved(state, job.id)
    return state


def _on_preempted(state: ClusterState, ev: JobPreempted) -> ClusterState:
    if _fenced(state, ev.epoch):
        return state
    job = state.jobs.get(ev.job)
    if job is None or job.status != "admitted":
        return skip(state)
    saved = job.saved_progress(ev.at)
    _release(state, job)
    job.work_done = saved
    job.status = "pending"
    job.admitted_at = None
    job.started_at = None
    job.preemptions += 1
    job.reason = ""
    job.evicted_by = ev.preemptor
    job.preempted_at = ev.at
    if ev.reason == "IdleReclaim":
        # it loses its place: behind the jobs waiting now, whom its room was reclaimed for (spec,
        # Idle reclamation); with its old place it would take the room back in the next cycle
        state.places += 1
        job.order_seq = state.places
        job.idle_reclaimed_at = ev.at
    if ev.preemptor is not None:
        preemptor = state.jobs.get(ev.preemptor)
        if preemptor is not None and preemptor.status == "pending":
            preemptor.nominated = True
            # its next failure, if any, is written down even if the words are the same
            preemptor.reason = ""
            state.dirty_jobs.add(preemptor.id)
    _count_decision(state, ev.cycle)
    return state


def _end(state: ClusterState, job_id: str, at: int, status: JobStatus, reason: str = "") -> ClusterState:
    job = state.jobs.get(job_id)
    if job is None or job.status in TERMINAL:
        return skip(state)
    if job.status == "admitted":
        if job.admitted_at is not None:
            job.work_done = job.progress(at) if job.runtime is None else min(job.runtime, job.progress(at))
        _release(state, job)
    _reservation_moved(state, job_id)
    job.status = status
    job.finished_at = at
    job.admitted_at = None
    if reason:
        job.reason = reason
    state.dirty_jobs.add(job_id)
    return state


def _on_utilization(state: ClusterState, ev: GpuUtilizationSampled) -> ClusterState:
    job = state.jobs.get(ev.job)
    if job is None or job.status != "admitted":
        return skip(state)
    threshold = state.idle_reclaim.threshold if state.idle_reclaim is not None else DEFAULT_IDLE_THRESHOLD
    job.utilization = ev.gpu
    if ev.gpu <= threshold:
        if job.idle_since is None:
            job.idle_since = ev.at
    else:
        job.idle_since = None
    return state


def _on_started(state: ClusterState, ev: JobStarted) -> ClusterState:
    job = state.jobs.get(ev.job)
    if job is None or job.status != "admitted":
        return skip(state)
    job.started_at = ev.at
    return state


def _on_inadmissible(state: ClusterState, ev: JobInadmissible) -> ClusterState:
    if _fenced(state, ev.epoch):
        return state
    job = state.jobs.get(ev.job)
    if job is None or job.status != "pending":
        return skip(state)
    job.reason = ev.reason
    job.nominated = False
    _count_decision(state, ev.cycle)
    return state


def _on_rejected(state: ClusterState, ev: JobRejected) -> ClusterState:
    if _fenced(state, ev.epoch):
        return state
    _count_decision(state, ev.cycle)
    return _end(state, ev.job, ev.at, "rejected", ev.reason)


def _on_submission_rejected(state: ClusterState, ev: SubmissionRejected) -> ClusterState:
    if _fenced(state, ev.epoch):
        return state
    for i, r in enumerate(state.refused):
        if r.job == ev.job and r.queue == ev.queue:
            del state.refused[i]
            _count_decision(state, ev.cycle)
            return state
    return skip(state)


def _on_leader(state: ClusterState, ev: LeaderElected) -> ClusterState:
    if not newer_leader(ev.epoch, state.epoch):
        return skip(state)
    state.epoch = ev.epoch
    state.leader = ev.holder
    # a new leader starts with a fresh scheduler index (nothing parked), and so does every reader
    # of the log at this point (an audit, a replay): their parking memos, and so the `CycleSettled`
    # records they write or re-derive, have the same history
    state.structure += 1
    return state


def _on_finished(state: ClusterState, ev: JobFinished) -> ClusterState:
    return _end(state, ev.job, ev.at, "finished")


def _on_failed(state: ClusterState, ev: JobFailed) -> ClusterState:
    return _end(state, ev.job, ev.at, "failed", ev.reason)


def foreign_control(state: ClusterState, ev: JobCancelled | JobHeld | JobReleased) -> str | None:
    """Why a user's control event does not count: it names a queue that is not its job's (None if it counts).

    A queue's identity may publish control events on its own queue's subjects
    only (`events.subjects`), naming any job; this is the other half of the
    rule, kept in the fold so replay, audit and every leader ignore the same
    events. The daemon's own cancellations and older logs name no queue.
    """
    if ev.queue is None:
        return None
    job = state.jobs.get(ev.job)
    if job is None or job.queue == ev.queue:
        return None
    return (
        f"{type(ev).__name__} from queue {ev.queue} for a job of queue {job.queue}: a queue controls its own jobs only"
    )


def _on_cancelled(state: ClusterState, ev: JobCancelled) -> ClusterState:
    if foreign_control(state, ev) is not None:
        return skip(state)
    return _end(state, ev.job, ev.at, "cancelled", ev.reason)


def _on_held(state: ClusterState, ev: JobHeld) -> ClusterState:
    job = state.jobs.get(ev.job)
    if job is None or job.status != "pending" or job.held or foreign_control(state, ev) is not None:
        return skip(state)
    job.held = True
    state.dirty_jobs.add(job.id)
    _reservation_moved(state, job.id)
    return state


def _on_released(state: ClusterState, ev: JobReleased) -> ClusterState:
    job = state.jobs.get(ev.job)
    if job is None or not job.held or foreign_control(state, ev) is not None:
        return skip(state)
    job.held = False
    state.dirty_jobs.add(job.id)  # the index validates and tries it like a new submission
    _reservation_moved(state, job.id)
    return state


def _on_reservation_made(state: ClusterState, ev: ReservationMade) -> ClusterState:
    if _fenced(state, ev.epoch):
        return state
    job = state.jobs.get(ev.job)
    if job is None or job.status != "pending" or ev.job in state.reservations:
        return skip(state)
    state.reservations[ev.job] = reservation_of(ev)
    # no rebuild: held room only shrinks what others see, so every verdict parked before stands
    _count_decision(state, ev.cycle)
    return state


def _on_reservation_released(state: ClusterState, ev: ReservationReleased) -> ClusterState:
    if _fenced(state, ev.epoch):
        return state
    res = state.reservations.pop(ev.job, None)
    if res is None:
        return skip(state)
    _room_opened(state, res)
    _count_decision(state, ev.cycle)
    return state


def _on_settled(state: ClusterState, ev: CycleSettled) -> ClusterState:
    """A cycle that decided nothing judged jobs: count it, so the memo keeps its parks (`parking`).

    It takes no cycle number (`_count_decision`): the cycles that decide keep the numbers they had."""
    if _fenced(state, ev.epoch):
        return state
    state.settles += 1
    return state


_HANDLERS: dict[type[Event], object] = {
    JobSubmitted: _on_submitted,
    JobAdmitted: _on_admitted,
    JobPreempted: _on_preempted,
    JobFinished: _on_finished,
    JobFailed: _on_failed,
    JobCancelled: _on_cancelled,
    JobHeld: _on_held,
    JobReleased: _on_released,
    JobStarted: _on_started,
    JobInadmissible: _on_inadmissible,
    JobRejected: _on_rejected,
    SubmissionRejected: _on_submission_rejected,
    ReservationMade: _on_reservation_made,
    ReservationReleased: _on_reservation_released,
    CycleSettled: _on_settled,
    GpuUtilizationSampled: _on_utilization,
    LeaderElected: _on_leader,
    **configuration.HANDLERS,
    NodeAdded: _on_node,
    NodeUpdated: _on_node,
}


def evolve(state: ClusterState, event: AnyEvent | Event) -> ClusterState:
    """Apply one event to the state (in place) and return it."""
    handler = _HANDLERS.get(type(event))
    state.applied += 1
    if handler is None:
        return skip(state)
    if event.at > state.now:
        state.now = event.at
    result: ClusterState = handler(state, event)  # type: ignore[operator]
    return result


def fold(events: list[AnyEvent] | list[Event], state: ClusterState | None = None) -> ClusterState:
    """Fold a sequence of events into a (new, unless given) state."""
    s = state if state is not None else ClusterState()
    for ev in events:
        evolve(s, ev)
    return s
