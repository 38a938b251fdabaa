"""`muster submit`: append a JobSubmitted (a gang) to the log, from flags or a YAML file.

    muster submit --queue team-a --pods 4 --gpus 8 --priority-class training --runtime 3600
    muster submit -f jobs.yaml            # one job, or a list, in the `submit` form of spec/scenario.md

A gang of `--pods` pods of `--gpus` GPUs each (plus `--cpu`/`--memory`), with
an optional topology (`--topology required:block`). The job id defaults to
`<queue>-<random>`. A job id the log already holds is refused (exit 2) with
its queue and state: the fold keeps an id's first submission and ignores any
later one. Each submission's msg id is `submit:<job>`, so a command retried
after a lost acknowledgement stores it once.

`--wait SECONDS` follows the log until the job is admitted or rejected and
prints the decision. This lives in the `muster` (CLI) package because it
reuses `muster.replay`'s reader of the submit form.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from muster.events.types import JobSubmitted


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from muster.adminconnect import add_nats_arguments
    from muster.replay.cliargs import add_output

    parser.add_argument(
        "-f", "--file", help="YAML: one job or a list of jobs (the `submit` fields of docs/spec/scenario.md)"
    )
    parser.add_argument("--job", help="job id (default: QUEUE-<random>)")
    parser.add_argument("--queue", help="the queue (required without --file)")
    parser.add_argument("--pods", type=int, default=1, help="pods in the gang (default 1)")
    parser.add_argument("--gpus", default="1", help="GPUs per pod (default 1)")
    parser.add_argument("--cpu", help="CPU per pod (e.g. 8 or 500m)")
    parser.add_argument("--memory", help="memory per pod (e.g. 64Gi)")
    parser.add_argument("--podset", default="worker", help="podset name (default worker)")
    parser.add_argument("--priority-class", help="priority class name")
    parser.add_argument("--runtime", type=int, help="seconds of work at full allocation")
    parser.add_argument("--checkpoint-every", type=int, help="seconds of work between checkpoints")
    parser.add_argument(
        "--max-runtime", type=int, metavar="SECONDS", help="declared time limit of one run (the cluster ends it there)"
    )
    parser.add_argument("--topology", help="required:LEVEL or preferred:LEVEL")
    parser.add_argument("--wait", type=float, metavar="SECONDS", help="wait for the admission (or rejection)")
    add_output(parser)
    add_nats_arguments(parser)


class UsageError(ValueError):
    pass


def from_flags(args: argparse.Namespace, at: int) -> JobSubmitted:
    import uuid

    from muster.events.types import JobId, JobSubmitted, PodSet, QueueName, Topology
    from muster.projections.resources import parse_quantity

    if not args.queue:
        raise UsageError("--queue is required (or give --file)")
    if args.pods < 1:
        raise UsageError("--pods must be at least 1")
    requests: dict[str, int] = {}
    try:
        for resource, value in (("gpu", args.gpus), ("cpu", args.cpu), ("memory", args.memory)):
            if value is not None:
                requests[resource] = parse_quantity(resource, value)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    topology = None
    if args.topology:
        kind, _, level = args.topology.partition(":")
        if kind not in ("required", "preferred") or not level:
            raise UsageError("--topology must be required:LEVEL or preferred:LEVEL")
        topology = Topology(**{kind: level})
    return JobSubmitted(
        at=at,
        job=JobId(args.job or f"{args.queue}-{uuid.uuid4().hex[:8]}"),
        queue=QueueName(args.queue),
        priority_class=args.priority_class,
        podsets=[PodSet(name=args.podset, count=args.pods, requests=requests, topology=topology)],
        runtime=args.runtime,
        checkpoint_every=args.checkpoint_every,
        source="muster submit",
        max_runtime=args.max_runtime,
    )


def from_file(path: str, at: int) -> list[JobSubmitted]:
    """Jobs of a YAML file in the scenario's `submit` form (raises ScenarioError naming file and line)."""
    import yaml

    from muster.events.types import JobId, JobSubmitted, QueueName
    from muster.replay.specreader import Reader, ScenarioError, yaml_problem
    from muster.replay.timelinespec import submit

    try:
        with open(path, encoding="utf-8") as f:
            root = yaml.compose(f, Loader=yaml.SafeLoader)
    except OSError as exc:
        raise ScenarioError(path, None, f"cannot read: {exc.strerror or exc}") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise ScenarioError(path, *yaml_problem(exc)) from None
    if root is None:
        raise ScenarioError(path, None, "no job in the file")
    reader = Reader(path)
    nodes = reader.seq(root, "jobs") if isinstance(root, yaml.SequenceNode) else [root]
    if not nodes:  # `[]`: as an empty file, nothing to submit is a mistake, not a success
        raise ScenarioError(path, None, "no job in the file")
    jobs = []
    for node in nodes:
        d: dict[str, Any] = submit(reader, node)
        if d.get("invalid"):
            print(f"muster submit: {path}: job {d['job']}: {d['invalid']} (it will be rejected)", file=sys.stderr)
        jobs.append(
            JobSubmitted(
                at=at,
                job=JobId(d["job"]),
                queue=QueueName(d["queue"]),
                priority_class=d["priority_class"],
                podsets=d["podsets"],
                runtime=d["runtime"],
                checkpoint_every=d["checkpoint_every"],
                source="muster submit",
                max_runtime=d["max_runtime"],
            )
        )
    return jobs


def _check_jobs(jobs: list[JobSubmitted]) -> None:
    """Refuse an id given twice, and a number muster cannot store (the core would reject the job)."""
    from muster.projections.validation import bounds_problem, max_runtime_problem

    seen: set[str] = set()
    for job in jobs:
        if job.job in seen:
            raise UsageError(f"job {job.job} appears twice (the log would keep only the first)")
        seen.add(job.job)
        problem = bounds_problem(job.podsets, job.runtime, job.checkpoint_every, job.max_runtime)
        problem = problem or max_runtime_problem(job.max_runtime)
        if problem is not None:
            raise UsageError(f"job {job.job}: {problem}")


def run(args: argparse.Namespace) -> int:
    import time

    import anyio

    from muster.replay.specreader import ScenarioError

    now = int(time.time())
    try:
        jobs = from_file(args.file, now) if args.file else [from_flags(args, now)]
        _check_jobs(jobs)
    except (ScenarioError, UsageError) as exc:
        print(f"muster submit: {exc}", file=sys.stderr)
        return 2
    from muster.adminconnect import CommandFailed

    try:
        code: int = anyio.run(_submit_all, args, jobs)
    except CommandFailed as exc:
        return exc.code
    return code


_STATES = {
    "JobAdmitted": "admitted",
    "JobStarted": "running",
    "JobPreempted": "preempted, pending again",
    "JobInadmissible": "pending",
    "JobRejected": "rejected",
    "JobFinished": "finished",
    "JobFailed": "failed",
    "JobCancelled": "cancelled",
    "JobHeld": "held",
    "GpuUtilizationSampled": "running",
}


async def existing_job(store: Any, job: str) -> str | None:
    """How the log already holds job id `job` (its queue, sequence and state), or None when it does not.

    The log keeps the first submission of an id and ignores later ones, so a reused id must be
    refused here. The subjects of submissions (`<prefix>.submit.<queue>.<job>`) are listed through
    stream info, which every identity may ask; the job's state is its latest decision or fact, read
    where the credentials allow it (a team's identity reads only its own submissions)."""
    import anyio
    import nats.errors
    from nats.js.errors import NotFoundError

    from muster.events.codec import DecodeError, decode
    from muster.events.store import StoreError, subject_token

    token = subject_token(job)
    info = await store.js.stream_info(store.stream, subjects_filter=f"{store.prefix}.submit.*.{token}")
    subjects = sorted(info.state.subjects or {})
    if not subjects:
        return None
    queue = subjects[0].split(".")[-2]
    what = f"submitted to queue {queue}"
    state = "state not readable with these credentials"
    with anyio.move_on_after(1.5):
        try:
            first = await store.js.get_msg(store.stream, subject=subjects[0], direct=True)
            what = f"submitted to queue {queue} at sequence {first.seq}"
            # a job's events are on its queue's subjects (`events.subjects.subject_for`), or on
            # job.<job> where their writer did not know the queue: the latest of them says the state
            latest = None
            for kind in (f"job.{queue}.{token}", f"control.{queue}.{token}", f"job.{token}"):
                try:
                    msg = await store.js.get_msg(store.stream, subject=f"{store.prefix}.{kind}", direct=True)
                except NotFoundError:
                    continue
                if latest is None or msg.seq > latest.seq:
                    latest = msg
            if latest is None:
                state = "pending, no decision yet"
            else:
                state = _STATES.get(type(decode(latest.data or b"")).__name__, "pending")
        except (nats.errors.Error, StoreError, DecodeError):
            pass
    return f"{what} ({state})"


async def _submit_all(args: argparse.Namespace, jobs: list[JobSubmitted]) -> int:
    import nats.errors

    from muster.adminconnect import open_store
    from muster.events.store import StoreError
    from muster.replay.cliutil import Report

    store = await open_store(args, command="submit", create=False)
    try:
        for job in jobs:
            try:
                taken = await existing_job(store, job.job)
            except nats.errors.Error as exc:
                print(f"muster submit: cannot check whether job id {job.job!r} is taken: {exc!r}", file=sys.stderr)
                return 1
            if taken is not None:
                print(f"muster submit: job id {job.job!r} is taken: {taken}; choose another --job", file=sys.stderr)
                return 2
        try:
            seqs = await store.append(jobs, msg_ids=[f"submit:{j.job}" for j in jobs])
        except StoreError as exc:
            print(f"muster submit: appending failed: {exc}", file=sys.stderr)
            return 1
        report = Report(args.output)
        try:
            return await _report(args, store, jobs, seqs, report)
        finally:
            report.close()
    finally:
        await store.close()


async def _report(args: argparse.Namespace, store: Any, jobs: list[JobSubmitted], seqs: list[int], report: Any) -> int:
    """Say what was appended and, with --wait, how the core decided."""
    import contextlib

    import anyio

    from muster.events.types import JobAdmitted, JobInadmissible, JobRejected

    for job, seq in zip(jobs, seqs, strict=True):
        report.say(f"submitted {job.job} to queue {job.queue} (sequence {seq})", job=job.job, queue=job.queue, seq=seq)
    if args.wait is None:
        return 0
    waiting = {j.job for j in jobs}
    rejected = False
    with anyio.move_on_after(args.wait):
        async with contextlib.aclosing(store.follow(min(seqs) + 1)) as events:
            async for stored in events:
                ev = stored.event
                if isinstance(ev, JobInadmissible) and ev.job in waiting:
                    report.say(f"waiting {ev.job}: {ev.reason}", job=ev.job, state="waiting", reason=ev.reason)
                if isinstance(ev, (JobAdmitted, JobRejected)) and ev.job in waiting:
                    waiting.discard(ev.job)
                    if isinstance(ev, JobAdmitted):
                        nodes = sorted(set(ev.placement.values()))
                        text = f"admitted {ev.job} on {len(nodes)} node(s): {', '.join(nodes)}"
                        report.say(text, job=ev.job, state="admitted", nodes=nodes)
                    else:
                        rejected = True
                        report.say(f"rejected {ev.job}: {ev.reason}", job=ev.job, state="rejected", reason=ev.reason)
                    if not waiting:
                        return 1 if rejected else 0
    print(f"muster submit: not decided within {args.wait:g} s: {', '.join(sorted(waiting))}", file=sys.stderr)
    return 1
