"""What each dashboard page shows, as JSON-ready documents built from a `Moment` of the log.

Role: compose the existing read side, never re-derive it: queues, domains,
nodes and pending reasons come from `replay.views`, a job's story and what
it waits for from `replay.story` (rendered by `explaincli.document`),
fair share from the core's own `QuotaTree`, chargeback from
`projections.chargeback.build_report` and `hourly_series` over the billing
fold. What is added here is only layout: nodes grouped by topology domain
with the GPUs each gang holds on them, job search, the queue history, and the
hourly chart summed into at most `BARS` bars.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from muster.projections.chargeback import HourPoint, build_report, hourly_series
from muster.projections.cluster import node_pods
from muster.projections.ledger import HOUR, Usage, UsageKey
from muster.projections.quota import QuotaTree
from muster.projections.ratecard import RateCard
from muster.projections.resources import gpus_of
from muster.projections.state import TERMINAL, JobState
from muster.replay.explaincli import document as story_document
from muster.replay.heap import no_gc
from muster.replay.points import Clock, Point
from muster.replay.story import Storyteller
from muster.replay.views import (
    domain_rows,
    job_counts,
    job_shape,
    node_rows,
    pending_reason,
    queue_gpus_used,
    queue_rows,
)
from muster.ui.feed import Feed, Moment

JOB_ROWS = 200
"""Most rows a job search returns (the count says how many matched)."""
BARS = 168
"""Most bars of the chargeback's hourly chart (a week of hours; longer logs get several hours a bar)."""

_json = msgspec.json.Encoder(decimal_format="number")


def header(feed: Feed, moment: Moment) -> dict[str, Any]:
    """Where in the log a page stands, for every page's header and the time slider."""
    return {
        "seq": moment.seq,
        "last_seq": moment.last_seq,
        "live": moment.live,
        "at": moment.now,
        "epoch": Clock.for_log(moment.now).epoch,
        "ready": feed.ready.is_set(),
        "folded": feed.seq,
        "target": feed.target,
        "jobs": job_counts(moment.state),
        "queues": sorted(moment.state.queues),
    }


# ---------------------------------------------------------------- cluster


def _gpus_by_node(job: JobState) -> dict[str, int]:
    out: dict[str, int] = {}
    for node, pods, requests in node_pods(job.podsets, job.placement):
        out[node] = out.get(node, 0) + pods * requests.get("gpu", 0)
    return out


def cluster(moment: Moment) -> dict[str, Any]:
    """The topology map: domains of the innermost level, their nodes, and each gang's GPUs on each node."""
    state = moment.state
    levels = state.levels
    nodes: dict[str, list[dict[str, Any]]] = {}
    placed: dict[str, dict[str, int]] = {}
    gangs: dict[str, dict[str, Any]] = {}
    for row in node_rows(state):
        node = state.nodes[row["node"]]
        cells = []
        for job_id in row["jobs"]:
            job = state.jobs.get(job_id)
            if job is None:
                continue
            if job_id not in placed:
                placed[job_id] = _gpus_by_node(job)
                gangs[job_id] = {
                    "queue": job.queue,
                    "gpus": job.gpus,
                    "shape": job_shape(job),
                    "nodes": len(placed[job_id]),
                    "utilization": job.utilization,
                    "idle": job.idle_since is not None,
                }
            cells.append({"job": job_id, "gpus": placed[job_id].get(row["node"], 0)})
        row["reserved"] = node.reserved.get("gpu", 0)
        row["schedulable"] = node.schedulable
        row["cells"] = cells
        del row["labels"], row["jobs"]
        domain = "/".join(node.labels.get(lv, "") for lv in levels) if levels else "cluster"
        nodes.setdefault(domain, []).append(row)
    domains = domain_rows(state)
    for d in domains:
        d["nodes_list"] = nodes.get(d["domain"], [])
    return {"levels": levels, "domains": domains, "gangs": gangs}


# ---------------------------------------------------------------- queues


def queues(moment: Moment) -> dict[str, Any]:
    """Per queue: nominal, used, borrowed, lent (views), pending gangs and GPUs, weight and fair share."""
    state = moment.state
    rows = queue_rows(state)
    pending_gpus: dict[str, int] = {}
    for job in state.jobs.values():
        if job.status == "pending":
            pending_gpus[job.queue] = pending_gpus.get(job.queue, 0) + job.gpus
    tree = QuotaTree(state) if state.queues else None
    for row in rows:
        name = row["queue"]
        row["pending_gpus"] = pending_gpus.get(name, 0)
        row["weight"] = state.queues[name].weight
        row["share_permille"] = tree.share(name) if tree is not None else 0
        # what the page draws: GPUs whether plain (`gpu`) or per flavor (`gpu@h100`)
        row["gpus"] = {k: gpus_of(row[k]) for k in ("nominal", "used", "borrowed", "lent")}
    history = [{"seq": s.seq, "at": s.at, "used": s.used} for s in moment.history]
    history.append({"seq": moment.seq, "at": moment.now, "used": queue_gpus_used(state)})
    return {"rows": rows, "cohorts": dict(sorted(state.cohorts.items())), "history": history}


# ---------------------------------------------------------------- jobs


def jobs(moment: Moment, *, text: str = "", status: str = "", queue: str = "", limit: int = JOB_ROWS) -> dict[str, Any]:
    """Jobs matching the search (id or queue contains `text`; exact status and queue), newest first."""
    state = moment.state
    needle = text.strip().lower()
    found = [
        j
        for j in state.jobs.values()
        if (not status or j.status == status)
        and (not queue or j.queue == queue)
        and (not needle or needle in j.id.lower() or needle in j.queue.lower())
    ]
    found.sort(key=lambda j: -j.seq)
    rows = [
        {
            "job": j.id,
            "queue": j.queue,
            "status": j.status,
            "gpus": j.gpus,
            "shape": job_shape(j),
            "priority_class": j.priority_class,
            "submitted_at": j.submitted_at,
            "age": moment.now - j.submitted_at,
            "preemptions": j.preemptions,
            "why": pending_reason(j) if j.status == "pending" else "",
        }
        for j in found[:limit]
    ]
    return {"matched": len(found), "rows": rows}


async def job(feed: Feed, moment: Moment, job_id: str) -> dict[str, Any] | None:
    """The job's `explain` story up to the moment (None: no such job then).

    The story starts from the state just before the job's submission (a
    checkpoint and a short fold) rather than from sequence 1, and ends where
    the job ended: the lines are the same, since a job's story begins at its
    submission and the fold changes a terminal job no more (only a later
    duplicate submission of its id would add a line to `explain`'s story,
    which the page leaves out).
    So a page costs the events of the job's lifetime, not of the log.
    """
    start = feed.books.submissions.get(job_id)
    if start is None or start > moment.seq or job_id not in moment.state.jobs:
        return None
    before = await feed.state_at(Point(seq=start - 1))
    teller = Storyteller(job_id, before.state)
    async for batch in feed.source.batches(start, moment.seq):
        with no_gc():  # not across the read: the server's other tasks run meanwhile
            for seq, ev in batch:
                teller.step(seq, ev)
        job = teller.state.jobs.get(job_id)
        if job is not None and job.status in TERMINAL:
            break
    teller.state.now = moment.now  # what a pending job waits for, told as of the moment (as `explain --at`)
    story = teller.finish()
    doc = story_document(story, moment.now)
    current = moment.state.jobs[job_id]
    doc["placement"] = _gpus_by_node(current) if current.status == "admitted" else {}
    return doc


# ---------------------------------------------------------------- chargeback


async def chargeback(feed: Feed, moment: Moment, rates: RateCard | None) -> dict[str, Any]:
    """The billing report by queue and by GPU model as of the moment, and the hourly series for the charts."""
    billing = await feed.billing_at(moment)
    ledger = billing.ledger
    usage = list(ledger.usage.items())
    capacity = list(ledger.capacity.items())
    hours = [h for (_, h, _) in ledger.usage] + [h for (h, _) in ledger.capacity]
    start = min(hours) if hours else 0
    # the books are settled up to the last event before the moment (`Books.at`): the window ends there
    end = moment.state.now + 1
    report = build_report(usage, capacity, ledger.queues, start=start, end=end, by="queue", rates=rates)
    models = sorted({m for (_, _, m) in ledger.usage})
    by_model = {
        model: build_report(_of_model(usage, model), [], ledger.queues, start=start, end=end, rates=rates).totals
        for model in models
    }
    series, span = bars(hourly_series(usage, capacity, start=start, end=end))
    return {
        "report": report,
        "by_model": by_model,
        "hours": series,
        "bar_hours": span,
        "priced": rates is not None,
    }


def bars(series: list[HourPoint], limit: int = BARS) -> tuple[list[HourPoint], int]:
    """The hourly series in at most `limit` bars of whole hours (sums per bar), and the hours per bar.

    A chart is ~700 pixels wide: a long log's thousands of hours would draw
    tens of thousands of shapes no one can tell apart.
    """
    if not series:
        return series, 1
    first = series[0].hour
    span = max(1, -(-(series[-1].hour - first + HOUR) // (limit * HOUR)))
    if span == 1:
        return series, 1
    out: dict[int, HourPoint] = {}
    for p in series:
        at = first + (p.hour - first) // (span * HOUR) * span * HOUR
        bar = out.get(at)
        if bar is None:
            bar = out[at] = HourPoint(hour=at, allocated_by_queue={})
        for queue, gpu_s in p.allocated_by_queue.items():
            bar.allocated_by_queue[queue] = bar.allocated_by_queue.get(queue, 0) + gpu_s
        bar.used_mgpu_s += p.used_mgpu_s
        bar.sampled_gpu_s += p.sampled_gpu_s
        bar.capacity_gpu_s += p.capacity_gpu_s
    return list(out.values()), span


def _of_model(usage: Iterable[tuple[UsageKey, Usage]], model: str) -> list[tuple[UsageKey, Usage]]:
    return [(k, u) for k, u in usage if k[2] == model]


def dumps(doc: Any) -> bytes:
    """A page's JSON (msgspec structs as objects; the report's Decimals as exact JSON numbers)."""
    return _json.encode(doc)
