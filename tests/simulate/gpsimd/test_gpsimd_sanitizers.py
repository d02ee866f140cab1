"""The GpSimd kernels and shim built with AddressSanitizer + UBSan run the conformance
cases and the shim's kernel tests with no finding.

Python cannot load an ASan library unless the ASan runtime is preloaded, so the tests run
in a child pytest with ``LD_PRELOAD`` set and ``ASICKERNELS_GPSIMD_SANITIZE=1`` selecting
the sanitized build (cached apart from the plain one). Every finding aborts the child.
"""

from __future__ import annotations

import pytest
from conftest import run_pytest_sanitized

from asickernels.backends.gpsimd import _library
from asickernels.simulate import gpsimd as shim


@pytest.mark.slow
@pytest.mark.skipif(shim.compiler() is None, reason="no C++ compiler for the shim")
def test_conformance_under_address_and_undefined_behaviour_sanitizers():
    # gpsimd runs on host arrays: its suite has no jit/vmap tests to run (they skip).
    selection = "(gpsimd and (test_giou or test_nms) and not jit) or test_kernel_"
    arguments = [
        "-m", "slow or not slow", "-k", selection,
        "tests/kernels/test_conformance.py", "tests/simulate/gpsimd/test_gpsimd_shim.py",
    ]  # fmt: skip
    # At least the fast conformance cases of both ops (40 today) must have run.
    run_pytest_sanitized(arguments, _library.SANITIZE_ENV, shim.sanitizer_preload(), 40)
