# Two commands do all the set-up on a fresh machine (Python >= 3.10 and a C compiler):
#   make demo   builds .venv, compiles the kernels, runs the demo (python -m zephon)
#   make test   the same set-up, then the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test bench install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'

demo: install
	$(BIN)/python -m zephon

test: install
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python bench/core.py

clean:
	rm -rf $(VENV) build *.egg-info _ext/*.c _ext/*.so
