"""Prometheus metrics of the daemon, in their own registry.

Counters and histograms are updated by the loop as things happen; the gauges
that describe the cluster (pending jobs, quota usage and borrowing per queue)
are computed from the folded state at scrape time, so they can never drift
from it. The age of a queue's oldest pending job is the one gauge that reads
a clock (the scrape's time less when the job last became pending: its
submission, or its last preemption); in the daemon event times are epoch
seconds; a job a user holds is counted apart (`muster_held_jobs`), not as
waiting. Every replica folds the same log, so a standby reports the same
cluster gauges as the leader; `muster_leader` tells them apart. Reservations
held per queue (`muster_queue_reservations`) are read from the folded state too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from muster.projections.state import ClusterState

__all__ = ["DaemonMetrics"]

_CYCLE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class DaemonMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.cycle_seconds = Histogram(
            "muster_cycle_duration_seconds", "Time of one scheduling cycle (decide)", buckets=_CYCLE_BUCKETS, registry=r
        )
        self.cycles = Counter("muster_cycles", "Scheduling cycles run by this replica", ["result"], registry=r)
        self.decisions = Counter("muster_decisions", "Decisions this replica appended", ["type"], registry=r)
        self.conflicts = Counter(
            "muster_append_conflicts", "Fenced appends refused because the log had moved on", registry=r
        )
        self.preemptions = Counter("muster_preemptions", "Preemptions on the log (folded)", ["reason"], registry=r)
        self.admissions = Counter("muster_admissions", "Admissions on the log (folded)", ["queue"], registry=r)
        self.applied = Counter(
            "muster_applied_decisions", "Decisions applied to the cluster", ["type", "outcome"], registry=r
        )
        self.apply_backlog = Gauge(
            "muster_apply_backlog", "Decisions on the log handed to the applier and not yet applied", registry=r
        )
        self.facts = Counter("muster_facts_appended", "Cluster facts this replica appended", ["type"], registry=r)
        self.bad_events = Counter("muster_bad_events", "Log messages that are not valid events, skipped", registry=r)
        self.fold_errors = Counter("muster_fold_errors", "Events the fold raised on, skipped", registry=r)
        self.lag = Gauge("muster_log_lag_events", "Log messages not yet folded by this replica", registry=r)
        self.folded_seq = Gauge("muster_log_folded_sequence", "Last log sequence folded", registry=r)
        self.leader = Gauge("muster_leader", "1 while this replica leads", registry=r)
        self.epoch = Gauge("muster_leader_epoch", "Leader epoch on the log", registry=r)
        self.utilization_samples = Counter(
            "muster_utilization_samples", "GpuUtilizationSampled events appended", registry=r
        )
        self.scrape_errors = Counter("muster_utilization_scrape_errors", "Failed utilization scrapes", registry=r)
        self._state: Callable[[], ClusterState] | None = None
        r.register(_StateCollector(self))

    def watch(self, state: Callable[[], ClusterState]) -> None:
        """Report the cluster gauges from this state."""
        self._state = state


class _StateCollector(Collector):
    def __init__(self, metrics: DaemonMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        get = self.metrics._state
        pending = GaugeMetricFamily("muster_pending_jobs", "Jobs waiting for admission", labels=["queue"])
        held = GaugeMetricFamily(
            "muster_held_jobs",
            "Pending jobs a user holds (muster hold): not waiting for the scheduler",
            labels=["queue"],
        )
        running = GaugeMetricFamily("muster_admitted_jobs", "Jobs admitted and not ended", labels=["queue"])
        usage = GaugeMetricFamily("muster_queue_usage", "Quota used by admitted jobs", labels=["queue", "resource"])
        nominal = GaugeMetricFamily("muster_queue_nominal", "Nominal quota", labels=["queue", "resource"])
        borrowed = GaugeMetricFamily(
            "muster_queue_borrowed", "Quota used above nominal (borrowed)", labels=["queue", "resource"]
        )
        oldest = GaugeMetricFamily(
            "muster_queue_oldest_pending_age_seconds",
            "Seconds the queue's longest-waiting pending job has waited since it last became pending (0: none)",
            labels=["queue"],
        )
        reserved = GaugeMetricFamily(
            "muster_queue_reservations",
            "Reservations held for the queue's pending jobs (room held back from jobs that would delay them)",
            labels=["queue"],
        )
        if get is not None:
            state = get()
            now = self.metrics.clock()
            counts: dict[str, list[int]] = {q: [0, 0, 0] for q in state.queues}
            since: dict[str, int] = {}
            for job in state.jobs.values():
                if job.status == "pending" and job.held:
                    # a held job waits for its user, not the scheduler: it must not look starved
                    counts.setdefault(job.queue, [0, 0, 0])[2] += 1
                elif job.status == "pending":
                    counts.setdefault(job.queue, [0, 0, 0])[0] += 1
                    since[job.queue] = min(since.get(job.queue, job.pending_since()), job.pending_since())
                elif job.status == "admitted":
                    counts.setdefault(job.queue, [0, 0, 0])[1] += 1
            for q, (p, a, h) in sorted(counts.items()):
                pending.add_metric([q], p)
                running.add_metric([q], a)
                held.add_metric([q], h)
                oldest.add_metric([q], max(0.0, now - since[q]) if q in since else 0.0)
            reservations: dict[str, int] = {}
            for r in state.reservations.values():
                reservations[r.queue] = reservations.get(r.queue, 0) + 1
            for q in sorted(set(state.queues) | set(reservations)):
                reserved.add_metric([q], reservations.get(q, 0))
            for name, queue in sorted(state.queues.items()):
                for res in sorted(set(queue.usage) | set(queue.nominal)):
                    used = queue.usage.get(res, 0)
                    usage.add_metric([name, res], used)
                    nominal.add_metric([name, res], queue.nominal.get(res, 0))
                    if res in queue.nominal:
                        borrowed.add_metric([name, res], max(0, used - queue.nominal[res]))
        yield from (pending, held, running, usage, nominal, borrowed, oldest, reserved)
