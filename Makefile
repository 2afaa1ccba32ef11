# `make demo` and `make test` set everything up on a fresh machine, then run.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo up test lint bench clean docs

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(VENV)/bin/clocktower demo $(ARGS)

up: setup
	$(VENV)/bin/clocktower up $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .

test: setup lint
	$(VENV)/bin/pytest -q $(ARGS)

bench: setup
	$(PY) benchmarks/pipeline_throughput.py $(ARGS)

docs: setup
	$(PY) -m schemas.docs > docs/SCHEMA.md

clean:
	rm -rf $(VENV) .clocktower .pytest_cache .ruff_cache
