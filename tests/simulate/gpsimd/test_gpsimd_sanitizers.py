"""The GpSimd kernels and shim built with AddressSanitizer + UBSan run the conformance
cases and the shim's kernel tests with no finding.

Python cannot load an ASan library unless the ASan runtime is preloaded, so the tests run
in a child pytest with ``LD_PRELOAD`` set and ``ASICKERNELS_GPSIMD_SANITIZE=1`` selecting
the sanitized build (cached apart from the plain one). Every finding aborts the child.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO

from asickernels.backends.gpsimd import _library
from asickernels.simulate import gpsimd as shim


@pytest.mark.slow
@pytest.mark.skipif(shim.compiler() is None, reason="no C++ compiler for the shim")
def test_conformance_under_address_and_undefined_behaviour_sanitizers():
    env = {
        **os.environ,
        _library.SANITIZE_ENV: "1",
        "LD_PRELOAD": shim.sanitizer_preload(),
        # Python and jaxlib keep memory until exit by design: leaks are not findings here.
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
        "UBSAN_OPTIONS": "print_stacktrace=1",
    }
    # gpsimd runs on host arrays: its suite has no jit/vmap tests to run (they skip).
    selection = "(gpsimd and (test_giou or test_nms) and not jit) or test_kernel_"
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        "-m", "slow or not slow", "-k", selection,
        "tests/kernels/test_conformance.py", "tests/simulate/gpsimd/test_gpsimd_shim.py",
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "AddressSanitizer" not in output and "runtime error:" not in output, output[-6000:]
    summary = re.search(r"(\d+) passed", output)
    # At least the fast conformance cases of both ops (40 today) must have run.
    assert summary and int(summary.group(1)) >= 40, output[-3000:]
    assert not re.search(r"\d+ (failed|skipped|error)", output), output[-3000:]
