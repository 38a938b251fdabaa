"""GPU utilization from DCGM metrics: parsing, per-job means, rate limiting, and the scraper in a leader's term."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
from aiohttp import web

from muster.daemon.loop import LoopOptions, SchedulerLoop, SoleElector
from muster.daemon.utilization import Sampler, UtilizationScraper, samples_from_prometheus, samples_from_text
from muster.demo.simcluster import SimulatedCluster, block_rack_nodes
from muster.events.types import (
    GpuUtilizationSampled,
    JobAdmitted,
    JobId,
    JobSubmitted,
    PodSet,
    QueueConfigured,
    QueueName,
    SchedulerConfigured,
)

EXPORTER_TEXT = """\
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-a",Hostname="n1",container="main",namespace="ml",pod="train-0"} 0.80
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="1",UUID="GPU-b",Hostname="n1",container="main",namespace="ml",pod="train-0"} 0.60
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="2",UUID="GPU-c",Hostname="n1",container="",namespace="",pod=""} 0.0
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",Hostname="n1",namespace="ml",pod="train-0"} 99
DCGM_FI_DEV_GPU_UTIL{gpu="3",UUID="GPU-d",Hostname="n2",namespace="ml",pod="train-1"} 40
DCGM_FI_DEV_GPU_UTIL{gpu="4",UUID="GPU-e",Hostname="n2",exported_namespace="web",exported_pod="infer-0"} 2
"""


def test_exporter_text_gives_engine_activity_per_pod_with_the_percentage_as_fallback():
    """PROF_GR_ENGINE_ACTIVE wins where a pod has it; GPU_UTIL (percent) counts only for pods without it."""
    samples = samples_from_text(EXPORTER_TEXT)
    assert samples == {"ml/train-0": [0.8, 0.6], "ml/train-1": [0.4], "web/infer-0": [0.02]}


def test_prometheus_answers_are_read_like_the_exporter_text():
    """The instant-query JSON of both metrics gives the same per-pod samples."""

    def answer(rows: list[tuple[dict[str, str], str]]) -> dict[str, Any]:
        result = [{"metric": m, "value": [1714000000.0, v]} for m, v in rows]
        return {"status": "success", "data": {"resultType": "vector", "result": result}}

    active = answer([({"pod": "train-0", "namespace": "ml", "gpu": "0"}, "0.5")])
    util = answer([({"pod": "train-0", "namespace": "ml"}, "90"), ({"pod_name": "x", "pod_namespace": "o"}, "10")])
    assert samples_from_prometheus(active, util) == {"ml/train-0": [0.5], "o/x": [0.1]}
    with pytest.raises(ValueError):
        samples_from_prometheus({"status": "error", "error": "bad query"}, util)


def test_the_sampler_averages_per_job_and_limits_the_rate():
    """One event per job per interval at most; after it, only a real change (or a threshold crossing) is written."""
    sampler = Sampler(interval=60, min_change=0.02, threshold=0.05)
    index = {"ml/train-0": "j1", "ml/train-1": "j1", "web/infer-0": "j2"}
    samples = {"ml/train-0": [0.8, 0.6], "ml/train-1": [0.4], "web/infer-0": [0.02]}
    first = sampler.events(index, samples, now=1000)
    assert [(e.job, e.gpu, e.at) for e in first] == [("j1", 0.6, 1000), ("j2", 0.02, 1000)]
    assert sampler.events(index, samples, now=1030) == []  # within the interval
    assert sampler.events(index, samples, now=1070) == []  # unchanged
    moved = {**samples, "web/infer-0": [0.5]}  # crosses the idle threshold
    assert [(e.job, e.gpu) for e in sampler.events(index, moved, now=1080)] == [("j2", 0.5)]
    assert sampler.events({}, moved, now=2000) == [] and sampler.last == {}  # ended jobs are forgotten


def test_a_job_admitted_again_gets_a_sample_for_its_new_run_at_once():
    """After a preemption and readmission the folds have no utilization for the run: the same value is written again."""
    sampler = Sampler(interval=60, min_change=0.02, threshold=0.05)
    index = {"ml/train-0": "j1"}
    samples = {"ml/train-0": [0.02]}
    assert len(sampler.events(index, samples, now=1000, runs={"j1": (1000, 0)})) == 1
    assert sampler.events(index, samples, now=1010, runs={"j1": (1000, 0)}) == []  # same run: rate-limited
    again = sampler.events(index, samples, now=1010, runs={"j1": (1009, 1)})  # preempted, admitted again
    assert [(e.job, e.gpu, e.at) for e in again] == [("j1", 0.02, 1010)]


@pytest.fixture
async def metrics_server() -> AsyncIterator[Callable[[str, Any], str]]:
    """`serve(path, body)` serves text (or JSON for a dict/callable) on a local aiohttp server; returns its URL."""
    routes: dict[str, Any] = {}

    async def handle(request: web.Request) -> web.Response:
        body = routes[request.path]
        if callable(body):
            body = body(request)
        if isinstance(body, dict):
            return web.Response(text=json.dumps(body), content_type="application/json")
        return web.Response(text=body)

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def serve(path: str, body: Any) -> str:
        routes[path] = body
        return f"http://127.0.0.1:{port}{path}"

    yield serve
    await runner.cleanup()


async def run_scraper(store: Any, scraper: UtilizationScraper) -> list[GpuUtilizationSampled]:
    """A leader with one running 2-pod job (pods ml/train-0, ml/train-1) and `scraper` as a term service."""
    await store.append(
        [
            SchedulerConfigured(at=0, levels=[]),
            QueueConfigured(at=0, name=QueueName("q"), nominal={"gpu": 16}),
            JobSubmitted(
                at=int(time.time()),
                job=JobId("j1"),
                queue=QueueName("q"),
                podsets=[PodSet(name="w", count=2, requests={"gpu": 1})],
                pods={"w-0": "ml/train-0", "w-1": "ml/train-1"},
            ),
        ]
    )
    nodes = block_rack_nodes(1, 1, 1, 8)
    loop = SchedulerLoop(
        store,
        elector=SoleElector("u"),
        cluster=lambda state: SimulatedCluster(nodes, state),
        options=LoopOptions(),
        services=[scraper.run],
    )
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        with anyio.fail_after(30):  # returns with the first sample; a busy CI box can take a while
            while True:
                events = [s.event for s in await store.read()]
                samples = [e for e in events if isinstance(e, GpuUtilizationSampled)]
                if samples:
                    break
                await anyio.sleep(0.05)
        assert any(isinstance(e, JobAdmitted) for e in events)
        loop.stop()
    return samples


async def test_the_leader_turns_exporter_metrics_into_job_samples_on_the_log(store, metrics_server):
    """Scraping a dcgm-exporter endpoint, the leader appends the admitted job's mean GPU utilization."""
    url = metrics_server("/metrics", EXPORTER_TEXT)
    scraper = UtilizationScraper(url, source="exporter", interval=0.1)
    samples = await run_scraper(store, scraper)
    assert [(s.job, s.gpu) for s in samples[:1]] == [("j1", 0.6)]  # (0.8 + 0.6 + 0.4) / 3


async def test_the_leader_reads_a_prometheus_server_too(store, metrics_server):
    """With source prometheus, the instant-query API is asked for both metrics."""

    def query(request: web.Request) -> dict[str, Any]:
        metric = request.query["query"]
        rows = [{"metric": {"pod": "train-1", "namespace": "ml"}, "value": [0, "0.25"]}]
        data = rows if metric == "DCGM_FI_PROF_GR_ENGINE_ACTIVE" else []
        return {"status": "success", "data": {"resultType": "vector", "result": data}}

    base = metrics_server("/api/v1/query", query).removesuffix("/api/v1/query")
    scraper = UtilizationScraper(base, source="prometheus", interval=0.1)
    samples = await run_scraper(store, scraper)
    assert [(s.job, s.gpu) for s in samples[:1]] == [("j1", 0.25)]
