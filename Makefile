# muster: the two commands are `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck layers unit core bench chart clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The scheduler core compiled by mypyc (tools/build_core.py): 1.4-1.7x faster on the bench shapes, the same decisions.
# Rebuilt when a core module changes; until then the package runs the changed core as Python.
CORE := projections/_compiled/manifest.json
$(CORE): $(STAMP) $(wildcard projections/*.py events/*.py) tools/build_core.py
	$(BIN)/python tools/build_core.py

core: $(CORE)

demo: $(STAMP) $(CORE)
	$(BIN)/muster demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy and grimp want the package as one folder tree; ours is spread over
# top-level folders (setuptools package-dir mapping), so lay it out with symlinks.
.layers/muster: $(STAMP)
	rm -rf .layers && mkdir -p .layers/muster
	for d in events projections daemon replay ui demo; do ln -s ../../$$d .layers/muster/$$d; done
	for f in muster/*.py; do ln -s ../../$$f .layers/muster/$$(basename $$f); done

typecheck: .layers/muster
	MYPYPATH=.layers $(BIN)/mypy -p muster

layers: .layers/muster
	$(BIN)/python tools/layers.py

unit: $(STAMP) $(CORE)
	$(BIN)/pytest

test: lint typecheck layers unit

# helm lint + helm template of the chart through Helm's Go SDK (the helm-python-sdk dev wheel).
chart: $(STAMP)
	$(BIN)/python deploy/helm_sdk.py lint deploy/helm/muster
	$(BIN)/python deploy/helm_sdk.py template muster deploy/helm/muster

bench: $(STAMP) $(CORE)
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build projections/_compiled
