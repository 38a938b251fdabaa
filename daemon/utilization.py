"""GPU utilization from DCGM, per job, into `GpuUtilizationSampled` events (idle reclaim reads them).

Where the numbers come from (`utilization.source`):
- `exporter`: the Prometheus text of one or more dcgm-exporter endpoints
  (comma-separated URLs), e.g. `http://dcgm-exporter:9400/metrics`;
- `prometheus`: a Prometheus server's instant-query API (`URL/api/v1/query`).

`DCGM_FI_PROF_GR_ENGINE_ACTIVE` (a ratio, 0..1) is used per pod; a pod that
has only `DCGM_FI_DEV_GPU_UTIL` (a percentage) falls back to it. A series
belongs to the pod named by its `pod`/`namespace` labels (`exported_pod`/
`exported_namespace` when Prometheus renamed them, `pod_name`/`pod_namespace`
in old exporters). A job's utilization is the mean over the GPUs of all its
pods that report.

Invariants:
- Only admitted jobs are sampled, and only by the leader (it runs in a term).
- Rate limit: at most one event per job per `interval`; within that, a job is
  written again only when its value moved by `min_change` or crossed the idle
  threshold, or `resend_after` seconds passed. A job admitted again (after a
  preemption) is a new run, which the folds start without utilization: its
  first value is written at once, whatever was written for the run before.
- A failed scrape is logged and counted; it never stops the daemon.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog

from muster.events.types import GpuUtilizationSampled, JobId
from muster.projections.state import DEFAULT_IDLE_THRESHOLD, ClusterState

__all__ = [
    "ENGINE_ACTIVE",
    "GPU_UTIL",
    "Sampler",
    "UtilizationScraper",
    "job_runs",
    "pod_index",
    "samples_from_prometheus",
    "samples_from_text",
]

log = structlog.get_logger("muster.utilization")

ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
_POD_LABELS = (("pod", "namespace"), ("exported_pod", "exported_namespace"), ("pod_name", "pod_namespace"))

Samples = dict[str, list[float]]
"""Pod `namespace/name` -> utilization of each of its GPUs (0..1)."""


def _pod_key(labels: Mapping[str, str]) -> str | None:
    for pod, ns in _POD_LABELS:
        if labels.get(pod):
            return f"{labels.get(ns) or 'default'}/{labels[pod]}"
    return None


def _merge(active: Iterable[tuple[str, float]], util: Iterable[tuple[str, float]]) -> Samples:
    """Per pod, the engine-active series if it has any, else GPU_UTIL/100; values clamped to 0..1."""
    out: Samples = {}
    for key, value in active:
        out.setdefault(key, []).append(value)
    fallback: Samples = {}
    for key, value in util:
        if key not in out:
            fallback.setdefault(key, []).append(value / 100.0)
    out.update(fallback)
    return {k: [min(1.0, max(0.0, v)) for v in vs if math.isfinite(v)] for k, vs in out.items()}


def samples_from_text(text: str) -> Samples:
    """Per-pod GPU utilization from Prometheus text exposition (a dcgm-exporter's /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    active: list[tuple[str, float]] = []
    util: list[tuple[str, float]] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            target = active if sample.name == ENGINE_ACTIVE else util if sample.name == GPU_UTIL else None
            if target is None:
                continue
            key = _pod_key(sample.labels)
            if key is not None:
                target.append((key, float(sample.value)))
    return _merge(active, util)


def _vector(answer: Any) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    if not isinstance(answer, dict) or answer.get("status") != "success":
        raise ValueError(f"Prometheus answered {str(answer)[:200]}")
    for item in (answer.get("data") or {}).get("result") or []:
        key = _pod_key(item.get("metric") or {})
        value = item.get("value") or [None, "nan"]
        if key is not None:
            out.append((key, float(value[1])))
    return out


def samples_from_prometheus(active_answer: Any, util_answer: Any) -> Samples:
    """Per-pod GPU utilization from the JSON answers of the two instant queries."""
    return _merge(_vector(active_answer), _vector(util_answer))


def pod_index(state: ClusterState, pod_keys: Callable[[str], list[str] | None] | None = None) -> dict[str, str]:
    """Pod `namespace/name` -> admitted job; the cluster's current pods first, else the submitted ones."""
    index: dict[str, str] = {}
    for job in state.jobs.values():
        if job.status != "admitted":
            continue
        keys = pod_keys(job.id) if pod_keys is not None else None
        for key in keys or job.pods.values():
            index[key] = job.id
    return index


def job_runs(state: ClusterState) -> dict[str, Hashable]:
    """Admitted job -> which run it is in (its admission time and preemption count): a new value per run."""
    return {j.id: (j.admitted_at, j.preemptions) for j in state.jobs.values() if j.status == "admitted"}


@dataclass
class Sampler:
    """Turns per-pod samples into rate-limited per-job events."""

    interval: float = 60.0
    min_change: float = 0.02
    resend_after: float = 600.0
    threshold: float = DEFAULT_IDLE_THRESHOLD
    last: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Job -> (time written, value written)."""
    runs: dict[str, Hashable] = field(default_factory=dict)
    """Job -> the run its last value was written for (None when the caller gives no runs)."""

    def events(
        self,
        index: Mapping[str, str],
        samples: Samples,
        now: float,
        runs: Mapping[str, Hashable] | None = None,
    ) -> list[GpuUtilizationSampled]:
        """Events for the jobs of `index` that `samples` cover; `runs` (job -> its run, see `job_runs`)
        lets a job admitted again be written at once instead of being rate-limited as the same run."""
        per_job: dict[str, list[float]] = {}
        for pod, values in samples.items():
            job = index.get(pod)
            if job is not None and values:
                per_job.setdefault(job, []).extend(values)
        out: list[GpuUtilizationSampled] = []
        for job in sorted(per_job):
            values = per_job[job]
            value = round(sum(values) / len(values), 3)
            run = runs.get(job) if runs is not None else None
            previous = self.last.get(job)
            if previous is not None and self.runs.get(job) == run:
                at, old = previous
                if now - at < self.interval:
                    continue
                crossed = (old <= self.threshold) != (value <= self.threshold)
                if abs(value - old) < self.min_change and not crossed and now - at < self.resend_after:
                    continue
            self.last[job] = (now, value)
            self.runs[job] = run
            out.append(GpuUtilizationSampled(at=int(now), job=JobId(job), gpu=value))
        alive = set(index.values())
        for job in [j for j in self.last if j not in alive]:
            del self.last[job]  # ended jobs: forget them
            self.runs.pop(job, None)
        return out


class UtilizationScraper:
    """A term service: scrape every `interval` seconds and append what the sampler lets through."""

    def __init__(
        self,
        url: str,
        *,
        source: str = "prometheus",
        interval: float = 60.0,
        timeout: float = 10.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if source not in ("prometheus", "exporter"):
            raise ValueError(f"utilization source must be prometheus or exporter, not {source!r}")
        self.urls = [u.strip() for u in url.split(",") if u.strip()]
        self.source = source
        self.interval = interval
        self.timeout = timeout
        self.clock = clock
        self.sampler = Sampler(interval=interval)
        self.scrapes = 0

    async def scrape(self, session: Any) -> Samples:
        import aiohttp

        if self.source == "exporter":
            merged: Samples = {}
            for url in self.urls:
                async with session.get(url) as resp:
                    resp.raise_for_status()
                    for key, values in samples_from_text(await resp.text()).items():
                        merged.setdefault(key, []).extend(values)
            return merged
        base = self.urls[0].rstrip("/")
        endpoint = base if base.endswith("/api/v1/query") else f"{base}/api/v1/query"
        answers = []
        for metric in (ENGINE_ACTIVE, GPU_UTIL):
            async with session.get(endpoint, params={"query": metric}) as resp:
                if resp.status >= 400:
                    raise aiohttp.ClientResponseError(
                        resp.request_info, resp.history, status=resp.status, message=await resp.text()
                    )
                answers.append(await resp.json(content_type=None))
        return samples_from_prometheus(answers[0], answers[1])

    async def run(self, loop: Any, term: Any) -> None:
        """Scrape for as long as the term lasts (`loop` is the SchedulerLoop)."""
        import time

        import aiohttp

        sink = loop.fact_sink(term)
        clock = self.clock or time.time
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout)) as session:
            while True:
                try:
                    samples = await self.scrape(session)
                    self.scrapes += 1
                except Exception as exc:
                    loop.metrics.scrape_errors.inc()
                    log.warning("utilization scrape failed", source=self.source, error=f"{type(exc).__name__}: {exc}")
                else:
                    state = loop.state
                    if state.idle_reclaim is not None:
                        self.sampler.threshold = state.idle_reclaim.threshold
                    cluster = term.cluster
                    index = pod_index(state, getattr(cluster, "pod_keys", None))
                    events = self.sampler.events(index, samples, clock(), job_runs(state))
                    if events:
                        await sink(list(events))
                        loop.metrics.utilization_samples.inc(len(events))
                await anyio.sleep(self.interval)
