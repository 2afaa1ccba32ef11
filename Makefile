# `make demo` and `make test` set everything up on a fresh machine, then run.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TORCH  := $(VENV)/.installed-pytorch

.PHONY: setup setup-pytorch setup-ebpf setup-chromium setup-prometheus demo up test lint bench bench-agent clean docs dashboards

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# torch (~750 MB) only for the tests of the training-script integration: `make demo` never installs it.
$(TORCH): $(STAMP)
	$(PY) -m pip install -q -e '.[dev,pytorch]'
	touch $(TORCH)

setup-pytorch: $(TORCH)

# BCC (python3-bpfcc via apt), kernel headers unpacked into .cache/, tracefs: the agent's eBPF source.
setup-ebpf: $(STAMP)
	scripts/setup_bcc.sh $(VENV)

# Debian's chromium (apt, as root): tests/test_report.py renders `clocktower report` in it, headless.
setup-chromium:
	scripts/setup_chromium.sh

# Prometheus from Debian's package, unpacked into .cache/ (not installed): tests/test_promql.py runs on it.
setup-prometheus:
	scripts/setup_prometheus.sh

demo: setup
	$(VENV)/bin/clocktower demo $(ARGS)

up: setup
	$(VENV)/bin/clocktower up $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(PY) scripts/lint_imports.py   # import-linter: the layering contracts in pyproject.toml

test: setup setup-pytorch setup-ebpf setup-chromium setup-prometheus lint
	$(VENV)/bin/pytest -q $(ARGS)

bench: setup
	$(PY) benchmarks/pipeline_throughput.py $(ARGS)

bench-agent: setup setup-ebpf
	$(PY) benchmarks/agent_overhead.py $(ARGS)

docs: setup
	$(PY) -m clocktower.schemas.docs > docs/SCHEMA.md && $(PY) -m clocktower.schemas.json_schema docs/schemas

# grafana/dashboards/*.json and grafana/provisioning/alerting/ from clocktower/dashboards/ (edit those, not the JSON)
dashboards: setup
	$(PY) -m clocktower.dashboards

clean:
	rm -rf $(VENV) .clocktower .clocktower-agent .cache .pytest_cache .ruff_cache
