# Souq: `make dev` runs a local cluster, `make test` runs every check, `make bench` measures.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TSTAMP := $(VENV)/.installed-test

.PHONY: dev test bench lint typecheck unit clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(TSTAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP) $@

dev: $(STAMP)
	$(BIN)/souq dev $(ARGS)

lint: $(TSTAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(TSTAMP)
	$(BIN)/mypy

test: $(TSTAMP) lint typecheck
	$(BIN)/python -m pytest $(PYTEST_ARGS)

unit: $(TSTAMP)
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

bench: $(TSTAMP)
	$(BIN)/python -m bench $(ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
