# archplace: `make test` sets itself up from a fresh clone (Python 3.11) and runs the test suite.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-system lint bench run clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# the CPU wheel first, so no dependency pulls several GB of CUDA wheels
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev,zigzag]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check archplace tests bench
	# two workers, whole files each (module fixtures such as test_platform's baseline search run once); a
	# third worker was no faster from a fresh clone (21:08 against 20:14 with two) and loads the machine more.
	# The tests marked `system` (their own `ray start` clusters, CLI drivers with their own Ray, `archplace
	# serve` processes, PostgreSQL servers: about a quarter of the suite's time) run in `make test-system`
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=30 -m "not system"

# the system tests (see `test`); CI (.ci/run) runs them after `make test`
test-system: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=15 -m system

lint: $(STAMP)
	$(BIN)/ruff check archplace tests bench

bench: $(STAMP)
	$(BIN)/python bench/platform/graph_capture.py

run: $(STAMP)
	$(BIN)/archplace search bert-large

clean:
	rm -rf $(VENV) .pytest_cache
