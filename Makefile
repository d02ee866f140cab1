# Two commands do all set-up on a fresh clone: `make run` (the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export TPU_SKIP_MDS_QUERY := 1
export ALLOW_MULTIPLE_LIBTPU_LOAD := 1

.PHONY: run test lint test-main

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[tpu,test,bench]'
	touch $(STAMP)

# Every op on every backend this machine has, checked against the reference and timed.
run: $(STAMP)
	$(PY) -m asickernels run

lint: $(STAMP)
	$(PY) -m ruff check asickernels tests benchmarks
	$(PY) -m ruff format --check asickernels tests benchmarks
	$(PY) -m mypy asickernels

test-main: $(STAMP)
	$(PY) -m pytest -m "slow or not slow"

test: lint test-main
