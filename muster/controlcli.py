"""`muster cancel|hold|release JOB...`: job control, as events on the log.

- `cancel` appends `JobCancelled` (reason `Cancelled: ...`): the core folds it (the job's quota
  and nodes are freed, a pending job leaves its queue) and the Kubernetes adapter stops the
  job's workload (`daemon/k8s/cancelling.py`).
- `hold` appends `JobHeld` for a pending job: the scheduler does not try it, and it keeps its
  place in its queue, until `release` appends `JobReleased`.

Each JOB is a full id, a short name or a unique prefix (`replay.jobnames`; live jobs are
preferred); the command says which job it chose. The event names the job's queue and goes on
that queue's control subject, so a team's own identity may append it (deploy/nats/accounts.conf);
with `--scope QUEUE` the command reads only what that identity may read. Every JOB is resolved and checked against
the folded state before anything is appended, so a typo appends nothing (exit 2). A
cancellation carries the msg id the daemon gives a job's end, so a cancel and the
adapter's own report of the same end are stored once.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from dataclasses import dataclass
from typing import Any

from muster.adminconnect import CommandFailed


@dataclass(frozen=True)
class Action:
    verb: str
    done: str
    allowed: frozenset[str]
    """Job states (`replay.status.job_state`) the action applies to."""
    refusal: str


ACTIONS = {
    "cancel": Action("cancel", "cancelled", frozenset({"pending", "held", "running"}), "it already ended"),
    "hold": Action("hold", "held", frozenset({"pending"}), "only a pending job can be held"),
    "release": Action("release", "released", frozenset({"held"}), "it is not held"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from muster.adminconnect import add_nats_arguments
    from muster.replay.cliargs import add_output, add_scope_argument

    p.add_argument("jobs", nargs="+", metavar="JOB", help="job id, short name or unique prefix")
    p.add_argument("--reason", default="", help="why (kept on the event; shown by explain)")
    add_scope_argument(p)
    add_output(p)
    add_nats_arguments(p)


def run(args: argparse.Namespace) -> int:
    import anyio

    try:
        code: int = anyio.run(_control, ACTIONS[args.command], args)
    except CommandFailed as exc:
        return exc.code
    return code


def event_for(action: Action, job: str, queue: str, at: int, reason: str) -> Any:
    """The action's event, naming the job's queue: it goes on that queue's control subject, which the
    queue's own identity may publish to, and counts only for a job of that queue (`foreign_control`)."""
    from muster.events.types import JobCancelled, JobHeld, JobId, JobReleased, QueueName

    q = QueueName(queue)
    if action.verb == "cancel":
        return JobCancelled(at=at, job=JobId(job), reason=f"Cancelled: {reason or 'by muster cancel'}", queue=q)
    if action.verb == "hold":
        return JobHeld(at=at, job=JobId(job), reason=reason, queue=q)
    return JobReleased(at=at, job=JobId(job), queue=q)


def msg_id(event: Any, last_seq: int) -> str:
    """A cancellation is the job's end (the daemon's id for it); a hold or release is one per log position."""
    from muster.daemon.msgids import fact_id

    end: str | None = fact_id(event)
    if end is not None:
        return end
    digest = hashlib.sha256(event.job.encode("utf-8", errors="surrogatepass")).hexdigest()[:32]
    return f"control:{type(event).__name__}:{digest}:{last_seq}"


async def _state(store: Any, scope: str | None) -> Any:
    """The folded state now: the whole log (from the newest snapshot), or with `scope` what that queue's
    own identity may read (`replay.source.QueueLog`: its jobs, from the start)."""
    from muster.replay.points import Point
    from muster.replay.rebuild import state_at
    from muster.replay.snapshots import Snapshots
    from muster.replay.snapshotstores import NatsSnapshots, default_bucket
    from muster.replay.source import NatsLog, QueueLog

    if scope is not None:
        return await state_at(QueueLog(store, scope), Point())
    source = NatsLog(store)
    backend = await NatsSnapshots.open(store.js, default_bucket(store.stream), create=False)
    return await state_at(source, Point(), Snapshots(backend, source) if backend is not None else None)


async def _control(action: Action, args: argparse.Namespace) -> int:
    import time

    from muster.adminconnect import open_store
    from muster.events.store import StoreError
    from muster.replay.cliutil import refusal_hint
    from muster.replay.jobnames import NameProblem, resolve
    from muster.replay.status import LIVE, job_state

    prog = f"muster {action.verb}"
    store = await open_store(args, command=action.verb, create=False)
    try:
        try:
            with store.refusals():
                replayed = await _state(store, args.scope)
        except StoreError as exc:
            print(f"{prog}: {exc}{refusal_hint(args, exc)}", file=sys.stderr)
            return 1
        jobs = replayed.state.jobs
        chosen: list[str] = []
        for typed in args.jobs:
            try:
                found = resolve(typed, jobs, preferred=lambda j: job_state(jobs[j]) in LIVE)
            except NameProblem as exc:
                print(f"{prog}: {exc}", file=sys.stderr)
                return 2
            st = job_state(jobs[found.job])
            if st not in action.allowed:
                print(f"{prog}: job {found.job} is {st}: {action.refusal}", file=sys.stderr)
                return 2
            if found.note is not None:
                print(f"{prog}: {found.note}", file=sys.stderr)
            if found.job not in chosen:
                chosen.append(found.job)
        now = int(time.time())
        events = [event_for(action, job, jobs[job].queue, now, args.reason) for job in chosen]
        try:
            seqs = await store.append(events, msg_ids=[msg_id(e, replayed.last_seq) for e in events])
        except StoreError as exc:
            print(f"{prog}: appending failed: {exc}", file=sys.stderr)
            return 1
    finally:
        await store.close()
    from muster.replay.cliutil import Report

    report = Report(args.output)
    for job, seq in zip(chosen, seqs, strict=True):
        report.say(f"{action.done} {job} (sequence {seq})", job=job, action=action.done, seq=seq)
    report.close()
    return 0
