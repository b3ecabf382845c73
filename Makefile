# dprflow: `make run` sets up .venv and runs the workflow; `make test` sets up and runs the tests.
# Other configs: make run CONFIG=config/examples/cranfield.yaml. Cores: make run CORES=8.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= config/config.yaml
CORES ?= 2
# make test runs the tests in this many processes (pytest-xdist); 1 runs them in one.
TEST_WORKERS ?= 2
SNAKEMAKE_ARGS ?=

# Jobs run `python -m dprflow.stages.<rule>`: the venv's bin comes first on PATH, as if activated.
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: setup run dry-run test test-slow test-all lint format bench check report render-check generic-corpus clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,slurm]'
	touch $@

# Snakemake reads --configfile before the workflow starts and names no line for malformed YAML:
# the config is parsed first, its errors named by file, line and column.
CHECK_CONFIG = $(BIN)/python -m dprflow.config $(CONFIG)

run: setup
	$(CHECK_CONFIG)
	$(BIN)/snakemake --profile profiles/local --cores $(CORES) --configfile $(CONFIG) $(SNAKEMAKE_ARGS)

# The latest results against config/expected/ (OK or FAIL per row); fails on a FAIL.
check: setup
	$(CHECK_CONFIG)
	$(BIN)/snakemake --profile profiles/local --cores 1 --configfile $(CONFIG) --forcerun check check

# One HTML page: comparison with provenance, figures, config (after make run).
report: setup
	$(CHECK_CONFIG)
	$(BIN)/snakemake --profile profiles/local --cores 1 --configfile $(CONFIG) --report results/report.html

# Opens the report in headless Chromium (installed from Debian when missing) and checks that the
# table and every figure render; screenshots in results/render_check/ (after make run).
render-check: report
	command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)
	$(BIN)/python scripts/check_report_render.py --results results --report results/report.html

dry-run: setup
	$(CHECK_CONFIG)
	$(BIN)/snakemake -n --cores $(CORES) --configfile $(CONFIG)

# make test: every test but those marked slow (pyproject.toml's markers: whole workflow runs, the
# Slurm cluster, torchrun, stock-image and interpreter builds, each over about 5 s on 2 idle cores);
# make test-slow runs those, make test-all both in one run. CI runs make test, then make test-slow.
PYTEST = $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: setup
	$(PYTEST) -m 'not slow' tests

test-slow: setup
	$(PYTEST) -m slow tests

test-all: setup
	$(PYTEST) tests

lint: setup
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/snakemake --lint --cores 1
	$(BIN)/snakefmt --check Snakefile rules

format: setup
	$(BIN)/ruff format src tests bench scripts
	$(BIN)/ruff check --fix src tests bench scripts
	$(BIN)/snakefmt Snakefile rules

bench: setup
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done
	$(BIN)/python bench/summarize.py

# The first thing to run on a new GPU machine (docs/clusters.md): the GPU tests, then every step
# type's tokens/s, MFU and memory on BERT-base, in one table. Needs only a stock PyTorch image
# (torch, transformers, pandas, pyarrow, safetensors, pytest), not `make setup`.
GPU_PYTHON ?= python3
.PHONY: gpu-check
gpu-check:
	PYTHONPATH=src $(GPU_PYTHON) scripts/gpu_check.py

# Then the workflow itself on that GPU (after make setup): the tests' tiny config (every stage type
# but doc2query and the MLM base) through Snakemake with the packaged MiniLM, in GPU_WORKDIR; then
# each job's wall time and the device its log names (scripts/gpu_workflow_jobs.py).
GPU_WORKDIR ?= results-gpu-workflow
.PHONY: gpu-workflow
gpu-workflow: setup
	mkdir -p $(GPU_WORKDIR)
	$(BIN)/snakemake -s $(abspath Snakefile) --directory $(GPU_WORKDIR) --cores $(CORES) \
		--configfile $(abspath tests/data/tiny_workflow.yaml) $(SNAKEMAKE_ARGS)
	$(BIN)/python scripts/gpu_workflow_jobs.py $(GPU_WORKDIR) --out $(GPU_WORKDIR)/jobs.csv

# The MLM base's generic corpus (docs/methods.md): English prose from Debian's documentation
# packages, installed first when missing (apt-get update only if the install cannot find them), in
# data/generic/debian-docs.jsonl with its manifest (eight packages, 10.3M tokens). Without root
# the install says what to do instead (an administrator's apt-get, fewer sources, another corpus).
# GENERIC_SOURCES=...,java adds the Java API docs.
GENERIC_SOURCES ?= python,linux,perl,postgresql,django,sqlalchemy,git,handbook
GENERIC_CORPUS ?= data/generic/debian-docs.jsonl

generic-corpus: setup
	$(BIN)/python scripts/generic_corpus.py --sources $(GENERIC_SOURCES) --install
	$(BIN)/python scripts/generic_corpus.py --sources $(GENERIC_SOURCES) --out $(GENERIC_CORPUS)

clean:
	rm -rf results .snakemake
