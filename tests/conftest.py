"""Shared fixtures. JAX gets 8 host devices (for the SPMD tests) before it initialises."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
# libtpu otherwise locks /tmp/libtpu_lockfile, failing any second process (a subprocess
# compile, a parallel test run) that loads it while this one holds it.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import fetch_vendor
import numpy as np
import pytest
from hypothesis import strategies as st

from asickernels.kernels import registry
from asickernels.kernels.declaration import Op

# Test data (and the vendor code tests/fetch_vendor.py fetches) is read by tests, never collected.
collect_ignore = ["data"]

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
DATA = TESTS / "data"
# The vendor corpus beside the checkout (CI has it; tests that need it skip without it).
SHARED = REPO.parent / "shared"
# The vendor files tests/fetch_vendor.py lists, laid out as <repo>@<commit>/<path>: where it
# fetched them (tests/data/vendor), else the same files beside the checkout (CI's copy).
VENDOR = fetch_vendor.VENDOR if fetch_vendor.VENDOR.is_dir() else SHARED / "vendor"
VENDOR_MISSING = (
    f"vendor files absent from {fetch_vendor.VENDOR} and {SHARED / 'vendor'}: "
    "run `python tests/fetch_vendor.py` (needs github.com)"
)


def vendor_present(folder: str, under: str = "") -> bool:
    """Whether every file tests/fetch_vendor.py lists for ``folder`` (``<repo>@<commit>``),
    under the path prefix ``under`` if given, is in ``VENDOR`` (a test asks only for the files
    it reads: a folder's other files may be missing from an older copy of ../shared)."""
    listed = [path for f, path, _ in fetch_vendor.FILES if f == folder and path.startswith(under)]
    assert listed, f"tests/fetch_vendor.py lists nothing for {folder}/{under}"
    return all((VENDOR / folder / path).is_file() for path in listed)


def load_module(path: Path, name: str) -> ModuleType:
    """Runs the Python file at ``path`` (a vendor kernel or script, not in a package) as the
    module ``sys.modules[name]`` and returns it; the caller removes ``name`` when it is done."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs: dataclasses and pickling look it up
    spec.loader.exec_module(module)
    return module


def backends_under_test(op: Op) -> list[str]:
    """Every backend implementing ``op``'s kernel except the reference it is checked
    against."""
    assert op.kernel is not None, f"{op.name} has no kernel"
    return [name for name in registry.backends_for(op.kernel) if name != "reference"]


def require(backend: str) -> None:
    """Skips (saying why) when ``backend`` cannot run on this machine."""
    status = registry.availability(backend)
    if status.mode == "missing":
        pytest.skip(f"{backend} cannot run here: {status.detail}")


def feature_map_draws(largest: int) -> dict[str, st.SearchStrategy[int]]:
    """Hypothesis keyword strategies of a random feature map (for ``@given(**...)``): its
    ``seed`` and a ``height`` and ``width`` from 1 to ``largest``."""
    side = st.integers(1, largest)
    return {"seed": st.integers(0, 2**31 - 1), "height": side, "width": side}


def run_pytest_sanitized(
    arguments: list[str], sanitize_env: str, preload: str, least_passed: int
) -> None:
    """Runs ``pytest arguments`` in a child process against the ASan + UBSan build that
    ``sanitize_env=1`` selects, with the runtime ``preload``ed (Python can load an ASan
    library only so); fails on any finding (each aborts the child), any failed, skipped or
    erroring test, or fewer than ``least_passed`` passing."""
    env = {
        **os.environ,
        sanitize_env: "1",
        "LD_PRELOAD": preload,
        # Python and jaxlib keep memory until exit by design: leaks are not findings here.
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
        "UBSAN_OPTIONS": "print_stacktrace=1",
    }
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *arguments]
    result = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "AddressSanitizer" not in output and "runtime error:" not in output, output[-6000:]
    summary = re.search(r"(\d+) passed", output)
    assert summary and int(summary.group(1)) >= least_passed, output[-3000:]
    assert not re.search(r"\d+ (failed|skipped|error)", output), output[-3000:]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
