"""Helpers for the chart tests: lint and render the Helm chart with real Helm.

Two backends, in order of preference:
- Helm's Go SDK from the `helm-python-sdk` wheel (pinned in the dev extras), driven by
  `deploy/helm_sdk.py batch` in a child process so the Go runtime stays out of pytest's process;
- a `helm` binary on PATH (`helm lint`, `helm template`).
Tests skip, saying why, only when neither is there.

The chart's nats dependency is never vendored. Cases that install NATS render a copy of the
chart with a stub `charts/nats` (a StatefulSet), which is enough to prove the `nats.install`
condition and the URL wiring; the official chart's own output is not muster's to test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "muster"
HELM_SDK = ROOT / "deploy" / "helm_sdk.py"
NAMESPACE = "muster-system"

STUB_NATS_CHART = """\
apiVersion: v2
name: nats
version: 1.2.0
appVersion: "2.11.0"
"""
STUB_NATS_STATEFULSET = """\
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {{ .Release.Name }}-nats
  namespace: {{ .Release.Namespace }}
  labels:
    stub: nats
    jetstream: {{ .Values.config.jetstream.enabled | quote }}
spec:
  replicas: {{ .Values.config.cluster.replicas }}
  serviceName: {{ .Release.Name }}-nats-headless
  selector:
    matchLabels: {app: {{ .Release.Name }}-nats}
  template:
    metadata:
      labels: {app: {{ .Release.Name }}-nats}
    spec:
      containers:
        - name: nats
          image: nats:2.11-alpine
"""


@dataclass
class Rendered:
    """One case's manifests: every YAML document, with the template it came from."""

    docs: list[dict[str, Any]]
    sources: list[str] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d.get("kind") == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [d for d in self.of_kind(kind) if name is None or d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
        return found[0]


@dataclass
class ChartRun:
    """What one batch of lint and render calls answered."""

    backend: str
    lint: list[dict[str, Any]]
    rendered: dict[str, Rendered]
    errors: dict[str, str]


def _parse(manifests: dict[str, str]) -> Rendered:
    out = Rendered(docs=[])
    for source, text in sorted(manifests.items()):
        for doc in yaml.safe_load_all(text):
            if doc:
                out.docs.append(doc)
                out.sources.append(source)
    return out


def make_stub_chart(dest: Path) -> Path:
    """A copy of the chart with a stub `charts/nats` subchart, as `helm dependency build` would leave it."""
    chart = dest / "muster"
    shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("charts"))
    stub = chart / "charts" / "nats"
    (stub / "templates").mkdir(parents=True)
    (stub / "Chart.yaml").write_text(STUB_NATS_CHART)
    (stub / "values.yaml").write_text("config:\n  cluster: {replicas: 1}\n  jetstream: {enabled: false}\n")
    (stub / "templates" / "statefulset.yaml").write_text(STUB_NATS_STATEFULSET)
    return chart


def _sdk_available() -> bool:
    probe = subprocess.run(
        [sys.executable, "-c", "import helm_python"], capture_output=True, text=True, timeout=60, check=False
    )
    return probe.returncode == 0


def _run_sdk(request: dict[str, Any]) -> ChartRun:
    proc = subprocess.run(
        [sys.executable, str(HELM_SDK), "batch"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"helm_sdk.py batch failed: {proc.stderr[-2000:]}"
    answer = json.loads(proc.stdout)
    rendered: dict[str, Rendered] = {}
    errors: dict[str, str] = {}
    for case, result in answer["render"].items():
        if "error" in result:
            errors[case] = result["error"]
        else:
            rendered[case] = _parse(result["manifests"])
    return ChartRun(f"helm SDK {answer['versions']['helm_sdk']}", answer["lint"], rendered, errors)


def _run_binary(helm: str, request: dict[str, Any], workdir: Path) -> ChartRun:
    def values_file(name: str, values: dict[str, Any]) -> Path:
        path = workdir / f"{name}.values.json"
        path.write_text(json.dumps(values))
        return path

    lint_reports = []
    for i, item in enumerate(request.get("lint", [])):
        chart = item.get("chart", request["chart"])
        cmd = [helm, "lint", chart, "-f", str(values_file(f"lint{i}", item.get("values", {})))]
        if item.get("strict"):
            cmd.append("--strict")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        errors = [] if proc.returncode == 0 else [proc.stdout + proc.stderr]
        messages = [
            {"severity": 2, "path": "", "error": line} for line in proc.stdout.splitlines() if "[WARNING]" in line
        ]
        lint_reports.append({"messages": messages, "errors": errors})
    rendered: dict[str, Rendered] = {}
    failures: dict[str, str] = {}
    # `helm template` refuses a chart whose declared dependency is missing, even when its condition
    # is off; the stub stands in for what `helm dependency build` would download.
    with_deps = str(make_stub_chart(workdir)) if not (CHART / "charts").is_dir() else str(CHART)
    for case, spec in request.get("render", {}).items():
        chart = spec.get("chart", request["chart"])
        chart = with_deps if chart == str(CHART) else chart
        values = values_file(case, spec.get("values", {}))
        cmd = [helm, "template", spec.get("release", "muster"), chart, "-n", request["namespace"], "-f", str(values)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            failures[case] = proc.stderr
            continue
        manifests: dict[str, str] = {}
        for part in proc.stdout.split("\n---\n"):
            source = next((ln[len("# Source: ") :] for ln in part.splitlines() if ln.startswith("# Source: ")), "?")
            manifests[source] = manifests.get(source, "") + "\n---\n" + part
        rendered[case] = _parse(manifests)
    version = subprocess.run([helm, "version", "--short"], capture_output=True, text=True, check=False).stdout.strip()
    return ChartRun(f"helm binary {version}", lint_reports, rendered, failures)


def run_chart(request: dict[str, Any], workdir: Path) -> ChartRun:
    """Lint and render `request` (see deploy/helm_sdk.py) with the best Helm available, or skip."""
    request = {"namespace": NAMESPACE, **request}
    if _sdk_available():
        return _run_sdk(request)
    helm = shutil.which("helm")
    if helm is not None:
        return _run_binary(helm, request, workdir)
    pytest.skip("no Helm: neither the helm-python-sdk wheel (pip install -e '.[dev]') nor a helm binary on PATH")
