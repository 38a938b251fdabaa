"""The README's table of Prometheus metrics is what the daemon and the billing subscriber export, both ways."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from muster.daemon.billing import BillingMetrics
from muster.daemon.metrics import DaemonMetrics
from muster.events.types import JobSubmitted, NodeAdded, NodeName, PodSet, QueueConfigured
from muster.projections.cluster import fold

README = Path(__file__).resolve().parents[2] / "README.md"


def _documented() -> dict[str, frozenset[str]]:
    """Metric name -> its label names, from the rows of README's "## Metrics" table."""
    text = README.read_text().split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    out: dict[str, frozenset[str]] = {}
    for line in text.splitlines():
        cells = line.strip().strip("|").split("|")
        if not line.startswith("| `muster_") or len(cells) < 3:
            continue
        labels = frozenset(re.findall(r"`([a-z_]+)`", cells[1]))
        for name in re.findall(r"`(muster_[a-z_]+)`", cells[0]):
            out[name] = labels
    return out


def _exported(registry_owner: object, documented: dict[str, frozenset[str]]) -> dict[str, frozenset[str]]:
    """Metric name as scraped (counters with `_total`) -> label names, once every labelled metric has a child
    with the documented labels (`labels()` refuses names the metric does not have)."""
    for value in vars(registry_owner).values():
        if isinstance(value, MetricWrapperBase):
            family = value.describe()[0]
            name = family.name + ("_total" if family.type == "counter" else "")
            if documented.get(name):
                value.labels(**dict.fromkeys(documented[name], "x"))
    out: dict[str, frozenset[str]] = {}
    for family in registry_owner.registry.collect():  # type: ignore[attr-defined]
        name = family.name + ("_total" if family.type == "counter" else "")
        for sample in family.samples:
            out[name] = out.get(name, frozenset()) | (frozenset(sample.labels) - {"le"})
    return out


def test_the_readme_table_lists_every_exported_metric_with_its_labels() -> None:
    """Each metric in README's table is exported with exactly its labels, and nothing exported is missing."""
    documented = _documented()
    daemon = DaemonMetrics(clock=lambda: 1000.0)
    state = fold(
        [
            QueueConfigured(at=0, name="q", nominal={"gpu": 8}),
            NodeAdded(at=0, node=NodeName("n0"), capacity={"gpu": 8}),
            JobSubmitted(at=1, job="j", queue="q", podsets=[PodSet(name="w", count=1, requests={"gpu": 8})]),
        ]
    )
    daemon.watch(lambda: state)
    exported = _exported(daemon, documented) | _exported(BillingMetrics(), documented)
    assert "muster_queue_oldest_pending_age_seconds" in exported and "muster_queue_reservations" in exported
    assert exported == documented
