# Two commands do all set-up on a fresh clone: `make run` (the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The second environment: torch_xla 2.9.0 pins torch 2.9.0 and jax 0.7.1 (~7.6 GB).
TX_VENV := .venv-torch-xla
TX_PY := $(TX_VENV)/bin/python
TX_STAMP := $(TX_VENV)/.installed
export TPU_SKIP_MDS_QUERY := 1
export ALLOW_MULTIPLE_LIBTPU_LOAD := 1

# The cpu backend's C++, built in place by the editable install (setup.py).
NATIVE := setup.py $(wildcard asickernels/backends/cpu/csrc/*)

.PHONY: run test lint test-main test-torch-xla package

$(STAMP): pyproject.toml $(NATIVE)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[tpu,test,bench]'
	touch $(STAMP)

# Every op on every backend this machine has, checked against the reference and timed.
run: $(STAMP)
	$(PY) -m asickernels run

lint: $(STAMP)
	$(PY) -m ruff check asickernels tests benchmarks setup.py
	$(PY) -m ruff format --check asickernels tests benchmarks setup.py
	$(PY) -m mypy asickernels

# The torch_xla environment first: a few main-tier tests run vendor code that imports
# torch_xla in a subprocess of it (the NKI softmax sample).
test-main: $(STAMP) $(TX_STAMP)
	$(PY) -m pytest -m "slow or not slow"

$(TX_STAMP): requirements-torch-xla.txt pyproject.toml $(NATIVE)
	test -x $(TX_PY) || $(PYTHON) -m venv $(TX_VENV)
	$(TX_PY) -m pip install --quiet --upgrade pip
	$(TX_PY) -m pip install --quiet -r requirements-torch-xla.txt
	touch $(TX_STAMP)

# The PyTorch frontend, the SPMD wrappers and the conformance suite on torch_xla + jax 0.7.1.
test-torch-xla: $(TX_STAMP)
	PJRT_DEVICE=CPU $(TX_PY) -m pytest -m "slow or not slow" tests/kernels/test_conformance.py \
		tests/frontends/test_torch_frontend.py tests/frontends/test_spmd_torch_xla.py \
		tests/frontends/test_spmd_jax.py tests/frontends/test_torchvision_compat.py \
		tests/frontends/test_detection.py tests/frontends/test_detection_training.py \
		tests/docs/test_readme.py tests/docs/test_doc_commands.py

test: lint test-main test-torch-xla

# The package as pip users get it (.ci/package): sdist, manylinux wheel, and the wheel in
# fresh environments with no compiler, an unwritable home and the oldest allowed versions.
package:
	PYTHON=$(PYTHON) .ci/package
