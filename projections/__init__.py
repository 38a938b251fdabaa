"""muster.projections: pure folds of the event log and the scheduling policy.

Nothing here performs I/O, reads a clock or draws unseeded random numbers (but this file, which
chooses at import whether the core runs compiled).

The core may run compiled by mypyc (`make core`, tools/build_core.py): the same source, 1.4-1.7x
faster on the bench shapes, deciding the same bytes. Its modules sit in `_compiled/` with the sha256
of the sources they were built from (the core's and the events' modules, whose constants the compiled
code may hold); that folder is searched first only while every one of those sources is unchanged, so
an edited module never runs stale compiled code. `MUSTER_CORE=python` keeps the core in Python.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

SOURCES = Path(__file__).parent
"""The core's source folder (a compiled module's `__file__` names where it was built, not its source)."""


def compiled_core(here: Path) -> tuple[Path | None, str]:
    """The folder of an up-to-date compiled core for the sources in `here`, or None, and a line saying
    which core runs and why."""
    folder = here / "_compiled"
    if os.environ.get("MUSTER_CORE", "") == "python":
        return None, "Python (MUSTER_CORE=python)"
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, "Python (no compiled core: `make core` builds one)"
    if manifest.get("cache_tag") != sys.implementation.cache_tag:
        return None, f"Python (the compiled core is for {manifest.get('cache_tag')}: `make core` rebuilds it)"
    for name, sha in sorted(manifest.get("sources", {}).items()):  # "projections/x.py", "events/y.py"
        try:
            now = hashlib.sha256((here.parent / name).read_bytes()).hexdigest()
        except OSError:
            now = ""
        if now != sha:
            return None, f"Python ({name} changed since the core was compiled: `make core`)"
    return folder, "compiled (mypyc)"


_folder, CORE = compiled_core(SOURCES)
"""Which core runs, and why: `muster --version`, the daemon's start line and the benches print it."""
COMPILED = _folder is not None
if _folder is not None:
    __path__.insert(0, str(_folder))
