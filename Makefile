# archplace: `make test` sets itself up from a fresh clone (Python 3.11) and runs the test suite.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Material for MkDocs prints a banner about MkDocs 2 on every build; nothing to act on here
export NO_MKDOCS_2_WARNING := 1

.PHONY: install test test-system lint docs docs-check bench run clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# the CPU wheel first, so no dependency pulls several GB of CUDA wheels
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev,zigzag,export-check]"
	# torchtitan 0.2.2, the last release with TOML job files, for tests/test_plan_export.py: without its
	# dependencies (datasets and its pins would downgrade huggingface_hub under transformers 5); the job-config
	# parser needs only torch and tyro (export-check)
	$(BIN)/pip install -q --no-deps torchtitan==0.2.2
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check archplace tests bench
	# the documentation site, strict (a broken link, a page missing from the nav, a reference page that no
	# longer matches the code): see docs-check
	$(MAKE) --no-print-directory docs-check
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

# the site in site/ (not committed); docs/hooks/reference.py generates the reference pages from the code
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

# `mkdocs build --strict` into a temporary folder, removed afterwards (`make test` runs it first); its log
# only when it fails (not --quiet: a quiet build never sees the warnings that --strict turns into errors)
docs-check: $(STAMP)
	@d=$$(mktemp -d) && log=$$($(BIN)/mkdocs build --strict --site-dir "$$d" 2>&1); rc=$$?; rm -rf "$$d"; \
	if [ $$rc -ne 0 ]; then echo "$$log" | grep -v '^INFO'; fi; exit $$rc

bench: $(STAMP)
	$(BIN)/python bench/platform/graph_capture.py

run: $(STAMP)
	$(BIN)/archplace search bert-large

clean:
	rm -rf $(VENV) .pytest_cache site
