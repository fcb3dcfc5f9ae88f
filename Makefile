# Two commands do all the set-up on a fresh machine (Python >= 3.10 and a C compiler):
#   make demo   builds .venv, compiles the kernels, runs the demo (python -m zephon)
#   make test   the same set-up, then the test suite
#   make docs   the docs site into docs/_build/html (warnings are errors)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test bench install docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# zephon/_ext/ is where the kernels were built before they moved to _ext/: a stale build left
# there by an old checkout would shadow the new kernels, so install removes it. The editable
# install is redone (kernels recompiled) only when the build inputs change.
INSTALLED := $(VENV)/.installed
$(INSTALLED): $(BIN)/python pyproject.toml setup.py $(wildcard _ext/*.pyx _ext/*.pxd _ext/*.h)
	rm -rf zephon/_ext
	$(BIN)/python -m pip install --quiet -e '.[test,docs]'
	touch $@

install: $(INSTALLED)

$(BIN)/sphinx-build:
	$(MAKE) install

demo: install
	$(BIN)/python -m zephon

test: install
	$(BIN)/python -m pytest

docs: $(BIN)/sphinx-build
	$(BIN)/python -m sphinx -W --keep-going -q -b html docs docs/_build/html

bench: install
	$(BIN)/python bench/core.py

clean:
	rm -rf $(VENV) build *.egg-info _ext/*.c _ext/*.so docs/_build zephon/_ext
