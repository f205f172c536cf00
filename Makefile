# The two commands a newcomer needs: `make demo` and `make test`.
# Each creates (or reuses) .venv, installs what is missing, then runs.
# torch is installed first and pinned to the CPU build, so that nothing
# resolves a (multi-GB) CUDA build of torch.

SHELL := bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.npusim-installed
TORCH_SPEC := torch==2.13.0

.PHONY: demo test lint bench install

install: $(STAMP)

CXX_SOURCES := $(shell find src/npusim/csrc -name "*.cpp" -o -name "*.h")

# Rebuilt when the C++ changes, so that tests and the demo never compile on import.
$(STAMP): pyproject.toml setup.py $(CXX_SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=23"
	$(PY) -m pip install -q $(TORCH_SPEC)
	@echo "Building npusim's C++ extensions (once, at install; about a minute):"
	$(PY) -m pip install -v --no-build-isolation -e ".[test,plot,integration]" 2>&1 \
	  | sed -unE 's/^ *(\[[0-9]+\/[0-9]+\]) .* -c (\S+\.cpp) .*/  \1 \2/p; /[Ee]rror|Successfully installed/p'
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
