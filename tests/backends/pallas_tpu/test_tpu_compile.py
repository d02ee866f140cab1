"""The real TPU compile gate: every Pallas kernel through Mosaic and the TPU backend of
libtpu, for v5e, v6e and v5p topologies, on this CPU-only machine."""

from __future__ import annotations

import functools

import pytest

from asickernels.estimates import compile_gate
from asickernels.kernels.cases import CompileShape
from asickernels.simulate import tpu_compile

missing = tpu_compile.libtpu_status()
pytestmark = pytest.mark.skipif(
    missing is not None, reason=f"libtpu cannot be installed here: {missing}"
)

SMALL_SHAPES = (
    compile_gate.KernelShape(
        "linear_sum_assignment",
        "2x7x5",
        functools.partial(
            compile_gate.build,
            CompileShape(
                "",
                "",
                "linear_sum_assignment",
                (((2, 7, 5), "float32"), ((2, 7), "bool"), ((2, 5), "bool")),
            ),
        ),
    ),
    compile_gate.KernelShape(
        "giou_forward", "1000 pairs", functools.partial(compile_gate._giou, False, 1000, "float32")
    ),
    compile_gate.KernelShape(
        "giou_backward",
        "1000 pairs bf16",
        functools.partial(compile_gate._giou, True, 1000, "bfloat16"),
    ),
    compile_gate.KernelShape("nms", "N=300 out=20", functools.partial(compile_gate._nms, 300, 20)),
    compile_gate.KernelShape(
        "int8_matmul",
        "100x300x200 scaled",
        functools.partial(compile_gate._matmul, 100, 300, 200, True),
    ),
    compile_gate.KernelShape(
        "roi_align_forward",
        "2x11x7x9 K=13",
        functools.partial(compile_gate._roi_align, False, (2, 11, 7, 9), 13, 3),
    ),
    compile_gate.KernelShape(
        "roi_align_backward",
        "2x11x7x9 K=13",
        functools.partial(compile_gate._roi_align, True, (2, 11, 7, 9), 13, 3),
    ),
)


@pytest.mark.parametrize("generation", compile_gate.GATE_GENERATIONS)
def test_kernels_compile_at_small_ragged_shapes(generation):
    results = compile_gate.compile_all([generation], targets=SMALL_SHAPES)
    assert all(r.ok for r in results), compile_gate.format_table(results)
    assert all(r.vmem_bytes and r.vmem_bytes > 0 for r in results)


@pytest.mark.slow
@pytest.mark.parametrize("generation", compile_gate.GATE_GENERATIONS)
def test_kernels_compile_at_benchmark_shapes(generation):
    results = compile_gate.compile_all([generation])
    assert {r.kernel for r in results} == {
        "giou_forward",
        "giou_backward",
        "nms",
        "int8_matmul",
        "box_iou_pairwise",
        "giou_pairwise",
        "diou_forward",
        "ciou_forward",
        "ciou_backward",
        "roi_align_forward",
        "roi_align_backward",
        "linear_sum_assignment",
    }
    assert all(r.ok for r in results), compile_gate.format_table(results)
    # The tuned int8 blocks outgrow the default scoped VMEM: the raised limit must show.
    big = next(r for r in results if r.shape == "8192^3")
    assert big.vmem_bytes and big.vmem_limit_bytes and big.vmem_limit_bytes >= big.vmem_bytes


def test_roi_align_on_a_map_larger_than_vmem_compiles_in_bands():
    """A 2048 x 2048 map (16 MiB a channel) cut into bands of rows, on v5p (the least VMEM
    of the three)."""
    shape = compile_gate.KernelShape(
        "roi_align_backward",
        "1x8x2048x2048",
        functools.partial(compile_gate._roi_align, True, (1, 8, 2048, 2048), 16, 7),
    )
    result = compile_gate.compile_one(shape, "v5p")
    assert result.ok, compile_gate.format_table([result])
    # One channel of the whole map, double-buffered, would take 32 MiB of v5p's 64.
    assert result.vmem_bytes and result.vmem_bytes < 24 << 20


def test_int8_kernel_is_refused_on_v4_with_a_clear_error():
    """v4's MXU has no int8 x int8: the kernel says so when lowered for it (choosing XLA
    there is the selection policy's job, never the backend's)."""
    result = compile_gate.compile_all(["v4"], ["int8_matmul"], targets=SMALL_SHAPES)
    assert not any(r.ok for r in result)
    assert all("no int8 MXU path" in r.error for r in result)


def test_a_kernel_lowered_for_a_topology_device_is_mosaic_with_no_context_manager():
    import jax
    import jax.numpy as jnp

    import asickernels
    from asickernels.jax_compat import single_device_sharding

    device = tpu_compile.topology_device("v6e")
    arg = jax.ShapeDtypeStruct((1000, 4), jnp.float32, sharding=single_device_sharding(device))
    lowered = jax.jit(lambda a, b: asickernels.giou(a, b, backend="pallas_tpu")).lower(arg, arg)
    assert "tpu_custom_call" in lowered.as_text()
    lowered.compile()


def test_block_tables_follow_the_generation_of_the_arguments_device():
    """v5e and v6e have different int8 tables: the VMEM the kernel asks for differs."""
    from asickernels.backends.pallas_tpu import lowering
    from asickernels.backends.pallas_tpu.int8_matmul import block_sizes

    requests = {}
    for generation in ("v5e", "v6e"):
        fn, specs = compile_gate._matmul(4096, 4096, 4096, False)
        with lowering.record_vmem() as requests[generation]:
            tpu_compile.lower_for_tpu(fn, specs, generation)
    assert block_sizes("v5e", 4096) != block_sizes("v6e", 4096)
    assert requests["v5e"] and requests["v6e"] and requests["v5e"] != requests["v6e"]


def test_compile_errors_are_reported_not_raised():
    def broken():
        raise ValueError("this kernel cannot be built")

    result = compile_gate.compile_one(compile_gate.KernelShape("broken", "-", broken), "v5e")
    assert not result.ok and "cannot be built" in result.error
    assert "FAILED" in compile_gate.format_table([result])
