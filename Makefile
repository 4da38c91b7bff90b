# `make demo` and `make test` set up (or refresh) the local virtualenv from pyproject.toml,
# then do their job. Nothing needs to be installed by hand first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
NP     ?= 4
# pytest workers (pytest-xdist): one leaves cores idle while its tests wait on mpiexec
# jobs and sleeps, two keep both of CI's cores busy (three were slower); JOBS=N make test
JOBS   ?= 2

.PHONY: demo test test-quick bench lint clean venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

venv: $(VENV)/.core

demo: $(VENV)/.core
	$(BIN)/python launch/mggrun -np $(NP) $(BIN)/mgg demo

test: $(VENV)/.core
	$(BIN)/python -m pytest -q -n $(JOBS)

# the edit-run loop: every test that starts no mpiexec and compiles no CUDA (markers mpi and
# compile; tests/conftest.py fails a test that starts either unmarked)
test-quick: $(VENV)/.core
	$(BIN)/python -m pytest -q -n $(JOBS) -m "not mpi and not compile"

bench: $(VENV)/.core
	$(BIN)/python bench/run_all.py

lint: $(VENV)/.core
	$(BIN)/ruff check mgg tests bench examples launch/mggrun
	$(BIN)/ruff format --check mgg tests bench examples

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
