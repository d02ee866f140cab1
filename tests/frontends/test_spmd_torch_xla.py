"""The torch_xla SPMD wrappers (``asickernels.frontends.torch_xla_spmd``): their
signatures here, and their results on 4 CPU devices in a process of their own
(tests/frontends/spmd_torch_xla_check.py): SPMD mode and the device count are fixed when the XLA
runtime starts."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest
from frontend_cases import SHARDED_OPS, parameters, sharded_signature

pytest.importorskip("torch_xla")

import asickernels.torch as at
from asickernels.frontends import torch_xla_spmd


def test_the_wrappers_are_the_ops():
    assert sorted(torch_xla_spmd.__all__) == sorted(op.name for op in SHARDED_OPS)


@pytest.mark.parametrize("op", SHARDED_OPS, ids=lambda op: op.name)
def test_each_wrapper_has_its_torch_functions_signature(op):
    wrapper = getattr(torch_xla_spmd, op.name)
    want = sharded_signature(op, inspect.signature(getattr(at, op.name)))
    assert parameters(inspect.signature(wrapper)) == want
    assert wrapper.__module__ == torch_xla_spmd.__name__ and wrapper.__doc__


def test_torch_xla_spmd_wrappers_equal_unsharded_ops():
    script = Path(__file__).with_name("spmd_torch_xla_check.py")
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), (
        result.stdout[-2000:] + result.stderr[-4000:]
    )
