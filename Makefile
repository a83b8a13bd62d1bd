# Two entry points: `make lab` and `make test`. Every install step lives here, with the exact
# versions of constraints.txt. pip installs without byte-compiling (--no-compile); what was
# installed, the package's own source with it, is byte-compiled after, in one process per core
# (compileall -j 0: 13 s on 2 cores, where pip's own compile step took 22 s of a 52 s
# install), and `make test` compiles it beside the lint, which runs on one core. It cannot be
# left to the first import: where PYTHONDONTWRITEBYTECODE is set (as on the machines the
# suite is timed on), Python writes no bytecode, and every process, each of the suite's two
# workers and each planner worker, launcher run and Ray worker it starts, compiled JAX's
# source again: about 100 CPU-s of the suite's 772, a minute of its wall time on 2 cores.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile \
	-c constraints.txt
BYTECODE := $(BIN)/python -m compileall -q -j 0 src \
	"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

.PHONY: lab test test-fast lint bench docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The package with JAX's CPU build (what `make lab` needs).
$(VENV)/.installed-runtime: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e '.[cpu]'
	$(BYTECODE)
	touch $@

# The package plus the test, lint and notebook tooling (and the Flax, Equinox and optax
# programs the suite and the benchmarks run), both deviceless accelerator compilers (GPU,
# TPU), so the tests cover every compile target, and Ray, whose local cluster the suite starts.
$(VENV)/.installed-dev: pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e '.[cpu,dev,gpu-compile,tpu-compile,ray]'
	touch $(VENV)/.installed-runtime $@

# The docs site's tools (the `docs` extra) beside everything the suite has: the guides run the
# GPU and TPU compilers, deviceless, and Flax.
$(VENV)/.installed-docs: $(VENV)/.bytecode
	$(PIP) -e '.[docs]'
	$(BYTECODE)
	touch $@

# The bytecode of the dev install (and of the package's source).
$(VENV)/.bytecode: $(VENV)/.installed-dev
	$(BYTECODE)
	touch $@

lab: $(VENV)/.installed-runtime
	$(BIN)/shardscope lab

# The lint (seconds, one process at a time) beside the bytecode, then the suite in
# TEST_WORKERS processes (pytest-xdist). Each worker starts on its half of the tests, in
# order, and a worker that runs out takes tests from the end of the other's (--dist
# worksteal): no file holds a worker up, and a module's fixtures are built again only where a
# file is split. The 30 slowest tests are printed. pytest exits 5 when it collects no test;
# that is not a failure of the suite.
TEST_WORKERS ?= 2
PYTEST = $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal --durations=30
test: $(VENV)/.installed-dev
	$(MAKE) --no-print-directory $(VENV)/.bytecode & bytecode=$$!; \
	$(MAKE) --no-print-directory lint; lint=$$?; wait $$bytecode && exit $$lint
	$(PYTEST); rc=$$?; if [ $$rc -eq 5 ]; then rc=0; fi; exit $$rc

# For development: the suite less its costly tiers (pyproject.toml's markers): GPU and TPU
# compiles, and Ray, notebooks and runs of several processes. `make test` runs everything.
test-fast: $(VENV)/.bytecode
	$(PYTEST) -m "not compiler and not slow"; rc=$$?; if [ $$rc -eq 5 ]; then rc=0; fi; exit $$rc

# ruff (rules and formatting), the layering contract of .importlinter (each floor imports
# only from below, and every module of shardscope._src is on a floor), and mypy (the settings
# in pyproject.toml: every module; base, hlo, audit, the cost floor and the planner core, plan,
# strictly).
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src
	$(BIN)/lint-imports
	$(BIN)/mypy

bench: $(VENV)/.bytecode
	$(BIN)/python benchmarks/lab_cold_start.py
	$(BIN)/python benchmarks/audit_overhead.py
	$(BIN)/python benchmarks/plan_speed.py
	$(BIN)/python benchmarks/plan_targets.py
	$(BIN)/python benchmarks/own_program.py
	$(BIN)/python benchmarks/hostile_hlo.py
	$(BIN)/python benchmarks/calibration.py

# The docs site in docs/_build/html, every guide executed (MyST-NB), warnings as errors: an
# example that raises fails the build and names its cell. Every page is read again each time
# (-E): a page whose text did not change still shows what the library computes today.
# DOCS_JOBS processes read (and execute) the pages.
DOCS_JOBS ?= 2
docs: $(VENV)/.installed-docs
	$(BIN)/python -m sphinx -W --keep-going -E -j $(DOCS_JOBS) -b html docs docs/_build/html

clean:
	rm -rf $(VENV) scores build src/*.egg-info docs/_build docs/reference/generated
