"""The design invariants as checks over a log: what fault tests and `bench/reliability.py` assert.

Role: audit tooling. Given a log (events in stream order, with or without
their sequences) and optionally what the outside world saw (the job ids
whose submissions were acknowledged, the message ids stored, the bindings
Kubernetes applied), `check_log` returns every place the log breaks one of
design.md's invariants. Pure: no I/O, no clock; it keeps its own shadow
state and does not use `evolve`, so a bug in the fold cannot hide one here.

Checks (the `check` of a `Violation`):
- `jobs`: every acknowledged submission is on the log exactly once and is
  pending, running or ended. (A gang's end reported twice is a fact, not a
  decision, and the fold ignores it: a note, counted in `duplicate_facts`.)
- `bindings`: no Kubernetes pod is bound twice or to two nodes, none is held
  by two running jobs, and every binding is one an effective admission asked for.
- `nodes`: an admission places pods only on existing, schedulable nodes and
  takes none over capacity (capacity minus what other schedulers reserved).
- `queues`: no queue is over nominal + borrowing limit (nominal alone without
  a cohort) after an admission into it.
- `lending`: no cohort tree lends more than its queues' lending limits allow.
- `decisions`: no job is admitted while running, preempted while not running,
  rejected after it ended; no decision or message id is stored twice; no two
  leaders claim one epoch.
- `gangs`: an admission places every pod of the gang, and (once the cluster
  settled) a running gang is bound whole or not at all.

A decision of an epoch older than the last `LeaderElected` is fenced: it takes
no effect (`projections.fencing`, as in the fold) and is only counted. "A resource a queue does not
name has no quota limit" (spec/scenario.md): such resources are not checked.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from muster.events.codec import encode
from muster.events.types import (
    DECISION_TYPES,
    CohortConfigured,
    CycleSettled,
    Event,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobInadmissible,
    JobPreempted,
    JobRejected,
    JobSubmitted,
    LeaderElected,
    NodeAdded,
    NodeCordoned,
    NodeRemoved,
    NodeUpdated,
    QueueConfigured,
)
from muster.projections.fencing import fenced, newer_leader

__all__ = ["CHECKS", "Binding", "Checker", "Report", "Violation", "check_log"]

CHECKS = ("jobs", "bindings", "nodes", "queues", "lending", "decisions", "gangs")

_ENDED = ("finished", "failed", "cancelled", "rejected")


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which check, where on the log (sequence), about which job, and what."""

    check: str
    seq: int
    job: str
    message: str

    def __str__(self) -> str:
        return f"[{self.check}] seq {self.seq}: {self.message}"


@dataclass(frozen=True)
class Binding:
    """A binding Kubernetes applied: `pod` identifies the pod object (its uid, or namespace/name).

    With `job` and `gang_pod` (the `PODSET-INDEX` name), the binding is also
    checked against the admissions of that job.
    """

    pod: str
    node: str
    job: str | None = None
    gang_pod: str | None = None


@dataclass
class _Node:
    capacity: dict[str, int]
    reserved: dict[str, int]
    ready: bool = True
    unschedulable: bool = False
    cordoned: bool = False

    @property
    def schedulable(self) -> bool:
        return self.ready and not self.unschedulable and not self.cordoned


@dataclass
class _Job:
    queue: str
    pod_requests: dict[str, dict[str, int]]
    """Gang pod name -> its requests."""
    k8s_pods: dict[str, str]
    requests: dict[str, int]
    raw: bytes
    status: str = "pending"
    placement: dict[str, str] = field(default_factory=dict)
    admitted: list[dict[str, str]] = field(default_factory=list)
    """Placements of every effective admission, in order."""


@dataclass
class Report:
    """What `check_log` found."""

    violations: list[Violation]
    status: dict[str, str]
    """Job id -> pending, running, finished, failed, cancelled or rejected."""
    events: int
    decisions: int
    fenced: int
    notes: list[str]
    """Things that are odd but break no invariant (a job id reused, an end for an unknown job...)."""
    duplicate_facts: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_check(self) -> dict[str, int]:
        counts = Counter(v.check for v in self.violations)
        return {c: counts.get(c, 0) for c in CHECKS}

    def summary(self) -> str:
        states = Counter(self.status.values())
        jobs = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        head = f"{self.events} events, {self.decisions} decisions ({self.fenced} fenced), jobs: {jobs or 'none'}"
        if self.ok:
            return f"{head}; no violation"
        lines = [f"{head}; {len(self.violations)} violation(s):", *(f"  {v}" for v in self.violations[:20])]
        if len(self.violations) > 20:
            lines.append(f"  ... and {len(self.violations) - 20} more")
        return "\n".join(lines)


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _over(capacity: dict[str, int], reserved: dict[str, int], used: dict[str, int], only: Iterable[str]) -> str | None:
    for r in sorted(set(only)):
        have = capacity.get(r, 0) - reserved.get(r, 0)
        if used.get(r, 0) > have:
            return f"{r} {used.get(r, 0)} used of {have}"
    return None


class Checker:
    """Feed events in log order (`feed`), then ask for a `report`. Incremental, so long runs check as they go."""

    def __init__(self) -> None:
        self.violations: list[Violation] = []
        self.notes: list[str] = []
        self.events = 0
        self.duplicate_facts = 0
        """End facts (JobFinished/JobFailed) repeated for a job that had already ended."""
        self.decisions = 0
        self.fenced = 0
        self.epoch = 0
        self.epoch_holder: dict[int, str] = {}
        self.nodes: dict[str, _Node] = {}
        self.used: dict[str, dict[str, int]] = {}
        self.queues: dict[str, QueueConfigured] = {}
        self.cohorts: dict[str, str | None] = {}
        self.usage: dict[str, dict[str, int]] = {}
        self.jobs: dict[str, _Job] = {}
        self.holders: dict[str, str] = {}
        """Kubernetes pod -> the running job that holds it."""
        self._seen_decisions: dict[bytes, int] = {}
        self._seen_ids: dict[str, int] = {}
        self._last_seq = 0

    # ------------------------------------------------------------ input

    def feed(self, event: Event, seq: int | None = None, msg_id: str | None = None) -> None:
        """Check one event; `seq` defaults to its position (1-based), `msg_id` to none."""
        self.events += 1
        seq = seq if seq is not None else self._last_seq + 1
        self._last_seq = seq
        if msg_id is not None:
            first = self._seen_ids.get(msg_id)
            if first is not None:
                self._fail("decisions", seq, "", f"message id {msg_id!r} stored twice (first at seq {first})")
            else:
                self._seen_ids[msg_id] = seq
        if isinstance(event, DECISION_TYPES):
            self._decision(event, seq)
            return
        match event:
            case JobSubmitted():
                self._submitted(event, seq)
            case JobFinished() | JobFailed() | JobCancelled():
                self._ended(event, seq)
            case NodeAdded() | NodeUpdated():
                old = self.nodes.get(event.node)
                self.nodes[event.node] = _Node(
                    dict(event.capacity),
                    dict(event.reserved),
                    event.ready,
                    event.unschedulable,
                    old.cordoned if old is not None else False,
                )
            case NodeRemoved():
                self.nodes.pop(event.node, None)
            case NodeCordoned():
                node = self.nodes.get(event.node)
                if node is not None:
                    node.cordoned = event.cordoned
            case QueueConfigured():
                self.queues[event.name] = event
            case CohortConfigured():
                self.cohorts[event.name] = event.parent
            case LeaderElected():
                holder = self.epoch_holder.get(event.epoch)
                if holder is not None and holder != event.holder:
                    self._fail(
                        "decisions", seq, "", f"{event.holder} claims epoch {event.epoch}, already held by {holder}"
                    )
                self.epoch_holder.setdefault(event.epoch, event.holder)
                if newer_leader(event.epoch, self.epoch):
                    self.epoch = event.epoch

    def feed_all(self, log: Iterable[Event | tuple[int, Event]], msg_ids: Sequence[str] | None = None) -> None:
        for i, item in enumerate(log):
            seq, event = item if isinstance(item, tuple) else (None, item)
            self.feed(event, seq, msg_ids[i] if msg_ids is not None else None)

    def _fail(self, check: str, seq: int, job: str, message: str) -> None:
        self.violations.append(Violation(check, seq, job, message))

    # ------------------------------------------------------------ jobs

    def _submitted(self, ev: JobSubmitted, seq: int) -> None:
        raw = encode(ev)
        old = self.jobs.get(ev.job)
        if old is not None:
            if old.raw == raw:
                self._fail("jobs", seq, ev.job, f"job {ev.job} submitted twice (the same submission stored twice)")
            else:
                self.notes.append(f"seq {seq}: job id {ev.job} reused by another submission (ignored)")
            return
        pod_requests = {f"{ps.name}-{i}": ps.requests for ps in ev.podsets for i in range(ps.count)}
        requests: dict[str, int] = {}
        for ps in ev.podsets:
            for r, v in ps.requests.items():
                requests[r] = requests.get(r, 0) + v * ps.count
        self.jobs[ev.job] = _Job(ev.queue, pod_requests, dict(ev.pods), requests, raw)

    def _ended(self, ev: JobFinished | JobFailed | JobCancelled, seq: int) -> None:
        job = self.jobs.get(ev.job)
        if job is None:
            self.notes.append(f"seq {seq}: {type(ev).__name__} for unknown job {ev.job}")
            return
        if job.status in _ENDED:
            if not isinstance(ev, JobCancelled) and job.status in ("finished", "failed"):
                # a fact reported twice (two replicas' adapters): the fold ignores it; not a decision, so a note
                self.notes.append(f"seq {seq}: job {ev.job} ended twice ({job.status}, then {type(ev).__name__})")
                self.duplicate_facts += 1
            return
        self._release(ev.job, job)
        job.status = {JobFinished: "finished", JobFailed: "failed", JobCancelled: "cancelled"}[type(ev)]

    # ------------------------------------------------------------ decisions

    def _decision(self, ev: Event, seq: int) -> None:
        self.decisions += 1
        digest = _digest(encode(ev))
        first = self._seen_decisions.get(digest)
        job_id: str = getattr(ev, "job", "")
        if first is not None:
            self._fail("decisions", seq, job_id, f"{type(ev).__name__} of {job_id} stored twice (first at seq {first})")
            return
        self._seen_decisions[digest] = seq
        if fenced(getattr(ev, "epoch", 0), self.epoch):
            self.fenced += 1
            return
        if isinstance(ev, CycleSettled):
            return  # it changes no job (the memo's verdicts stand)
        job = self.jobs.get(job_id)
        if job is None:
            self._fail("decisions", seq, job_id, f"{type(ev).__name__} of {job_id}, which was never submitted")
            return
        match ev:
            case JobAdmitted():
                self._admitted(ev, job, seq)
            case JobPreempted():
                if job.status != "running":
                    self._fail("decisions", seq, job_id, f"{job_id} preempted while {job.status}")
                    return
                self._release(job_id, job)
                job.status = "pending"
            case JobRejected():
                if job.status in _ENDED:
                    self._fail("decisions", seq, job_id, f"{job_id} rejected after it was {job.status}")
                    return
                self._release(job_id, job)
                job.status = "rejected"
            case JobInadmissible():
                if job.status != "pending":
                    self._fail("decisions", seq, job_id, f"{job_id} called inadmissible while {job.status}")

    def _admitted(self, ev: JobAdmitted, job: _Job, seq: int) -> None:
        jid = ev.job
        if job.status != "pending":
            self._fail("decisions", seq, jid, f"{jid} admitted while {job.status} (no preemption or end in between)")
            return
        if set(ev.placement) != set(job.pod_requests):
            missing = sorted(set(job.pod_requests) - set(ev.placement))
            extra = sorted(set(ev.placement) - set(job.pod_requests))
            self._fail(
                "gangs", seq, jid, f"{jid} admitted with a partial placement (missing {missing}, unknown {extra})"
            )
            return
        if ev.queue != job.queue:
            self._fail("queues", seq, jid, f"{jid} of queue {job.queue} admitted into queue {ev.queue}")
        unknown = sorted({n for n in ev.placement.values() if n not in self.nodes})
        if unknown:
            self._fail("nodes", seq, jid, f"{jid} placed on nodes that do not exist: {unknown}")
            return
        # take the room, then look at each node touched
        touched: dict[str, set[str]] = {}
        for pod, target in ev.placement.items():
            used = self.used.setdefault(target, {})
            for r, v in job.pod_requests[pod].items():
                used[r] = used.get(r, 0) + v
                if v > 0:
                    touched.setdefault(target, set()).add(r)
        for node_name in sorted(touched):
            node = self.nodes[node_name]
            if not node.schedulable:
                why = "not ready" if not node.ready else "cordoned" if node.cordoned else "unschedulable"
                self._fail("nodes", seq, jid, f"{jid} placed on {node_name}, which is {why}")
            over = _over(node.capacity, node.reserved, self.used[node_name], touched[node_name])
            if over is not None:
                self._fail("nodes", seq, jid, f"{node_name} over capacity after admitting {jid}: {over}")
        self._take_queue(jid, job, seq)
        for pod, key in sorted(job.k8s_pods.items()):
            holder = self.holders.get(key)
            if holder is not None and holder != jid:
                self._fail("bindings", seq, jid, f"pod {key} ({pod} of {jid}) is already held by running job {holder}")
            self.holders[key] = jid
        job.status = "running"
        job.placement = dict(ev.placement)
        job.admitted.append(job.placement)

    def _take_queue(self, jid: str, job: _Job, seq: int) -> None:
        queue = self.queues.get(job.queue)
        if queue is None:
            self._fail("queues", seq, jid, f"{jid} admitted into queue {job.queue}, which does not exist")
            return
        before = {r: self._tree_excess(job.queue, r) for r in job.requests}
        usage = self.usage.setdefault(job.queue, {})
        for r, v in job.requests.items():
            usage[r] = usage.get(r, 0) + v
        for r in sorted(job.requests):
            if job.requests[r] <= 0 or r not in queue.nominal:
                continue
            limit = queue.nominal[r]
            what = "nominal"
            if queue.cohort is not None:
                if queue.borrowing_limit is None or r not in queue.borrowing_limit:
                    limit = -1
                else:
                    limit += queue.borrowing_limit[r]
                    what = "nominal + borrowing limit"
            if limit >= 0 and usage[r] > limit:
                self._fail("queues", seq, jid, f"queue {job.queue} uses {r} {usage[r]}, over its {what} {limit}")
            excess = self._tree_excess(job.queue, r)
            if queue.cohort is not None and excess > max(0, before[r]):
                self._fail(
                    "lending",
                    seq,
                    jid,
                    f"cohort of {job.queue} lends {excess} {r} beyond its lending limits after admitting {jid}",
                )

    def _root(self, queue: str) -> str | None:
        q = self.queues.get(queue)
        if q is None or q.cohort is None:
            return None
        name: str = q.cohort
        seen = {name}
        while (parent := self.cohorts.get(name)) is not None and parent not in seen:
            seen.add(parent)
            name = parent
        return name

    def _tree_excess(self, queue: str, r: str) -> int:
        """How far the borrowers of the queue's cohort tree are beyond what its queues may lend (> 0 is a breach)."""
        root = self._root(queue)
        if root is None:
            return 0
        borrowed = lendable = 0
        for name, q in self.queues.items():
            if r not in q.nominal or self._root(name) != root:
                continue
            nominal = q.nominal[r]
            guaranteed = 0
            if q.lending_limit is not None and r in q.lending_limit:
                guaranteed = max(0, nominal - q.lending_limit[r])
            borrowed += max(0, self.usage.get(name, {}).get(r, 0) - guaranteed)
            lendable += nominal - guaranteed
        return borrowed - lendable

    def _release(self, jid: str, job: _Job) -> None:
        if job.status != "running":
            return
        for pod, node in job.placement.items():
            used = self.used.get(node, {})
            for r, v in job.pod_requests[pod].items():
                used[r] = used.get(r, 0) - v
        usage = self.usage.setdefault(job.queue, {})
        for r, v in job.requests.items():
            usage[r] = usage.get(r, 0) - v
        for key in job.k8s_pods.values():
            if self.holders.get(key) == jid:
                del self.holders[key]
        job.placement = {}

    # ------------------------------------------------------------ the outside world

    def report(
        self,
        *,
        submitted: Iterable[str] | None = None,
        bindings: Iterable[Binding] | None = None,
        settled: bool = False,
    ) -> Report:
        """The violations so far, plus those against what the world saw.

        `submitted`: job ids whose submission was acknowledged (each must be on
        the log). `bindings`: every successful binding Kubernetes applied.
        `settled`: the cluster had time to apply every decision, so a running
        gang with some pods bound must have all of them bound.
        """
        violations = list(self.violations)
        seq = self._last_seq
        if submitted is not None:
            for job_id in sorted(set(submitted)):
                if job_id not in self.jobs:
                    violations.append(
                        Violation("jobs", seq, job_id, f"job {job_id} was submitted but is not on the log")
                    )
        if bindings is not None:
            violations.extend(self._check_bindings(list(bindings), settled, seq))
        status = {j: job.status for j, job in sorted(self.jobs.items())}
        return Report(
            violations, status, self.events, self.decisions, self.fenced, list(self.notes), self.duplicate_facts
        )

    def _check_bindings(self, bindings: list[Binding], settled: bool, seq: int) -> list[Violation]:
        out: list[Violation] = []
        nodes_of: dict[str, list[str]] = {}
        bound_gang_pods: dict[str, set[str]] = {}
        for b in bindings:
            nodes_of.setdefault(b.pod, []).append(b.node)
            if b.job is None or b.gang_pod is None:
                continue
            bound_gang_pods.setdefault(b.job, set()).add(b.gang_pod)
            job = self.jobs.get(b.job)
            allowed = {p.get(b.gang_pod) for p in job.admitted} if job is not None else set()
            if b.node not in allowed:
                out.append(
                    Violation(
                        "bindings",
                        seq,
                        b.job,
                        f"pod {b.pod} ({b.gang_pod} of {b.job}) bound to {b.node}, which no effective admission chose",
                    )
                )
        for pod, nodes in sorted(nodes_of.items()):
            if len(nodes) > 1:
                where = "to two nodes" if len(set(nodes)) > 1 else "twice"
                out.append(Violation("bindings", seq, "", f"pod {pod} bound {where}: {', '.join(nodes)}"))
        if settled:
            for job_id, pods in sorted(bound_gang_pods.items()):
                job = self.jobs.get(job_id)
                if job is not None and job.status == "running" and pods != set(job.placement):
                    missing = sorted(set(job.placement) - pods)
                    out.append(Violation("gangs", seq, job_id, f"running gang {job_id} is partly bound: {missing} not"))
        return out


def check_log(
    log: Iterable[Event | tuple[int, Event]],
    *,
    submitted: Iterable[str] | None = None,
    msg_ids: Sequence[str] | None = None,
    bindings: Iterable[Binding] | None = None,
    settled: bool = False,
) -> Report:
    """Check a whole log (events, or `(seq, event)` pairs such as `StoredEvent`s); see `Checker.report`."""
    checker = Checker()
    checker.feed_all(log, msg_ids)
    return checker.report(submitted=submitted, bindings=bindings, settled=settled)
