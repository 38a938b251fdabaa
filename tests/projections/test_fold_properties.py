"""Properties of the cluster-state fold: deterministic, and folding is resumable at any point.

The generator builds event sequences that mostly apply: it keeps its own
ClusterState while drawing, so admissions name pending jobs and existing nodes,
preemptions and utilization samples name admitted jobs, and so on. A few
deliberately invalid events (unknown jobs, stale leaders) exercise the
skip path.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from muster.events import codec
from muster.events.types import (
    CohortConfigured,
    Event,
    GpuUtilizationSampled,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobInadmissible,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    LeaderElected,
    NodeAdded,
    NodeCordoned,
    NodeRemoved,
    NodeUpdated,
    PodSet,
    PriorityClassConfigured,
    QueueConfigured,
)
from muster.projections.cluster import evolve, fold
from muster.projections.state import ClusterState

ACTIONS = (
    "submit",
    "submit",
    "admit",
    "admit",
    "start",
    "finish",
    "fail",
    "cancel",
    "preempt",
    "utilization",
    "inadmissible",
    "node_update",
    "cordon",
    "node_add",
    "node_remove",
    "queue",
    "leader",
    "invalid",
)


class Generated:
    """A drawn sequence and how many of its events were made invalid on purpose."""

    def __init__(self, events: list[Event], invalid: int) -> None:
        self.events = events
        self.invalid = invalid

    def __repr__(self) -> str:
        return f"Generated(invalid={self.invalid}, events={self.events!r})"


@st.composite
def cluster_histories(draw: st.DrawFn, max_steps: int = 40) -> Generated:
    """A plausible cluster history: configuration, nodes, then job lifecycles over non-decreasing time."""
    model = ClusterState()
    events: list[Event] = []
    invalid = 0
    at = 0

    def emit(event: Event) -> None:
        events.append(event)
        evolve(model, event)

    emit(PriorityClassConfigured(at=0, name="high", value=1000, preemptible=False))
    emit(PriorityClassConfigured(at=0, name="low", value=10))
    emit(CohortConfigured(at=0, name="org"))
    for q in range(draw(st.integers(1, 3))):
        emit(QueueConfigured(at=0, name=f"q{q}", cohort="org", nominal={"gpu": draw(st.integers(0, 32))}))
    node_names = [f"n{i}" for i in range(draw(st.integers(1, 4)))]
    for name in node_names:
        emit(NodeAdded(at=0, node=name, labels={"rack": f"r{len(name) % 2}"}, capacity={"gpu": 8, "cpu": 64_000}))
    next_job = 0
    next_node = len(node_names)

    for _ in range(draw(st.integers(0, max_steps))):
        at += draw(st.integers(0, 300))
        action = draw(st.sampled_from(ACTIONS))
        jobs = model.jobs
        pending = sorted(j for j, s in jobs.items() if s.status == "pending")
        admitted = sorted(j for j, s in jobs.items() if s.status == "admitted")
        live = sorted(j for j, s in jobs.items() if s.status in ("pending", "admitted"))
        nodes = sorted(model.nodes)
        epoch = model.epoch

        if action == "submit" or (action in ("admit", "inadmissible") and not pending):
            count = draw(st.integers(1, 3))
            emit(
                JobSubmitted(
                    at=at,
                    job=f"job-{next_job}",
                    queue=draw(st.sampled_from(sorted(model.queues))),
                    priority_class=draw(st.sampled_from([None, "high", "low"])),
                    podsets=[PodSet(name="worker", count=count, requests={"gpu": draw(st.integers(1, 8))})],
                    runtime=draw(st.one_of(st.none(), st.integers(60, 7200))),
                    checkpoint_every=draw(st.one_of(st.none(), st.integers(60, 1800))),
                )
            )
            next_job += 1
        elif action == "admit" and nodes:
            job = jobs[draw(st.sampled_from(pending))]
            placement = {f"{ps.name}-{i}": draw(st.sampled_from(nodes)) for ps in job.podsets for i in range(ps.count)}
            emit(JobAdmitted(at=at, job=job.id, queue=job.queue, placement=placement, cycle=len(events), epoch=epoch))
        elif action == "inadmissible":
            emit(JobInadmissible(at=at, job=draw(st.sampled_from(pending)), reason="no room", epoch=epoch))
        elif action in ("start", "preempt", "utilization") and admitted:
            job_id = draw(st.sampled_from(admitted))
            if action == "start":
                emit(JobStarted(at=at, job=job_id))
            elif action == "preempt":
                emit(JobPreempted(at=at, job=job_id, preemptor=None, reason="WithinQueue", epoch=epoch))
            else:
                emit(GpuUtilizationSampled(at=at, job=job_id, gpu=draw(st.sampled_from([0.0, 0.03, 0.5, 1.0]))))
        elif action in ("finish", "fail", "cancel") and live:
            job_id = draw(st.sampled_from(live))
            end = {"finish": JobFinished(at=at, job=job_id), "cancel": JobCancelled(at=at, job=job_id)}
            emit(end.get(action) or JobFailed(at=at, job=job_id, reason="exit 1"))
        elif action == "node_update" and nodes:
            name = draw(st.sampled_from(nodes))
            emit(
                NodeUpdated(
                    at=at, node=name, capacity={"gpu": draw(st.sampled_from([4, 8]))}, ready=draw(st.booleans())
                )
            )
        elif action == "cordon" and nodes:
            emit(NodeCordoned(at=at, node=draw(st.sampled_from(nodes)), cordoned=draw(st.booleans())))
        elif action == "node_add":
            emit(NodeAdded(at=at, node=f"n{next_node}", capacity={"gpu": 8}))
            next_node += 1
        elif action == "node_remove" and len(nodes) > 1:
            emit(NodeRemoved(at=at, node=draw(st.sampled_from(nodes))))
        elif action == "queue":
            emit(QueueConfigured(at=at, name=draw(st.sampled_from(sorted(model.queues))), nominal={"gpu": 16}))
        elif action == "leader":
            emit(LeaderElected(at=at, epoch=epoch + 1, holder=f"muster-{epoch + 1}"))
        elif action == "invalid":
            invalid += 1
            emit(
                draw(
                    st.sampled_from(
                        [
                            JobFinished(at=at, job="no-such-job"),
                            NodeRemoved(at=at, node="no-such-node"),
                            LeaderElected(at=at, epoch=epoch, holder="stale"),
                        ]
                    )
                )
            )
    return Generated(events, invalid)


@settings(max_examples=150, deadline=None)
@given(cluster_histories())
def test_folding_twice_gives_equal_states(history: Generated) -> None:
    """Folding the same events into two fresh states gives equal states (the fold is deterministic)."""
    first = fold(history.events)
    second = fold(history.events)
    assert first == second
    assert first.applied == len(history.events)


@settings(max_examples=150, deadline=None)
@given(cluster_histories(), st.data())
def test_folding_a_prefix_then_the_rest_equals_folding_the_whole(history: Generated, data: st.DataObject) -> None:
    """Stopping a fold at any event and resuming it on the same state gives the state of one full fold."""
    cut = data.draw(st.integers(0, len(history.events)), label="cut")
    resumed = fold(history.events[cut:], fold(history.events[:cut]))
    assert resumed == fold(history.events)


@settings(max_examples=100, deadline=None)
@given(cluster_histories())
def test_generated_events_apply_except_the_deliberately_invalid(history: Generated) -> None:
    """The generator's events are meaningful: every one applies except those made invalid on purpose."""
    state = fold(history.events)
    assert state.skipped == history.invalid
    assert state.fenced == 0


@settings(max_examples=100, deadline=None)
@given(cluster_histories())
def test_folding_stored_bytes_equals_folding_the_events(history: Generated) -> None:
    """Replaying the encoded log gives the same state as folding the events in memory."""
    replayed = fold([codec.decode(codec.encode(e)) for e in history.events])
    assert replayed == fold(history.events)
