"""The legacy ``neuronxcc.nki`` API of the simulator (asickernels.simulate.nki.legacy),
function by function, against its documented semantics (aws-neuron-sdk 0521004c,
general/nki/api/...)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asickernels.simulate.nki import errors, last_counters
from asickernels.simulate.nki import legacy as nki
from asickernels.simulate.nki.errors import (
    Err1dArangeNotSupported,
    ErrSharedHbmMustInKernelLevel,
)
from asickernels.simulate.nki.legacy import isa as nisa
from asickernels.simulate.nki.legacy import language as nl
from asickernels.simulate.nki.legacy import typing as nt

RNG = np.random.default_rng(7)


def rand(*shape: int, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def run(body, *arrays, **kwargs):
    """Runs ``body(*tensors)`` as a kernel through ``nki.simulate_kernel``."""
    return nki.simulate_kernel(body, *arrays, **kwargs)


def returning(compute):
    """A kernel loading its inputs, applying ``compute`` to the tiles and storing the tile
    it returns into a new shared_hbm output."""

    def kernel(*inputs):
        tiles = [nl.load(x) for x in inputs]
        result = compute(*tiles)
        out = nl.ndarray(result.shape, dtype=result.dtype, buffer=nl.shared_hbm)
        nl.store(out, result)
        return out

    return kernel


# -- index grids, masks ----------------------------------------------------------------------
def test_unlifted_arange_is_rejected():
    def kernel(x):
        nl.load(x[nl.arange(4)])

    with pytest.raises(Err1dArangeNotSupported):
        run(kernel, rand(4, 4))


def test_arange_and_mgrid_select_a_strided_tile():
    def kernel(x):
        out = nl.ndarray((4, 3), dtype=x.dtype, buffer=nl.shared_hbm)
        grid = nl.mgrid[0:4, 0:3]
        nl.store(out[grid.p, grid.x], nl.load(x[grid.p, 2 * grid.x + 1]))
        return out

    x = rand(4, 8)
    np.testing.assert_array_equal(run(kernel, x), x[:, 1:7:2])


def test_masks_combine_with_ampersand_only():
    i = nl.arange(4)[:, None]
    with pytest.raises(errors.ErrControlFlowConditionDependingOnArange, match="'&'"):
        bool(i < 2)
    assert ((i < 3) & (i > 0)).values[:, 0].tolist() == [False, True, True, False]


def test_out_of_bounds_access_needs_a_mask():
    """nki.errors.rst err_tensor_access_out_of_bound: an index grid past the end is an error
    unless a mask excludes those elements; a masked load leaves them unwritten."""

    def unmasked(x):
        nl.load(x[nl.arange(128)[:, None], nl.arange(4)[None, :]])

    def masked(x):
        i_p, i_f = nl.arange(128)[:, None], nl.arange(4)[None, :]
        out = nl.ndarray((100, 4), dtype=x.dtype, buffer=nl.shared_hbm)
        tile = nl.load(x[i_p, i_f], mask=i_p < 100)
        nl.store(out[i_p, i_f], tile, mask=i_p < 100)
        return out

    x = rand(100, 4)
    with pytest.raises(errors.TensorAccessOutOfBound):
        run(unmasked, x)
    np.testing.assert_array_equal(run(masked, x), x)


def test_masked_instruction_leaves_other_elements_unwritten():
    def kernel(x):
        _, i_f = nl.mgrid[0:4, 0:6]
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.multiply(nl.load(x), 2.0, mask=(i_f < 3)))
        return out

    out = run(kernel, rand(4, 6))
    assert np.isnan(out[:, 3:]).all() and not np.isnan(out[:, :3]).any()


# -- SPMD launch grids -------------------------------------------------------------------------
def test_program_ids_cover_the_grid_and_shared_hbm_is_shared():
    @nki.jit
    def kernel(x):
        out = nl.ndarray((6, 4), dtype=x.dtype, buffer=nl.shared_hbm)
        assert nl.program_ndim() == 2 and nl.num_programs() == 6
        assert nl.num_programs(axes=1) == 3
        row = nl.program_id(0) * 3 + nl.program_id(1)
        tile = nl.load(x[row : row + 1, :])
        nl.store(out[row : row + 1, :], nl.add(tile, row))
        return out

    x = rand(6, 4)
    np.testing.assert_allclose(kernel[2, 3](x), x + np.arange(6)[:, None], rtol=1e-6)
    with pytest.raises(ValueError):
        kernel[0](x)


def test_shared_hbm_only_at_the_kernel_top_level():
    def helper(shape):
        return nl.ndarray(shape, dtype=nl.float32, buffer=nl.shared_hbm)

    def kernel(x):
        return helper(x.shape)

    with pytest.raises(ErrSharedHbmMustInKernelLevel):
        run(kernel, rand(2, 2))


def test_neuron_2_20_style_output_argument_is_written_in_place():
    @nki.trace
    def kernel(x, out):
        nl.store(out, nl.exp(nl.load(x)))

    x = rand(8, 16)
    out = np.zeros((16, 8), np.float32).T  # a non-contiguous output array
    before = x.copy()
    assert nki.simulate_kernel(kernel, x, out) is None
    np.testing.assert_allclose(out, np.exp(x), rtol=1e-6)
    np.testing.assert_array_equal(x, before)


def test_returning_an_sbuf_tile_warns_and_returns_its_values():
    """The SDK's simulator returns it (nki/test/test_nki_isa_range_select.py@81ce03a); a
    device would not."""

    def kernel(x):
        return nl.load(x)

    x = rand(2, 2)
    with pytest.warns(errors.OnChipOutputWarning, match="HBM"):
        np.testing.assert_array_equal(run(kernel, x), x)


# -- dtypes and broadcasting -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("left", "right", "expected"),
    # nki.api.shared.rst, "NKI Type Promotion" and "Weakly Typed Scalar Type Inference"
    [
        (np.float16, 1.2, np.float32),
        (np.float16, 2, np.float16),
        (np.int8, 2, np.int32),
        (np.float16, ml_dtypes.bfloat16, np.float32),
        (ml_dtypes.float8_e4m3, ml_dtypes.float8_e5m2, ml_dtypes.bfloat16),
        (ml_dtypes.float8_e4m3, np.float16, np.float16),
        (np.int8, np.uint8, np.int16),
        (np.int32, np.uint32, np.float32),
        (np.uint16, np.int32, np.int32),
    ],
)
def test_type_promotion(left, right, expected):
    def kernel(x, *rest):
        other = nl.load(rest[0]) if rest else right
        result = nl.add(nl.load(x), other)
        assert result.dtype == np.dtype(expected)

    arrays = [np.ones((2, 2), left)]
    if not isinstance(right, (int, float)):
        arrays.append(np.ones((2, 2), right))
    run(kernel, *arrays)


def test_comparisons_default_to_bool():
    out = run(returning(lambda a, b: nl.greater(a, b)), rand(3, 3), rand(3, 3))
    assert out.dtype == np.bool_


def test_partition_broadcast_in_nl_ops_but_not_in_operators():
    """nki_known_issues.rst: operator overloads do not broadcast the partition dimension."""
    x, row = rand(4, 5), rand(1, 5)
    np.testing.assert_allclose(run(returning(nl.add), x, row), x + row, rtol=1e-6)
    with pytest.raises(errors.NumPartitionMismatch):
        run(returning(lambda a, b: a + b), x, row)


def test_reduction_result_broadcasts_along_free_axes():
    x = rand(6, 5)
    out = run(returning(lambda t: nl.subtract(t, nl.max(t, axis=1))), x)
    np.testing.assert_allclose(out, x - x.max(axis=1, keepdims=True), rtol=1e-6)


def test_broadcast_to_is_read_only():
    def kernel(x):
        wide = nl.load(x).broadcast_to((4, 3))
        wide[...] = nl.zeros((4, 3), dtype=nl.float32)

    with pytest.raises(errors.StoreDstShapeSmallerThanOtherShape):
        run(kernel, rand(1, 3))


def test_assignment_broadcasts_from_source_only():
    """nki.errors.rst err_store_dst_shape_smaller_than_other_shape."""

    def kernel(x):
        small = nl.ndarray((4, 1), dtype=nl.float32)
        small[...] = nl.load(x)

    with pytest.raises(errors.StoreDstShapeSmallerThanOtherShape):
        run(kernel, rand(4, 3))


# -- reductions ------------------------------------------------------------------------------
def test_reductions_remove_axes_unless_keepdims():
    def kernel(x):
        t = nl.load(x)
        assert nl.sum(t, axis=2).shape == (4, 3)
        assert nl.sum(t, axis=1).shape == (4, 5)  # any free axes (the avgpool tutorial)
        assert nl.sum(t, axis=[1, 2], keepdims=True).shape == (4, 1, 1)
        # Reducing every free axis keeps one: [P, 1] (nki-samples attention.py@8370e11
        # broadcasts such results to [P, F]).
        assert nl.mean(t, axis=[1, 2]).shape == (4, 1)
        assert nisa.tensor_reduce(nl.add, t, axis=(1, 2)).shape == (4, 1)
        assert t[:, 0, 0].shape == (4, 1)  # an integer on the last free axis: [P, 1]
        assert t[:, 0].shape == (4, 5)
        with pytest.raises(errors.UnsupportedReduceAxis):
            nl.sum(t, axis=0)
        with pytest.raises(errors.UnsupportedReduceAxis):
            nisa.tensor_reduce(nl.add, t, axis=1)  # the instruction wants trailing axes
        out = nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.mean(t, axis=[1, 2], keepdims=True).reshape((4, 1)))
        return out

    x = rand(4, 3, 5)
    np.testing.assert_allclose(run(kernel, x)[:, 0], x.mean(axis=(1, 2)), rtol=1e-5)


def test_tensor_reduce_negate():
    x = rand(4, 8)
    out = run(returning(lambda t: nisa.tensor_reduce(np.add, t, axis=1, negate=True,
                                                     keepdims=True)), x)  # fmt: skip
    np.testing.assert_allclose(out[:, 0], -x.sum(axis=1), rtol=1e-5)


# -- Tensor engine ---------------------------------------------------------------------------
def test_matmul_and_transpose_x():
    x, y = rand(64, 32), rand(32, 48)
    out = run(returning(lambda a, b: nl.matmul(a, b)), x, y)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, x @ y, rtol=1e-4, atol=1e-4)
    xt = rand(32, 64)
    out = run(returning(lambda a, b: nl.matmul(a, b, transpose_x=True)), xt, y)
    np.testing.assert_allclose(out, xt.T @ y, rtol=1e-4, atol=1e-4)


def test_matmul_limits_and_dtypes():
    with pytest.raises(errors.SizeOfDimensionExceedArchLimit):
        run(returning(lambda a, b: nl.matmul(a, b, transpose_x=True)), rand(8, 129), rand(8, 4))
    with pytest.raises(errors.SizeOfDimensionExceedArchLimit):
        run(returning(lambda a, b: nisa.nc_matmul(a, b)), rand(8, 4), rand(8, 513))
    ints = np.ones((8, 4), np.int8)
    with pytest.raises(errors.UnsupportedDtype):
        run(returning(lambda a, b: nisa.nc_matmul(a, b)), ints, ints)


def test_psum_accumulation_with_plus_equals():
    def kernel(x, y):
        acc = nl.zeros((16, 8), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(2):
            acc += nisa.nc_matmul(nl.load(x[k * 32 : (k + 1) * 32, :]),
                                  nl.load(y[k * 32 : (k + 1) * 32, :]))  # fmt: skip
        out = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, acc)
        return out

    x, y = rand(64, 16), rand(64, 8)
    np.testing.assert_allclose(run(kernel, x, y), x.T @ y, rtol=1e-4, atol=1e-4)
    assert last_counters()["tensor_instructions"] == 2


def test_transpose_limits():
    x = rand(16, 24)
    np.testing.assert_array_equal(run(returning(nl.transpose), x), x.T)
    with pytest.raises(errors.SizeOfDimensionExceedArchLimit):
        run(returning(nl.transpose), rand(4, 200))


def test_nc_transpose_engines():
    def kernel(x):
        tile = nl.load(x)
        assert nisa.nc_transpose(tile).buffer is nl.sbuf  # <= 32x32: the Vector engine
        assert nisa.nc_transpose(tile, engine=nisa.tensor_engine).buffer is nl.psum
        out = nl.ndarray((16, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nisa.nc_transpose(tile))
        return out

    x = rand(8, 16)
    np.testing.assert_array_equal(run(kernel, x), x.T)


def test_vector_engine_transpose_past_the_documented_32x32_warns_and_transposes():
    """The docs' Vector-engine limit is 32x32; public kernels transposed 128x64 tiles there
    on trn1 (issue 31): a warning citing both, and the full transpose. Past the Tensor
    engine's 128x128 it is still refused."""
    on_vector = returning(lambda t: nisa.nc_transpose(t, engine=nisa.vector_engine))
    x = rand(128, 64)
    with pytest.warns(errors.DeviceRanItWarning, match=r"up to 32x32.*ran on trn1"):
        np.testing.assert_array_equal(run(on_vector, x), x.T)
    with pytest.raises(errors.SizeOfDimensionExceedArchLimit):
        run(on_vector, rand(8, 129))


# -- Vector / Scalar / GpSimd instructions -----------------------------------------------------
def test_bn_stats_and_bn_aggr_give_mean_and_variance():
    def kernel(x):
        t = nl.load(x)
        stats = nl.ndarray((8, 12), dtype=nl.float32)
        i_p, i_s, i_f = nl.arange(8)[:, None], nl.arange(6)[None, :], nl.arange(300)[None, :]
        for j in nl.affine_range(2):
            stats[i_p, j * 6 + i_s] = nisa.bn_stats(t[i_p, j * 300 + i_f])
        out = nl.ndarray((8, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nisa.bn_aggr(stats))
        return out

    x = rand(8, 600)
    out = run(kernel, x)
    np.testing.assert_allclose(out[:, 0], x.mean(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[:, 1], x.var(axis=1), rtol=1e-5)
    with pytest.raises(errors.SizeOfDimensionExceedArchLimit):
        run(returning(nisa.bn_stats), rand(2, 513))


def test_activation_scale_bias_and_accumulators():
    def kernel(x, scale, bias):
        t, s, b = nl.load(x), nl.load(scale), nl.load(bias)
        sums = nl.ndarray((4, 1), dtype=nl.float32)
        result = nisa.activation(nl.exp, t, scale=s, bias=b, reduce_op=nl.add,
                                 reduce_res=sums, reduce_cmd=nisa.reduce_cmd.reset_reduce)  # fmt: skip
        nisa.activation(nl.exp, t, scale=s, bias=b, reduce_op=nl.add, reduce_res=sums,
                        reduce_cmd=nisa.reduce_cmd.reduce)  # fmt: skip
        out = nl.ndarray((4, 7), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:6], result)
        nl.store(out[:, 6:7], sums)
        return out

    x, scale, bias = rand(4, 6), rand(4, 1), rand(4, 1)
    expected = np.exp(x * scale + bias)
    out = run(kernel, x, scale, bias)
    np.testing.assert_allclose(out[:, :6], expected, rtol=1e-5)
    np.testing.assert_allclose(out[:, 6], 2 * expected.sum(axis=1), rtol=1e-5)


def test_tensor_scalar_vector_operands_and_reverse():
    x, v = rand(4, 5), rand(4, 1)
    out = run(returning(lambda t, s: nisa.tensor_scalar(t, np.subtract, s, reverse0=True,
                                                        op1=np.multiply, operand1=3.0)), x, v)  # fmt: skip
    np.testing.assert_allclose(out, (v - x) * 3.0, rtol=1e-6)
    with pytest.raises(errors.ShapeMismatch):
        run(returning(lambda t, s: nisa.tensor_scalar(t, np.add, s)), x, rand(4, 2))


def test_tensor_tensor_rules():
    x, y = rand(4, 6), rand(4, 2, 3)
    out = run(returning(lambda a, b: nisa.tensor_tensor(a, b, op=nl.maximum)), x, y)
    np.testing.assert_array_equal(out, np.maximum(x, y.reshape(4, 6)))
    with pytest.raises(errors.NumPartitionMismatch):
        run(returning(lambda a, b: nisa.tensor_tensor(a, b, op=nl.add)), x, rand(1, 6))


def test_tensor_tensor_scan_matches_its_recurrence():
    a, b = rand(3, 10), rand(3, 10)
    initial = rand(3, 1)
    out = run(returning(lambda p, q, r: nisa.tensor_tensor_scan(p, q, r, np.multiply, np.add)),
              a, b, initial)  # fmt: skip
    state, expected = initial[:, 0], np.empty_like(a)
    for i in range(10):
        state = a[:, i] * state + b[:, i]
        expected[:, i] = state
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_iota_memset_copy_reciprocal_partition_reduce():
    def kernel(x):
        i_p, i_f = nl.arange(4)[:, None], nl.arange(3)[None, :]
        out = nl.ndarray((4, 13), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:3], nisa.iota(10 * i_p + i_f, dtype=nl.float32))
        nl.store(out[:, 3:6], nisa.memset((4, 3), 2.5, nl.float32))
        t = nl.load(x)
        nl.store(out[:, 6:9], nisa.reciprocal(nisa.tensor_copy(t)))
        nl.store(out[0:1, 9:12], nisa.tensor_partition_reduce(np.add, t))
        nl.store(out[:, 12:13], nl.sum(t, axis=1, keepdims=True))
        return out

    x = rand(4, 3)
    out = run(kernel, x)
    np.testing.assert_array_equal(out[:, 0:3], 10 * np.arange(4)[:, None] + np.arange(3))
    assert (out[:, 3:6] == 2.5).all()
    np.testing.assert_allclose(out[:, 6:9], 1 / x, rtol=1e-6)
    np.testing.assert_allclose(out[0, 9:12], x.sum(axis=0), rtol=1e-5)
    assert last_counters()["gpsimd_instructions"] == 2  # iota, partition reduce


# -- memory ----------------------------------------------------------------------------------
def test_block_dimensions_and_capacity():
    """nki_block_dimension_migration_guide.rst: block tiles need not be live at once, so one
    (P, F) tile is counted; its values are all kept."""

    def kernel(x):
        blocks = nl.zeros((4, nl.par_dim(128), 32 * 1024), dtype=nl.float32)  # 4 x 128 KiB
        blocks[3, 0:128, 0:4] = nl.load(x)
        with pytest.raises(TypeError, match="block"):
            nl.exp(blocks)
        out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, blocks[3, 0:128, 0:4])
        return out

    x = rand(128, 4)
    np.testing.assert_array_equal(run(kernel, x), x)
    assert last_counters()["peak_sbuf_bytes_per_partition"] == 128 * 1024 + 16


def test_on_chip_limits():
    def too_big(x):
        nl.ndarray((128, 50 * 1024), dtype=nl.float32)  # 200 KiB > 192 KiB on trn1/inf2

    def one_dimensional(x):
        nl.zeros((128,), dtype=nl.float32)  # nki_known_issues.rst: "this won't work"

    def too_many_partitions(x):
        nl.zeros((256, 4), dtype=nl.float32)

    with pytest.raises(errors.SbufCapacityExceeded):
        run(too_big, rand(1, 1))
    with pytest.raises(errors.LeadingDimensionOfTensorMustBePartition):
        run(one_dimensional, rand(1, 1))
    with pytest.raises(errors.NumPartitionExceedArchLimit):
        run(too_many_partitions, rand(1, 1))


def test_default_target_is_neuroncore_v2(monkeypatch):
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    assert run(lambda x: nisa.get_nc_version(), rand(1, 1)) is nisa.nc_version.gen2
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    assert run(lambda x: nisa.get_nc_version(), rand(1, 1)) is nisa.nc_version.gen3
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    with pytest.raises(ValueError, match="trn1/inf2 and trn2"):
        run(lambda x: None, rand(1, 1))


# -- the rest of the surface -----------------------------------------------------------------
def test_apis_need_a_running_kernel():
    with pytest.raises(errors.NkiApiOutsideOfNkiKernel):
        nl.zeros((2, 2), dtype=nl.float32)


def test_device_print_and_typing(capsys):
    def kernel(x):
        nl.device_print("value:", nl.load(x))

    run(kernel, np.full((1, 2), 3.0, np.float32))
    assert "value: [[3. 3.]]" in capsys.readouterr().out
    annotation = nt.tensor[[128, 512], nl.bfloat16]
    assert annotation.shape == (128, 512) and annotation.dtype == nl.bfloat16
    assert nt.mutable_tensor[4, 4].mutable


def test_compiler_directives():
    assert nki.compiler.skip_middle_end_transformations(len) is len
    assert nki.compiler.sbuf.auto_alloc() is nl.sbuf


def test_activation_functions_and_elementwise_ops():
    x = np.abs(rand(4, 5)) + 0.1
    cases = {
        nl.rsqrt: 1 / np.sqrt(x),
        nl.square: x * x,
        nl.exp: np.exp(x),
        nl.log: np.log(x),
        nl.tanh: np.tanh(x),
        nl.sigmoid: 1 / (1 + np.exp(-x)),
        nl.silu: x / (1 + np.exp(-x)),
        nl.relu: x,
        nl.reciprocal: 1 / x,
    }
    for function, expected in cases.items():
        np.testing.assert_allclose(run(returning(function), x), expected, rtol=1e-5)
    y = rand(4, 5)
    chosen = run(returning(lambda a, b: nl.where(nl.greater(a, 0.5), a, b)), x, y)
    np.testing.assert_array_equal(chosen, np.where(x > 0.5, x, y))


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3, np.float16])
def test_matmul_low_precision_inputs_accumulate_in_float32(dtype):
    """nki.isa.nc_matmul: fp8/bf16/fp16/tf32/fp32 inputs, float32 accumulation."""
    x, y = rand(32, 16).astype(dtype), rand(32, 8).astype(dtype)
    out = run(returning(lambda a, b: nisa.nc_matmul(a, b)), x, y)
    assert out.dtype == np.float32
    expected = x.astype(np.float32).T @ y.astype(np.float32)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_var_softmax_expand_dims_and_derivatives():
    x = rand(4, 6)

    def kernel(a):
        t = nl.load(a)
        out = nl.ndarray((4, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:1], nl.var(t, axis=1))  # [4, 1]
        assert nl.expand_dims(nl.var(t, axis=1), 2).shape == (4, 1, 1)
        nl.store(out[:, 1:7], nl.softmax(t, axis=1))
        nl.store(out[:, 7:13], nl.silu_dx(t))
        nl.store(out[:, 13:16], nl.erf_dx(t[:, 0:3]))
        return out

    out = run(kernel, x)
    np.testing.assert_allclose(out[:, 0], x.var(axis=1), rtol=1e-5)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out[:, 1:7], e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    s = 1 / (1 + np.exp(-x))
    np.testing.assert_allclose(out[:, 7:13], s * (1 + x * (1 - s)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[:, 13:16], 2 / np.sqrt(np.pi) * np.exp(-x[:, :3] ** 2),
                               rtol=1e-5)  # fmt: skip


def test_load_transpose2d_and_dma_copy():
    def kernel(a):
        out = nl.ndarray((6, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        tile = nl.load_transpose2d(a)
        nisa.dma_copy(dst=out, src=tile)
        nisa.dma_copy(dst=out, src=tile, dst_rmw_op=np.add)
        return out

    x = rand(4, 6)
    np.testing.assert_allclose(run(kernel, x), 2 * x.T, rtol=1e-6)


def test_data_movement_runs_the_core_instructions():
    """nl.load/store run the core DMA and nl.copy/assignment the core tensor_copy: int32
    values beyond float32's 24-bit mantissa move and copy exactly (a bit copy), and the
    counters are the current generation's for the same transfers."""
    big = np.array([[2**24 + 1, -(2**30) - 3, 7]] * 4, np.int32)

    def kernel(x):
        tile = nl.load(x)
        copied = nl.copy(tile)
        assigned = nl.ndarray(x.shape, dtype=x.dtype)
        assigned[...] = copied
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, assigned)
        return out

    np.testing.assert_array_equal(run(kernel, big), big)
    counters = last_counters()
    assert counters["hbm_to_sbuf_bytes"] == big.nbytes == counters["sbuf_to_hbm_bytes"]
    assert counters["dma_transfers"] == 2
    assert counters["vector_instructions"] == 2


def test_a_dtype_view_of_an_immutable_parameter_is_that_parameter():
    @nki.jit
    def writes_through_a_view(x):
        nl.store(x.view(nl.int32), nl.full((2, 3), 7, nl.int32))
        return x

    x = np.zeros((2, 3), np.float32)
    with pytest.warns(errors.DeviceRanItWarning, match="immutable"):
        writes_through_a_view(x)
    np.testing.assert_array_equal(x.view(np.int32), 7)


def test_an_older_style_kernel_storing_into_its_output_argument_runs_with_a_warning():
    """Kernels of the older style take their output as an argument and ``nl.store`` into it
    without ``nt.mutable_tensor``, which the docs refuse
    (err_cannot_update_immutable_parameter) but devices ran: the shape of
    aws-neuron/neuronx-distributed examples/training/mamba2/mamba2/conv1d_grouped.py@8b29d69
    (``conv1d_grouped_kernel(input_data, w, b, output)``, a depthwise causal conv1d)."""

    @nki.jit
    def depthwise_conv1d(input_data, w, output):
        channels, n = input_data.shape
        ks = w.shape[1]
        i_p = nl.arange(channels)[:, None]
        i_y = nl.arange(n)[None, :]
        x = nl.zeros((channels, n + ks - 1), dtype=input_data.dtype)
        x[i_p, ks - 1 + i_y] = nl.load(input_data[i_p, i_y])
        w_tile = nl.load(w)
        conv = nl.zeros((channels, n), dtype=nl.float32)
        for i in nl.static_range(ks):
            conv[i_p, i_y] = conv[i_p, i_y] + nl.multiply(x[i_p, i + i_y], w_tile[i_p, i])
        nl.store(output[i_p, i_y], value=conv[i_p, i_y])

    data, weights = rand(16, 32), rand(16, 4)
    data_before = data.copy()
    output = np.zeros_like(data)
    with pytest.warns(errors.DeviceRanItWarning, match="output argument") as caught:
        assert depthwise_conv1d(data, weights, output) is None
    assert len(caught) == 1  # once per parameter, not once per store
    padded = np.pad(data, ((0, 0), (3, 0)))
    want = sum(padded[:, i : i + 32] * weights[:, i : i + 1] for i in range(4))
    np.testing.assert_allclose(output, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(data, data_before)  # what it only reads is left as it was


def test_affine_select_causal_mask():
    def kernel(a):
        i_p, i_f = nl.mgrid[0:4, 0:4]
        out = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nisa.affine_select(i_p - i_f >= 0, nl.load(a), -9984.0))
        return out

    x = rand(4, 4)
    np.testing.assert_array_equal(run(kernel, x), np.where(np.tril(np.ones((4, 4))) > 0, x, -9984))


def test_max8_and_find_index8():
    def kernel(a):
        t = nl.load(a)
        top = nisa.max8(src=t)
        out = nl.ndarray((3, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:8], top)
        nl.store(out[:, 8:16], nisa.nc_find_index8(data=t, vals=top))
        return out

    x = rand(3, 20)
    out = run(kernel, x)
    order = np.argsort(-x, axis=1)[:, :8]
    np.testing.assert_array_equal(out[:, :8], np.take_along_axis(x, order, axis=1))
    np.testing.assert_array_equal(out[:, 8:], order)


def test_scalar_tensor_tensor_and_copy_predicated():
    def kernel(a, b, v, p):
        t, u = nl.load(a), nl.load(b)
        out = nl.ndarray((4, 10), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:5], nisa.scalar_tensor_tensor(data=t, op0=np.subtract,
                 operand0=nl.load(v), op1=np.multiply, operand1=u))  # fmt: skip
        dst = nl.zeros((4, 5), dtype=nl.float32)
        nisa.tensor_copy_predicated(src=t, dst=dst, predicate=nl.load(p))
        nl.store(out[:, 5:10], dst)
        return out

    a, b, v = rand(4, 5), rand(4, 5), rand(4, 1)
    p = (RNG.random((4, 5)) > 0.5).astype(np.uint8)
    out = run(kernel, a, b, v, p)
    np.testing.assert_allclose(out[:, :5], (a - v) * b, rtol=1e-6)
    np.testing.assert_array_equal(out[:, 5:], np.where(p != 0, a, 0))


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 300),
    cols=st.integers(1, 40),
    step=st.integers(1, 3),
)
def test_masked_tiled_copy_property(rows, cols, step):
    """Any row count, tiled by 128 with the last tile masked, and a strided free-axis grid:
    the copy equals numpy's slicing, and rows past the end are never touched."""

    def kernel(x):
        width = (x.shape[1] + step - 1) // step
        out = nl.ndarray((x.shape[0], width), dtype=x.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.arange(128)[:, None], nl.arange(width)[None, :]
        for i in nl.affine_range((x.shape[0] + 127) // 128):
            valid = i * 128 + i_p < x.shape[0]
            tile = nl.load(x[i * 128 + i_p, step * i_f], mask=valid)
            nl.store(out[i * 128 + i_p, i_f], nl.copy(tile, mask=valid), mask=valid)
        return out

    x = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    np.testing.assert_array_equal(run(kernel, x), x[:, ::step])


def test_indirect_dma_with_index_tiles():
    """An integer SBUF tile indexes HBM (test_nki_nl_load_store_indirect.py); run-time
    indices outside the tensor raise (an IndexError, as the SDK simulator's), unless
    ``dma_copy(oob_mode=skip)`` skips them."""

    def gather(x, idx):
        i_p, i_f = nl.arange(4)[:, None], nl.arange(8)[None, :]
        rows = nl.load(idx[i_p])
        out = nl.ndarray((4, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x[rows[i_p, 0], i_f]))
        return out

    def skip(x, idx):
        i_p, i_f = nl.arange(4)[:, None], nl.arange(8)[None, :]
        rows = nl.load(idx[i_p])
        tile = nisa.memset((4, 8), -1.0, nl.float32)
        nisa.dma_copy(dst=tile, src=x[rows, i_f], oob_mode=nisa.oob_mode.skip)
        out = nl.ndarray((4, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, tile)
        return out

    x = rand(10, 8)
    idx = np.array([7, 0, 3, 3], np.int32)
    np.testing.assert_array_equal(run(gather, x, idx), x[idx])
    outside = np.array([7, 0, 12, 3], np.int32)
    with pytest.raises(IndexError):
        run(gather, x, outside)
    expected = x[np.minimum(outside, 9)]
    expected[2] = -1
    np.testing.assert_array_equal(run(skip, x, outside), expected)


def test_random_numbers_follow_the_seed():
    def kernel(x):
        nl.random_seed(5)
        first = nl.rand((4, 8))
        nl.random_seed(5)
        second = nl.rand((4, 8))
        out = nl.ndarray((4, 24), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:8], first)
        nl.store(out[:, 8:16], second)
        nl.store(out[:, 16:24], nisa.dropout(nl.load(x), 1.0))
        return out

    out = run(kernel, rand(4, 8))
    np.testing.assert_array_equal(out[:, 0:8], out[:, 8:16])
    assert ((out[:, 0:8] >= 0) & (out[:, 0:8] < 1)).all()
    assert (out[:, 16:24] == 0).all()  # probability 1 drops everything


def test_core_annotations_keep_the_grid():
    """``nl.nc``/``nl.spmd_dim`` only place programs on cores: the ids are unchanged."""

    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        i = nl.program_id(0)
        nl.store(out[i : i + 1, :], nl.load(x[i : i + 1, :]))
        return out

    x = rand(4, 3)
    np.testing.assert_array_equal(kernel[nl.spmd_dim(nl.nc(2), 2)](x), x)
    np.testing.assert_array_equal(kernel[nl.nc(2) * 2](x), x)


def test_kernel_may_return_a_private_hbm_tensor():
    """nki.simulate_kernel's own example returns an ``nl.hbm`` tensor (legacy only)."""

    def kernel(x):
        out = nl.empty_like(x, buffer=nl.hbm)
        nl.store(out, nl.load(x))
        return out

    x = rand(3, 4)
    np.testing.assert_array_equal(run(kernel, x), x)


def test_dynamic_offsets_and_gathers():
    """tensor_copy_dynamic_src/dst take views at run-time offsets (an SBUF value plus an
    index grid); gather_flattened indexes the flattened free elements per partition."""

    def kernel(x, offsets, positions):
        t, where, pos = nl.load(x), nl.load(offsets), nl.load(positions)
        ix, iy = nl.mgrid[0:4, 0:1]
        out = nl.ndarray((4, 9), dtype=nl.float32, buffer=nl.shared_hbm)
        picked = nl.ndarray((4, 3), dtype=nl.float32)
        for i in nl.affine_range(3):
            picked[ix, i] = nisa.tensor_copy_dynamic_src(t[ix, where[0, i] + iy])
        nl.store(out[:, 0:3], picked)
        placed = nl.zeros((4, 3), dtype=nl.float32)
        nisa.tensor_copy_dynamic_dst(dst=placed[ix, where[0, 0] - 2 + iy], src=t[ix, 0 + iy])
        nl.store(out[:, 3:6], placed)
        nl.store(out[:, 6:9], nl.gather_flattened(t, pos))
        return out

    x = rand(4, 6)
    offsets = np.array([[2, 5, 0]], np.int32)
    positions = np.array([[5, 0, 1]] * 4, np.uint32)
    out = run(kernel, x, offsets, positions)
    np.testing.assert_array_equal(out[:, 0:3], x[:, [2, 5, 0]])
    np.testing.assert_array_equal(out[:, 3], x[:, 0])
    assert (out[:, 4:6] == 0).all()
    np.testing.assert_array_equal(out[:, 6:9], x[:, [5, 0, 1]])


def test_atomic_rmw_applies_repeated_indices():
    def kernel(x, idx, value):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x))
        i_p, i_f = nl.arange(3)[:, None], nl.arange(4)[None, :]
        rows = nl.load(idx[i_p, 0])
        nl.atomic_rmw(out[rows[i_p, 0], i_f], value=nl.load(value), op=np.add)
        return out

    x, value = rand(5, 4), rand(3, 4)
    idx = np.array([[1], [1], [4]], np.int32)
    expected = x.copy()
    np.add.at(expected, idx[:, 0], value)
    np.testing.assert_allclose(run(kernel, x, idx, value), expected, rtol=1e-6)


def test_atomic_rmw_leaves_the_rest_of_the_tensor_exact():
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x))
        nl.atomic_rmw(out[0:1, 0:1], value=1, op=np.add)
        return out

    x = np.full((2, 3), 2**24 + 1, np.int32)
    expected = x.copy()
    expected[0, 0] += 1  # float32 accumulation: 2**24 + 2 is exact
    np.testing.assert_array_equal(run(kernel, x), expected)


def test_dma_transpose_permutations():
    x2, x3 = rand(2, 3), rand(2, 3, 4)
    np.testing.assert_array_equal(run(returning(lambda t: nisa.dma_transpose(t)), x2), x2.T)
    np.testing.assert_array_equal(
        run(returning(lambda t: nisa.dma_transpose(t, axes=(2, 1, 0))), x3),
        x3.transpose(2, 1, 0),
    )
    with pytest.raises(errors.ShapeMismatch):
        run(returning(lambda t: nisa.dma_transpose(t, axes=(0, 2, 1))), x3)


def test_range_select_and_select_reduce_accumulate_max(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")  # range_select: v3+

    def kernel(x, low, high, p):
        t, lo, hi, pred = nl.load(x), nl.load(low), nl.load(high), nl.load(p)
        maxima = nl.ndarray((4, 1), dtype=nl.float32)
        out = nl.ndarray((4, 14), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:6], nisa.range_select(
            on_true_tile=t, comp_op0=np.greater_equal, comp_op1=np.less, bound0=lo,
            bound1=hi, reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_res=maxima,
            reduce_op=np.max, range_start=0, on_false_value=nl.fp32.min))  # fmt: skip
        nl.store(out[:, 6:7], maxima)
        picked = nl.ndarray((4, 6), dtype=nl.float32)
        nisa.select_reduce(dst=picked, predicate=pred, on_true=t, on_false=-5.0,
                           reduce_res=maxima, reduce_cmd=nisa.reduce_cmd.reduce)  # fmt: skip
        nl.store(out[:, 7:13], picked)
        nl.store(out[:, 13:14], maxima)
        return out

    x = rand(4, 6)
    low, high = (
        np.array([[0], [1], [2], [5]], np.float32),
        np.array([[3], [4], [6], [6]], np.float32),
    )
    p = (RNG.random((4, 6)) > 0.5).astype(np.uint8)
    out = run(kernel, x, low, high, p)
    index = np.arange(6)
    window = (index >= low) & (index < high)
    selected = np.where(window, x, np.finfo(np.float32).min)
    np.testing.assert_array_equal(out[:, 0:6], selected)
    np.testing.assert_array_equal(out[:, 6], selected.max(axis=1))
    picked = np.where(p != 0, x, -5.0)
    np.testing.assert_array_equal(out[:, 7:13], picked)
    np.testing.assert_array_equal(out[:, 13], np.maximum(selected.max(axis=1), picked.max(axis=1)))
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    with pytest.raises(errors.UnsupportedOperator, match="NeuronCore-v3"):  # the core's rule
        run(kernel, x, low, high, p)


def test_sequence_bounds():
    ids = np.array([[1, 1, 2, 2, 2, 0, 3]], np.int32)
    out = run(returning(lambda t: nisa.sequence_bounds(segment_ids=t)), ids)
    np.testing.assert_array_equal(out[0], [[0, 0, 2, 2, 2, 7, 6], [2, 2, 5, 5, 5, -1, 7]])
    assert last_counters()["gpsimd_instructions"] == 1
    with pytest.raises(errors.UnsupportedDtype):
        run(returning(lambda t: nisa.sequence_bounds(segment_ids=t)), ids.astype(np.float16))


def test_match_replace8_stream_shuffle_and_view():
    def kernel(x, raw):
        t = nl.load(x)
        top = nisa.max8(src=t)
        where = nl.ndarray((32, 8), dtype=nl.uint32)
        out = nl.ndarray((32, 28), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:12], nisa.nc_match_replace8(data=t, vals=top, imm=-1.0,
                                                      dst_idx=where))  # fmt: skip
        nl.store(out[:, 12:20], where)
        shuffled = nl.zeros((32, 4), dtype=nl.float32)
        nisa.nc_stream_shuffle(t[:, 0:4], shuffled, [31 - i for i in range(32)])
        nl.store(out[:, 20:24], shuffled)
        nl.store(out[:, 24:28], nl.load(raw.view(nl.float32)))
        return out

    x = rand(32, 12)
    bits = x[:, :4].view(np.int32).copy()
    out = run(kernel, x, bits)
    order = np.argsort(-x, axis=1)[:, :8]
    replaced = x.copy()
    np.put_along_axis(replaced, order, -1.0, axis=1)
    np.testing.assert_array_equal(out[:, 0:12], replaced)
    np.testing.assert_array_equal(out[:, 12:20], order)
    np.testing.assert_array_equal(out[:, 20:24], x[::-1, 0:4])
    np.testing.assert_array_equal(out[:, 24:28], x[:, :4])


def test_mgrid_axes_by_name():
    def kernel(x):
        g = nl.mgrid[0:2, 0:3, 0:4]
        out = nl.ndarray((2, 3, 4), dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out[g.p, g.x, g.y], nl.load(x[g.p, g.x, g.y]))
        return out

    x = rand(2, 3, 4)
    np.testing.assert_array_equal(run(kernel, x), x)


def test_bitvec_operators_keep_integers_exact():
    """Bitvec operators treat elements as bit patterns (no float32 rounding), arithmetic
    reductions take any arithmetic operator (subtract too)."""
    big = np.array([[2**30 + 1, 2**29 + 3, 7]], np.int32)

    def kernel(x):
        t = nl.load(x)
        out = nl.ndarray((1, 7), dtype=nl.int32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:3], nl.bitwise_xor(t, 1))
        nl.store(out[:, 3:6], nisa.tensor_scalar(t, np.bitwise_and, 0xFF, op1=np.left_shift,
                                                 operand1=1))  # fmt: skip
        nl.store(out[:, 6:7], nisa.tensor_reduce(np.bitwise_or, t, axis=1, keepdims=True))
        return out

    out = run(kernel, big)
    np.testing.assert_array_equal(out[0, 0:3], big[0] ^ 1)
    np.testing.assert_array_equal(out[0, 3:6], (big[0] & 0xFF) << 1)
    assert out[0, 6] == np.bitwise_or.reduce(big[0])
    x = rand(2, 4)
    out = run(returning(lambda t: nisa.tensor_reduce(np.subtract, t, axis=1, keepdims=True)), x)
    np.testing.assert_allclose(out[:, 0], x[:, 0] - x[:, 1] - x[:, 2] - x[:, 3], rtol=1e-5)
    with pytest.raises(errors.UnsupportedDtype):
        run(returning(lambda t: nl.bitwise_and(t, 1)), x)


def test_parameters_are_immutable_unless_annotated():
    """nki.errors.rst: err_cannot_update_immutable_parameter and
    err_mutable_parameter_not_returned (nki.trace kernels of 2.20 write output arguments)."""

    @nki.jit
    def writes_input(x):
        nl.store(x, nl.load(x) + 1.0)
        return x

    @nki.jit
    def mutable(x: nt.mutable_tensor):
        nl.store(x, nl.load(x) + 1.0)
        return x

    @nki.jit
    def forgets_to_return(x: nt.mutable_tensor):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(x, nl.load(x) + 1.0)
        nl.store(out, nl.load(x))
        return out

    x = np.zeros((2, 3), np.float32)
    with pytest.warns(errors.DeviceRanItWarning):  # the docs refuse it; devices ran it
        writes_input(x)
    np.testing.assert_array_equal(x, np.ones((2, 3)))
    np.testing.assert_array_equal(mutable(x), np.full((2, 3), 2.0))
    np.testing.assert_array_equal(x, np.full((2, 3), 2.0))  # updated in place, as on device
    with pytest.raises(errors.ErrMutableParameterNotReturned):
        forgets_to_return(x)


def test_documented_misuse_raises_the_sdk_error():
    def mixed_indexing(x):
        nl.load(x[nl.arange(2)[:, None], :])

    def branch_on_grid(x):
        i = nl.arange(2)[:, None]
        if i > 0:
            nl.load(x)

    @nki.jit
    def inner(x):
        return x

    def nested_grid(x):
        inner[2](x)

    for kernel, error in (
        (mixed_indexing, errors.ErrUnsupportedMixingBasicAdvancedTensorIndexing),
        (branch_on_grid, errors.ErrControlFlowConditionDependingOnArange),
        (nested_grid, errors.ErrNestedKernelWithSpmdGrid),
    ):
        with pytest.raises(error):
            run(kernel, rand(2, 3))
    with pytest.raises(errors.ErrCannotAssignToIndex):
        nl.arange(4)[None, :][0, 1] = 3


# -- what AWS's reference kernels rely on (issue 24) -----------------------------------------
def test_loop_reduce_combines_into_its_destination():
    def kernel(x):
        acc = nl.zeros((2, nl.par_dim(4), 3), dtype=nl.float32)
        for i in nl.affine_range(3):
            acc[1, :, :] = nl.loop_reduce(nl.load(x), op=np.add, loop_indices=(i,))
        with pytest.raises(TypeError):  # not a tile: assign it into a view
            nl.exp(nl.loop_reduce(nl.load(x), op=np.add, loop_indices=(0,)))
        out = nl.ndarray((4, 3), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, acc[1])
        return out

    x = rand(4, 3)
    np.testing.assert_allclose(run(kernel, x), 3 * x, rtol=1e-6)


def test_fewer_indices_than_block_dims_keep_the_rest():
    def kernel(x):
        blocks = nl.zeros((2, 3, nl.par_dim(4), 1), dtype=nl.float32)
        inner = blocks[1]  # one block dimension left
        inner[2, :, 0] = nl.load(x)
        out = nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, blocks[1, 2])
        return out

    x = rand(4, 1)
    np.testing.assert_array_equal(run(kernel, x), x)


def test_live_tiles_over_capacity_spill_with_a_warning():
    """This generation's compiler spills (nki-samples attention.py@8370e11); a single tile
    larger than the memory still fails (test_on_chip_limits)."""

    def kernel(x):
        tiles = [nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(9)]
        return x if tiles else None

    with pytest.warns(errors.SpillWarning, match="spills"):
        run(kernel, rand(1, 1))


def test_hbm_handles_are_truthy_and_nki_tensor_is_the_tensor_type():
    def kernel(x):
        assert x  # an HBM handle (nki/test/test_nki_isa_tensor_scalar_cumulative.py)
        assert isinstance(x, nki.tensor)
        with pytest.raises(errors.AmbiguousTensorTruthValue):
            bool(nl.load(x))
        return x

    run(kernel, rand(2, 2))


def test_run_time_out_of_bounds_is_numpys_index_error():
    """The SDK simulator's error, verbatim (nki/test/test_nki_isa_dma_copy.py@81ce03a)."""

    def kernel(x):
        rows = nisa.iota(3 * nl.arange(4)[:, None], dtype=np.int32)  # 0, 3, 6, 9 of 8 rows
        i_f = nl.arange(2)[None, :]
        return nl.load(x[rows, i_f])

    with pytest.raises(IndexError, match=r"^index 18 is out of bounds for axis 0 with size 16$"):
        run(kernel, rand(8, 2))


def test_bn_stats_and_bn_aggr_agree_across_generations():
    """One implementation (alu.batch_norm_stats / batch_norm_aggregate): bit-identical."""
    from asickernels.simulate import nki as current
    from asickernels.simulate.nki import isa as core_isa
    from asickernels.simulate.nki import language as core_nl

    def legacy_kernel(x):
        out = nl.ndarray((x.shape[0], 8), dtype=nl.float32, buffer=nl.shared_hbm)
        stats = nisa.bn_stats(nl.load(x))
        nl.store(out[:, 0:6], stats)
        nl.store(out[:, 6:8], nisa.bn_aggr(stats))
        return out

    def core_kernel(x):
        tile = core_nl.load(x)
        stats = core_nl.ndarray((x.shape[0], 6), dtype=core_nl.float32)
        core_isa.bn_stats(stats, tile)
        aggr = core_nl.ndarray((x.shape[0], 2), dtype=core_nl.float32)
        core_isa.bn_aggr(aggr, stats)
        out = core_nl.ndarray((x.shape[0], 8), dtype=core_nl.float32, buffer=core_nl.shared_hbm)
        core_isa.dma_copy(dst=out[:, 0:6], src=stats)
        core_isa.dma_copy(dst=out[:, 6:8], src=aggr)
        return out

    x = rand(16, 37) * 100
    np.testing.assert_array_equal(run(legacy_kernel, x), current.simulate(core_kernel)(x))


def test_match_replace8_duplicate_vals_follow_each_generations_reference():
    """One implementation, the slot order a parameter: the 2.26 reference's NumPy equivalent
    matches vals slots 0 to 7, the 2.32 reference 7 down to 0 (its own example)."""
    from asickernels.simulate import nki as current
    from asickernels.simulate.nki import isa as core_isa
    from asickernels.simulate.nki import language as core_nl

    def legacy_kernel(d, v):
        where = nl.ndarray((1, 8), dtype=nl.uint32)
        nisa.nc_match_replace8(data=nl.load(d), vals=nl.load(v), imm=0.0, dst_idx=where)
        out = nl.ndarray((1, 8), dtype=nl.uint32, buffer=nl.shared_hbm)
        nl.store(out, where)
        return out

    def core_kernel(d, v):
        data, vals = core_nl.load(d), core_nl.load(v)
        replaced = core_nl.ndarray(data.shape, dtype=core_nl.float32)
        where = core_nl.ndarray((1, 8), dtype=core_nl.uint32)
        core_isa.nc_match_replace8(replaced, data, vals, 0.0, dst_idx=where)
        out = core_nl.ndarray((1, 8), dtype=core_nl.uint32, buffer=core_nl.shared_hbm)
        core_isa.dma_copy(dst=out, src=where)
        return out

    data = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8]], np.float32)
    vals = np.array([[3, 8, 8, 8, 8, 8, 8, 8]], np.float32)
    assert run(legacy_kernel, data, vals).tolist() == [[2, 4, 5, 6, 7, 8, 9, 10]]
    assert current.simulate(core_kernel)(data, vals).tolist() == [[2, 10, 9, 8, 7, 6, 5, 4]]


def test_activation_reduces_with_any_alu_operator():
    """2.26 reference: ``accu_registers = reduce_op(accu_registers, reduce_op(output))``
    (the current API takes nl.add only)."""

    def kernel(x):
        sums = nl.ndarray((4, 1), dtype=nl.float32)
        nisa.activation(nl.exp, nl.load(x), reduce_op=nl.max, reduce_res=sums,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)  # fmt: skip
        out = nl.ndarray((4, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, sums)
        return out

    x = rand(4, 9)
    np.testing.assert_allclose(run(kernel, x), np.exp(x).max(axis=1, keepdims=True), rtol=1e-6)


def test_iota_and_affine_select_take_affine_expressions():
    """2.26 reference: ``expr``/``pred`` are affine expressions, and ``pred`` "can't be
    multiple masks combined using logical operators such as & and |"."""
    i_p, i_f = nl.arange(4)[:, None], nl.arange(4)[None, :]

    def combined(t):
        return nisa.affine_select((i_p < 2) & (i_f > 0), t, 0.0)

    with pytest.raises(TypeError, match="one affine comparison"):
        run(returning(combined), rand(4, 4))
    with pytest.raises(TypeError, match="affine expression"):
        run(returning(lambda t: nisa.iota(i_p % 2 + i_f, dtype=nl.int32)), rand(4, 4))
    np.testing.assert_array_equal(
        run(returning(lambda t: nisa.iota(5 - 2 * i_p + 3 * i_f, dtype=nl.int32)), rand(4, 4)),
        5 - 2 * np.arange(4)[:, None] + 3 * np.arange(4)[None, :],
    )
