"""Applying decisions: per-job order, preemptors bound only after their victims left, nothing without the lease."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
from adapterkit import eventually

from muster.daemon.applier import DecisionApplier
from muster.daemon.cluster import Reapply
from muster.daemon.metrics import DaemonMetrics
from muster.events.types import Event, JobAdmitted, JobId, JobPreempted, NodeName, QueueName


class Recorder:
    """A `Cluster` whose victims' pods stay on their nodes until `release(job)`."""

    def __init__(self) -> None:
        self.applied: list[tuple[str, str]] = []
        self.holding: set[str] = set()
        self.unready: dict[str, anyio.Event] = {}
        """Jobs whose decisions the cluster cannot apply yet (their pods are not there) until the event is set."""

    async def run(self, sink: Any, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    async def ready(self, event: Event) -> None:
        gate = self.unready.get(str(getattr(event, "job", "")))
        if gate is not None:
            await gate.wait()

    async def apply(self, event: Event) -> Any:
        await anyio.lowlevel.checkpoint()
        kind = type(event).__name__
        self.applied.append((kind, str(getattr(event, "job", ""))))
        return type("Result", (), {"ok": True, "outcome": "applied"})()

    def holds(self, job: str) -> bool:
        return job in self.holding


def admitted(job: str) -> JobAdmitted:
    return JobAdmitted(at=1, job=JobId(job), queue=QueueName("q"), placement={"w-0": NodeName("n1")}, epoch=1)


def preempted(job: str, by: str | None) -> JobPreempted:
    return JobPreempted(at=1, job=JobId(job), preemptor=JobId(by) if by else None, reason="WithinQueue", epoch=1)


async def test_a_preemptor_is_bound_only_after_its_victims_pods_are_gone():
    """The preemptor's binding waits for the victims' pods; other jobs' decisions are not held up meanwhile."""
    cluster = Recorder()
    cluster.holding.add("victim")
    victims = {"boss": {"victim"}}
    applier = DecisionApplier(cluster, leading=lambda: True, victims=victims, poll=0.01)
    async with anyio.create_task_group() as tg:
        await tg.start(applier.run)
        applier.submit(preempted("victim", "boss"))
        applier.submit(admitted("boss"))
        applier.submit(admitted("bystander"))
        with anyio.fail_after(30):  # the bystander goes through while the preemptor waits
            while ("JobAdmitted", "bystander") not in cluster.applied:  # noqa: ASYNC110 - observing a fake
                await anyio.sleep(0.01)
        assert ("JobAdmitted", "boss") not in cluster.applied
        cluster.holding.discard("victim")
        with anyio.fail_after(30):
            while ("JobAdmitted", "boss") not in cluster.applied:  # noqa: ASYNC110 - observing a fake
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert cluster.applied.index(("JobPreempted", "victim")) < cluster.applied.index(("JobAdmitted", "boss"))
    assert victims == {}


async def test_the_wait_for_victims_is_bounded():
    """Victims that never leave delay the preemptor's binding by `victim_wait`, not forever."""
    cluster = Recorder()
    cluster.holding.add("stuck")
    applier = DecisionApplier(cluster, leading=lambda: True, victims={"p": {"stuck"}}, victim_wait=0.2, poll=0.01)
    async with anyio.create_task_group() as tg:
        await tg.start(applier.run)
        started = anyio.current_time()
        applier.submit(admitted("p"))
        with anyio.fail_after(30):
            while ("JobAdmitted", "p") not in cluster.applied:  # noqa: ASYNC110 - observing a fake
                await anyio.sleep(0.01)
        waited = anyio.current_time() - started
        tg.cancel_scope.cancel()
    assert waited >= 0.2  # an upper bound would be wall-clock flakiness; the wait is bounded by fail_after


async def test_one_jobs_decisions_are_applied_in_log_order():
    """An admission, a preemption and a re-admission of one job reach the cluster in that order."""
    cluster = Recorder()
    applier = DecisionApplier(cluster, leading=lambda: True, victims={})
    async with anyio.create_task_group() as tg:
        await tg.start(applier.run)
        for ev in (admitted("j"), preempted("j", None), admitted("j")):
            applier.submit(ev)
        with anyio.fail_after(30):
            while len(cluster.applied) < 3:  # noqa: ASYNC110 - observing a fake
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert cluster.applied == [("JobAdmitted", "j"), ("JobPreempted", "j"), ("JobAdmitted", "j")]


async def test_nothing_is_applied_without_the_lease():
    """A decision waits while the lease is not valid: applied if it comes back, never if the term ends first."""
    cluster = Recorder()
    lease = {"valid": False}
    applier = DecisionApplier(cluster, leading=lambda: lease["valid"], victims={}, poll=0.01)
    async with anyio.create_task_group() as tg:
        await tg.start(applier.run)
        applier.submit(admitted("blip"))
        await anyio.sleep(0.1)
        assert cluster.applied == []
        lease["valid"] = True  # a slow refresh came through
        with anyio.fail_after(30):
            while not cluster.applied:  # noqa: ASYNC110 - observing a fake
                await anyio.sleep(0.01)
        lease["valid"] = False
        applier.submit(admitted("lost"))
        await anyio.sleep(0.1)
        tg.cancel_scope.cancel()  # the term ends: the lease was really lost
    assert cluster.applied == [("JobAdmitted", "blip")]


async def test_admissions_waiting_for_their_pods_hold_no_slot():
    """With one slot, two gangs whose pods are slow to come do not keep a third gang's binding waiting."""
    cluster = Recorder()
    cluster.unready = {"slow-1": anyio.Event(), "slow-2": anyio.Event()}
    metrics = DaemonMetrics()
    applier = DecisionApplier(cluster, leading=lambda: True, victims={}, concurrency=1, metrics=metrics)
    async with anyio.create_task_group() as tg:
        await tg.start(applier.run)
        for job in ("slow-1", "slow-2", "fast"):
            applier.submit(admitted(job))
        with anyio.fail_after(30):
            while ("JobAdmitted", "fast") not in cluster.applied:  # noqa: ASYNC110 - observing a fake
                await anyio.sleep(0.01)
        assert metrics.registry.get_sample_value("muster_apply_backlog") == 2  # the two still waiting
        for gate in cluster.unready.values():
            gate.set()
        with anyio.fail_after(30):
            while len(cluster.applied) < 3:  # noqa: ASYNC110 - observing a fake
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert metrics.registry.get_sample_value("muster_apply_backlog") == 0


class ReapplyingRecorder(Recorder):
    """A `Recorder` that, like the Kubernetes adapter, finds work of its own (a Job's successor pods to bind)."""

    def __init__(self) -> None:
        super().__init__()
        self.submit: Any = None

    def reapply_through(self, submit: Any) -> None:
        self.submit = submit

    def successors(self, job: str) -> None:
        async def bind() -> Any:
            self.applied.append(("Successors", job))
            return type("Result", (), {"ok": True, "outcome": "applied"})()

        self.submit(Reapply(job, "Successors", bind))


async def test_a_clusters_own_work_waits_for_the_lease_and_the_jobs_earlier_decisions():
    """A successor binding found by the cluster goes after its job's queued preemption, and only under the lease."""
    cluster = ReapplyingRecorder()
    lease = {"valid": False}
    applier = DecisionApplier(cluster, leading=lambda: lease["valid"], victims={}, poll=0.01)
    async with anyio.create_task_group() as tg:
        await tg.start(applier.run)
        applier.submit(preempted("j", None))
        cluster.successors("j")
        await eventually(lambda: applier.waits == 1)
        assert cluster.applied == []
        lease["valid"] = True
        await eventually(lambda: len(cluster.applied) == 2)
        tg.cancel_scope.cancel()
    assert cluster.applied == [("JobPreempted", "j"), ("Successors", "j")]
