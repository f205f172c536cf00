# The two commands a newcomer needs: `make demo` and `make test`.
# Each creates (or reuses) .venv, installs what is missing, then runs.
# torch is installed first and pinned to the CPU build, so that nothing
# resolves a (multi-GB) CUDA build of torch.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.npusim-installed
TORCH_SPEC := torch==2.13.0

.PHONY: demo test lint bench install

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=23"
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q --no-build-isolation -e ".[test,plot]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m npusim demo

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

bench: $(STAMP)
	$(PY) -m npusim bench foreach-copy
	$(PY) -m npusim bench matmul
