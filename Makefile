PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench train clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/jaxmesh eval configs/cartpole.yaml

test: $(STAMP)
	$(BIN)/ruff check jaxmesh tests benchmarks
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

train: $(STAMP)
	$(BIN)/python -m jaxmesh.train_cartpole

clean:
	rm -rf $(VENV)
