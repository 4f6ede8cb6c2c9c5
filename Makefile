# One command to run the service, one to run every test. Both install what they need first.
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin

.PHONY: install run test lint bench screenshot clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

install: $(BIN)/.installed

run: install
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
