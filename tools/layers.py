"""Check the import-linter contracts of pyproject.toml (`make layers`).

grimp, under import-linter, wants a package as one folder tree, and muster's
is spread over top-level folders (setuptools package-dir mapping). `make`
lays it out as symlinks in `.layers/`; this script puts that tree first and
drops the editable-install finder so `muster` resolves to it.
"""

import sys
from pathlib import Path

sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in str(getattr(f, "__module__", ""))]
sys.path.insert(0, str(Path(".layers").resolve()))
for name in [m for m in sys.modules if m == "muster" or m.startswith("muster.")]:
    del sys.modules[name]

from importlinter.application import use_cases  # noqa: E402
from importlinter.configuration import configure  # noqa: E402

configure()
kept = use_cases.lint_imports(cache_dir=None, no_logo=True)
sys.exit(0 if kept else 1)
