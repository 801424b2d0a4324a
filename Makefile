# Two commands do everything, from a fresh clone with only Python and make:
#   make demo   set up .venv, then run the main job
#   make test   set up .venv, then lint, type-check and run the test suite (all but the `models` tests)
#   make test-models   the tests that compile large real models (minutes each)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kiln-installed
DEMO_STAMP := $(VENV)/.kiln-demo-installed

.PHONY: demo test test-models lint typecheck bench clean

# everything the tests need: the dev tools, the ONNX extra, and the CUDA extra (NVRTC compiles CUDA C to
# CUBIN without a GPU; the tests check every op's source that way)
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,onnx,cuda]'
	touch $(STAMP) $(DEMO_STAMP)

# the demo needs kiln and its ONNX part only: no CUDA wheels on a machine that has no GPU
$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[onnx]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/kiln demo

lint: $(STAMP)
	$(BIN)/ruff check kiln tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

# loadgroup: ONNX's node suite runs whole in one worker (test_onnx_backend.py), which must survive it
test: lint typecheck
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup -m "not models" tests

test-models: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -m models tests

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
