"""`muster explain JOB [--at POINT]`: a job's story from the log, one line per event.

Submitted, each reason it waited (with the numbers that blocked it),
admitted where and on whose borrowed quota, preempted by whom and why with
the work lost, requeued, finished. For a job still pending: its position in
its queue and what would have to change for it to run. Exit status 2 when
the log has no such job.
"""

from __future__ import annotations

import argparse
from typing import IO, Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    from muster.replay.cliargs import POINT_HELP, add_common, add_scope_argument

    p.add_argument("job", help="job id, short name or unique prefix")
    p.add_argument("--at", metavar="POINT", default="end", help=f"tell the story up to: {POINT_HELP} (default)")
    add_common(p, snapshots=False)
    add_scope_argument(p)


def run(args: argparse.Namespace) -> int:
    import sys

    from muster.replay.cliutil import point_arg, point_reader, run_command

    async def body(source: Any, store: Any) -> int:
        from muster.replay.cliutil import emit
        from muster.replay.explain import explain

        point = point_arg(args.at, "--at")
        source = await point_reader(source, point, "--at")
        story, now = await explain(source, args.job, point)
        if story.status == "unknown":
            # not a full id: a short name or prefix (the state says which job, or lists candidates)
            from muster.replay.cliutil import open_snapshots
            from muster.replay.jobnames import NameProblem, resolve
            from muster.replay.rebuild import state_at

            snapshots = await open_snapshots(args, source, store)
            replayed = await state_at(source, point, snapshots)
            try:
                found = resolve(args.job, replayed.state.jobs)
            except NameProblem as exc:
                later = None if point.is_end else await _submitted_later(source, args.job, snapshots)
                if later is not None:
                    job, submitted_at = later
                    where = f"{point.text} in {source.name}"
                    print(f"muster explain: {not_yet_submitted(job, where, submitted_at)}", file=sys.stderr)
                    return 2
                print(f"muster explain: {exc} in {source.name} up to {point.text}", file=sys.stderr)
                return 2
            print(f"muster explain: {found.note}", file=sys.stderr)
            story, now = await explain(source, found.job, point)
        if args.output != "table":
            doc = document(story, now)
            emit(args.output, doc, doc["story"])
        else:
            render(story, now)
        return 0

    code: int = run_command(args, body, "explain")
    return code


def not_yet_submitted(job: str, at: str, submitted_at: int) -> str:
    """What a story asked for at a point (`at`) before the job's submission says, in `explain` and on the
    dashboard: that it was not yet submitted, and when it was (not that there is no such job)."""
    from muster.replay.points import Clock

    return f"{job} was not yet submitted at {at}: it was submitted at {Clock.for_log(submitted_at).at(submitted_at)}"


async def _submitted_later(source: Any, typed: str, snapshots: Any) -> tuple[str, int] | None:
    """The job `typed` names and when it was submitted, when the point does not hold it but the log
    does, later (a point before a job's submission is no reason to say there is no such job)."""
    from muster.replay.jobnames import NameProblem, resolve
    from muster.replay.points import END
    from muster.replay.rebuild import state_at

    jobs = (await state_at(source, END, snapshots)).state.jobs
    try:
        found = resolve(typed, jobs)
    except NameProblem:
        return None
    return found.job, jobs[found.job].submitted_at


def document(story: Any, now: int) -> dict[str, Any]:
    from muster.replay.points import Clock

    clock = Clock.for_log(now)
    return {
        "job": story.job,
        "status": story.status,
        "queue": story.queue,
        "summary": story.summary,
        "as_of": now,
        "story": [
            {"seq": ln.seq, "at": ln.at, "at_local": clock.iso(ln.at), "kind": ln.kind, "text": ln.text, **ln.data}
            for ln in story.lines
        ],
        "pending": story.pending,
    }


def render(story: Any, now: int, out: IO[str] | None = None) -> None:
    import time

    from rich.table import Table

    from muster.replay.cliutil import add_row, console
    from muster.replay.points import Clock, duration

    con = console(out)
    clock = Clock.for_log(now, int(time.time()))
    s = story.summary
    con.print(
        f"[bold]{story.job}[/bold] · queue {story.queue} · {s.get('gpus', 0)} GPUs ({s.get('shape', '-')}) · "
        f"priority {s.get('priority_class') or 'lowest'} ({s.get('priority')}) · "
        f"[bold]{story.status}[/bold] as of {clock.when(now)}",
        highlight=False,
    )
    t = Table(show_header=True, box=None, pad_edge=False)
    t.add_column("seq", justify="right")
    t.add_column("time")
    t.add_column("since submit", justify="right")
    t.add_column("what happened", overflow="fold")
    start = s.get("submitted_at")
    for ln in story.lines:
        since = f"+{duration(ln.at - start)}" if start is not None else ""
        add_row(t, str(ln.seq), clock.at(ln.at), since, ln.text)
    con.print(t)
    p = story.pending
    if p is not None:
        # since it last became pending: a requeued job's run before its preemption was no wait
        since = s.get("pending_since", start)
        waited = f"waiting {duration(now - since)}" if since is not None else "waiting"
        if since is not None and start is not None and since != start:
            waited += f" since it was requeued ({duration(now - start)} since submission)"
        ahead = ", ".join(f"{a['job']} ({a['gpus']} GPUs)" for a in p["ahead"][:8])
        more = f" and {len(p['ahead']) - 8} more" if len(p["ahead"]) > 8 else ""
        con.print(
            f"\n[bold]Pending[/bold], {waited}: position {p['position']} of {p['queue_length']} in {story.queue}"
            + (f", behind {ahead}{more}" if ahead else ""),
            highlight=False,
        )
        con.print("What would have to change for it to run:", highlight=False)
        for c in p["what_would_have_to_change"]:
            con.print(f"  - {c}", highlight=False, markup=False)
