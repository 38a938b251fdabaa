"""The Helm chart in deploy/helm/muster, linted and rendered by real Helm, then checked manifest by manifest.

One batch renders every case (values overrides below) in one child process; the tests read it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, get_args

import msgspec
import pytest
import yaml
from helmkit import CHART, NAMESPACE, ChartRun, Rendered, make_stub_chart, run_chart

from muster.daemon.billingcli import CONFIG_TOP as BILLING_TOP
from muster.daemon.config import KEYS, LOG_LEVELS, check_keys, load_config
from muster.events.types import (
    BorrowPolicy,
    CohortConfigured,
    PriorityClassConfigured,
    QueueConfigured,
    QueueingStrategy,
    ReclaimPolicy,
    SchedulerConfigured,
    WhenCanBorrow,
    WhenCanPreempt,
    WithinQueuePolicy,
)

SECURED = {
    "nats": {
        "auth": {"type": "userPassword", "existingSecret": "muster-daemon-nats"},
        "tls": {"enabled": True, "existingSecret": "muster-nats-tls"},
    },
    "billing": {"enabled": True, "natsAuthSecret": "muster-billing-nats"},
    "queuesApply": {"natsAuthSecret": "muster-admin-nats"},
}
EVERYTHING_ON = {
    **SECURED,
    "leaderElection": {"backend": "lease"},
    "serviceMonitor": {"enabled": True},
}
CASES: dict[str, dict[str, Any]] = {
    "default": {},
    "billing": {"billing": {"enabled": True}},
    "service-monitor": {"serviceMonitor": {"enabled": True}},
    "billing-monitored": {"billing": {"enabled": True}, "serviceMonitor": {"enabled": True}},
    "lease": {"leaderElection": {"backend": "lease"}},
    "secured": SECURED,
    "token": {
        "nats": {
            "auth": {"type": "token", "existingSecret": "t"},
            "tls": {"enabled": True, "existingSecret": "ca-only", "certKey": ""},
        }
    },
    "no-queues-apply": {"queuesApply": {"enabled": False}},
    "one-replica": {"replicaCount": 1},
    "no-snapshots": {"snapshots": {"enabled": False}},
    "no-pod-conditions": {"podConditions": False},
    "no-events": {"events": False},
    "no-workload-status": {"workloadStatus": False},
    "bind-connections": {"bindConnections": 0},
    "snapshots-tuned": {"snapshots": {"every": 1000}, "leaderElection": {"kvBucket": "leases"}},
    "ui-local": {"ui": {"enabled": True}},
    "flavors": {
        "queues": {
            "flavors": [
                {"name": "h100", "node_labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
                {"name": "spot", "node_labels": {"pool": "spot"}, "taints": [{"key": "spot", "effect": "NoSchedule"}]},
            ],
            "queues": [
                {
                    "name": "team-f",
                    "resource_groups": [
                        {"covered": ["gpu"], "flavors": [{"name": "h100", "nominal": {"gpu": 16}}, {"name": "spot"}]}
                    ],
                    "flavor_fungibility": {"when_can_borrow": "TryNextFlavor"},
                }
            ],
        }
    },
    "ui-exposed": {"ui": {"enabled": True, "port": 9000, "tokenSecret": "muster-ui", "tokenKey": "t"}},
    "retention": {
        "archive": {"enabled": True, "bucket": "MUSTER-archive"},
        "retention": {"maxAgeSeconds": 7 * 86400, "maxBytes": 1 << 30, "ceilingFactor": 4},
    },
    "archive-volume": {"archive": {"enabled": True, "claimName": "muster-archive"}},
    "nkey": {"nats": {"auth": {"type": "nkey", "existingSecret": "muster-nkey"}}},
    "creds": {
        "nats": {
            "auth": {"type": "creds", "existingSecret": "muster-creds"},
            "tls": {"enabled": True, "existingSecret": "muster-nats-tls", "serverName": "nats.example.com"},
        }
    },
    "pod-group-controllers": {
        "rbac": {"podGroupControllers": [{"apiGroup": "example.com", "resources": ["trainers"]}]}
    },
}
BAD_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "token-without-secret": ({"nats": {"auth": {"type": "token"}}}, "nats.auth.existingSecret is required"),
    "tls-without-secret": ({"nats": {"tls": {"enabled": True}}}, "nats.tls.existingSecret is required"),
    "unknown-election": ({"leaderElection": {"backend": "etcd"}}, "leaderElection/backend"),
    "bad-preemption-policy": (
        {"queues": {"queues": [{"name": "x", "preemption": {"within_queue": "Sometimes"}}]}},
        "within_queue",
    ),
    "no-nats": ({"nats": {"url": ""}}, "set nats.url"),
    "bad-fungibility": (
        {"queues": {"queues": [{"name": "x", "flavor_fungibility": {"when_can_borrow": "Sometimes"}}]}},
        "when_can_borrow",
    ),
    "pdb-blocks-drains": ({"podDisruptionBudget": {"minAvailable": 2}}, "must be below replicaCount"),
    "typo": ({"replicas": 3}, "replicas"),
    "snapshots-every-zero": ({"snapshots": {"every": 0}}, "snapshots/every"),
    "ui-typo": ({"ui": {"enabled": True, "token": "plain"}}, "token"),
    "ceiling-below-the-window": (
        {"archive": {"enabled": True, "bucket": "b"}, "retention": {"maxBytes": 1, "ceilingFactor": 0.5}},
        "ceilingFactor",
    ),
}
STUB_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "stub-external": ("muster", {}),
    "stub-install": ("muster", {"nats": {"install": True}}),
    "stub-install-named": ("nats-prod", {"nats": {"install": True, "url": "nats://elsewhere:4222"}}),
}

BUILTIN_API_VERSIONS = {
    "ServiceAccount": "v1",
    "ConfigMap": "v1",
    "Service": "v1",
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "Job": "batch/v1",
    "PodDisruptionBudget": "policy/v1",
    "ClusterRole": "rbac.authorization.k8s.io/v1",
    "ClusterRoleBinding": "rbac.authorization.k8s.io/v1",
    "Role": "rbac.authorization.k8s.io/v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
}
CUSTOM_API_VERSIONS = {"ServiceMonitor": "monitoring.coreos.com/v1", "PodMonitor": "monitoring.coreos.com/v1"}

WORKLOAD_STATUS = {
    ("batch", "jobs", "patch"),
    ("jobset.x-k8s.io", "jobsets", "patch"),
    ("kubeflow.org", "pytorchjobs", "patch"),
    ("kubeflow.org", "mpijobs", "patch"),
}
"""The gang's status annotations on its workload (workloadStatus, and events, on by default)."""
LEAST_PRIVILEGE = {
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "pods/binding", "create"),
    ("", "pods/eviction", "create"),
    ("", "pods/status", "patch"),
    ("", "nodes", "get"),
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    ("", "namespaces", "get"),
    ("", "events", "create"),
    ("", "events", "patch"),
    ("events.k8s.io", "events", "create"),
    ("events.k8s.io", "events", "patch"),
    ("batch", "jobs", "get"),
    ("batch", "jobs", "list"),
    ("batch", "jobs", "watch"),
    ("jobset.x-k8s.io", "jobsets", "get"),
    ("jobset.x-k8s.io", "jobsets", "list"),
    ("jobset.x-k8s.io", "jobsets", "watch"),
    ("kubeflow.org", "pytorchjobs", "get"),
    ("kubeflow.org", "pytorchjobs", "list"),
    ("kubeflow.org", "pytorchjobs", "watch"),
    ("kubeflow.org", "mpijobs", "get"),
    ("kubeflow.org", "mpijobs", "list"),
    ("kubeflow.org", "mpijobs", "watch"),
    ("scheduling.volcano.sh", "podgroups", "get"),
    ("scheduling.volcano.sh", "podgroups", "list"),
    ("scheduling.volcano.sh", "podgroups", "watch"),
    ("scheduling.x-k8s.io", "podgroups", "get"),
    ("scheduling.x-k8s.io", "podgroups", "list"),
    ("scheduling.x-k8s.io", "podgroups", "watch"),
} | WORKLOAD_STATUS
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> ChartRun:
    """Every case above, linted and rendered in one batch."""
    stub_chart = make_stub_chart(tmp_path_factory.mktemp("chart"))
    render: dict[str, dict[str, Any]] = {case: {"values": values} for case, values in CASES.items()}
    render |= {case: {"values": values} for case, (values, _) in BAD_CASES.items()}
    render |= {
        case: {"chart": str(stub_chart), "release": release, "values": values}
        for case, (release, values) in STUB_CASES.items()
    }
    request = {
        "chart": str(CHART),
        "lint": [
            {"values": {}},
            {"chart": str(stub_chart), "values": {}, "strict": True},
            {"chart": str(stub_chart), "values": EVERYTHING_ON, "strict": True},
            {"chart": str(stub_chart), "values": {"nats": {"install": True}}, "strict": True},
        ],
        "render": render,
    }
    return run_chart(request, tmp_path_factory.mktemp("helm"))


def rules_of(rendered: Rendered, kind: str) -> set[tuple[str, str, str]]:
    out = set()
    for role in rendered.of_kind(kind):
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        out.add((group, resource, verb))
    return out


def config_of(rendered: Rendered, key: str) -> dict[str, Any]:
    data = rendered.one("ConfigMap")["data"]
    parsed: dict[str, Any] = yaml.safe_load(data[key])
    return parsed


def container(workload: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """The workload's only container, or the one named `name`."""
    containers = workload["spec"]["template"]["spec"]["containers"]
    if name is None:
        assert len(containers) == 1
        result: dict[str, Any] = containers[0]
        return result
    found: list[dict[str, Any]] = [c for c in containers if c["name"] == name]
    assert len(found) == 1, [c["name"] for c in containers]
    return found[0]


def volumes(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in workload["spec"]["template"]["spec"].get("volumes", [])}


# ---------------------------------------------------------------- lint and schemas


def test_chart_lints_without_errors(run: ChartRun) -> None:
    """helm lint passes on the chart as committed (the only warning: the nats dependency is not downloaded)."""
    report = run.lint[0]
    assert report["errors"] == [], run.backend
    warnings = [m["error"] for m in report["messages"] if m["severity"] >= 2]
    assert all("missing these dependencies: nats" in w for w in warnings), warnings


def test_chart_lints_strict_with_dependency_and_every_option(run: ChartRun) -> None:
    """helm lint --strict passes with the dependency present: defaults, every option on, and nats.install."""
    for report in run.lint[1:]:
        assert report["errors"] == [], report["messages"]


def test_every_case_renders(run: ChartRun) -> None:
    """Every valid combination of values renders, and every document has a kind, an apiVersion and a name."""
    expected = set(CASES) | set(STUB_CASES)
    assert not {c: e for c, e in run.errors.items() if c in expected}
    assert expected <= set(run.rendered)
    for case, rendered in run.rendered.items():
        for doc in rendered.docs:
            assert doc.get("apiVersion") and doc.get("kind") and doc["metadata"].get("name"), (case, doc)


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_invalid_values_fail_with_a_reason(run: ChartRun, case: str) -> None:
    """Values that cannot work stop the render with a message naming what to fix."""
    _, reason = BAD_CASES[case]
    assert case in run.errors, f"{case} rendered although it should fail"
    assert reason in run.errors[case]


def test_kinds_and_api_versions(run: ChartRun) -> None:
    """The default install is exactly the daemon's objects, each at a served, non-deprecated apiVersion."""
    rendered = run.rendered["default"]
    kinds = sorted(d["kind"] for d in rendered.docs)
    assert kinds == sorted(
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "Deployment",
            "Job",
            "PodDisruptionBudget",
            "Service",
            "ServiceAccount",
            "ServiceAccount",
        ]
    )
    for case, r in run.rendered.items():
        for doc in r.docs:
            want = BUILTIN_API_VERSIONS.get(doc["kind"]) or CUSTOM_API_VERSIONS.get(doc["kind"])
            assert doc["apiVersion"] == want, (case, doc["kind"], doc["apiVersion"])
            if doc["kind"] != "StatefulSet":  # the stub subchart's
                assert DNS_LABEL.match(doc["metadata"]["name"]) and len(doc["metadata"]["name"]) <= 63
                namespaced = doc["kind"] not in {"ClusterRole", "ClusterRoleBinding"}
                assert (doc["metadata"].get("namespace") == NAMESPACE) == namespaced, (case, doc["kind"])


def test_manifests_validate_against_kubernetes_schemas(run: ChartRun) -> None:
    """Every built-in object validates (strict: no unknown fields) against Kubernetes 1.29 and the newest schemas."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed")
    versions = ["1.29.0", kubernetes_validate.latest_version()]
    checked: set[str] = set()
    for case, rendered in run.rendered.items():
        for doc in rendered.docs:
            key = json.dumps(doc, sort_keys=True)
            if doc["kind"] in CUSTOM_API_VERSIONS or key in checked:
                continue  # CRDs are checked in their own tests; many cases share documents
            checked.add(key)
            for version in versions:
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.ValidationError as exc:
                    pytest.fail(f"{case}: {doc['kind']} {doc['metadata']['name']} on {version}: {exc.message}")
    assert len(checked) > 20


# ---------------------------------------------------------------- RBAC


def test_rbac_is_exactly_the_least_privilege_set(run: ChartRun) -> None:
    """The ClusterRole grants exactly what a gang scheduler needs: no wildcard, no secrets, no pod writes but
    the PodScheduled condition, no leases."""
    rendered = run.rendered["default"]
    granted = rules_of(rendered, "ClusterRole")
    assert granted == LEAST_PRIVILEGE
    assert not rendered.of_kind("Role") and not rendered.of_kind("RoleBinding")
    for group, resource, verb in granted:
        assert "*" not in (group, resource, verb)
        assert resource not in {"secrets", "configmaps", "leases", "pods/exec", "nodes/status"}
        if resource == "pods/status":
            assert verb == "patch"  # the PodScheduled condition (podConditions, on by default)
        if resource in {"pods", "nodes"}:
            assert verb in {"get", "list", "watch"}, (resource, verb)
    binding = rendered.one("ClusterRoleBinding")
    assert binding["roleRef"]["name"] == rendered.one("ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "muster", "namespace": NAMESPACE},
    ]


def test_pod_conditions_off_drops_the_pods_status_right_and_tells_the_daemon(run: ChartRun) -> None:
    """`podConditions: false` renders no pods/status right and `kubernetes.pod_conditions: false` for the daemon."""
    rendered = run.rendered["no-pod-conditions"]
    assert rules_of(rendered, "ClusterRole") == LEAST_PRIVILEGE - {("", "pods/status", "patch")}
    assert config_of(rendered, "config.yaml")["kubernetes"]["pod_conditions"] is False
    assert config_of(run.rendered["default"], "config.yaml")["kubernetes"]["pod_conditions"] is True


def test_events_off_drops_the_events_rights_and_tells_the_daemon(run: ChartRun, tmp_path: Path) -> None:
    """`events: false` renders no events rights, and the daemon's config it renders turns the reporter off."""
    rendered = run.rendered["no-events"]
    events = {rule for rule in LEAST_PRIVILEGE if rule[1] == "events"}
    # no reporter, so no status annotations either
    assert events and rules_of(rendered, "ClusterRole") == LEAST_PRIVILEGE - events - WORKLOAD_STATUS
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config_of(rendered, "config.yaml")))
    assert load_config(str(path), env={}).events is False
    assert config_of(run.rendered["default"], "config.yaml")["kubernetes"]["events"] is True


def test_workload_status_off_drops_the_workload_patch_rights_and_tells_the_daemon(run: ChartRun) -> None:
    """`workloadStatus: false` renders no patch of jobs, jobsets, Kubeflow jobs and `workload_status: false`."""
    rendered = run.rendered["no-workload-status"]
    assert rules_of(rendered, "ClusterRole") == LEAST_PRIVILEGE - WORKLOAD_STATUS
    assert config_of(rendered, "config.yaml")["kubernetes"]["workload_status"] is False


def test_bind_connections_reach_the_daemon_only_when_set(run: ChartRun, tmp_path: Path) -> None:
    """`bindConnections: 0` renders `kubernetes.bind_connections: 0`, which the daemon reads; unset, the
    daemon's default (32) holds."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config_of(run.rendered["bind-connections"], "config.yaml")))
    assert load_config(str(path), env={}).bind_connections == 0
    path.write_text(yaml.safe_dump(config_of(run.rendered["default"], "config.yaml")))
    assert load_config(str(path), env={}).bind_connections == 32


def test_lease_election_adds_one_namespaced_lease_role(run: ChartRun, tmp_path: Path) -> None:
    """Lease election adds a namespaced Role for one named Lease (create, get, update), the one the daemon reads."""
    rendered = run.rendered["lease"]
    assert rules_of(rendered, "ClusterRole") == LEAST_PRIVILEGE
    role = rendered.one("Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert [(r["resources"], r["verbs"], r["resourceNames"]) for r in named] == [
        (["leases"], ["get", "update"], ["muster-leader"])
    ]
    assert rules_of(rendered, "Role") == {
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "update"),
    }
    assert rendered.one("RoleBinding")["subjects"][0]["name"] == "muster"
    config = config_of(rendered, "config.yaml")["leader_election"]
    assert config == {
        "backend": "lease",
        "lease_name": "muster-leader",
        "lease_namespace": NAMESPACE,
        "ttl_seconds": 10,
    }
    assert config_of(run.rendered["default"], "config.yaml")["leader_election"]["backend"] == "nats-kv"
    # the daemon accepts the rendered config and elects on exactly the Lease the Role allows
    (tmp_path / "config.yaml").write_text(rendered.one("ConfigMap")["data"]["config.yaml"])
    daemon = load_config(str(tmp_path / "config.yaml"), env={})
    assert (daemon.leader_backend, daemon.lease_namespace, daemon.lease_name) == ("lease", NAMESPACE, "muster-leader")


def test_pods_without_kubernetes_access_get_no_token(run: ChartRun) -> None:
    """Billing and the queues-apply Job run under an account bound to nothing, without an API token."""
    rendered = run.rendered["billing"]
    client_sa = rendered.one("ServiceAccount", "muster-client")
    assert client_sa["automountServiceAccountToken"] is False
    bound = {
        s["name"]
        for kind in ("ClusterRoleBinding", "RoleBinding")
        for b in rendered.of_kind(kind)
        for s in b["subjects"]
    }
    assert bound == {"muster"}
    for workload in (rendered.one("Deployment", "muster-billing"), rendered.one("Job")):
        spec = workload["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] == "muster-client"
        assert spec["automountServiceAccountToken"] is False


# ---------------------------------------------------------------- the daemon


def test_daemon_runs_two_hardened_replicas_with_probes(run: ChartRun) -> None:
    """The daemon runs as 2 replicas with /healthz and /readyz probes, non-root, read-only, without capabilities."""
    deployment = run.rendered["default"].one("Deployment", "muster")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert "schedulerName" not in pod  # the scheduler is not scheduled by itself
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    c = container(deployment, "daemon")
    assert c["args"] == ["daemon", "--config", "/etc/muster/config.yaml"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/etc/muster/config.yaml"]["subPath"] == "config.yaml"
    assert volumes(deployment)[mounts["/etc/muster/config.yaml"]["name"]]["configMap"]["name"] == "muster"
    assert "/tmp" in mounts  # the only writable path, with the root filesystem read-only
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_service_and_pdb_select_the_daemon_pods(run: ChartRun) -> None:
    """The Service (metrics 9090, health 8080) and the PDB (one replica kept) select exactly the daemon pods."""
    rendered = run.rendered["default"]
    pod_labels = rendered.one("Deployment", "muster")["spec"]["template"]["metadata"]["labels"]
    service = rendered.one("Service")
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        "metrics": (9090, "metrics"),
        "health": (8080, "health"),
    }
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "daemon"
    pdb = rendered.one("PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    assert not run.rendered["one-replica"].of_kind("PodDisruptionBudget")


def test_config_map_holds_the_daemon_config(run: ChartRun) -> None:
    """config.yaml names NATS, leader election, Kubernetes, ports and the queues file, as deploy/README.md documents."""
    config = config_of(run.rendered["default"], "config.yaml")
    assert config["nats"] == {
        "url": "nats://nats:4222",
        "stream": "MUSTER",
        "subject_prefix": "muster",
        "inbox_prefix": "_INBOX.muster-daemon",
        "max_event_bytes": 1048576,
    }
    assert config["leader_election"] == {"backend": "nats-kv", "kv_bucket": "muster-leader", "ttl_seconds": 10}
    assert config["kubernetes"] == {
        "scheduler_name": "muster",
        "namespaces": [],
        "pod_conditions": True,
        "events": True,
        "workload_status": True,
    }
    assert config["http"] == {"health_port": 8080, "metrics_port": 9090}
    assert config["queues_file"] == "/etc/muster/queues.yaml"


def test_queues_file_uses_the_scenario_and_event_field_names(run: ChartRun) -> None:
    """queues.yaml carries the scenario.md fields, and each entry converts into its configuration event."""
    queues = config_of(run.rendered["default"], "queues.yaml")
    assert set(queues) <= {"topology", "fair_sharing", "idle_reclaim", "priority_classes", "cohorts", "queues"}
    for entry in queues["queues"]:
        event = msgspec.convert({**entry, "at": 0}, QueueConfigured)
        assert set(entry) <= set(QueueConfigured.__struct_fields__)
        assert event.preemption.within_queue in {"Never", "LowerPriority", "LowerOrNewerEqualPriority"}
    for entry in queues["priority_classes"]:
        assert set(entry) <= set(msgspec.convert({**entry, "at": 0}, PriorityClassConfigured).__struct_fields__)
    for entry in queues["cohorts"]:
        msgspec.convert({**entry, "at": 0}, CohortConfigured)
    msgspec.convert(
        {"levels": queues["topology"]["levels"], "fair_sharing": queues["fair_sharing"], "at": 0}, SchedulerConfigured
    )
    team_b = next(q for q in queues["queues"] if q["name"] == "team-b")
    assert team_b["borrowing_limit"] == {"gpu": 8} and team_b["lending_limit"] == {"gpu": 4}


def test_flavors_in_the_values_become_a_queues_file_apply_reads(run: ChartRun, tmp_path: Path) -> None:
    """Flavors and a queue's quota per flavor pass the values schema and are read by `muster queues apply`."""
    from muster.queuescli import load_file

    path = tmp_path / "queues.yaml"
    path.write_text(run.rendered["flavors"].one("ConfigMap")["data"]["queues.yaml"])
    scenario = load_file(str(path))
    assert sorted(scenario.flavors) == ["h100", "spot"] and scenario.flavors["spot"].taints[0].key == "spot"
    groups = scenario.queues["team-f"].resource_groups
    assert groups and [f.name for f in groups[0].flavors] == ["h100", "spot"]


def test_flavors_in_the_values_grant_the_pod_patch_binding_needs(run: ChartRun) -> None:
    """With flavors in the values the ClusterRole adds exactly a patch of pods (label, tolerations and
    nodeSelector at binding); without them there is none."""
    assert rules_of(run.rendered["flavors"], "ClusterRole") == LEAST_PRIVILEGE | {("", "pods", "patch")}
    assert ("", "pods", "patch") not in rules_of(run.rendered["default"], "ClusterRole")


def test_pod_group_controllers_in_the_values_grant_get_on_them(run: ChartRun) -> None:
    """`rbac.podGroupControllers` adds exactly a `get` of each named kind (reconciliation reads a pod group's
    controller to learn it was deleted); by default there is none."""
    assert rules_of(run.rendered["pod-group-controllers"], "ClusterRole") == LEAST_PRIVILEGE | {
        ("example.com", "trainers", "get")
    }


def test_queues_apply_hook_runs_after_install_and_upgrade(run: ChartRun) -> None:
    """A post-install/post-upgrade Job runs `muster queues apply` as the admin identity; it can be turned off."""
    rendered = run.rendered["default"]
    job = rendered.one("Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    c = container(job)
    assert c["args"] == ["queues", "apply", "--config", "/etc/muster/admin.yaml", "/etc/muster/queues.yaml"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert config_of(rendered, "admin.yaml")["nats"]["inbox_prefix"] == "_INBOX.muster-admin"
    off = run.rendered["no-queues-apply"]
    assert not off.of_kind("Job") and "admin.yaml" not in off.one("ConfigMap")["data"]


# ---------------------------------------------------------------- NATS connection


def test_credentials_come_from_secrets_never_from_the_config(run: ChartRun) -> None:
    """With user/password and TLS, each pod mounts its own identity's Secret and its config names only file paths."""
    rendered = run.rendered["secured"]
    expected_secret = {"muster": "muster-daemon-nats", "muster-billing": "muster-billing-nats"}
    workloads = [*rendered.of_kind("Deployment"), rendered.one("Job")]
    for workload in workloads:
        name = workload["metadata"]["name"]
        vols = volumes(workload)
        auth_secret = vols["nats-auth"]["secret"]
        assert auth_secret["secretName"] == expected_secret.get(name, "muster-admin-nats")
        assert {i["path"] for i in auth_secret["items"]} == {"username", "password"}
        assert vols["nats-tls"]["secret"]["secretName"] == "muster-nats-tls"
        assert {i["path"] for i in vols["nats-tls"]["secret"]["items"]} == {"ca.crt", "tls.crt", "tls.key"}
        for c in workload["spec"]["template"]["spec"]["containers"]:  # the daemon's snapshots sidecar too
            mounts = {m["name"]: m for m in c["volumeMounts"]}
            assert mounts["nats-auth"]["mountPath"] == "/etc/muster/nats-auth" and mounts["nats-auth"]["readOnly"]
            assert mounts["nats-tls"]["mountPath"] == "/etc/muster/nats-tls" and mounts["nats-tls"]["readOnly"]
    for key in ("config.yaml", "billing.yaml", "admin.yaml"):
        nats = config_of(rendered, key)["nats"]
        assert nats["auth"] == {
            "username_file": "/etc/muster/nats-auth/username",
            "password_file": "/etc/muster/nats-auth/password",
        }
        assert nats["tls"] == {
            "ca_file": "/etc/muster/nats-tls/ca.crt",
            "cert_file": "/etc/muster/nats-tls/tls.crt",
            "key_file": "/etc/muster/nats-tls/tls.key",
        }
    assert not rendered.of_kind("Secret")
    token = run.rendered["token"]
    nats = config_of(token, "config.yaml")["nats"]
    assert nats["auth"] == {"token_file": "/etc/muster/nats-auth/token"}
    assert nats["tls"] == {"ca_file": "/etc/muster/nats-tls/ca.crt"}  # server-only TLS: no client cert
    assert "nats-auth" not in volumes(run.rendered["default"].one("Deployment"))


def test_nats_install_adds_the_nats_chart_and_points_muster_at_it(run: ChartRun) -> None:
    """nats.install=true renders the nats subchart with JetStream and 3 servers, and muster connects to its Service."""
    external = run.rendered["stub-external"]
    assert not external.of_kind("StatefulSet")
    assert config_of(external, "config.yaml")["nats"]["url"] == "nats://nats:4222"
    installed = run.rendered["stub-install"]
    statefulset = installed.one("StatefulSet")
    assert statefulset["metadata"]["labels"]["jetstream"] == "true"
    assert statefulset["spec"]["replicas"] == 3
    url = f"nats://muster-nats.{NAMESPACE}.svc:4222"
    assert config_of(installed, "config.yaml")["nats"]["url"] == url
    assert config_of(installed, "admin.yaml")["nats"]["url"] == url
    named = run.rendered["stub-install-named"]  # a release named like the chart, as the nats chart names it
    assert config_of(named, "config.yaml")["nats"]["url"] == f"nats://nats-prod.{NAMESPACE}.svc:4222"


# ---------------------------------------------------------------- optional parts


def test_billing_deployment_is_optional(run: ChartRun) -> None:
    """billing.enabled adds one `muster billing run` pod with its own config and identity, and changes nothing else."""
    assert {d["metadata"]["name"] for d in run.rendered["default"].of_kind("Deployment")} == {"muster"}
    assert "billing.yaml" not in run.rendered["default"].one("ConfigMap")["data"]
    rendered = run.rendered["billing"]
    billing = rendered.one("Deployment", "muster-billing")
    assert billing["spec"]["replicas"] == 1
    assert billing["spec"]["strategy"] == {"type": "Recreate"}
    c = container(billing)
    assert c["args"] == ["billing", "run", "--config", "/etc/muster/billing.yaml"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/etc/muster/billing.yaml", "/var/lib/muster"}
    config = config_of(rendered, "billing.yaml")
    assert config["billing"]["consumer"] == "muster-billing"
    assert config["nats"]["inbox_prefix"] == "_INBOX.muster-billing"
    assert billing["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "billing"
    service_selector = rendered.one("Service")["spec"]["selector"]
    assert not service_selector.items() <= billing["spec"]["template"]["metadata"]["labels"].items()
    others = [d for d in rendered.docs if d["kind"] not in {"Deployment", "ConfigMap"}]
    default_others = [d for d in run.rendered["default"].docs if d["kind"] not in {"Deployment", "ConfigMap"}]
    assert others == default_others


def test_service_monitor_is_optional_and_scrapes_the_metrics_port(run: ChartRun) -> None:
    """serviceMonitor.enabled adds a ServiceMonitor for the Service's metrics port at /metrics, and only then."""
    assert not run.rendered["default"].of_kind("ServiceMonitor")
    rendered = run.rendered["service-monitor"]
    monitor = rendered.one("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"] == rendered.one("Service")["spec"]["selector"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert {p["name"] for p in rendered.one("Service")["spec"]["ports"]} >= {endpoint["port"]}


def test_the_billing_subscribers_metrics_are_scraped_too(run: ChartRun) -> None:
    """With billing and serviceMonitor enabled, a PodMonitor scrapes the billing pod's metrics port at /metrics
    (its `muster_billing_*` metrics were served on a port nothing scraped); without billing, none."""
    assert not run.rendered["service-monitor"].of_kind("PodMonitor")
    rendered = run.rendered["billing-monitored"]
    monitor = rendered.one("PodMonitor")
    billing = rendered.one("Deployment", "muster-billing")
    pod_labels = billing["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    port = next(p for p in container(billing)["ports"] if p["name"] == endpoint["port"])
    assert port["containerPort"] == config_of(rendered, "billing.yaml")["http"]["metrics_port"]


def test_snapshot_sidecar_follows_the_log_as_the_daemon_and_writes_only_as_leader(run: ChartRun) -> None:
    """Each daemon pod runs `snapshot --follow` as the daemon (config, Secrets, hardening), gated on the lease."""
    deployment = run.rendered["default"].one("Deployment", "muster")
    assert [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]] == ["daemon", "snapshots"]
    daemon, sidecar = container(deployment, "daemon"), container(deployment, "snapshots")
    assert sidecar["image"] == daemon["image"]
    assert sidecar["args"] == [
        "snapshot",
        "--config",
        "/etc/muster/config.yaml",
        "--follow",
        "--every",
        "50000",
        "--leader",
        "muster-leader/leader",
        "--holder",
        "$(POD_NAME)",
    ]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in sidecar["env"]}
    assert env["POD_NAME"] == "metadata.name"  # the daemon's identity in leader election, expanded in args
    assert sidecar["securityContext"] == daemon["securityContext"]
    sc = sidecar["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sidecar["resources"]["requests"] and sidecar["resources"]["limits"]["memory"]
    assert "ports" not in sidecar
    mounts = {m["mountPath"]: m for m in sidecar["volumeMounts"]}
    assert mounts["/etc/muster/config.yaml"] == {
        "name": "config",
        "mountPath": "/etc/muster/config.yaml",
        "subPath": "config.yaml",
        "readOnly": True,
    }
    assert set(mounts) == {"/etc/muster/config.yaml", "/tmp"}  # default: no NATS Secrets to mount
    secured = run.rendered["secured"].one("Deployment", "muster")
    daemon_mounts = [m for m in container(secured, "daemon")["volumeMounts"] if m["name"].startswith("nats-")]
    sidecar_mounts = [m for m in container(secured, "snapshots")["volumeMounts"] if m["name"].startswith("nats-")]
    assert sidecar_mounts == daemon_mounts and len(sidecar_mounts) == 2


def test_snapshot_sidecar_is_tunable_and_optional(run: ChartRun) -> None:
    """snapshots.every and the leader bucket reach its args; lease election gates on the log; enabled=false drops it."""
    tuned = container(run.rendered["snapshots-tuned"].one("Deployment", "muster"), "snapshots")["args"]
    assert tuned[tuned.index("--every") + 1] == "1000"
    assert tuned[tuned.index("--leader") + 1] == "leases/leader"
    lease = container(run.rendered["lease"].one("Deployment", "muster"), "snapshots")["args"]
    assert "--leader" not in lease and "--follow" in lease  # no KV leader key to read: the log names the leader
    assert lease[lease.index("--log-leader") + 1 : lease.index("--log-leader") + 3] == ["--holder", "$(POD_NAME)"]
    off = run.rendered["no-snapshots"].one("Deployment", "muster")
    assert [c["name"] for c in off["spec"]["template"]["spec"]["containers"]] == ["daemon"]
    assert run.rendered["no-snapshots"].one("ConfigMap") == run.rendered["default"].one("ConfigMap")


def test_the_dashboard_is_off_by_default_local_without_a_token_and_internal_with_one(
    run: ChartRun, tmp_path: Path
) -> None:
    """ui.enabled: on the pod's loopback; with ui.tokenSecret: every address, the token mounted, a ClusterIP port."""
    default = run.rendered["default"]
    assert "ui" not in config_of(default, "config.yaml")
    assert {p["name"] for p in default.one("Service")["spec"]["ports"]} == {"metrics", "health"}
    local = run.rendered["ui-local"]
    assert config_of(local, "config.yaml")["ui"] == {"port": 8321, "host": "127.0.0.1"}
    (tmp_path / "config.yaml").write_text(local.one("ConfigMap")["data"]["config.yaml"])
    assert load_config(str(tmp_path / "config.yaml"), env={}).ui_port == 8321  # the daemon accepts it
    assert {p["name"] for p in local.one("Service")["spec"]["ports"]} == {"metrics", "health"}
    assert "ui" not in {p["name"] for p in container(local.one("Deployment", "muster"), "daemon")["ports"]}
    exposed = run.rendered["ui-exposed"]
    config = config_of(exposed, "config.yaml")["ui"]
    assert config == {"port": 9000, "host": "0.0.0.0", "token_file": "/etc/muster/ui/token"}
    service = exposed.one("Service")
    assert service["spec"]["type"] == "ClusterIP"
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]}["ui"] == 9000
    pod = exposed.one("Deployment", "muster")["spec"]["template"]["spec"]
    daemon = container(exposed.one("Deployment", "muster"), "daemon")
    assert {"name": "ui", "containerPort": 9000, "protocol": "TCP"} in daemon["ports"]
    mount = next(m for m in daemon["volumeMounts"] if m["name"] == "ui-token")
    volume = next(v for v in pod["volumes"] if v["name"] == "ui-token")
    assert volume["secret"]["secretName"] == "muster-ui" and volume["secret"]["items"] == [
        {"key": "t", "path": "token"}
    ]
    assert config["token_file"].startswith(mount["mountPath"] + "/")


def test_retention_values_become_the_sealers_window_and_the_streams_ceiling(run: ChartRun, tmp_path: Path) -> None:
    """`retention` renders the window the sealer purges to; the stream's own limits are ceilingFactor times it."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config_of(run.rendered["retention"], "config.yaml")))
    cfg = load_config(str(path), env={})
    assert (cfg.archive_location, cfg.archive_consumers) == ("nats-object:MUSTER-archive", ["muster-billing"])
    assert (cfg.archive_segment_events, cfg.archive_state_every) == (10_000, 50_000)
    assert cfg.retention_window == (7 * 86400.0, 1 << 30)
    assert cfg.retention_ceiling == (28 * 86400.0, 4 << 30)
    path.write_text(yaml.safe_dump(config_of(run.rendered["default"], "config.yaml")))
    assert load_config(str(path), env={}).retention_ceiling == (0.0, 0), "no window, no limits"


def test_the_snapshot_sidecar_reads_the_archive_too(run: ChartRun) -> None:
    """With an archive, the sidecar reads archive and stream as one log (the stream's past may be purged)."""
    in_bucket = container(run.rendered["retention"].one("Deployment", "muster"), "snapshots")
    assert in_bucket["args"][in_bucket["args"].index("--archive") + 1] == "nats-object:MUSTER-archive"
    on_volume = container(run.rendered["archive-volume"].one("Deployment", "muster"), "snapshots")
    assert on_volume["args"][on_volume["args"].index("--archive") + 1] == "/var/lib/muster/archive"
    mounts = {m["mountPath"]: m for m in on_volume["volumeMounts"]}
    assert mounts["/var/lib/muster/archive"] == {
        "name": "archive",
        "mountPath": "/var/lib/muster/archive",
        "readOnly": True,
    }
    assert "--archive" not in container(run.rendered["default"].one("Deployment", "muster"), "snapshots")["args"]


QUEUE_ITEM = ("properties", "queues", "properties", "queues", "items", "properties")


@pytest.mark.parametrize(
    ("path", "literal"),
    [
        (("queueing_strategy",), QueueingStrategy),
        (("preemption", "properties", "within_queue"), WithinQueuePolicy),
        (("preemption", "properties", "reclaim_within_cohort"), ReclaimPolicy),
        (("preemption", "properties", "borrow_within_cohort", "properties", "policy"), BorrowPolicy),
        (("flavor_fungibility", "properties", "when_can_borrow"), WhenCanBorrow),
        (("flavor_fungibility", "properties", "when_can_preempt"), WhenCanPreempt),
    ],
    ids=lambda v: v[-1] if isinstance(v, tuple) else None,
)
def test_the_charts_queue_enums_are_the_values_the_scheduler_takes(path: tuple[str, ...], literal: object) -> None:
    """Each queue setting's enum in values.schema.json lists exactly what the event model accepts."""
    node: Any = json.loads((Path(CHART) / "values.schema.json").read_text())
    for key in QUEUE_ITEM + path:
        node = node[key]
    assert node["enum"] == list(get_args(literal))


CHART_LEAVES_OUT: dict[str, str] = {
    "kubernetes.kubeconfig": "in a cluster the daemon uses its service account; a kubeconfig is for running it outside",
}
"""Daemon config keys (`daemon.config.KEYS`) no values of the chart set, and why."""


def _dotted(doc: dict[str, Any], prefix: str = "") -> set[str]:
    """The keys of a config document as `section.key` (`nats.auth.token_file`); a section's own name too."""
    out: set[str] = set()
    for key, value in doc.items():
        out.add(prefix + key)
        if isinstance(value, dict) and (prefix + key) in KEYS:
            out |= _dotted(value, f"{prefix}{key}.")
    return out


def test_every_config_key_the_chart_writes_is_read_and_every_key_the_daemon_reads_is_settable(run: ChartRun) -> None:
    """Both ways between the chart and `daemon.config.KEYS`: every config file any case renders passes the
    daemon's key check, and every key the daemon reads is written by some case (values.schema.json lets a user
    set it) or is named in CHART_LEAVES_OUT with the reason."""
    written: set[str] = set()
    for case, rendered in sorted(run.rendered.items()):
        if case in BAD_CASES:
            continue
        data = rendered.one("ConfigMap")["data"]
        for name, top in (("config.yaml", None), ("admin.yaml", None), ("billing.yaml", BILLING_TOP)):
            if name in data:
                doc = yaml.safe_load(data[name]) or {}
                check_keys(doc, f"{case}/{name}", **({"top": top} if top else {}))
                written |= _dotted(doc)
    every = {f"{section}.{key}" for section, keys in KEYS.items() for key in keys}
    unset = sorted(every - written - set(CHART_LEAVES_OUT))
    assert unset == [], f"keys the daemon reads that no values of the chart set: {unset}"
    assert sorted(set(CHART_LEAVES_OUT) & written) == [], "a key left out that a case writes: drop it from the list"


def test_the_charts_log_levels_are_the_ones_the_daemon_takes() -> None:
    """`daemon.logLevel`'s enum in values.schema.json is `daemon.config.LOG_LEVELS`, which the daemon checks."""
    schema: Any = json.loads((Path(CHART) / "values.schema.json").read_text())
    assert schema["properties"]["daemon"]["properties"]["logLevel"]["enum"] == list(LOG_LEVELS)
