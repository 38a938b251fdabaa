"""Hostile input on a running daemon: the real scheduler loop follows a stream of bad bytes and absurd jobs.

The fuzzer of test_hostile_stream.py feeds the store, the core and billing
directly; here the same items go onto the stream of a leading `SchedulerLoop`
(the daemon's loop, with the simulated cluster) while it runs. It must not
stop: each bad message is counted once and skipped, each absurd job gets a
JobRejected (or a JobInadmissible when it only asks too much) whose reason
says what is wrong, and every valid job is admitted, bound and reported
started, whatever its name (unicode and path characters included).
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import anyio
import nats
import pytest
from hostile import absurd_jobs, bad_payloads, valid_job
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from muster.daemon.loop import LoopOptions, SchedulerLoop, SoleElector
from muster.demo.simcluster import SimulatedCluster
from muster.events.codec import encode
from muster.events.store import EventStore, subject_for
from muster.events.types import (
    Event,
    JobAdmitted,
    JobInadmissible,
    JobRejected,
    JobStarted,
    NodeAdded,
    PriorityClassConfigured,
    QueueConfigured,
    SchedulerConfigured,
)

pytestmark = pytest.mark.faults

NODES = [
    NodeAdded(at=0, node=f"n{i}", labels={"rack": f"r{i % 2}"}, capacity={"gpu": 8, "cpu": 96_000}) for i in range(4)
]
CONFIG: list[Event] = [
    SchedulerConfigured(at=0, levels=["rack"]),
    PriorityClassConfigured(at=0, name="low", value=0),
    QueueConfigured(at=0, name="team-a", nominal={"gpu": 32}),
]
ANSWERS = (JobAdmitted, JobRejected, JobInadmissible)

Item = tuple[str, Any]


@st.composite
def hostile_items(draw: st.DrawFn) -> list[Item]:
    items: list[Item] = []
    for i in range(draw(st.integers(4, 16))):
        choice = draw(st.sampled_from(["bad", "valid", "absurd"]))
        if choice == "bad":
            items.append(("bad", draw(bad_payloads())[1]))
        elif choice == "valid":
            items.append(("valid", valid_job(i)))
        else:
            items.append(("absurd", draw(absurd_jobs(i))))
    return items


async def run_case(url: str, items: list[Item]) -> None:
    tag = uuid.uuid4().hex[:10]
    async with contextlib.AsyncExitStack() as stack:
        store = await EventStore.connect(url, stream=f"HD{tag}", prefix=f"hd{tag}")
        stack.push_async_callback(store.close)
        stack.push_async_callback(store.delete_stream)
        await store.append(CONFIG)
        loop = SchedulerLoop(
            store,
            elector=SoleElector("fuzzed"),
            cluster=lambda state: SimulatedCluster(NODES, state, speed=1.0),
            options=LoopOptions(),
        )
        async with anyio.create_task_group() as tg:
            await tg.start(loop.run)
            with anyio.fail_after(30):
                await loop.first_term.wait()
            nc = await nats.connect(url)
            try:
                js = nc.jetstream()
                for what, item in items:
                    if what == "bad":
                        await js.publish(f"{store.prefix}.job.hostile", item, stream=store.stream)
                    else:
                        ev = item if what == "valid" else item[0]
                        await js.publish(subject_for(ev, store.prefix), encode(ev), stream=store.stream)
            finally:
                await nc.close()
            jobs = {(item if what == "valid" else item[0]).job for what, item in items if what != "bad"}
            answers: dict[str, Event] = {}
            with anyio.move_on_after(40):  # generous for a loaded 2-core machine; both waits fit the test timeout
                while set(answers) != jobs:
                    await anyio.sleep(0.1)
                    for stored in await store.read():
                        if isinstance(stored.event, ANSWERS):
                            answers.setdefault(stored.event.job, stored.event)
            assert set(answers) == jobs, f"never answered: {sorted(jobs - set(answers))}"
            bad = sum(1 for what, _ in items if what == "bad")
            registry = loop.metrics.registry
            # answers say nothing of bad messages published after the last job: wait until they are folded too
            with anyio.move_on_after(40):
                while (registry.get_sample_value("muster_bad_events_total") or 0) < bad:  # noqa: ASYNC110 (a metric: nothing to wait on)
                    await anyio.sleep(0.1)
            assert registry.get_sample_value("muster_bad_events_total") == bad
            # admitted jobs whatever their names are bound and reported started (facts stored)
            admitted = {j for j, a in answers.items() if isinstance(a, JobAdmitted)}
            started: set[str] = set()
            with anyio.move_on_after(40):
                while not admitted <= started:
                    await anyio.sleep(0.1)
                    started = {s.event.job for s in await store.read() if isinstance(s.event, JobStarted)}
            assert admitted <= started, f"admitted, never started: {sorted(admitted - started)}"
            assert not registry.get_sample_value(
                "muster_applied_decisions_total", {"type": "JobAdmitted", "outcome": "error"}
            )
            loop.stop()
    for what, item in items:
        if what == "valid":
            assert isinstance(answers[item.job], JobAdmitted), (item.job, answers[item.job])
        elif what == "absurd":
            job, outcome, words = item
            answer = answers[job.job]
            want = {"rejected": JobRejected, "waits": JobInadmissible, "runs": JobAdmitted}[outcome]
            assert isinstance(answer, want), (job, answer)
            if words:
                assert words in answer.reason and answer.reason.isprintable(), (job, answer)


@settings(
    max_examples=4,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: a failing example can take 80 s
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(items=hostile_items())
def test_a_running_daemon_outlives_hostile_input(nats_url: str, items: list[Item]) -> None:
    """The daemon's loop skips and counts each bad message, rejects absurd jobs with a reason, admits valid ones."""
    anyio.run(run_case, nats_url, items)
