# Two commands do all set-up on a fresh clone: `make run` (the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The second environment: torch_xla 2.9.0 pins torch 2.9.0 and jax 0.7.1 (~7.6 GB).
TX_VENV := .venv-torch-xla
TX_PY := $(TX_VENV)/bin/python
TX_STAMP := $(TX_VENV)/.installed
# The newest JAX: Python 3.13 with what `pip install -e '.[tpu,test]'` gets there today (the
# newest jax, jaxlib and the libtpu jax[tpu] pins). PYTHON313: pyenv's 3.13 where there is one.
PYTHON313 ?= $(or $(firstword $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3)),python3.13)
NEW_VENV := .venv-newest
NEW_PY := $(NEW_VENV)/bin/python
NEW_STAMP := $(NEW_VENV)/.installed
# The newest jax release, without libtpu: jax[tpu] holds jax back to the newest release whose
# libtpu is published, so .venv-newest may not have it (0.12.0.1 there, 0.12.1 here today).
LATEST_VENV := .venv-jax-latest
LATEST_PY := $(LATEST_VENV)/bin/python
LATEST_STAMP := $(LATEST_VENV)/.installed
# The third environment: TorchTPU (torch-tpu 0.2.0, torch 2.13.0, jax 0.10.2, libtpu 0.0.52).
TT_VENV := .venv-torch-tpu
TT_PY := $(TT_VENV)/bin/python
TT_STAMP := $(TT_VENV)/.installed
# The nki-library environment: aws-neuron/nki-library's own test suite in its simulation mode (torch 2.13 CPU,
# pytest plugins and the AWS clients its test framework imports; ~1.6 GB).
NL_VENV := .venv-nkilib
NL_PY := $(NL_VENV)/bin/python
NL_STAMP := $(NL_VENV)/.installed
export TPU_SKIP_MDS_QUERY := 1
export ALLOW_MULTIPLE_LIBTPU_LOAD := 1

# The cpu backend's C++ (each op's file and what they share), built in place by the editable
# install (setup.py).
NATIVE := setup.py $(wildcard asickernels/backends/cpu/*.cpp asickernels/backends/cpu/csrc/*)

# $(call install,venv,python,pip arguments): creates the venv with that Python if it is not
# there, installs into it, and stamps it. (Arguments with commas go through a variable.)
MAIN_EXTRAS := -e '.[tpu,test,bench]'
NEW_EXTRAS := -e '.[tpu,test]'
LATEST_EXTRAS := -e '.[test]'
define install
	test -x $(1)/bin/python || $(2) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip
	$(1)/bin/python -m pip install --quiet $(3)
	touch $(1)/.installed
endef

.PHONY: run test lint test-main test-torch-xla test-newest-jax test-jax-latest test-torch-tpu \
	test-nkilib test-nkilib-sample package dist environments

# Every environment, one after another: each editable install builds the cpu library in place,
# so two at once would write the same file (CI installs them first, then tests in parallel).
environments:
	$(MAKE) $(STAMP)
	$(MAKE) $(TX_STAMP)
	$(MAKE) $(NEW_STAMP)
	$(MAKE) $(LATEST_STAMP)
	$(MAKE) $(TT_STAMP)
	$(MAKE) $(NL_STAMP)

$(STAMP): pyproject.toml $(NATIVE)
	$(call install,$(VENV),$(PYTHON),$(MAIN_EXTRAS))

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
	$(call install,$(TX_VENV),$(PYTHON),-r requirements-torch-xla.txt)

# The PyTorch frontend, the SPMD wrappers and the conformance suite on torch_xla + jax 0.7.1:
# the torch tests in both tiers (nowhere else has torch_xla); the JAX-only ones in the fast
# tier (their slow tier runs on jax 0.10.2 in test-main).
test-torch-xla: $(TX_STAMP)
	PJRT_DEVICE=CPU $(TX_PY) -m pytest tests/kernels/test_conformance.py tests/frontends/test_spmd_jax.py
	PJRT_DEVICE=CPU $(TX_PY) -m pytest -m "slow or not slow" \
		tests/frontends/test_torch_frontend.py tests/frontends/test_spmd_torch_xla.py \
		tests/frontends/test_torchvision_compat.py \
		tests/frontends/test_detection.py tests/frontends/test_detection_graph_mode.py \
		tests/frontends/test_detection_training.py tests/frontends/test_hungarian_matcher.py \
		tests/docs/test_readme.py tests/docs/test_doc_commands.py

$(NEW_STAMP): pyproject.toml $(NATIVE)
	$(call install,$(NEW_VENV),$(PYTHON313),$(NEW_EXTRAS))

# The JAX tiers on the newest JAX (fast tier; the slow one runs on jax 0.10.2 in test-main):
# conformance and kernel tests, Pallas interpret and TPU interpret, the TPU compile gate.
test-newest-jax: $(NEW_STAMP)
	$(NEW_PY) -m pytest tests/kernels tests/backends/pallas_tpu tests/simulate/tpu_estimate
	$(NEW_PY) -m asickernels check --quick

$(LATEST_STAMP): pyproject.toml $(NATIVE)
	$(call install,$(LATEST_VENV),$(PYTHON313),$(LATEST_EXTRAS))

# The newest jax without libtpu (fast tier, ~4 min): the Pallas kernels' own tests (interpret
# and TPU interpret mode), no deprecated jax API in our calls, and `asickernels check --quick`
# (every op on every backend; the whole conformance suite runs on the other jax tiers).
test-jax-latest: $(LATEST_STAMP)
	$(LATEST_PY) -m pytest tests/backends/pallas_tpu tests/kernels/test_jax_deprecations.py
	$(LATEST_PY) -m asickernels check --quick --quiet

$(TT_STAMP): requirements-torch-tpu.txt pyproject.toml $(NATIVE)
	$(call install,$(TT_VENV),$(PYTHON),-r requirements-torch-tpu.txt)

# TorchTPU without a TPU: every op's jax_op operator (schema, make_fx on fake tensors, traced
# gradients, compiles for v5e/v6e/v5p and a 4-chip slice, interpret-mode numbers), and the
# PyTorch guide's examples on torch 2.13 (those needing torch_xla or torchvision skip).
test-torch-tpu: $(TT_STAMP)
	$(TT_PY) -m pytest tests/frontends/test_torch_tpu.py
	$(TT_PY) -m pytest -m "slow or not slow" tests/docs/test_readme.py -k torch.md

$(NL_STAMP): requirements-nkilib.txt pyproject.toml $(NATIVE)
	$(call install,$(NL_VENV),$(PYTHON),-r requirements-nkilib.txt)

# AWS's NKI kernel library's own test suite (nki-library@d2ad3a5, read unchanged from
# ../shared/vendor) in its simulation mode on our NKI simulator, two workers: every
# NKILIB_EVERY-th case of each test function in its default selection (test/integration on
# trn2, the large shapes its conftest skips left out); NKILIB_EVERY=1 runs all ~3,500 (about
# 3 CPU-seconds each). ARGS: more pytest arguments, e.g. ARGS='-k cumsum'.
NKILIB_EVERY ?= 16
test-nkilib: $(NL_STAMP)
	$(NL_PY) tests/simulate/nki/nkilib_suite.py -n 2 --nkilib-every $(NKILIB_EVERY) $(ARGS)

# CI's share of it (~4 min on 2 cores): every 64th case, less the six test files whose
# cases take most of the suite's time and memory (their goldens build 1-16 GB float64 arrays).
NKILIB_TESTS = $(realpath $(firstword $(wildcard tests/data/vendor/nki-library@d2ad3a5 \
	../shared/vendor/nki-library@d2ad3a5)))/test/integration/nkilib
NKILIB_HEAVY := experimental/loss/test_cross_entropy_forward.py \
	experimental/transformer/test_attention_block_tkg.py core/moe/moe_cte/test_moe_cte.py \
	core/moe/moe_tkg/test_moe_tkg.py core/output_projection/test_output_proj_cte.py \
	core/qkv/test_qkv_cte.py
test-nkilib-sample: $(NL_STAMP)
	$(NL_PY) tests/simulate/nki/nkilib_suite.py -n 2 --nkilib-every 64 \
		$(foreach file,$(NKILIB_HEAVY),--ignore=$(NKILIB_TESTS)/$(file))

test: lint test-main test-torch-xla test-newest-jax test-jax-latest test-torch-tpu \
	test-nkilib-sample

# The release: dist/ gets the sdist and the manylinux abi3 wheel (.ci/dist; no compiler needed).
dist:
	PYTHON=$(PYTHON) .ci/dist dist

# The package as pip users get it (.ci/package): sdist, manylinux wheel, and the wheel in
# fresh environments with no compiler, an unwritable home and the oldest allowed versions.
package:
	PYTHON=$(PYTHON) .ci/package
