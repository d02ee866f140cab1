"""AWS-written kernels of the current ``nki`` API (../shared/corpus/nki, see its README), run
unchanged in the simulator and checked against numpy (the files' own references where they
have one). Each file is loaded by a module loader while a local fixture maps ``nki``,
``nki.language``, ``nki.isa`` and ``nki.typing`` to :mod:`asickernels.simulate.nki`."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from conftest import SHARED, load_module
from mamba import mamba_inputs, selective_scan

from asickernels.simulate import nki as simulator
from asickernels.simulate.nki import errors

CORPUS = SHARED / "corpus" / "nki"
SDK = CORPUS / "aws-neuron-sdk@81ce03a" / "nki"
SAMPLES = CORPUS / "nki-samples@6905a68" / "src" / "nki_samples" / "tutorials"

pytestmark = [
    pytest.mark.skipif(not CORPUS.is_dir(), reason=f"vendor kernel corpus not found at {CORPUS}"),
    # The SDK's NKI 0.6 examples loop with nl.affine_range, which NKI 0.7 deprecated: each
    # loop warns (errors.DeprecatedApiWarning), as test_nki_reference.py checks.
    pytest.mark.filterwarnings("ignore::asickernels.simulate.nki.errors.DeprecatedApiWarning"),
]

ALIASES = {
    "nki": simulator,
    "nki.language": simulator.language,
    "nki.isa": simulator.isa,
    "nki.typing": simulator.typing,
}


@pytest.fixture
def load(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``load(path)``: the corpus file as a module importing ``nki`` from the simulator. The
    aliases, sys.path entries, environment and loaded modules are restored afterwards."""
    for name, module in ALIASES.items():
        monkeypatch.setitem(sys.modules, name, module)
    saved_env = dict(os.environ)  # e.g. tensor_addition sets NEURON_PLATFORM_TARGET_OVERRIDE
    loaded: list[str] = []

    def load_file(path: Path) -> ModuleType:
        monkeypatch.syspath_prepend(str(path.parent))  # sibling imports (mx_kernel_utils)
        name = f"corpus_{path.stem.replace('-', '_')}"
        loaded.append(name)
        return load_module(path, name)

    yield load_file
    for name in loaded + ["mx_kernel_utils", "mx_kernels", "mx_cpu_utils"]:
        sys.modules.pop(name, None)
    os.environ.clear()
    os.environ.update(saved_env)


RNG = np.random.default_rng(0)


def test_getting_started_tensor_add(load):
    module = load(SDK / "examples" / "getting_started_baremetal.py")
    a, b = np.ones((4, 3), np.float16), np.full((4, 3), 2.5, np.float16)
    np.testing.assert_array_equal(module.nki_tensor_add_kernel(a, b), a + b)


def test_simulate_example_checks_itself(load):
    """The module runs ``nki.simulate`` and asserts against ``a + b`` when it is loaded."""
    module = load(SDK / "examples" / "simulate" / "nki_simulate_example.py")
    np.testing.assert_allclose(module.result, module.a + module.b, rtol=1e-5)


def test_tensor_addition(load):
    module = load(SDK / "examples" / "tensor_addition" / "tensor_addition_nki_kernels.py")
    a = RNG.standard_normal((256, 1024)).astype(np.float32)
    b = RNG.standard_normal((256, 1024)).astype(np.float32)
    np.testing.assert_array_equal(module.nki_tensor_add(a, b), a + b)


def test_transpose2d(load):
    module = load(SDK / "examples" / "transpose2d" / "transpose2d_nki_kernels.py")
    p, x, y = 5, 3, 4
    a = np.arange(p * x * y, dtype=np.int8).reshape((p, x * y))
    expected = np.transpose(a.reshape(p, x, y), (0, 2, 1)).reshape(p, x * y)
    np.testing.assert_array_equal(module.tensor_transpose2D_kernel_(a, (x, y)), expected)


def test_average_pool2d_through_an_access_pattern(load):
    module = load(SDK / "examples" / "average_pool2d" / "average_pool2d_nki_kernels.py")
    image = np.arange(2 * 6 * 6, dtype=np.float16).reshape(2, 6, 6)
    result = module.tensor_avgpool_kernel(image, 2)
    np.testing.assert_array_equal(result, module.np_average_pool_2D(image, 2))


def test_strided_split(load):
    module = load(SDK / "examples" / "index-case-1.py")
    x = np.arange(4 * 5, dtype=ml_dtypes.bfloat16).reshape(4, 5)
    even, odd = module.tensor_split_kernel_(x)
    np.testing.assert_array_equal(even, x[:, 0::2])
    np.testing.assert_array_equal(odd, x[:, 1::2])


def test_maxpool_through_an_access_pattern(load):
    module = load(SDK / "examples" / "index-case-3.py")
    x = RNG.standard_normal((2, 6, 6)).astype(ml_dtypes.bfloat16)
    expected = x.astype(np.float32).reshape(2, 3, 2, 3, 2).max(axis=(2, 4))
    np.testing.assert_array_equal(module.tensor_maxpool_kernel_(x, 2).astype(np.float32), expected)


def test_layout_pass(load):
    module = load(SDK / "examples" / "layout-pass.py")
    x = RNG.standard_normal((128, 512)).astype(np.float32)
    np.testing.assert_allclose(module.tensor_exp_kernel_(x), np.exp(x), rtol=1e-6)


def test_layout_violation_is_rejected(load):
    """A 256-partition tile: the SDK's "Size of partition dimension 256 exceeds architecture
    limitation of 128" (nki/get-started/about/tiling-overview.rst)."""
    module = load(SDK / "examples" / "layout-violation.py")
    with pytest.raises(errors.NumPartitionExceedArchLimit, match="partition dimension 256 exceeds"):
        module.tensor_exp_kernel_(np.ones((256, 512), np.float32))


MATMUL_CASES = [  # kernel name, (K, M, N), extra keyword arguments (small blockings)
    ("nki_matmul_basic_", (128, 64, 512), {}),
    ("nki_matmul_tiled_", (256, 256, 1024), {}),
    ("nki_matmul_hoist_load_", (256, 256, 1024), {}),
    ("nki_matmul_block_free_dimension_", (256, 256, 1024), {}),
    (
        "nki_matmul_fully_optimized_",
        (256, 256, 1024),
        {"TILES_IN_BLOCK_M": 2, "TILES_IN_BLOCK_N": 1, "TILES_IN_BLOCK_K": 1},
    ),
]


@pytest.mark.parametrize("root", [SDK / "examples", SAMPLES], ids=["sdk", "nki-samples-beta"])
@pytest.mark.parametrize(
    ("kernel", "sizes", "options"), MATMUL_CASES, ids=[c[0] for c in MATMUL_CASES]
)
def test_matmul_tutorial(load, root, kernel, sizes, options):
    module = load(root / "matrix_multiplication" / "matrix_multiplication_nki_kernels.py")
    k, m, n = sizes
    lhs_t = RNG.standard_normal((k, m)).astype(np.float32)
    rhs = RNG.standard_normal((k, n)).astype(np.float32)
    result = getattr(module, kernel)(lhs_t, rhs, **options)
    np.testing.assert_allclose(result, lhs_t.T @ rhs, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("version", ["mamba_v1", "mamba_v2", "mamba_v3"])
def test_fused_mamba(load, version):
    module = load(SDK / "examples" / "fused_mamba" / "mamba_nki_kernels.py")
    inputs = mamba_inputs(RNG, (0.0, 0.2), (0.5, 1.5))
    result = getattr(module, version)(*inputs)
    np.testing.assert_allclose(result, selective_scan(*inputs), rtol=1e-4, atol=1e-4)


MX = SDK / "deep-dives" / "src" / "mxfp-matmul"


@pytest.fixture
def mx(load, monkeypatch):
    """The MX kernels and their goldens, on trn3 (nc_matmul_mx and quantize_mx are v4 only)."""
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    np.random.seed(0)  # the golden generators draw from numpy's global generator
    return load(MX / "mx_kernels.py"), load(MX / "mx_cpu_utils.py")


X4 = {
    ml_dtypes.float8_e5m2: "float8_e5m2_x4",
    ml_dtypes.float8_e4m3fn: "float8_e4m3fn_x4",
    ml_dtypes.float4_e2m1fn: "float4_e2m1fn_x4",
}


def _compare(result, golden):
    """mx_toplevel.compare_and_print_results' check."""
    np.testing.assert_allclose(result.astype(np.float32), golden, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("quantized", [ml_dtypes.float8_e5m2, ml_dtypes.float4_e2m1fn])
def test_mx_offline_quantized_matmul(mx, quantized):
    """mx_toplevel.run_offline_quantized_matmul_mx_test without torch."""
    kernels, golden = mx
    m, k, n = 128, 128, 512
    _, _, st_data, st_scale = golden.generate_stabilized_mx_data(quantized, (k, m * 4))
    _, _, mv_data, mv_scale = golden.generate_stabilized_mx_data(quantized, (k, n * 4))
    result = kernels.kernel_offline_quantized_mx_matmul(
        st_data, st_scale, mv_data, mv_scale, getattr(simulator.language, X4[quantized])
    )
    expected = golden.nc_matmul_mx_golden(
        st_data, mv_data, st_scale, mv_scale, quantized, quantized
    )
    _compare(result, expected)


@pytest.mark.parametrize(
    ("stationary", "moving"),
    [
        (ml_dtypes.float4_e2m1fn, ml_dtypes.float8_e5m2),
        (ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2),
    ],
)
def test_mx_on_device_quantize_matmul(mx, stationary, moving):
    """mx_toplevel.run_on_device_quantize_matmul_mx_test without torch."""
    kernels, golden = mx
    m, k, n = 128, 128, 512
    _, _, st_data, st_scale = golden.generate_stabilized_mx_data(stationary, (k, m * 4))
    mv_values, _, _, _ = golden.generate_stabilized_mx_data(moving, (k, n * 4))
    result = kernels.kernel_on_device_quantize_matmul_mx(
        st_data,
        st_scale,
        mv_values.astype(ml_dtypes.bfloat16),
        getattr(simulator.language, X4[stationary]),
        getattr(simulator.language, X4[moving]),
    )
    mv_data, mv_scale = golden.quantize_mx_golden(mv_values, moving)
    expected = golden.nc_matmul_mx_golden(st_data, mv_data, st_scale, mv_scale, stationary, moving)
    _compare(result, expected)


@pytest.mark.parametrize("use_tensor_copy", [True, False], ids=["tensor_copy", "dma"])
@pytest.mark.parametrize("packed_scales", [False, True], ids=["scales", "packed_scales"])
def test_mx_copy_strided_quantize_matmul(mx, use_tensor_copy, packed_scales):
    """mx_toplevel.run_copy_strided_test without torch: golden = st.T @ mv."""
    kernels, golden = mx
    k, m, n = 512, 128, 512
    st_values, _, _, _ = golden.generate_stabilized_mx_data(ml_dtypes.float8_e5m2, (k, m))
    mv_values, _, _, _ = golden.generate_stabilized_mx_data(ml_dtypes.float8_e5m2, (k, n))
    kernel = (
        kernels.kernel_copy_strided_quantize_matmul_mx_packed_scale
        if packed_scales
        else kernels.kernel_copy_strided_quantize_matmul_mx
    )
    result = kernel(
        st_values.astype(ml_dtypes.bfloat16),
        mv_values.astype(ml_dtypes.bfloat16),
        simulator.language.float8_e5m2_x4,
        use_tensor_copy,
    )
    _compare(result, st_values.T @ mv_values)


def test_mx_needs_trn3(load, monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    kernels = load(MX / "mx_kernels.py")
    data = np.zeros((128, 128), np.uint32)
    with pytest.raises(errors.UnsupportedOperator, match="NeuronCore-v4"):
        kernels.kernel_offline_quantized_mx_matmul(
            data,
            np.zeros((16, 128), np.uint8),
            np.zeros((128, 512), np.uint32),
            np.zeros((16, 512), np.uint8),
            simulator.language.float8_e5m2_x4,
        )
