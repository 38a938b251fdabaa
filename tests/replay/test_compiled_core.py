"""The compiled core (mypyc, `make core`) decides the bytes the Python core decides, and never runs stale."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from corpus import scenarios

from muster.events.codec import encode
from muster.projections import COMPILED, CORE, compiled_core
from muster.replay.simulator import simulate

HERE = Path(__file__).resolve().parent


def digests(tmp: Path) -> dict[str, str]:
    """Each corpus scenario's whole log (`CycleSettled` records too), as a sha256."""
    tmp.mkdir(parents=True, exist_ok=True)
    return {
        name: hashlib.sha256(b"".join(encode(e) for e in simulate(sc).events)).hexdigest()
        for name, sc in scenarios(tmp)
    }


_CHILD = """
import json, sys
from pathlib import Path
from muster.projections import CORE
from test_compiled_core import digests
print(json.dumps({"core": CORE, "logs": digests(Path(sys.argv[1]))}))
"""


# about 10 CPU seconds in Python and 4 compiled; the suite's 120 s timeout would fail it under heavy load
@pytest.mark.timeout(900)
@pytest.mark.skipif(not COMPILED, reason=f"the core runs as {CORE}")
def test_the_compiled_core_writes_the_log_the_python_core_writes(tmp_path: Path) -> None:
    """Every corpus scenario (examples, findings, bench shapes) writes the same log compiled and as Python."""
    compiled = digests(tmp_path / "compiled")
    env = {**os.environ, "MUSTER_CORE": "python", "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "python")], env=env, capture_output=True, text=True, timeout=800
    )
    assert child.returncode == 0, child.stderr[-3000:]
    python = json.loads(child.stdout)
    assert python["core"] == "Python (MUSTER_CORE=python)"
    assert len(compiled) >= 40 and python["logs"].keys() == compiled.keys()
    differ = [name for name in compiled if python["logs"][name] != compiled[name]]
    assert not differ, f"the compiled core decided otherwise on {differ}"


def _built(tmp: Path) -> Path:
    """A package folder `tmp/projections` with one module and a compiled folder whose manifest matches it."""
    package = tmp / "projections"
    (package / "_compiled").mkdir(parents=True)
    (package / "x.py").write_text("X = 1\n")
    manifest = {
        "cache_tag": sys.implementation.cache_tag,
        "sources": {"projections/x.py": hashlib.sha256(b"X = 1\n").hexdigest()},
    }
    (package / "_compiled" / "manifest.json").write_text(json.dumps(manifest))
    return package


def test_an_edited_core_module_runs_as_python_until_the_core_is_compiled_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled folder is used only while every source it was built from is unchanged, and says why not."""
    monkeypatch.delenv("MUSTER_CORE", raising=False)
    package = _built(tmp_path)
    assert compiled_core(package) == (package / "_compiled", "compiled (mypyc)")
    (package / "x.py").write_text("X = 2\n")
    folder, why = compiled_core(package)
    assert folder is None and why == "Python (projections/x.py changed since the core was compiled: `make core`)"
    (package / "x.py").unlink()
    assert compiled_core(package)[0] is None


def test_the_python_core_is_chosen_without_a_build_for_this_python_or_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No manifest, a build for another interpreter, or MUSTER_CORE=python: the core runs as Python."""
    monkeypatch.delenv("MUSTER_CORE", raising=False)
    package = _built(tmp_path)
    monkeypatch.setenv("MUSTER_CORE", "python")
    assert compiled_core(package) == (None, "Python (MUSTER_CORE=python)")
    monkeypatch.delenv("MUSTER_CORE")
    manifest = package / "_compiled" / "manifest.json"
    manifest.write_text(manifest.read_text().replace(sys.implementation.cache_tag, "cpython-399"))
    assert compiled_core(package)[1] == "Python (the compiled core is for cpython-399: `make core` rebuilds it)"
    manifest.unlink()
    assert compiled_core(package) == (None, "Python (no compiled core: `make core` builds one)")
