"""Compile the scheduler core (projections/) to C with mypyc (`make core`).

The compiled modules decide exactly what the Python ones decide (the same source, compiled;
tests/replay/test_compiled_core.py compares the logs byte for byte), 1.4-1.7x faster on the bench shapes.
They go to projections/_compiled/ with a manifest of the sha256 of every module of projections/ and
events/: the package puts that folder first on its path only while every one still matches
(projections/__init__.py), so an edited module never runs stale compiled code; the core runs as
Python until the next `make core`.

mypyc wants the package as one folder tree and muster's is spread over top-level folders, so the
build lays out `build/core/src/muster/` with symlinks, as `make layers` does for mypy.
Modules that define msgspec Structs stay Python: mypyc drops a Struct's class options (kw_only,
array_like, dict...), which would change their encoding.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "projections"
OUT = PACKAGE / "_compiled"
BUILD = ROOT / "build" / "core"
GROUP = "muster.projections.core"
"""The shared library's module name (mypyc adds `__mypyc`): inside the package, so it needs no top-level name."""


def compiled_modules() -> list[Path]:
    """The core's modules mypyc compiles: every one but the package's `__init__` and those defining Structs."""
    return [
        p
        for p in sorted(PACKAGE.glob("*.py"))
        if p.name != "__init__.py" and "(msgspec.Struct" not in p.read_text(encoding="utf-8")
    ]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _layout() -> Path:
    """`build/core/src/muster/` with the packages the core imports, as symlinks to the sources."""
    src = BUILD / "src"
    shutil.rmtree(src, ignore_errors=True)
    pkg = src / "muster"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").symlink_to(ROOT / "muster" / "__init__.py")
    for name in ("events", "projections"):
        (pkg / name).symlink_to(ROOT / name)
    return src


def build() -> int:
    from mypyc.build import mypycify
    from setuptools import Distribution

    modules = compiled_modules()
    src = _layout()
    cwd = Path.cwd()
    os.chdir(src)  # mypyc names a module by its path: muster/projections/x.py is muster.projections.x
    try:
        extensions = mypycify(
            [f"muster/projections/{p.name}" for p in modules],
            opt_level="3",
            multi_file=True,  # C files gcc can compile two at a time
            group_name=GROUP,
            target_dir=str(BUILD / "c"),
        )
        for ext in extensions:  # mypyc writes a dotted group's headers under its package's folder
            ext.include_dirs.append(str(BUILD / "c" / "muster" / "projections"))
        dist = Distribution({"name": "muster-core", "ext_modules": extensions})
        cmd = dist.get_command_obj("build_ext")
        cmd.build_lib = str(BUILD / "lib")
        cmd.build_temp = str(BUILD / "temp")
        cmd.parallel = os.cpu_count() or 1
        dist.run_command("build_ext")
    finally:
        os.chdir(cwd)
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir()
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for lib in (BUILD / "lib" / "muster" / "projections").glob(f"*{suffix}"):
        shutil.copy2(lib, OUT / lib.name)
    # every source the compiled code was built against, as the package's guard checks them
    sources = sorted([*PACKAGE.glob("*.py"), *(ROOT / "events").glob("*.py")])
    manifest = {
        "cache_tag": sys.implementation.cache_tag,
        "sources": {f"{p.parent.name}/{p.name}": digest(p) for p in sources},
    }
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"compiled {len(modules)} core modules into {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(build())
