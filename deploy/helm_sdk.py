"""`helm lint` and `helm template` without a helm binary, through Helm's own Go SDK.

The `helm-python-sdk` wheel (PyPI, pinned in the dev extras) bundles libhelm_c, a C ABI over
Helm v4's Go packages, so linting and rendering here are Helm's, not an imitation. This script
is what the chart tests and `make chart` call; it runs in its own process so that the Go runtime
never shares a process with the test suite.

    python deploy/helm_sdk.py lint deploy/helm/muster [--strict] [-f values.yaml] [--set k=v]
    python deploy/helm_sdk.py template RELEASE deploy/helm/muster [-n NS] [-f values.yaml] [--set k=v]
    python deploy/helm_sdk.py batch < request.json > answer.json

`batch` reads {"chart": PATH, "namespace": NS, "lint": [{"values": {...}, "strict": bool}],
"render": {CASE: {"release": NAME, "values": {...}}}} (an item may name its own "chart") and
answers {"versions": {...},
"lint": [REPORT...], "render": {CASE: {"manifests": {TEMPLATE: YAML}} | {"error": MESSAGE}}}.

Exit status: 0 on success, 1 when lint finds errors or a template fails, 2 when the SDK is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

SEVERITY = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}


def _load_sdk() -> Any:
    try:
        import helm_python
    except ImportError as exc:  # the wheel exists for some platforms only
        print(f"helm-python-sdk is not installed ({exc}); `pip install -e '.[dev]'`", file=sys.stderr)
        raise SystemExit(2) from exc
    return helm_python


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _values(helm: Any, files: list[str], sets: list[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in files:
        values = _deep_merge(values, helm.values_from_yaml(Path(name).read_text()))
    for expr in sets:
        values = _deep_merge(values, helm.parse_set_string(expr))
    return values


def lint(helm: Any, chart: str, values: dict[str, Any], strict: bool) -> dict[str, Any]:
    """Helm's lint report; `errors` is non-empty when lint fails (warnings fail too under strict)."""
    report: dict[str, Any] = helm.lint(chart, values or None, strict=strict)
    return report


def render(helm: Any, chart: str, release: str, namespace: str, values: dict[str, Any]) -> dict[str, str]:
    """Template path -> rendered YAML, for every template that rendered to something."""
    with helm.Chart.load(chart) as loaded:
        # Schema validation runs on install and in lint; do it here too, as `helm template` does.
        loaded.validate_schema(values)
        manifests: dict[str, str] = loaded.render(values, name=release, namespace=namespace, is_install=True)
    return {path: text for path, text in sorted(manifests.items()) if text.strip() and not path.endswith("NOTES.txt")}


def _batch(helm: Any) -> int:
    request = json.load(sys.stdin)
    chart, namespace = request["chart"], request.get("namespace", "default")
    answer: dict[str, Any] = {
        "versions": {"helm_sdk": helm.helm_sdk_version(), "helm_c": helm.helm_c_version()},
        "lint": [
            lint(helm, item.get("chart", chart), item.get("values", {}), item.get("strict", False))
            for item in request.get("lint", [])
        ],
        "render": {},
    }
    for case, spec in request.get("render", {}).items():
        try:
            release = spec.get("release", "muster")
            manifests = render(helm, spec.get("chart", chart), release, namespace, spec.get("values", {}))
            answer["render"][case] = {"manifests": manifests}
        except helm.HelmError as exc:
            answer["render"][case] = {"error": str(exc)}
    json.dump(answer, sys.stdout)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_lint = sub.add_parser("lint", help="lint a chart, like `helm lint`")
    p_lint.add_argument("chart")
    p_lint.add_argument("--strict", action="store_true", help="fail on warnings too")
    p_tpl = sub.add_parser("template", help="render a chart, like `helm template`")
    p_tpl.add_argument("release")
    p_tpl.add_argument("chart")
    p_tpl.add_argument("-n", "--namespace", default="default")
    for p in (p_lint, p_tpl):
        p.add_argument("-f", "--values", action="append", default=[], help="values file (repeatable)")
        p.add_argument("--set", action="append", default=[], help="KEY=VALUE (repeatable)")
    sub.add_parser("batch", help="JSON request on stdin, JSON answer on stdout (for tests)")
    args = parser.parse_args(argv)

    helm = _load_sdk()
    if args.command == "batch":
        return _batch(helm)
    values = _values(helm, args.values, args.set)
    if args.command == "lint":
        report = lint(helm, args.chart, values, args.strict)
        for msg in report["messages"]:
            print(f"[{SEVERITY.get(msg['severity'], '?')}] {msg['path']}: {msg['error']}")
        failed = bool(report["errors"])
        print(f"1 chart(s) linted, {1 if failed else 0} chart(s) failed")
        return 1 if failed else 0
    try:
        manifests = render(helm, args.chart, args.release, args.namespace, values)
    except helm.HelmError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    for path, text in manifests.items():
        print(f"---\n# Source: {path}\n{text.strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
