# Quick start: `make demo` and `make test` on a fresh machine (Python 3.11, pip).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The CPU build of torch; an unpinned torch pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv demo test lint format clean-demo demo-model

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/openrft train examples/arithmetic/recipe.yaml --output runs/demo --overwrite

test: $(STAMP)
	$(VENV)/bin/ruff check src tests scripts
	$(VENV)/bin/pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests scripts
	$(VENV)/bin/ruff format --check src tests scripts

format: $(STAMP)
	$(VENV)/bin/ruff check --fix src tests scripts
	$(VENV)/bin/ruff format src tests scripts

# Rebuild the bundled demo model and dataset (deterministic; the result is committed).
demo-model: $(STAMP)
	$(PY) scripts/build_demo_model.py
