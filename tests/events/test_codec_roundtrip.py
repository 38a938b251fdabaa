"""Every event type survives JSON encoding, and stored v1 bytes are upcast to the current version."""

from __future__ import annotations

import pytest

from muster.events import codec
from muster.events.types import (
    EVENT_TYPES,
    BorrowWithinCohort,
    CohortConfigured,
    CycleSettled,
    Event,
    ExpectedEnd,
    FlavorConfigured,
    FlavorFungibility,
    FlavorQuota,
    GpuUtilizationSampled,
    IdleReclaimPolicy,
    JobAdmitted,
    JobCancelled,
    JobFailed,
    JobFinished,
    JobHeld,
    JobInadmissible,
    JobPreempted,
    JobRejected,
    JobReleased,
    JobStarted,
    JobSubmitted,
    LeaderElected,
    NodeAdded,
    NodeCordoned,
    NodeRemoved,
    NodeUpdated,
    PodSet,
    PreemptionPolicy,
    PriorityClassConfigured,
    QueueConfigured,
    ReservationMade,
    ReservationReleased,
    ResourceGroup,
    SchedulerConfigured,
    SubmissionRejected,
    Taint,
    Topology,
    event_tag,
)

V1_JOB_SUBMITTED = b'{"type":"JobSubmitted","at":5,"job":"j1","queue":"q","pods":4,"gpus":8}'


def one_of_each() -> list[Event]:
    """One instance of every event type, with non-default values wherever a field allows."""
    return [
        SchedulerConfigured(
            at=1,
            levels=["block", "rack"],
            fair_sharing=True,
            idle_reclaim=IdleReclaimPolicy(threshold=0.1, after=600, only_borrowing=False),
        ),
        PriorityClassConfigured(at=2, name="training", value=100, preemptible=False),
        CohortConfigured(at=3, name="org", parent="root"),
        QueueConfigured(
            at=4,
            name="team-a",
            cohort="org",
            nominal={"gpu": 128, "cpu": 96_000},
            borrowing_limit={"gpu": 64},
            lending_limit={"gpu": 32},
            weight=2.5,
            preemption=PreemptionPolicy(
                within_queue="LowerPriority",
                reclaim_within_cohort="Any",
                borrow_within_cohort=BorrowWithinCohort(policy="LowerPriority", max_priority_threshold=100),
            ),
            reserve_after=3600,
        ),
        NodeAdded(
            at=5,
            node="b0-r0-n0",
            labels={"block": "b0", "rack": "r0"},
            capacity={"gpu": 8, "memory": 2**40},
            ready=False,
            unschedulable=True,
            reserved={"cpu": 500},
        ),
        NodeUpdated(at=6, node="b0-r0-n0", labels={"block": "b0"}, capacity={"gpu": 4}, ready=True),
        NodeRemoved(at=7, node="b0-r0-n1"),
        NodeCordoned(at=8, node="b0-r0-n0", cordoned=False),
        JobSubmitted(
            at=9,
            job="train-1",
            queue="team-a",
            priority_class="training",
            podsets=[
                PodSet(name="worker", count=2, requests={"gpu": 8, "cpu": 32_000}, topology=Topology(required="rack")),
                PodSet(name="launcher", count=1, requests={"cpu": 1000}, topology=Topology(preferred="block")),
            ],
            runtime=7200,
            checkpoint_every=1800,
            pods={"worker-0": "ns/train-1-worker-0"},
            source="k8s",
        ),
        JobCancelled(at=10, job="train-1", reason="WorkloadDeleted: Job ns/train-1 is gone"),
        JobHeld(at=10, job="train-1", reason="waiting for the dataset"),
        JobReleased(at=11, job="train-1"),
        SubmissionRejected(at=12, job="train-1", queue="team-a", reason="job id 'train-1' is taken", cycle=3, epoch=2),
        ReservationMade(
            at=12,
            job="train-1",
            queue="team-a",
            nodes=["b1-r3-n0", "b1-r3-n1"],
            domain="b1/r3",
            expected_start=3600,
            waits_for=[ExpectedEnd(job="eval-2", end=3600), ExpectedEnd(job="dev-3", end=None)],
            reason="waited 7200 s (reserve_after 3600 s)",
            cycle=3,
            epoch=2,
        ),
        ReservationReleased(at=13, job="train-1", reason="admitted", cycle=4, epoch=2),
        CycleSettled(at=13, judged=12, serial=3, cycle=5, epoch=2),
        JobStarted(at=11, job="train-1"),
        JobFinished(at=12, job="train-1"),
        JobFailed(at=13, job="train-1", reason="OOMKilled"),
        GpuUtilizationSampled(at=14, job="train-1", gpu=0.25),
        LeaderElected(at=15, epoch=3, holder="muster-0"),
        JobAdmitted(
            at=16,
            job="train-1",
            queue="team-a",
            placement={"worker-0": "b0-r0-n0", "worker-1": "b0-r0-n0", "launcher-0": "b0-r0-n2"},
            borrowed={"gpu": 8},
            cycle=7,
            epoch=3,
            policy_version="abc123",
            explanation="fits within nominal quota",
        ),
        JobPreempted(
            at=17,
            job="train-1",
            preemptor="serve-1",
            reason="ReclaimWithinCohort",
            lost_gpu_seconds=960,
            cycle=8,
            epoch=3,
        ),
        JobInadmissible(at=18, job="train-2", reason="insufficient gpu in cohort org", cycle=9, epoch=3),
        JobRejected(at=19, job="train-3", reason="podset worker requests 0 pods", cycle=9, epoch=3),
        FlavorConfigured(
            at=20, name="h100", node_labels={"nvidia.com/gpu.product": "H100"}, taints=[Taint(key="gpu", value="h100")]
        ),
    ]


def flavored() -> list[Event]:
    """Events with the fields flavors added (queues by flavor, a podset's flavors, an admission's)."""
    return [
        QueueConfigured(
            at=21,
            name="team-b",
            resource_groups=[
                ResourceGroup(
                    covered=["gpu", "cpu"],
                    flavors=[FlavorQuota(name="h100", nominal={"gpu": 16}, borrowing_limit={"gpu": 8})],
                )
            ],
            flavor_fungibility=FlavorFungibility(when_can_borrow="TryNextFlavor", when_can_preempt="Preempt"),
        ),
        JobAdmitted(
            at=22,
            job="train-4",
            queue="team-b",
            placement={"worker-0": "b0-r0-n0"},
            borrowed={"gpu@h100": 8},
            flavors={"worker": {"gpu": "h100", "cpu": "h100"}},
        ),
        JobSubmitted(
            at=23,
            job="train-4",
            queue="team-b",
            podsets=[PodSet(name="w", count=1, requests={"gpu": 8}, flavors=["h100"])],
        ),
    ]


def test_flavor_fields_round_trip() -> None:
    """The fields flavors added survive encoding, and are absent from the bytes when unset."""
    for ev in flavored():
        assert codec.decode(codec.encode(ev)) == ev
    plain = QueueConfigured(at=0, name="q", nominal={"gpu": 8})
    assert b"resource_groups" not in codec.encode(plain) and b"flavor" not in codec.encode(plain)


def test_samples_cover_every_event_type() -> None:
    """The round-trip samples include one instance of each type in EVENT_TYPES, so a new type cannot go untested."""
    assert sorted(event_tag(type(e)) for e in one_of_each()) == sorted(event_tag(t) for t in EVENT_TYPES)


@pytest.mark.parametrize("event", one_of_each(), ids=lambda e: type(e).__name__)
def test_every_event_type_round_trips_through_json(event: Event) -> None:
    """Encoding then decoding any event gives an equal event of the same type, tagged with its type name."""
    raw = codec.encode(event)
    assert raw.startswith(b'{"type":"' + event_tag(type(event)).encode() + b'"')
    decoded = codec.decode(raw)
    assert type(decoded) is type(event)
    assert decoded == event


def test_stored_v1_job_submitted_is_upcast_to_podsets() -> None:
    """The v1 bytes of a JobSubmitted (flat pods and gpus) decode as a v2 job with one worker podset."""
    event = codec.decode(V1_JOB_SUBMITTED)
    assert event == JobSubmitted(
        at=5, job="j1", queue="q", podsets=[PodSet(name="worker", count=4, requests={"gpu": 8})], v=2
    )


def test_a_job_cancelled_stored_before_it_had_a_reason_decodes_with_none() -> None:
    """`JobCancelled.reason` was added last with a default: bytes written without it decode, reason empty."""
    assert codec.decode(b'{"type":"JobCancelled","at":10,"v":1,"job":"j1"}') == JobCancelled(at=10, job="j1")
