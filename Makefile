# Two entry points: `make lab` and `make test`. Every install step lives here.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: lab test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The package with its pinned runtime dependencies (what `make lab` needs).
$(VENV)/.installed-runtime: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e .
	touch $@

# The package plus the test and notebook tooling.
$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(VENV)/.installed-runtime $@

lab: $(VENV)/.installed-runtime
	$(BIN)/shardscope lab

# pytest exits 5 when it collects no test; that is not a failure of the suite.
test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest; rc=$$?; if [ $$rc -eq 5 ]; then rc=0; fi; exit $$rc

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks

bench: $(VENV)/.installed-runtime
	$(BIN)/python benchmarks/lab_cold_start.py
	$(BIN)/python benchmarks/audit_overhead.py
	$(BIN)/python benchmarks/plan_speed.py

clean:
	rm -rf $(VENV) scores build src/*.egg-info
