# One command to run the service, one to run every test. Both install what they need first:
# `run` only the service's own dependencies, the others the test tools too (`install`).
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin

.PHONY: install install-service run test lint bench screenshot clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(BIN)/.installed-service: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(BIN)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@

install-service: $(BIN)/.installed-service

install: $(BIN)/.installed

run: install-service
	$(BIN)/climate serve

lint: install
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

bench: install
	$(BIN)/python -m bench

# docs/img/dashboard.png, the dashboard as README shows it (needs /usr/bin/chromium).
screenshot: install
	$(BIN)/python -m bench.screenshot

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
