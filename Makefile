# Two commands do everything from a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint typecheck unit venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[engine,serve,dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/prfaas demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

# Strict mypy on every package and top-level module (pydantic models via the pydantic plugin).
TYPED := core spec perf analytic workload cache policy sim transfer testbed engine serve commands \
	config.py scenarios.py deployment_sections.py cli.py errors.py

typecheck: $(STAMP)
	$(VENV)/bin/mypy $(addprefix src/prfaas/,$(TYPED))

test: lint typecheck
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
