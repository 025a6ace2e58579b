# Two entry points for a fresh machine: `make run` (the main job) and `make test`.
# Both create or reuse .venv. TORCH_SPEC picks the torch build: the default is the
# CPU wheel that this kind of machine keeps on local disk; on a GPU box use e.g.
# `make run TORCH_SPEC=torch`.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PRESET ?= tiny
# Two pytest workers: much of the suite waits on subprocesses, servers and launchers.
TEST_WORKERS ?= 2
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test test-fast bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	DS_ACCELERATOR=$${DS_ACCELERATOR:-cpu} $(BIN)/llmforge run --preset $(PRESET)

test: $(STAMP)
	DS_ACCELERATOR=$${DS_ACCELERATOR:-cpu} $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=15

test-fast: $(STAMP)
	DS_ACCELERATOR=$${DS_ACCELERATOR:-cpu} $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not slow"

bench: $(STAMP)
	$(BIN)/python bench/dedup.py

clean:
	rm -rf work .pytest_cache
