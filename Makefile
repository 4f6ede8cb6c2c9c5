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

# Two workers for most of the suite (pyproject's addopts), then the OpenStack rig's tests in one
# process on their own: they stop and start the rig's services, which time out when the machine's
# two cores also run the other tests. Both parts always run; either failing fails the target.
test: lint
	$(BIN)/pytest -m "not rig"; first=$$?; \
	$(BIN)/pytest -m rig -n 0; second=$$?; \
	test $$first -eq 0 -a $$second -eq 0

bench: install
	$(BIN)/python -m bench

# docs/img/dashboard.png, the dashboard as README shows it (needs /usr/bin/chromium).
screenshot: install
	$(BIN)/python -m bench.screenshot

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
