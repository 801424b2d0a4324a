# Two commands do everything, from a fresh clone with only Python and make:
#   make demo   set up .venv, then run the main job
#   make test   set up .venv, then lint, type-check and run the test suite (all but the `models` tests)
#   make test-models   the tests that compile large real models (minutes each)
#   make test-pythons  the same suite on the oldest and newest Python that kiln supports (3.10, 3.13), as CI runs it
#   make test-install  `pip install .` (no extras) into a new venv: the README's quick start and `kiln demo` run
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kiln-installed
DEMO_STAMP := $(VENV)/.kiln-demo-installed

# the oldest and newest Python of pyproject.toml's requires-python and classifiers. No Debian suite packages a
# CPython 3.10, nor does any package we found on PyPI; this kind of machine comes with pyenv's builds of both (under
# $(PYENV_ROOT)/versions), and any other machine may put python3.10 and python3.13 on PATH instead.
PYTHONS ?= 3.10 3.13
PYENV_ROOT ?= $(HOME)/.pyenv
pyenv_python = $(lastword $(sort $(wildcard $(PYENV_ROOT)/versions/$(1).*/bin/python$(1))))
python_for = $(or $(call pyenv_python,$(1)),$(shell command -v python$(1)))

.PHONY: demo test test-models test-pythons test-install lint typecheck bench clean

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

# .venv-3.10 and .venv-3.13, set up as .venv is; lint and type-check stay with `make test` (ruff and mypy already
# read the code as Python 3.10's), since mypy's verdict here would follow each Python's numpy stubs
.venv-%/.kiln-installed: pyproject.toml
	@test -n "$(call python_for,$*)" || { echo "no Python $*: none under $(PYENV_ROOT)/versions or on PATH"; exit 1; }
	test -x .venv-$*/bin/python || $(call python_for,$*) -m venv .venv-$*
	.venv-$*/bin/python -m pip install --quiet --upgrade pip
	.venv-$*/bin/python -m pip install --quiet -e '.[dev,onnx,cuda]'
	touch $@

.PRECIOUS: .venv-%/.kiln-installed
test-python-%: .venv-%/.kiln-installed
	.venv-$*/bin/python -m pytest -q -n 2 --dist loadgroup -m "not models" tests

# one Python after the other: each run already takes both cores
test-pythons:
	@for v in $(PYTHONS); do echo "== Python $$v"; $(MAKE) --no-print-directory test-python-$$v || exit 1; done

# what a user who does not use make gets: kiln and its three dependencies, nothing from the extras
test-install:
	rm -rf .venv-install && $(PYTHON) -m venv .venv-install
	.venv-install/bin/python -m pip install --quiet .
	awk '/^## Quick start in Python/{on=1} on && /^```$$/{exit} on && f{print} on && /^```python/{f=1}' README.md \
		> .venv-install/quickstart.py
	cd .venv-install && bin/python quickstart.py
	.venv-install/bin/kiln demo > .venv-install/demo.log
	grep -q "pip install 'kiln\[onnx\]' adds this part" .venv-install/demo.log
	rm -rf .venv-install

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(PYTHONS:%=.venv-%) .mypy_cache .pytest_cache .ruff_cache
