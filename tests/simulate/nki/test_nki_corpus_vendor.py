"""AWS's own NKI kernels and tests, the files tests/fetch_vendor.py lists (MIT-0; never
committed; read from conftest's ``VENDOR``, the tests skip without them), run unchanged
through the import hook against their own goldens:

- nki-samples@8370e11 (the last commit before the reference kernels were removed,
  c4b806e^): ``flash_fwd``, ``flash_attn_bwd``, ``fused_self_attn_for_SD_small_head_size``
  (src/nki_samples/reference/attention.py), ``resize_nearest_fixed_dma_kernel``,
  ``adaptive_avg_pool2d_kernel`` (vision.py), each driven by the numerical test method of its
  own test/unit/test_*.py file at smaller shapes than the file's (the simulator runs Python),
  and ``quantized_double_row_matmul`` (double_row_matmul.py) with its test file's helpers.
- nki-samples@0898a77 (fc5c69f^): the direct-allocation kernels 8370e11 removed,
  ``allocated_fused_rms_norm_qkv`` and ``allocated_fused_self_attn_for_SD_small_head_size``,
  through their own numerical tests.
- aws-neuron-sdk@81ce03a: the per-instruction unittest files of nki/test/ (with the SBUF and
  PSUM modulo-allocation tests).
"""

from __future__ import annotations

import importlib
import io
import sys
import unittest
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import VENDOR, VENDOR_MISSING, load_module, vendor_present

from asickernels.simulate.nki import install as hook
from asickernels.simulate.nki.benchmarking import NoDeviceTimeWarning
from asickernels.simulate.nki.errors import BroadcastOperandWarning

pytestmark = pytest.mark.skipif(
    not (
        vendor_present("nki-samples@8370e11")
        and vendor_present("aws-neuron-sdk@81ce03a", "nki/test/")
    ),
    reason=VENDOR_MISSING,
)
SAMPLES = VENDOR / "nki-samples@8370e11"
ALLOCATED = VENDOR / "nki-samples@0898a77"
SDK_TESTS = VENDOR / "aws-neuron-sdk@81ce03a" / "nki" / "test"


def _importing(root: Path) -> Iterator[Any]:
    """``vendor(name)``: imports a module of the nki-samples tree ``root`` (its src/ and
    test/unit/ on sys.path) with the hook installed (``neuronxcc.nki`` resolving to the
    simulator); modules, path and hook are restored afterwards."""
    if hook.real_sdk_available("neuronxcc"):
        pytest.skip("a real neuronxcc is installed: the hook does not shadow it")
    hook.install()
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    sys.path[:0] = [str(root / "src"), str(root / "test" / "unit")]
    np.random.seed(0)  # the vendor tests draw from numpy's global generator
    try:
        with warnings.catch_warnings():
            # the test modules decorate their kernels with nki.benchmark at import
            warnings.simplefilter("ignore", NoDeviceTimeWarning)
            yield importlib.import_module
    finally:
        hook.uninstall()
        for name in set(sys.modules) - saved_modules:
            if _is_vendor(sys.modules[name]):
                del sys.modules[name]
        sys.path[:] = saved_path


@pytest.fixture
def vendor() -> Iterator[Any]:
    """Imports from nki-samples@8370e11 (see :func:`_importing`)."""
    yield from _importing(SAMPLES)


@pytest.fixture
def allocated() -> Iterator[Any]:
    """Imports from nki-samples@0898a77, whose direct-allocation kernels 8370e11 removed."""
    if not vendor_present(ALLOCATED.name):
        pytest.skip(VENDOR_MISSING)
    yield from _importing(ALLOCATED)


def _is_vendor(module: Any) -> bool:
    paths = [getattr(module, "__file__", None), *getattr(module, "__path__", [])]
    return any(p is not None and str(p).startswith(str(VENDOR)) for p in paths)


# -- nki-samples reference kernels, through their own numerical tests -----------------------
@pytest.mark.parametrize(
    ("nheads", "kv_heads", "training", "sliding_window", "should_transpose_v"),
    [
        (2, 1, True, -1, False),  # grouped-query attention, with the lse output
        (1, None, False, 256, False),  # sliding window
        (1, None, False, -1, True),  # V given as [d, seq]
    ],
)
def test_flash_fwd(vendor, nheads, kv_heads, training, sliding_window, should_transpose_v):
    module = vendor("test_flash_attn_fwd")
    module.TestAttention().test_flash_attn_fwd_numerical(
        True, 1, nheads, 512, 512, 64, np.float32, True, sliding_window, training, 512,
        kv_heads, should_transpose_v,
    )  # fmt: skip


@pytest.mark.parametrize(("sliding_window", "sinks"), [(-1, False), (128, True)])
def test_flash_attn_bwd(vendor, sliding_window, sinks):
    module = vendor("test_flash_attn_bwd")
    module.TestAttention().test_flash_attn_bwd_numerical(
        True, 1, 2, 1, 512, 64, np.float32, sliding_window, sinks
    )


def test_stable_diffusion_attention(vendor):
    module = vendor("test_SD_attention_small_head")
    module.TestAttention().test_attention_for_SD_numberic(True, 1, 512, 64, np.float32)


@pytest.mark.slow
def test_stable_diffusion_attention_bfloat16_file_shape(vendor):
    """One of the file's own cases (seqlen 4096), unchanged."""
    module = vendor("test_SD_attention_small_head")
    nl = vendor("neuronxcc.nki.language")
    module.TestAttention().test_attention_for_SD_numberic(True, 1, 4096, 128, nl.bfloat16)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_resize_nearest(vendor, dtype):
    module = vendor("test_resize_nearest")
    nl = vendor("neuronxcc.nki.language")
    module.TestResizeNearest().test_resize_nearest_for_numberic(
        True, 2, 30, 20, 64, 2, 59, 38, 64, getattr(nl, dtype)
    )


@pytest.mark.parametrize(
    ("shape", "output_size", "dtype"),
    [  # cases of the file's own list
        ((1, 64, 56, 56), 7, "float32"),
        ((1, 256, 14, 14), 7, "float16"),
        ((3, 96, 24, 24), (6, 6), "bfloat16"),
        ((2, 192, 16, 16), (4, 2), "float32"),
        ((1, 1, 1, 1), 1, "float32"),
        ((1, 256, 13, 13), 6, "float32"),
        ((4, 512, 7, 7), (1, 1), "float32"),
    ],
)
def test_adaptive_avg_pool2d(vendor, shape, output_size, dtype):
    module = vendor("test_adaptive_avg_pool2d")
    nl = vendor("neuronxcc.nki.language")
    module.TestAdaptiveAvgPool2D().test_adaptive_avg_pool2d_numerical(
        True, *shape, output_size, getattr(nl, dtype)
    )


def test_quantized_double_row_matmul(vendor):
    """The file's numerical test returns early off a trn2 machine, so its steps are repeated
    here with its own helpers (column_wise_quantize, reshape) at a smaller K."""
    module = vendor("test_double_row_matmul")
    nl = vendor("neuronxcc.nki.language")
    nki = vendor("neuronxcc.nki")
    lhs, rhs = np.random.rand(256, 1024), np.random.rand(1024, 512)
    golden = lhs @ rhs
    rhs_scale, rhs_quantized = module.column_wise_quantize(rhs)
    with pytest.warns(BroadcastOperandWarning):  # it multiplies [128, 512] by [128, 1]
        out = nki.simulate_kernel(
            nki.baremetal(module.quantized_double_row_matmul),
            nl.static_cast(lhs, nl.bfloat16),
            nl.static_cast(module.reshape(rhs_quantized), nl.float8_e4m3),
            nl.static_cast(rhs_scale, nl.bfloat16),
            2, 1, 4,
        )  # fmt: skip
    assert np.allclose(golden, out.astype(np.float32), rtol=2e-2)  # the file's tolerance


def test_benchmark_decorated_kernel_runs_and_says_no_device_time(vendor):
    """The files' own ``benchmark(warmup=5, iters=10)(kernel)`` objects: launched on a grid
    they simulate the kernel and report that no device time was measured."""
    module = vendor("test_resize_nearest")
    x = np.random.default_rng(0).random((1, 30, 20, 64)).astype(np.float32)
    bench = module.bench_func[1]
    with pytest.warns(NoDeviceTimeWarning, match="no device time was measured"):
        out = bench(x, (1, 59, 38, 64))
    np.testing.assert_allclose(out, module.cpu_golden_result(x, out.shape))
    result = bench.benchmark_result
    assert result.device_time_measured is False
    assert result.nc_latency.get_latency_percentile(50) == result.estimate.latency_us > 0
    assert result.counters["dma_transfers"] > 0


# -- nki-samples' direct-allocation kernels (nki.compiler.sbuf/psum placements), through
# their own numerical tests ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("batch", "seqlen", "dim", "d_head", "dtype"),
    [  # the file's own cases
        (1, 128, 512, 512, "float16"),
        (1, 512, 1024, 384, "bfloat16"),
        (1, 128, 1024, 512, "bfloat16"),
        pytest.param(1, 1024, 8192, 512, "bfloat16", marks=pytest.mark.slow),
    ],
)
def test_allocated_fused_rms_norm_qkv(allocated, batch, seqlen, dim, d_head, dtype):
    module = allocated("test_rmsnorm_qkv")
    nl = allocated("neuronxcc.nki.language")
    module.TestRMSNormQKV().test_allocated_rmsnorm_qkv_numeric(
        True, batch, seqlen, dim, d_head, getattr(nl, dtype)
    )


@pytest.mark.parametrize(
    ("seqlen", "dtype"),
    [  # 2048 is not the file's (4096 and 5120 are): the kernel takes multiples of 1024
        (2048, "float32"),
        pytest.param(4096, "float32", marks=pytest.mark.slow),
        pytest.param(4096, "bfloat16", marks=pytest.mark.slow),
        pytest.param(5120, "bfloat16", marks=pytest.mark.slow),
    ],
)
def test_allocated_stable_diffusion_attention(allocated, seqlen, dtype):
    """The kernel advances its address counter inside an affine_range body, so its tiles
    fit only as the SDK traces that body: once (legacy/spmd.py, traced_placement)."""
    module = allocated("test_allocated_SD_attention_small_head")
    nl = allocated("neuronxcc.nki.language")
    module.TestAttention().test_allocated_attention_for_SD_numberic(
        True, 1, seqlen, 128, getattr(nl, dtype)
    )


# -- aws-neuron-sdk per-instruction tests -----------------------------------------------------
def _sdk_test_files() -> list[str]:
    return sorted(p.name for p in SDK_TESTS.glob("test_*.py"))


# Files that still fail here (strict: a fix must remove its entry).
SDK_FAILING = {
    "test_nki_isa_activation.py": "its golden needs bfloat16 kept at float32 precision, the SDK "
    "simulator's known issue (nki_known_issues.rst); this simulator rounds as a device does",
    "test_nki_isa_nc_match_replace8.py": "combines masks with Python 'and', which the docs "
    "reject (nki_known_issues.rst) and the simulator raises for",
}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=SDK_FAILING[n]))
        if n in SDK_FAILING
        else n
        for n in _sdk_test_files()
    ],
)
def test_sdk_instruction_tests(vendor, name):
    module = load_module(SDK_TESTS / name, f"sdk_{name[:-3]}")
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)
    problems = [f"{case}: {trace.strip().splitlines()[-1]}" for case, trace in result.errors]
    problems += [f"{case}: {trace.strip().splitlines()[-1]}" for case, trace in result.failures]
    assert result.testsRun > 0
    assert not problems, "\n".join(problems)
