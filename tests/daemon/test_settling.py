"""The daemon and `muster sim` settle an instant with one loop (`projections.settling`): the same decisions."""

from __future__ import annotations

import anyio
import msgspec

from muster.daemon.loop import SchedulerLoop, SoleElector
from muster.events.store import EventStore
from muster.events.types import (
    CycleSettled,
    Event,
    JobAdmitted,
    JobCancelled,
    JobId,
    JobInadmissible,
    JobPreempted,
    JobSubmitted,
    NodeAdded,
    NodeName,
    PodSet,
    PreemptionPolicy,
    PriorityClassConfigured,
    QueueConfigured,
    QueueName,
    SchedulerConfigured,
)
from muster.projections.cluster import evolve
from muster.projections.scheduler import decide
from muster.projections.state import ClusterState
from muster.replay.audit import audit
from muster.replay.scenario import Scenario
from muster.replay.simulator import simulate
from muster.replay.source import MemoryLog
from muster.replay.timelinespec import Input

CONFIG: list[Event] = [
    SchedulerConfigured(at=0, levels=["rack"]),
    PriorityClassConfigured(at=0, name="low", value=0),
    PriorityClassConfigured(at=0, name="high", value=100),
    QueueConfigured(
        at=0, name=QueueName("q"), nominal={"gpu": 32}, preemption=PreemptionPolicy(within_queue="LowerPriority")
    ),
    *(NodeAdded(at=0, node=NodeName(f"n{i}"), labels={"rack": "r0"}, capacity={"gpu": 8}) for i in range(4)),
]


def _job(name: str, at: int, pods: int, priority: str) -> JobSubmitted:
    podsets = [PodSet(name="w", count=pods, requests={"gpu": 8})]
    return JobSubmitted(at=at, job=JobId(name), queue=QueueName("q"), podsets=podsets, priority_class=priority)


# the cluster full of low-priority work, then two high-priority gangs that evict it (a preemption
# ends its cycle: the instant takes several) and one that can never fit
INSTANTS: dict[int, list[Event]] = {
    100: [_job(f"low-{i}", 100, 1, "low") for i in range(4)],
    200: [_job("high-0", 200, 2, "high"), _job("high-1", 200, 2, "high"), _job("huge", 200, 8, "high")],
}
DECISIONS = (JobAdmitted, JobPreempted, JobInadmissible)


def _decisions(events: list[Event]) -> list[Event]:
    """The decisions, less the leader's epoch (the simulator has no leader)."""
    return [msgspec.structs.replace(e, epoch=0) for e in events if isinstance(e, DECISIONS)]


def _simulated() -> list[Event]:
    inputs = [
        Input(at=at, order=i, kind="event", data={"event": ev})
        for i, (at, ev) in enumerate((at, ev) for at, evs in INSTANTS.items() for ev in evs)
    ]
    return _decisions(simulate(Scenario("settling", CONFIG, inputs, None, ["rack"])).events)


async def _logged(store: EventStore, at_least: int = 0) -> list[Event]:
    """The log's decisions, once there are `at_least` of them."""
    while True:
        logged = _decisions([s.event for s in await store.read()])
        if len(logged) >= at_least:
            return logged
        await anyio.sleep(0.05)


async def test_the_daemon_settles_an_instant_as_the_simulator_does(store: EventStore) -> None:
    """Evictions over several cycles at one instant: the daemon's log holds exactly the decisions `muster sim` takes."""
    expected = _simulated()
    at_200 = [e for e in expected if e.at == 200]
    assert {type(e) for e in at_200} == set(DECISIONS) and len({e.cycle for e in at_200}) >= 2

    clock = [100.0]

    def whole_instant(state: ClusterState, now: int) -> list[Event]:
        # as the simulator does, decide once every input of the instant is folded
        if any(ev.job not in state.jobs for ev in INSTANTS[now] if isinstance(ev, JobSubmitted)):
            return []
        return decide(state, now)

    await store.append(CONFIG)
    loop = SchedulerLoop(store, elector=SoleElector("d1"), clock=lambda: clock[0], decider=whole_instant)
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        with anyio.fail_after(30):
            for at, facts in INSTANTS.items():
                clock[0] = float(at)
                await store.append(facts)
                await _logged(store, len([e for e in expected if e.at <= at]))
        loop.stop()
    assert await _logged(store) == expected


async def _settled(store: EventStore) -> None:
    """Returns once the log holds a `CycleSettled`."""
    while True:
        if any(isinstance(s.event, CycleSettled) for s in await store.read()):
            return
        await anyio.sleep(0.05)


class _CutInOnSettled:
    """Another writer gets in just before the loop's first `CycleSettled` append (an event the fold skips)."""

    def __init__(self, store: EventStore) -> None:
        self.store, self.fired = store, 0

    async def before_append(self, events: list[Event]) -> None:
        if not self.fired and any(isinstance(e, CycleSettled) for e in events):
            self.fired = len(events)
            await self.store.append([JobCancelled(at=1, job=JobId("nobody"))])


async def test_a_settled_cycle_refused_by_the_fence_is_judged_and_recorded_again(store: EventStore) -> None:
    """A refused CycleSettled leaves its parks dropped: the next cycle judges the job again and records it once."""
    huge = _job("huge", 1, 8, "high")
    judged = ClusterState()
    for ev in [*CONFIG, huge]:
        evolve(judged, ev)
    (wait,) = decide(judged, 1)  # the verdict a new leader finds on the log already: it writes no JobInadmissible
    assert isinstance(wait, JobInadmissible)
    await store.append([*CONFIG, huge, msgspec.structs.replace(wait, cycle=0)])
    hook = _CutInOnSettled(store)
    loop = SchedulerLoop(store, elector=SoleElector("d1"), clock=lambda: 5.0, hooks=hook)
    async with anyio.create_task_group() as tg:
        await tg.start(loop.run)
        with anyio.fail_after(30):
            await _settled(store)
        loop.stop()
    log = await store.read()
    assert hook.fired == 1, "the first cycle of the term judged `huge` again and decided nothing else"
    settled = [s for s in log if isinstance(s.event, CycleSettled)]
    cut_in = next(s.seq for s in log if isinstance(s.event, JobCancelled))
    assert [(s.event.judged, s.event.serial) for s in settled] == [(1, 1)] and settled[0].seq > cut_in
    assert loop.metrics.registry.get_sample_value("muster_append_conflicts_total") == 1
    assert [s.seq for s in log] == list(range(1, len(log) + 1))
    report = await audit(MemoryLog.from_events([s.event for s in log]))
    assert report.differ == 0 and report.identical == 1 and not report.unrecorded
