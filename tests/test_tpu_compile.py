"""The real TPU compile gate: every Pallas kernel through Mosaic and the TPU backend of
libtpu, for v5e, v6e and v5p topologies, on this CPU-only machine."""

from __future__ import annotations

import functools
import warnings

import pytest

from asickernels.simulate import tpu_compile

missing = tpu_compile.libtpu_status()
pytestmark = pytest.mark.skipif(
    missing is not None, reason=f"libtpu cannot be installed here: {missing}"
)

SMALL_SHAPES = (
    tpu_compile.KernelShape(
        "giou_forward", "1000 pairs", functools.partial(tpu_compile._giou, False, 1000, "float32")
    ),
    tpu_compile.KernelShape(
        "giou_backward",
        "1000 pairs bf16",
        functools.partial(tpu_compile._giou, True, 1000, "bfloat16"),
    ),
    tpu_compile.KernelShape("nms", "N=300 out=20", functools.partial(tpu_compile._nms, 300, 20)),
    tpu_compile.KernelShape(
        "int8_matmul",
        "100x300x200 scaled",
        functools.partial(tpu_compile._matmul, 100, 300, 200, True),
    ),
)


@pytest.mark.parametrize("generation", tpu_compile.GATE_GENERATIONS)
def test_kernels_compile_at_small_ragged_shapes(generation):
    results = tpu_compile.compile_all([generation], targets=SMALL_SHAPES)
    assert all(r.ok for r in results), tpu_compile.format_table(results)
    assert all(r.vmem_bytes and r.vmem_bytes > 0 for r in results)


@pytest.mark.slow
@pytest.mark.parametrize("generation", tpu_compile.GATE_GENERATIONS)
def test_kernels_compile_at_benchmark_shapes(generation):
    results = tpu_compile.compile_all([generation])
    assert {r.kernel for r in results} == {"giou_forward", "giou_backward", "nms", "int8_matmul"}
    assert all(r.ok for r in results), tpu_compile.format_table(results)
    # The tuned int8 blocks outgrow the default scoped VMEM: the raised limit must show.
    big = next(r for r in results if r.shape == "8192^3")
    assert big.vmem_bytes and big.vmem_limit_bytes and big.vmem_limit_bytes >= big.vmem_bytes


def test_int8_kernel_fails_on_v4_and_the_public_op_falls_back():
    """v4's MXU has no int8 x int8: the raw kernel is refused by the real compiler, so the
    op warns and uses XLA's int8 dot there."""
    from asickernels.backends.pallas_tpu.int8_matmul import pallas_int8_matmul

    raw = tpu_compile.KernelShape(
        "int8_matmul",
        "raw kernel",
        lambda: (
            lambda x, y: pallas_int8_matmul(x, y, x_scale=None, y_scale=None, out_dtype="int32"),
            [((256, 256), "int8"), ((256, 256), "int8")],
        ),
    )
    result = tpu_compile.compile_one(raw, "v4")
    assert not result.ok and result.error
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fallback = tpu_compile.compile_all(["v4"], ["int8_matmul"], targets=SMALL_SHAPES)
    assert all(r.ok for r in fallback)
    assert any("no int8 MXU" in str(w.message) for w in caught)


def test_compile_errors_are_reported_not_raised():
    def broken():
        raise ValueError("this kernel cannot be built")

    result = tpu_compile.compile_one(tpu_compile.KernelShape("broken", "-", broken), "v5e")
    assert not result.ok and "cannot be built" in result.error
    assert "FAILED" in tpu_compile.format_table([result])
