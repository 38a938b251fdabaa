"""deploy/Dockerfile builds the package it ships: every source folder and the compiled core's build script."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _copied() -> set[str]:
    """The build stage's COPY sources (paths in the repository)."""
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    build = text.split("\nFROM ", 2)[1]  # the first stage
    return {src for line in re.findall(r"^COPY (.+)$", build, re.M) for src in line.split()[:-1]}


def test_the_image_build_copies_every_folder_the_package_is_built_from() -> None:
    """Each folder of pyproject's package-dir mapping is copied, or `pip install .` fails in the image build."""
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    missing = sorted(set(package_dir.values()) - _copied())
    assert not missing, f"deploy/Dockerfile does not copy {missing}"


def test_the_image_build_compiles_the_core_it_ships() -> None:
    """The build stage copies and runs tools/build_core.py before installing, so the image runs the compiled core."""
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    build = text.split("\nFROM ", 2)[1]
    assert "tools/build_core.py" in _copied()
    assert build.index("tools/build_core.py \\") < build.index("--prefix=/install .")
