"""The NKI 0.6 API reference's own examples, run unchanged: every ``.. code-block:: python``
of the docstrings of aws-neuron/aws-neuron-sdk's API stubs (nki/api/nki/{isa,language}/
__init__.py at 81ce03a, Neuron 2.32, the source of the reference pages; pinned by
tests/fetch_vendor.py), executed inside a kernel with ``import nki...`` hooked to the
simulator. Examples that name inputs they do not define get them here (``INPUTS``); blocks
that are NumPy-style pseudo code of an instruction's semantics, not kernel code, are listed
with that reason (``NOT_KERNEL_CODE``)."""

from __future__ import annotations

import ast
import re
import textwrap
import warnings

import numpy as np
import pytest
from conftest import VENDOR, VENDOR_MISSING, vendor_present

from asickernels.simulate import nki
from asickernels.simulate.nki import install
from asickernels.simulate.nki import isa as nisa
from asickernels.simulate.nki import language as nl
from asickernels.simulate.nki.tensor import NkiTensor

FOLDER = "aws-neuron-sdk@81ce03a"
STUBS = ("nki/api/nki/isa/__init__.py", "nki/api/nki/language/__init__.py")
_BLOCK = re.compile(r"code-block:: python\n\n((?:    .*\n|\n)+)")


def examples() -> dict[str, str]:
    """``{"isa.topk#0": code, ...}``: each docstring code block of the stubs."""
    found = {}
    for stub in STUBS:
        tree = ast.parse((VENDOR / FOLDER / stub).read_text())
        module = stub.split("/")[-2]
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node) or ""
                for i, block in enumerate(_BLOCK.findall(doc + "\n")):
                    found[f"{module}.{node.name}#{i}"] = textwrap.dedent(block)
    return found


EXAMPLES = examples() if vendor_present(FOLDER, "nki/api/") else {}
F32 = np.float32
# The inputs an example uses without defining them: numpy arrays, passed as kernel arguments.
INPUTS = {
    "isa.VirtualRegister#0": {"input_tensor": (128, 512), "out_tensor": (128, 512)},
    "language.affine_range#0": {"input_tensor": (128, 512), "out_tensor": (128, 512)},
    "language.sequential_range#0": {"input_tensor": (128, 512), "out_tensor": (128, 512)},
    "language.static_range#0": {"input_tensor": (128, 512), "out_tensor": (128, 512)},
    "language.dynamic_range#0": {"input_tensor": (128, 512), "out_tensor": (128, 512)},
    "language.copy#0": {"x_tensor": (128, 128), "y_tensor": (128, 512)},
    "language.gather_flattened#0": {
        "data_tensor": (128, 512),
        "indices_tensor": np.arange(128 * 512, dtype=np.uint32).reshape(128, 512) % 512,
        "actual_tensor": (128, 512),
    },
    "language.fori_loop#1": {
        "data": (1, 8),
        "output": (1, 8),
        "ub_input": np.array([[5]], np.int32),
        "N": 8,
    },
    "language.while_loop#1": {"data": (1, 1), "count_input": np.array([[3]], np.int32)},
    "language.shared_identity_matrix#0": {
        "expected_tensor": np.eye(128, dtype=F32),
        "actual_tensor": (128, 128),
    },
    "language.__getitem__#0": {"i": 8},
    "language.ap#0": {"idx": np.zeros((1, 1), np.int32)},
}
NOT_KERNEL_CODE = {
    name: "the reference's NumPy-style pseudo code of the semantics, not kernel code"
    for name in (
        "isa.activation#0",
        "isa.activation_reduce#0",
        "isa.activate2#1",
        "isa.iota#0",
        "isa.affine_select#0",
        "isa.tensor_scalar_cumulative#0",
        "isa.tensor_tensor_scan#0",
        "isa.exponential#0",
        "isa.range_select#0",
        "isa.select_reduce#0",
        "isa.nonzero_with_count#0",
        "language.fori_loop#0",
        "language.while_loop#0",
    )
} | {
    "isa.VirtualRegister#1": "a sketch: it copies from `src=...` (an Ellipsis)",
    "isa.core_barrier#0": "an LNC=2 fragment without its inputs (test_nki_api's LNC tests)",
    "isa.sendrecv#0": "an LNC=2 fragment without its inputs (test_nki_api's LNC tests)",
}


def run_example(name: str, code: str) -> None:
    arrays = {}
    constants = {}
    for key, value in INPUTS.get(name, {}).items():
        if isinstance(value, int):
            constants[key] = value
        else:
            arrays[key] = (
                np.random.default_rng(0).normal(size=value).astype(F32)
                if isinstance(value, tuple)
                else value
            )

    def kernel(**tensors):
        namespace = {"nl": nl, "nisa": nisa, "nki": nki, "np": np, **constants, **tensors}
        if "idx" in tensors:  # a run-time index in SBUF
            namespace["idx"] = nl.load(tensors["idx"])
        exec(compile(code, name, "exec"), namespace)

    nki.simulate(kernel)(**arrays)


@pytest.fixture(scope="module", autouse=True)
def hooked_imports():
    """``import nki.language`` in the examples resolves to the simulator."""
    hooked = install.install()
    yield
    if hooked:
        install.uninstall()


@pytest.mark.skipif(not EXAMPLES, reason=VENDOR_MISSING)
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_reference_example_runs_unchanged(name, monkeypatch):
    """The examples state their results as ``assert nl.equal(actual, expected)``; a tensor's
    truth value is a presence test (True) in a kernel, so here it is every element nonzero,
    for the asserts to check the values."""
    if name in NOT_KERNEL_CODE:
        pytest.skip(NOT_KERNEL_CODE[name])
    monkeypatch.setattr(NkiTensor, "__bool__", lambda tensor: bool(np.all(tensor.values != 0)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NKI 0.6 examples use what 0.7/0.8 deprecated
        run_example(name, EXAMPLES[name])


@pytest.mark.skipif(not EXAMPLES, reason=VENDOR_MISSING)
def test_every_listed_example_exists():
    assert set(INPUTS) | set(NOT_KERNEL_CODE) <= set(EXAMPLES)
