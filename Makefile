# distill — `make help` lists the targets.
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
export TOKENIZERS_PARALLELISM := false

.DEFAULT_GOAL := help
.PHONY: help setup test test-fast lint tiny-world bench

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

setup: ## create .venv; install torch 2.13.0 (CPU build) first, then distill with its dev extra
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e '.[dev]'

test: ## the whole suite, slow end-to-end tests included
	$(BIN)/pytest -q

test-fast: ## unit tests only (skips tests marked slow)
	$(BIN)/pytest -q -m "not slow"

lint: ## ruff
	$(BIN)/ruff check distill tests benchmarks

tiny-world: ## build the CPU tiny world (teacher + student) unless already built
	$(BIN)/distill tiny-world
