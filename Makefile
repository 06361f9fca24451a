# The two commands of the README's quick start. Each creates .venv if needed and
# installs zmesh into it first, so both work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test bench lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

demo: $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	$(BIN)/zmesh demo

test: $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[dev,spark]"
	$(BIN)/python -m pytest

bench: $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	$(BIN)/python -m benchmarks

lint: $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[dev]"
	$(BIN)/ruff check zmesh tests benchmarks examples
	$(BIN)/ruff format --check zmesh tests benchmarks examples
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
