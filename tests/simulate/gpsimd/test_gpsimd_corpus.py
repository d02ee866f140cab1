"""Vendor-written GpSimd custom operators (../shared/corpus/gpsimd, see its README) build
unchanged against the host shim and match numpy through the user entry point
:func:`asickernels.simulate.gpsimd.load`; the seed article's GIOU operator is reported with
each of its defects and passes once they are fixed in a copy.

The API-reference fragments (``*.inc``) are functions only: the test supplies the guide's
include preamble and a shape function, and includes the fragment itself, byte for byte.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import SHARED

from asickernels.simulate import gpsimd as shim

CORPUS = SHARED / "corpus" / "gpsimd"

pytestmark = [
    pytest.mark.skipif(shim.compiler() is None, reason="no C++ compiler for the shim"),
    pytest.mark.skipif(
        not CORPUS.is_dir(), reason=f"vendor corpus not found at {CORPUS} (needs ../shared)"
    ),
]

# The includes of the programming guide's kernel example.
PREAMBLE = "#include <stdint.h>\n#include <stdlib.h>\n#include <torch/torch.h>\n"
REGISTER = '#include "torchneuron/register.h"\n'


def fragment_library(tmp_path: Path, fragment: str, shape: str, op: str, kernel: str):
    """Loads a guide fragment with the preamble and a shape function written here."""
    compute = tmp_path / "compute.cpp"
    compute.write_text(f'{PREAMBLE}#include "{CORPUS / fragment}"\n')
    shape_source = tmp_path / "shape.cpp"
    shape_source.write_text(
        f'{PREAMBLE}{REGISTER}{shape}\nNEURON_LIBRARY(my_ops, m) {{\n  m.def("{op}", '
        f'&{op}_shape, "{kernel}");\n}}\n'
    )
    return shim.load("my_ops", [compute], [shape_source])


NEGATE_SHAPE = """
torch::Tensor tensor_negate_shape(torch::Tensor t_in) {
  return torch::zeros(t_in.sizes(), torch::kFloat);
}
"""
ADD_SHAPE = """
torch::Tensor tensor_add_shape(torch::Tensor t1, torch::Tensor t2) {
  return torch::zeros(t1.sizes(), torch::kFloat);
}
"""


def values(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_guide_negate_with_standard_accessors():
    """The programming guide's kernel.cpp and shape.cpp, single-core (the default)."""
    folder = CORPUS / "docs_negate_accessor"
    library = shim.load("my_ops", [folder / "kernel.cpp"], [folder / "shape.cpp"])
    x = values(37)
    np.testing.assert_array_equal(library.tensor_negate(x), -x)


@pytest.mark.parametrize(
    ("fragment", "shape"), [("docs_add_accessor", (300,)), ("docs_add_stream", (3, 700))]
)
def test_reference_add_with_standard_and_streaming_accessors(tmp_path, fragment, shape):
    library = fragment_library(
        tmp_path, f"{fragment}/tensor_add_compute.inc", ADD_SHAPE, "tensor_add",
        "tensor_add_compute",
    )  # fmt: skip
    a, b = values(*shape, seed=1), values(*shape, seed=2)
    np.testing.assert_array_equal(library.tensor_add(a, b), a + b)


def test_reference_add_rejects_mismatched_sizes_through_its_assert(tmp_path):
    library = fragment_library(
        tmp_path, "docs_add_accessor/tensor_add_compute.inc", ADD_SHAPE, "tensor_add",
        "tensor_add_compute",
    )  # fmt: skip
    with pytest.raises(shim.ShimError, match=r"assertion failed: t1.sizes\(\) == t2.sizes\(\)"):
        library.tensor_add(values(5), values(6))


def test_reference_negate_through_tcm(tmp_path):
    """2500 elements: three rounds through the guide's 1024-float TCM buffer."""
    library = fragment_library(
        tmp_path, "docs_negate_tcm/tensor_negate_compute.inc", NEGATE_SHAPE, "tensor_negate",
        "tensor_negate_compute",
    )  # fmt: skip
    x = values(50, 50)
    np.testing.assert_array_equal(library.tensor_negate(x), -x)
    assert library.stats()["tcm_peak_bytes"] == 4096


def test_reference_negate_with_printf(tmp_path, monkeypatch, capsys):
    folder = CORPUS / "docs_negate_printf"
    shape = tmp_path / "shape.cpp"
    shape.write_text(
        f"{PREAMBLE}{REGISTER}{NEGATE_SHAPE}\nNEURON_LIBRARY(my_ops, m) {{\n  m.def("
        '"tensor_negate", &tensor_negate_shape, "tensor_negate_compute");\n}\n'
    )
    library = shim.load("my_ops", [folder / "kernel.cpp"], [shape])
    x = np.arange(1, 9, dtype=np.float32)
    np.testing.assert_array_equal(library.tensor_negate(x), -x)
    lines = library.last_stdout.splitlines()
    assert lines[0] == "Assigning element 0 to a value of -1.000000" and len(lines) == 8
    assert capsys.readouterr().out == ""  # the runtime prints only when asked to
    monkeypatch.setenv("NEURON_RT_LOG_LEVEL", "INFO")
    monkeypatch.setenv("NEURON_RT_GPSIMD_STDOUT_QUEUE_SIZE_BYTES", "131072")
    library.tensor_negate(x)
    assert "Assigning element 7 to a value of -8.000000" in capsys.readouterr().out


def test_torch_tensors_in_and_out(tmp_path):
    torch = pytest.importorskip("torch")
    folder = CORPUS / "docs_negate_accessor"
    library = shim.load("my_ops", [folder / "kernel.cpp"], [folder / "shape.cpp"])
    x = torch.arange(5, dtype=torch.float32)
    assert torch.equal(library.tensor_negate(x), -x)


# ---- the seed article's GIOU operator (multicore, TCM) --------------------------------------

BOXES = 64  # per sample; the seed's 3 TCM buffers of BOXES * 4 floats then take 3 KB


def seed_boxes(samples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 10, (samples, BOXES, 2))
    return np.concatenate([xy, xy + rng.uniform(0.1, 5, (samples, BOXES, 2))], -1).astype(
        np.float32
    )


def seed_giou_reference(pred: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The seed kernel's own formula (epsilon 1e-5 inside max), in float64."""
    p, t = pred.astype(np.float64), target.astype(np.float64)
    area1 = (p[..., 2] - p[..., 0]) * (p[..., 3] - p[..., 1])
    area2 = (t[..., 2] - t[..., 0]) * (t[..., 3] - t[..., 1])
    inter_w = np.maximum(np.minimum(p[..., 2], t[..., 2]) - np.maximum(p[..., 0], t[..., 0]), 0)
    inter_h = np.maximum(np.minimum(p[..., 3], t[..., 3]) - np.maximum(p[..., 1], t[..., 1]), 0)
    inter = inter_w * inter_h
    union = area1 + area2 - inter
    enclose_w = np.maximum(p[..., 2], t[..., 2]) - np.minimum(p[..., 0], t[..., 0])
    enclose_h = np.maximum(p[..., 3], t[..., 3]) - np.minimum(p[..., 1], t[..., 1])
    enclose = np.maximum(enclose_w * enclose_h, 1e-5)
    return inter / np.maximum(union, 1e-5) - (enclose - union) / enclose


# Each defect of seeds/README.md and its fix, applied to a copy of giou.cpp.
FIX_OFFSET = [
    ("partition*cpu_id + i*tcm_in_size", "(partition*cpu_id + i)*tcm_in_size"),
    ("partition*cpu_id + i*tcm_out_size", "(partition*cpu_id + i)*tcm_out_size"),
]
FIX_LEAK = [("torch::neuron::tcm_free(tcm_target);", "torch::neuron::tcm_free(tcm_target);\n"
             "torch::neuron::tcm_free(tcm_output);")]  # fmt: skip
FIX_BATCH = [
    ("uint32_t partition = num_samples / cpu_count;",
     "uint32_t partition = (num_samples + cpu_count - 1) / cpu_count;"),
    ("for (size_t i = 0; i < partition; i++) {",
     "for (size_t i = 0; i < partition && partition*cpu_id + i < num_samples; i++) {"),
]  # fmt: skip


def seed_library(tmp_path: Path, fixes: list[tuple[str, str]]):
    source = (CORPUS / "seed_giou" / "giou.cpp").read_text()
    for old, new in fixes:
        assert source.count(old) >= 1, old
        source = source.replace(old, new)
    tmp_path.mkdir(parents=True, exist_ok=True)
    compute = tmp_path / "giou.cpp"
    compute.write_text(source)
    return shim.load("giou", [compute], [CORPUS / "seed_giou" / "shape.cpp"], multicore=True)


def run_seed(library, samples: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    pred, target = seed_boxes(samples, 1), seed_boxes(samples, 2)
    return library.giou(pred, target), pred, target


def findings_of(library, samples: int) -> str:
    with pytest.raises(shim.ShimError) as error:
        run_seed(library, samples)
    return str(error.value)


def test_seed_giou_is_reported_with_each_of_its_defects(tmp_path):
    original = seed_library(tmp_path, [])
    report = findings_of(original, 12)  # 12 samples: not divisible by the 8 cores
    assert re.search(r"cores \d and \d both wrote output elements", report)  # the offset
    assert len(re.findall(r"core \d: returned with 1 TCM buffer\(s\) \(1024 bytes\) never passed "
                          r"to tcm_free", report)) == 8  # fmt: skip
    assert re.search(r"output elements were written by no core", report)
    # With the offset and the leak fixed, what is left is the batch assumption: samples
    # 8..11 (elements [512, 768)) belong to no core.
    divisible_only = seed_library(tmp_path / "partly_fixed", FIX_OFFSET + FIX_LEAK)
    report = findings_of(divisible_only, 12)
    assert report.endswith(
        "256 of 768 output elements were written by no core: [512, 768); the device would "
        "leave garbage there"
    ), report
    assert report.count("\n") == 0
    run_seed(divisible_only, 16)  # divisible batches were fine


@pytest.mark.parametrize("samples", [1, 12, 16])
def test_seed_giou_with_its_defects_fixed_matches_numpy(tmp_path, samples):
    library = seed_library(tmp_path, FIX_OFFSET + FIX_LEAK + FIX_BATCH)
    got, pred, target = run_seed(library, samples)
    np.testing.assert_allclose(got, seed_giou_reference(pred, target), atol=2e-5, rtol=0)
    per_core = -(-samples // shim.CORE_COUNT)  # the fixed kernel rounds the share up
    assert library.stats()["active_cores"] == -(-samples // per_core)
