"""The torch_xla SPMD wrappers (``asickernels.backends.xla_spmd.torch_xla_spmd``) on 4 CPU
devices, in a process of their own (tests/spmd_torch_xla_check.py): SPMD mode and the
device count are fixed when the XLA runtime starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch_xla")


def test_torch_xla_spmd_wrappers_equal_unsharded_ops():
    script = Path(__file__).with_name("spmd_torch_xla_check.py")
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), (
        result.stdout[-2000:] + result.stderr[-4000:]
    )
