"""Topology-aware gang placement as scenarios (spec/scenario.md, Gangs and placement).

Nodes are named `bB-rR-nI` (block B, rack R): `racks_of` and `blocks_of`
read a placement's domains back from the node names.
"""

from __future__ import annotations

import pytest
from simkit import blocks_of, flat_nodes, nodes_8gpu, queue, racks_of, run, scenario, submit

TWO_BLOCKS = nodes_8gpu(blocks=2, racks=2, per_rack=2)  # 2 blocks x 2 racks x 2 nodes x 8 GPUs = 64 GPUs
BIG_QUEUE = [queue("q", 10_000)]


def _pods_per_node(placement: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for node in placement.values():
        out[node] = out.get(node, 0) + 1
    return out


# ---------------------------------------------------------------- required / preferred


def test_required_block_keeps_the_gang_in_one_block() -> None:
    """A gang with `required: block` lands inside one block even when it must skip a half-full one."""
    out = run(
        scenario(
            TWO_BLOCKS,
            BIG_QUEUE,
            [submit("filler", "q", 16, required="rack"), submit("gang", "q", 32, required="block")],
        )
    )
    assert len(blocks_of(out.nodes_of("gang"))) == 1
    assert blocks_of(out.nodes_of("gang")) != blocks_of(out.nodes_of("filler"))


def test_required_level_with_no_room_stays_pending_naming_the_level() -> None:
    """When no domain of the required level can hold the gang it waits, and says which level has no room."""
    out = run(
        scenario(
            TWO_BLOCKS,
            BIG_QUEUE,
            [
                "  - {at: 0, cordon: b0-r0-n0}\n",
                "  - {at: 0, cordon: b1-r1-n1}\n",
                submit("gang", "q", 32, at=10, required="block"),
            ],
        )
    )
    # 48 GPUs are free, but no block holds 32
    assert out.decisions(at=10) == [("pending", "gang")]
    assert out.reasons("gang") == ["no block has room for 4 pods of gpu=8"]


def test_required_rack_no_rack_big_enough() -> None:
    """A gang larger than any rack with `required: rack` waits forever with a reason naming racks."""
    out = run(scenario(TWO_BLOCKS, BIG_QUEUE, [submit("gang", "q", 24, required="rack")]))
    assert out.decisions() == [("pending", "gang")]
    assert out.reasons("gang") == ["no rack has room for 3 pods of gpu=8"]


def test_preferred_block_spreads_over_fewest_blocks_when_none_fits() -> None:
    """`preferred: block` runs across blocks when no single block fits, using as few as possible."""
    out = run(
        scenario(
            TWO_BLOCKS,
            BIG_QUEUE,
            [
                submit("x0", "q", 8, required="host"),
                submit("x1", "q", 8, required="host"),
                submit("gang", "q", 40, at=10, preferred="block"),
            ],
        )
    )
    nodes = out.nodes_of("gang")
    assert blocks_of(nodes) == {"b0", "b1"}
    assert len(nodes) == 5


def test_preferred_block_uses_one_block_when_one_fits() -> None:
    """`preferred: block` stays in one block when one has room."""
    out = run(scenario(TWO_BLOCKS, BIG_QUEUE, [submit("x", "q", 8), submit("gang", "q", 24, at=10, preferred="block")]))
    assert len(blocks_of(out.nodes_of("gang"))) == 1


def test_required_host_puts_all_pods_on_one_node() -> None:
    """`required: host` packs every pod of the gang onto one node."""
    out = run(scenario(TWO_BLOCKS, BIG_QUEUE, [submit("gang", "q", 8, per_pod=2, required="host")]))
    assert len(out.nodes_of("gang")) == 1
    assert len(out.admitted("gang").placement) == 4


# ---------------------------------------------------------------- best fit


def test_small_gang_takes_the_tightest_block_so_a_big_gang_finds_a_whole_block() -> None:
    """Best fit: a small gang goes to the fuller block, leaving a whole block for the big gang that follows."""
    out = run(
        scenario(
            TWO_BLOCKS,
            BIG_QUEUE,
            [
                submit("x", "q", 8),
                submit("small", "q", 16, at=10, required="block"),
                submit("big", "q", 32, at=20, required="block"),
            ],
        )
    )
    assert blocks_of(out.nodes_of("small")) == blocks_of(out.nodes_of("x"))
    assert out.decisions(at=20) == [("admit", "big")]
    assert len(blocks_of(out.nodes_of("big"))) == 1


def test_best_fit_tie_goes_to_domain_in_tightest_enclosing_domain() -> None:
    """Racks equally free: the rack inside the fuller block is taken."""
    out = run(
        scenario(
            TWO_BLOCKS,
            BIG_QUEUE,
            [
                # b1 gets one full rack busy: b1-r0 or b1-r1 is taken, so b1 has 16 free, b0 32
                submit("x", "q", 16, required="rack"),
                submit("y", "q", 16, at=5, required="rack"),
                submit("gang", "q", 16, at=10, required="rack"),
            ],
        )
    )
    x_block = blocks_of(out.nodes_of("x"))
    # y fills the other rack of x's block (the tighter block); gang then goes to the other block
    assert blocks_of(out.nodes_of("y")) == x_block
    assert blocks_of(out.nodes_of("gang")) != x_block


def test_tightest_node_first() -> None:
    """A single pod goes to the node with the least free GPUs that holds it."""
    out = run(
        scenario(
            flat_nodes(8, 4, 8, 2),
            BIG_QUEUE,
            [submit("two", "q", 2), submit("three", "q", 3, at=10)],
        )
    )
    assert out.admitted("two").placement == {"w-0": "n3"}
    assert out.admitted("three").placement == {"w-0": "n1"}


def test_ties_go_by_name() -> None:
    """Equally free domains: the first by name wins (deterministic placement)."""
    out = run(scenario(TWO_BLOCKS, BIG_QUEUE, [submit("gang", "q", 16, required="rack")]))
    assert racks_of(out.nodes_of("gang")) == {"b0-r0"}


# ---------------------------------------------------------------- below the level


@pytest.mark.parametrize(
    ("topology", "gpus", "per_pod", "racks", "nodes"),
    [
        pytest.param({"required": "block"}, 48, 8, 2, 6, id="required-block-fewest-racks"),
        pytest.param({"required": "block"}, 16, 8, 1, 2, id="required-block-one-rack-when-it-fits"),
        pytest.param({"required": "block"}, 8, 4, 1, 1, id="required-block-fewest-nodes"),
        pytest.param({"required": "rack"}, 16, 4, 1, 2, id="required-rack-fewest-nodes"),
        pytest.param({}, 16, 8, 1, 2, id="no-topology-packs-like-preferred-outermost"),
        pytest.param({"preferred": "rack"}, 8, 2, 1, 1, id="preferred-rack-one-node"),
    ],
)
def test_fewest_domains_below_the_level(
    topology: dict[str, str], gpus: int, per_pod: int, racks: int, nodes: int
) -> None:
    """Below the topology level a gang uses the fewest racks, then the fewest nodes."""
    out = run(
        scenario(
            nodes_8gpu(blocks=2, racks=4, per_rack=4),
            BIG_QUEUE,
            [submit("gang", "q", gpus, per_pod=per_pod, **topology)],  # type: ignore[arg-type]
        )
    )
    placed = out.nodes_of("gang")
    assert (len(racks_of(placed)), len(placed)) == (racks, nodes)
    assert len(blocks_of(placed)) == 1


def test_spread_takes_roomiest_racks_first() -> None:
    """A gang that needs more than one rack fills the roomiest racks, so it spans as few as possible."""
    out = run(
        scenario(
            nodes_8gpu(racks=3, per_rack=4),
            BIG_QUEUE,
            [
                submit("a", "q", 24, required="rack"),
                submit("b", "q", 8, required="rack"),
                submit("gang", "q", 56, at=10, required="block"),
            ],
        )
    )
    # racks now hold 8, 24 and 32 free GPUs: 56 = 32 + 24 needs two racks, not three
    assert len(racks_of(out.nodes_of("gang"))) == 2
    assert racks_of(out.nodes_of("gang")).isdisjoint(racks_of(out.nodes_of("a")))


# ---------------------------------------------------------------- gangs


def test_two_64_gpu_gangs_on_96_gpus_do_not_deadlock() -> None:
    """Two 64-GPU gangs on 96 free GPUs: one runs whole, the other waits whole, then runs."""
    out = run(
        scenario(
            nodes_8gpu(racks=3, per_rack=4),
            BIG_QUEUE,
            [submit("big-1", "q", 64, runtime=3600), submit("big-2", "q", 64, runtime=3600)],
        )
    )
    assert out.decisions(at=0) == [("admit", "big-1"), ("pending", "big-2")]
    assert out.reasons("big-2") == ["8 pods of gpu=8 do not fit on the schedulable nodes"]
    assert len(out.admitted("big-1").placement) == 8
    assert out.decisions(at=3600, pending=False) == [("admit", "big-2")]
    assert len(out.admitted("big-2").placement) == 8
    assert out.finished_at("big-2") == 7200


def test_gang_with_two_podsets_is_all_or_nothing() -> None:
    """A gang of two podsets is admitted only when both have nodes; its placement names every pod."""
    job = (
        "  - {at: 0, submit: {job: js, queue: q, runtime: 100, podsets: ["
        "{name: driver, count: 1, requests: {gpu: 4}}, "
        "{name: worker, count: 3, requests: {gpu: 8}}]}}\n"
    )
    out = run(scenario(flat_nodes(8, 8, 8, 4), BIG_QUEUE, [submit("x", "q", 8, runtime=50), job]))
    assert out.decisions(at=0) == [("admit", "x"), ("pending", "js")]
    placement = out.admitted("js").placement
    assert out.admitted("js").at == 50
    assert set(placement) == {"driver-0", "worker-0", "worker-1", "worker-2"}
    assert placement["driver-0"] == "n3"


def test_multi_pod_per_node_packing() -> None:
    """Pods smaller than a node share nodes: 8 pods of 2 GPUs fill two nodes exactly."""
    out = run(scenario(TWO_BLOCKS, BIG_QUEUE, [submit("gang", "q", 16, per_pod=2)]))
    assert sorted(_pods_per_node(out.admitted("gang").placement).values()) == [4, 4]


def test_cpu_and_memory_requests_limit_placement() -> None:
    """Pods need room for every resource they request; a resource a node does not name is zero there."""
    nodes = (
        "nodes:\n"
        "  - {name: a, capacity: {gpu: 8, cpu: 4, memory: 64Gi}}\n"
        "  - {name: b, capacity: {gpu: 8, cpu: 32, memory: 256Gi}}\n"
        "  - {name: c, capacity: {gpu: 8}}\n"
    )
    jobs = [
        "  - {at: 0, submit: {job: cpu, queue: q, podsets: [{name: w, count: 2, requests: {gpu: 1, cpu: 3}}]}}\n",
        "  - {at: 0, submit: {job: mem, queue: q, podsets: [{name: w, count: 1, requests: {gpu: 1, memory: 99Gi}}]}}\n",
        "  - {at: 0, submit: {job: milli, queue: q, podsets: [{name: w, count: 1, requests: {cpu: 500m}}]}}\n",
        "  - {at: 0, submit: {job: huge, queue: q, podsets: [{name: w, count: 1, requests: {gpu: 1, cpu: 40}}]}}\n",
    ]
    out = run(scenario(nodes, BIG_QUEUE, jobs))
    # two pods of 3 CPUs need one node with 6 free CPUs (fewest nodes): only b
    assert out.admitted("cpu").placement == {"w-0": "b", "w-1": "b"}
    assert out.admitted("mem").placement == {"w-0": "b"}
    # half a CPU fits on a (4 CPUs), not on c (no CPU at all)
    assert out.admitted("milli").placement == {"w-0": "a"}
    assert out.reasons("huge") == ["1 pod of cpu=40 gpu=1 do not fit on the schedulable nodes"]


def test_an_over_committed_node_does_not_hide_the_room_of_its_rack() -> None:
    """Foreign pods holding more than a node's capacity leave its rack's other nodes usable: the gang lands there."""
    from muster.events.types import JobAdmitted, JobSubmitted, NodeAdded, PodSet, QueueConfigured, SchedulerConfigured
    from muster.projections.cluster import fold
    from muster.projections.scheduler import decide

    def node(name: str, reserved: int) -> NodeAdded:
        block, rack, _ = name.split("-")
        labels = {"block": block, "rack": f"{block}-{rack}"}
        return NodeAdded(at=0, node=name, labels=labels, capacity={"gpu": 8}, reserved={"gpu": reserved})  # type: ignore[arg-type]

    state = fold(
        [
            SchedulerConfigured(at=0, levels=["block", "rack"]),
            QueueConfigured(at=0, name="q", nominal={"gpu": 64}),  # type: ignore[arg-type]
            node("b0-r0-n0", 2),
            node("b0-r1-n0", 0),
            node("b0-r1-n1", 0),
            node("b0-r1-n2", 12),  # 4 GPUs over: its free room is -4, which must not count against b0-r1
            JobSubmitted(at=1, job="gang", queue="q", podsets=[PodSet(name="w", count=2, requests={"gpu": 8})]),  # type: ignore[arg-type]
        ]
    )
    [admitted] = decide(state, 1)
    assert isinstance(admitted, JobAdmitted)
    assert sorted(admitted.placement.values()) == ["b0-r1-n0", "b0-r1-n1"]
