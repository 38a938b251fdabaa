"""The chart's rendered RBAC bound to the real API server's user `tester` (tests/deploy/helmkit.py renders it).

`bind_chart_rbac_to_tester(kube, tmp_path)`: the chart rendered with Lease election into the
test's namespace, its ClusterRole, Role and bindings applied with `tester` as their subject;
returns the daemon's config the chart renders.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from kubekit import Kube

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "deploy"))
from helmkit import CHART, run_chart

TESTER = {"kind": "User", "name": "tester", "apiGroup": "rbac.authorization.k8s.io"}
RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


async def bind_chart_rbac_to_tester(kube: Kube, tmp_path: Path, values: dict[str, Any] | None = None) -> dict[str, Any]:
    """Render the chart (Lease election on, and `values`) into the test's namespace, bind its roles to `tester`;
    return its config."""
    release = kube.ns  # cluster-wide role names are per test
    values = {"leaderElection": {"backend": "lease"}, **(values or {})}
    rendered = run_chart(
        {
            "chart": str(CHART),
            "namespace": kube.ns,
            "render": {"lease": {"release": release, "values": values}},
        },
        tmp_path,
    ).rendered["lease"]
    for doc in rendered.docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind not in RBAC_KINDS:
            continue
        if "subjects" in doc:
            doc["subjects"] = [TESTER]
        if kind == "ClusterRole":
            await kube.rbac.create_cluster_role(doc)
        elif kind == "ClusterRoleBinding":
            await kube.rbac.create_cluster_role_binding(doc)
        elif kind == "Role":
            await kube.rbac.create_namespaced_role(kube.ns, doc)
        else:
            await kube.rbac.create_namespaced_role_binding(kube.ns, doc)
        if kind.startswith("Cluster"):
            kube.cluster_objects.append((kind, name))
    config: dict[str, Any] = yaml.safe_load(rendered.one("ConfigMap")["data"]["config.yaml"])
    return config
