# Every target creates .venv and installs the pinned dependencies first, so each works on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export XLA_PYTHON_CLIENT_PREALLOCATE := false

.PHONY: install run test test-slow lint bench clean

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.lock
	$(BIN)/pip install -q --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/popjax train --config experiments/default.yaml --out runs/default

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

lint: $(STAMP)
	$(BIN)/ruff check popjax tests benchmarks experiments

bench: $(STAMP)
	@echo "make bench: the benchmark suite is not built yet (issue: speed-up benchmark suite)."; exit 1

clean:
	rm -rf $(VENV) runs
