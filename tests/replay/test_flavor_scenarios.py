"""The flavors of the scenario contract (spec/scenario.md, Flavors): what a file may say, and its errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.cli import main
from muster.events.types import FlavorConfigured, QueueConfigured
from muster.replay.scenario import loads
from muster.replay.simulator import simulate
from muster.replay.specreader import ScenarioError

NODES = """\
nodes:
  - {name: h0, labels: {model: H100}, capacity: {gpu: 8}}
  - {name: a0, labels: {model: A100}, capacity: {gpu: 8}}
flavors:
  - {name: h100, node_labels: {model: H100}, taints: [{key: gpu, value: h100}]}
  - {name: a100, node_labels: {model: A100}}
"""

GOOD_QUEUE = """\
queues:
  - name: q
    resource_groups:
      - covered: [gpu]
        flavors:
          - {name: h100, nominal: {gpu: 8}}
          - {name: a100, nominal: {gpu: 8}}
"""


def test_flavors_and_groups_become_configuration_events() -> None:
    """Flavors are configured before the queues that name them; a queue keeps its groups in order."""
    s = loads(NODES + GOOD_QUEUE, "f.yaml")
    kinds = [type(e).__name__ for e in s.config]
    assert kinds.index("FlavorConfigured") < kinds.index("QueueConfigured") < kinds.index("NodeAdded")
    h100 = next(e for e in s.config if isinstance(e, FlavorConfigured) and e.name == "h100")
    assert h100.node_labels == {"model": "H100"} and h100.taints[0].key == "gpu"
    q = next(e for e in s.config if isinstance(e, QueueConfigured))
    assert q.resource_groups and [f.name for f in q.resource_groups[0].flavors] == ["h100", "a100"]
    assert q.flavor_fungibility is not None


BAD = [
    pytest.param(
        NODES + GOOD_QUEUE.replace("a100, nominal", "l4, nominal"),
        13,
        "flavor 'l4' is not defined",
        id="unknown-flavor-in-queue",
    ),
    pytest.param(
        NODES.replace("{model: A100}}", "{model: L4}}"),
        6,
        "flavor 'a100' has no nodes",
        id="flavor-with-no-nodes",
    ),
    pytest.param(
        NODES
        + """\
queues:
  - name: q
    resource_groups:
      - covered: [gpu, cpu]
        flavors: [{name: h100, nominal: {gpu: 8}}]
      - covered: [gpu]
        flavors: [{name: a100, nominal: {gpu: 8}}]
""",
        12,
        "resource 'gpu' is in two resource groups",
        id="resource-in-two-groups",
    ),
    pytest.param(
        NODES + GOOD_QUEUE.replace("a100, nominal", "h100, nominal"),
        13,
        "flavor 'h100' appears twice",
        id="flavor-twice-in-a-queue",
    ),
    pytest.param(
        NODES + GOOD_QUEUE.replace("{name: a100, nominal: {gpu: 8}}", "{name: a100, nominal: {cpu: 8}}"),
        13,
        "names 'cpu', which its group does not cover",
        id="quota-for-an-uncovered-resource",
    ),
    pytest.param(
        NODES + GOOD_QUEUE.replace("  - name: q\n", "  - name: q\n    nominal: {gpu: 8}\n"),
        9,
        "nominal and resource_groups exclude each other",
        id="plain-quota-and-groups",
    ),
    pytest.param(
        NODES
        + GOOD_QUEUE
        + """\
timeline:
  - {at: 0, submit: {job: j, queue: q, podsets: [{count: 1, requests: {gpu: 8}, flavors: [l4]}]}}
""",
        15,
        "podset 'worker': flavor 'l4' is not defined",
        id="unknown-flavor-in-podset",
    ),
    pytest.param(
        NODES
        + GOOD_QUEUE
        + """\
timeline:
  - {at: 5, queue_update: {name: q, borrowing_limit: {gpu: 8}}}
""",
        15,
        "queue 'q' has resource_groups: change its quota there",
        id="plain-limit-update-of-a-flavored-queue",
    ),
    pytest.param(
        NODES + GOOD_QUEUE + "    flavor_fungibility: {when_can_borrow: Sometimes}\n",
        14,
        "when_can_borrow must be one of Borrow, TryNextFlavor",
        id="unknown-fungibility",
    ),
    pytest.param(
        NODES + GOOD_QUEUE + "    reserve_after: 60\n",
        14,
        "reservations do not cover flavors yet",
        id="reservations-on-a-flavored-queue",
    ),
]


@pytest.mark.parametrize(("text", "line", "message"), BAD)
def test_invalid_flavor_configuration_names_file_and_line(text: str, line: int, message: str) -> None:
    """Each invalid combination is a scenario error at the line that causes it."""
    with pytest.raises(ScenarioError) as err:
        loads(text, "bad.yaml")
    assert err.value.line == line, str(err.value)
    assert message in err.value.message


def test_invalid_flavor_scenario_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`muster sim` answers an invalid flavor configuration with exit status 2 and file:line."""
    path = tmp_path / "bad.yaml"
    path.write_text(NODES + GOOD_QUEUE.replace("a100, nominal", "l4, nominal"))
    assert main(["sim", str(path)]) == 2
    assert f"{path}:13: queue q: flavor 'l4' is not defined" in capsys.readouterr().err


def test_queue_update_replaces_groups_and_plain_nominal_turns_back() -> None:
    """`queue_update` with `resource_groups` moves quota between flavors; `nominal` makes one plain pool again."""
    untainted = NODES.replace(", taints: [{key: gpu, value: h100}]", "")  # a plain pool may use every node
    text = (
        untainted
        + GOOD_QUEUE
        + """\
timeline:
  - {at: 0, submit: {job: j1, queue: q, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 100}}
  - {at: 0, submit: {job: j2, queue: q, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 100}}
  - {at: 200, queue_update: {name: q, resource_groups: [{covered: [gpu], flavors: [{name: a100, nominal: {gpu: 8}}]}]}}
  - {at: 200, submit: {job: j3, queue: q, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 100}}
  - {at: 400, queue_update: {name: q, nominal: {gpu: 16}}}
  - {at: 400, submit: {job: j4, queue: q, podsets: [{count: 2, requests: {gpu: 8}}], runtime: 100}}
"""
    )
    result = simulate(loads(text, "u.yaml"))
    admitted = {e.job: e for e in result.events if type(e).__name__ == "JobAdmitted"}
    assert {j: getattr(admitted[j], "flavors", None) for j in ("j1", "j2", "j3")} == {
        "j1": {"worker": {"gpu": "h100"}},
        "j2": {"worker": {"gpu": "a100"}},
        "j3": {"worker": {"gpu": "a100"}},
    }
    assert set(admitted["j4"].placement.values()) == {"h0", "a0"}
    assert not admitted["j4"].flavors


def test_a_flavored_queue_makes_no_reservation_even_if_its_configuration_asks() -> None:
    """A QueueConfigured with groups and reserve_after (from a source other than a scenario) reserves nothing."""
    import dataclasses

    import msgspec

    from muster.events.types import ReservationMade

    text = (
        NODES
        + GOOD_QUEUE
        + """\
timeline:
  - {at: 0, submit: {job: small, queue: q, podsets: [{count: 1, requests: {gpu: 8}}], runtime: 600}}
  - {at: 0, submit: {job: wide, queue: q, podsets: [{count: 2, requests: {gpu: 8}}], runtime: 60}}
"""
    )
    s = loads(text, "f.yaml")
    config = [msgspec.structs.replace(e, reserve_after=0) if isinstance(e, QueueConfigured) else e for e in s.config]
    events = list(simulate(dataclasses.replace(s, config=config)).events)
    assert not [e for e in events if isinstance(e, ReservationMade)]


def test_queues_shows_a_flavored_queues_quota_and_use_per_flavor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`muster queues` gives a queue with flavors (and its cohort) one line of quota, used, borrowed and lent
    GPUs per flavor instead of a sum of unlike GPUs; a plain queue keeps its one line."""
    from muster.events.codec import encode
    from muster.events.types import JobAdmitted

    text = NODES + GOOD_QUEUE.replace("queues:\n", "cohorts:\n  - {name: org}\nqueues:\n").replace(
        "  - name: q\n", "  - name: q\n    cohort: org\n"
    )
    text += "  - {name: plain, cohort: org, nominal: {gpu: 2}}\n"
    text += "timeline:\n  - {at: 0, submit: {job: j, queue: q, podsets: [{name: w, count: 1, requests: {gpu: 4}}]}}\n"
    events = simulate(loads(text, "f.yaml")).events
    log = tmp_path / "log.jsonl"
    log.write_bytes(b"".join(encode(e) + b"\n" for e in events))
    admitted = next(i for i, e in enumerate(events, start=1) if isinstance(e, JobAdmitted))
    assert main(["queues", "--log", str(log), "--at", str(admitted), "-o", "json"]) == 0
    doc = __import__("json").loads(capsys.readouterr().out)
    plain, q = doc["queues"]
    assert q["flavors"] == [
        {"flavor": "a100", "nominal": 8, "borrowing_limit": None, "used": 0, "borrowed": 0, "lent": 0},
        {"flavor": "h100", "nominal": 8, "borrowing_limit": None, "used": 4, "borrowed": 0, "lent": 0},
    ]
    assert plain["flavors"] == [] and plain["nominal"] == 2
    assert [(f["flavor"], f["nominal"], f["used"]) for f in doc["cohorts"][0]["flavors"]] == [
        ("a100", 8, 0),
        ("h100", 8, 4),
    ]
    assert main(["queues", "--log", str(log), "--at", str(admitted)]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(line.split() for line in lines if line.split()[:1] == ["q"])
    assert row[:2] == ["q", "org"] and "16" not in row, "a flavored queue's line sums no GPUs of unlike flavors"
    assert any(line.split()[:3] == ["h100", "8", "-"] and line.split()[3] == "4" for line in lines)


def test_a_podset_naming_a_flavor_in_a_plain_queue_is_rejected_not_bound_off_its_flavor() -> None:
    """A podset naming flavors in a queue without resource_groups is rejected, never bound on another flavor's node."""
    from muster.events.types import JobAdmitted, JobRejected

    text = (
        NODES
        + """\
queues: [{name: q, nominal: {gpu: 16}}]
timeline:
  - at: 0
    submit: {job: j, queue: q, podsets: [{name: w, count: 1, requests: {gpu: 8}, flavors: [h100]}], runtime: 10}
"""
    )
    events = list(simulate(loads(text, "f.yaml")).events)
    assert not [e for e in events if isinstance(e, JobAdmitted)]
    (rejected,) = [e for e in events if isinstance(e, JobRejected)]
    assert "queue 'q' has no resource_groups" in rejected.reason and "flavors (h100)" in rejected.reason
