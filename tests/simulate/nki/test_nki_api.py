"""The current NKI API, function by function, against the semantics its 2.32 reference
documents (aws-neuron-sdk@81ce03a nki/api/nki/{language,isa}/__init__.py): each test
computes the documented result independently with numpy."""

from __future__ import annotations

import math
import warnings

import ml_dtypes
import numpy as np
import pytest

from asickernels.simulate import nki
from asickernels.simulate.nki import errors
from asickernels.simulate.nki import isa as nisa
from asickernels.simulate.nki import language as nl
from asickernels.simulate.nki import typing as nt


def run(kernel, *args):
    return nki.simulate(kernel)(*args)


def returning(function):
    """A kernel loading its arguments, applying ``function`` to the tiles and storing the
    resulting tile."""

    def kernel(*arrays):
        result = function(*(nl.load(a) for a in arrays))
        out = nl.ndarray(result.shape, dtype=result.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=result if result.buffer is nl.sbuf else nl.copy(result))
        return out

    return kernel


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def erf(x):
    return np.vectorize(math.erf)(x)


# nl functions that mean numpy's function of the same name
UNARY_AS_NUMPY = "exp log sqrt tanh sin cos tan arctan abs square negative sign ceil floor trunc"
BINARY_AS_NUMPY = "power logical_and logical_or logical_xor greater_equal not_equal"
UNARY = {  # nl function: its documented meaning
    **{name: getattr(np, name) for name in UNARY_AS_NUMPY.split()},
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "reciprocal": lambda x: 1 / x,
    "sigmoid": sigmoid,
    "relu": lambda x: np.maximum(x, 0),
    "silu": lambda x: x * sigmoid(x),
    "gelu": lambda x: 0.5 * x * (1 + erf(x / np.sqrt(2))),
    "gelu_apprx_tanh": lambda x: (
        0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    ),
    "softplus": lambda x: np.log1p(np.exp(x)),
    "mish": lambda x: x * np.tanh(np.log1p(np.exp(x))),
    "erf": erf,
    "erf_dx": lambda x: 2 / np.sqrt(np.pi) * np.exp(-(x**2)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_math_and_activations(name, rng):
    x = (rng.uniform(0.1, 2.0, (8, 16)) * rng.choice([-1, 1], (8, 16))).astype(np.float32)
    if name in ("log", "sqrt", "rsqrt"):
        x = np.abs(x)
    result = run(returning(getattr(nl, name)), x)
    np.testing.assert_allclose(result, UNARY[name](x.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_derivative_activations_match_finite_differences(rng):
    x = rng.uniform(-2, 2, (4, 32)).astype(np.float32)
    step = 1e-3
    for derivative, function in (
        ("gelu_dx", "gelu"),
        ("silu_dx", "silu"),
        ("gelu_apprx_sigmoid_dx", "gelu_apprx_sigmoid"),
    ):
        forward = UNARY.get(function) or (lambda v: v * sigmoid(1.702 * v))
        slope = (forward(x + step) - forward(x - step)) / (2 * step)
        np.testing.assert_allclose(run(returning(getattr(nl, derivative)), x), slope, atol=1e-3)


BINARY = {
    **{name: getattr(np, name) for name in BINARY_AS_NUMPY.split()},
    "abs_max": lambda x, y: np.maximum(np.abs(x), np.abs(y)),
    "abs_min": lambda x, y: np.minimum(np.abs(x), np.abs(y)),
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_math(name, rng):
    x = rng.uniform(0.5, 2.0, (4, 8)).astype(np.float32)
    y = np.round(rng.uniform(0.0, 3.0, (4, 8))).astype(np.float32)
    np.testing.assert_allclose(
        run(returning(getattr(nl, name)), x, y), BINARY[name](x, y), rtol=1e-6
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("bitwise_and", np.bitwise_and),
        ("bitwise_or", np.bitwise_or),
        ("bitwise_xor", np.bitwise_xor),
        ("left_shift", lambda x, y: np.left_shift(x, y % 8)),
        ("right_shift", lambda x, y: np.right_shift(x, y % 8)),
    ],
)
def test_bitwise_operators_read_bit_patterns(name, expected, rng):
    x = rng.integers(0, 2**20, (4, 8)).astype(np.int32)
    y = rng.integers(0, 2**20, (4, 8)).astype(np.int32)
    if "shift" in name:
        y %= 8
    np.testing.assert_array_equal(run(returning(getattr(nl, name)), x, y), expected(x, y))
    np.testing.assert_array_equal(run(returning(nl.invert), x), np.invert(x))
    with pytest.raises(errors.UnsupportedDtype, match="integer"):
        run(returning(getattr(nl, name)), x.astype(np.float32), y)


@pytest.mark.parametrize(
    ("name", "expected"), [("mean", np.mean), ("prod", np.prod), ("var", np.var)]
)
def test_reductions(name, expected, rng):
    x = rng.normal(size=(4, 3, 5)).astype(np.float32)
    reduce = getattr(nl, name)
    result = run(returning(lambda t: reduce(t, axis=[1, 2], keepdims=True)), x)
    np.testing.assert_allclose(result[:, 0, 0], expected(x, axis=(1, 2)), rtol=1e-5)
    flags = (x > -1.0).astype(np.float32)
    np.testing.assert_array_equal(
        run(returning(lambda t: nl.all(t, axis=2)), flags), flags.all(axis=2)
    )


def test_softmax_and_rms_norm(rng):
    x = rng.normal(size=(8, 32)).astype(np.float32)
    w = rng.normal(size=(8, 32)).astype(np.float32)
    shifted = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(
        run(returning(lambda t: nl.softmax(t, axis=1)), x),
        shifted / shifted.sum(1, keepdims=True),
        rtol=1e-5,
    )
    rms = np.sqrt(np.square(x).sum(axis=1, keepdims=True) / 32 + 1e-6)
    np.testing.assert_allclose(
        run(returning(lambda t, v: nl.rms_norm(t, v, axis=1, n=32)), x, w), x / rms * w, rtol=1e-5
    )


def test_broadcast_to_repeats_size_one_axes_including_the_partition_axis(rng):
    row = rng.normal(size=(1, 6)).astype(np.float32)
    np.testing.assert_array_equal(
        run(returning(lambda t: nl.broadcast_to(t, (4, 6))), row), np.repeat(row, 4, 0)
    )
    with pytest.raises(errors.ShapeMismatch):
        run(returning(lambda t: nl.broadcast_to(t, (4, 3))), row)


def test_matmul_transpose_and_identity(rng):
    x = rng.normal(size=(32, 16)).astype(np.float32)
    y = rng.normal(size=(16, 64)).astype(np.float32)
    np.testing.assert_allclose(run(returning(nl.matmul), x, y), x @ y, rtol=1e-5, atol=1e-5)
    x_t = np.ascontiguousarray(x.T)
    np.testing.assert_allclose(
        run(returning(lambda a, b: nl.matmul(a, b, transpose_x=True)), x_t, y),
        x @ y,
        rtol=1e-5,
        atol=1e-5,
    )
    np.testing.assert_array_equal(run(returning(nl.transpose), x), x.T)
    eye = run(returning(lambda t: nl.shared_identity_matrix(4, dtype=nl.float32)), x)
    np.testing.assert_array_equal(eye, np.eye(4))


def test_creation_and_gathers(rng):
    x = rng.normal(size=(4, 8)).astype(np.float32)
    indices = rng.integers(0, 8, (4, 5)).astype(np.int32)
    gathered = run(returning(lambda t, i: nl.gather_flattened(t, i)), x, indices)
    np.testing.assert_array_equal(gathered, np.take_along_axis(x, indices, axis=1))

    def like(t):
        zeros = nl.zeros_like(t)
        assert nl.empty_like(t, dtype=nl.int32).dtype == nl.int32
        return zeros

    np.testing.assert_array_equal(run(returning(like), x), 0)

    def transposed(src):
        out = nl.ndarray(src.shape[::-1], dtype=src.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load_transpose2d(src))
        return out

    np.testing.assert_array_equal(run(transposed, x), x.T)


def test_loops_and_program_ids_without_a_grid():
    seen = []

    def kernel(x):
        nl.fori_loop(0, 3, lambda i: seen.append(i.value))  # i: an NkiScalar (NKI 0.7)
        seen.append((nl.program_id(0), nl.num_programs(), nl.program_ndim()))
        with nl.no_reorder():
            return x

    run(kernel, np.zeros((1, 1), np.float32))
    assert seen == [0, 1, 2, (0, 1, 0)]


def test_ndarray_address_is_checked_against_the_partition():
    def kernel(x):
        tile = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf, address=(0, 1024))
        with pytest.raises(errors.TensorAccessOutOfBound):
            nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf, address=(1, 0))
        with pytest.raises(errors.TensorAccessOutOfBound):
            nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.psum, address=(0, 16 * 1024))
        return tile.shape

    assert run(kernel, np.zeros((1, 1), np.float32)) == (128, 4)


# -- dtypes ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "storage"),
    [
        ("float8_e4m3", ml_dtypes.float8_e4m3),
        ("float8_e5m2", ml_dtypes.float8_e5m2),
        ("float8_e4m3fn", ml_dtypes.float8_e4m3fn),
        ("bfloat16", ml_dtypes.bfloat16),
    ],
)
def test_low_precision_tiles_round_like_ml_dtypes(name, storage, rng):
    x = rng.normal(size=(4, 16)).astype(np.float32)
    result = run(returning(lambda t: nl.copy(t, dtype=getattr(nl, name))), x)
    np.testing.assert_array_equal(result.astype(np.float32), x.astype(storage).astype(np.float32))


def test_tfloat32_keeps_ten_mantissa_bits():
    x = np.array([[1 + 2**-10, 1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-12]], np.float32)
    result = run(returning(lambda t: nl.copy(t, dtype=nl.tfloat32)), x)
    # round to nearest, ties to even on the 10-bit mantissa
    np.testing.assert_array_equal(result.astype(np.float32), [[1 + 2**-10, 1.0, 1 + 2**-9, 1.0]])


def test_packed_mx_types_are_bytes_only_mx_instructions_read():
    def kernel(x):
        packed = nl.ndarray((32, 4), dtype=nl.float8_e5m2_x4, buffer=nl.sbuf)
        assert packed.dtype.itemsize == 4 and nl.float4_e2m1fn_x4.itemsize == 2
        with pytest.raises(errors.UnsupportedDtype, match="packed"):
            nl.exp(packed)
        # cleared, as nki-library clears the padding of its MX weight tiles; nothing else
        nisa.memset(dst=packed, value=0.0)
        assert not packed.values.view(np.uint8).any()
        with pytest.raises(errors.UnsupportedDtype, match="only be cleared"):
            nisa.memset(dst=packed, value=1.0)
        return x

    run(kernel, np.zeros((1, 1), np.float32))


# -- tensor views -----------------------------------------------------------------------
def test_view_methods_share_storage():
    def kernel(x):
        t = nl.load(x)  # [4, 6]
        assert t.strides == (6, 1) and t.offset == 0
        assert t[:, 2:].offset == 2 and t[1:, :].strides == (6, 1)
        assert t.slice(1, 0, 6, 2).shape == (4, 3) and t.slice(1, 0, 6, 2).strides == (6, 2)
        split = t.reshape_dim(1, (2, -1))
        assert split.shape == (4, 2, 3)
        assert split.flatten_dims(1, 2).shape == (4, 6)
        assert split.select(1, 1).shape == (4, 3)
        assert split[:, :, 0:1].squeeze_dim(2).shape == (4, 2)
        assert t.rearrange(("p", ("h", "w")), ("p", "w", "h"), {"h": 2}).shape == (4, 3, 2)
        assert t.is_contiguous() and not t.slice(1, 0, 6, 2).is_contiguous()
        assert t.get_pattern() == [[6, 4], [1, 6]]
        assert not t.is_indirect()
        as_bytes = t.view(nl.uint8)
        assert as_bytes.shape == (4, 24) and t.reinterpret_cast(nl.int32).shape == (4, 6)
        out = nl.ndarray((4, 3, 2), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t.rearrange(("p", ("h", "w")), ("p", "w", "h"), {"h": 2}))
        return out

    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    np.testing.assert_array_equal(run(kernel, x), x.reshape(4, 2, 3).transpose(0, 2, 1))


@pytest.mark.parametrize("address", [None, (0, 4096)])
def test_access_pattern_addresses_storage_and_writes_through(address):
    """Also for a tensor placed at an address (a view of physical memory whose partitions
    lie further apart): the pattern counts in the tensor's own row-major layout."""

    def kernel(x):
        tile = nl.ndarray(x.shape, dtype=x.dtype, address=address)  # [4, 8]
        nisa.dma_copy(dst=tile, src=x)
        odd_columns = tile.ap([[8, 4], [2, 4]], offset=1)
        nisa.memset(dst=odd_columns, value=-1.0)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, tile)
        past_the_rows = tile.ap([[8, 4], [1, 9]])  # an error only when accessed
        with pytest.raises(errors.TensorAccessOutOfBound, match=r"rows \[0, 1, 2, 3\]"):
            nisa.memset(dst=past_the_rows, value=0.0)
        with pytest.raises(errors.LeadingDimensionOfTensorMustBePartition):
            tile.ap([[4, 8], [1, 4]])  # a partition stride that is not a whole partition
        return out

    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    expected = x.copy()
    expected[:, 1::2] = -1
    np.testing.assert_array_equal(run(kernel, x), expected)


def test_access_pattern_on_a_view_may_step_partitions_by_the_views_free_size():
    """nki-library's TensorView re-patterns a view with its own free size as the partition
    step (the gate and up halves of one [T, 2 * I] buffer, mlp_tkg_gate_up_projection.py):
    one partition, the view's offset kept."""

    def kernel(x):
        both = nl.ndarray((4, 12), dtype=x.dtype)
        nisa.memset(dst=both, value=0.0)
        up = both.slice(dim=1, start=6, end=12)  # [4, 6] at offset 6
        nisa.dma_copy(dst=up.ap([[6, 4], [1, 3]], offset=2), src=x)  # columns 8..10
        with pytest.raises(errors.LeadingDimensionOfTensorMustBePartition):
            up.ap([[3, 4], [1, 3]])  # neither the storage's nor the view's free size
        out = nl.ndarray((4, 12), dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, both)
        return out

    x = np.arange(12, dtype=np.float32).reshape(4, 3) + 1
    expected = np.zeros((4, 12), np.float32)
    expected[:, 8:11] = x
    np.testing.assert_array_equal(run(kernel, x), expected)


def test_dynamic_select_and_scalar_offset_read_the_index_tensor():
    def kernel(x, index):
        i = nl.load(index)
        picked = x.select(0, i)
        assert picked.is_indirect()
        out = nl.ndarray((2, 3), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x.ap([[3, 2], [1, 3]], scalar_offset=i, indirect_dim=0))
        return out, nl.copy(nl.load(picked.reshape((1, 3)))).shape

    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    out, shape = run(kernel, x, np.array([[1]], np.int32))
    np.testing.assert_array_equal(out, x[1:3])
    assert shape == (1, 3)


@pytest.mark.parametrize("expert", [0, 1, 2, 3])
def test_a_pattern_past_the_tensor_fails_only_where_it_is_accessed(expert):
    """nki-library@d2ad3a5's MoE kernel DMAs expert ``scalar_offset`` rows with
    oob_mode.skip, the expert index running past the last (bwmm_shard_on_block.py:1441-1454):
    the rows outside move nothing, the rows inside move; oob_mode.error refuses the DMA.
    Its output projection builds a pattern past a tile and never uses it
    (output_projection_tkg.py:932-948): no error."""

    def kernel(x, index):
        i = nl.load(index)
        tile = nl.ndarray((2, 3), dtype=x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=tile, value=-1.0)
        tile.ap([[3, 2], [1, 4]])  # each row runs past its partition: unused, no error
        experts = x.ap([[3, 2], [1, 3]], scalar_offset=i, indirect_dim=0)  # rows i, i + 1
        nisa.dma_copy(dst=tile, src=experts, oob_mode=nisa.oob_mode.skip)
        out = nl.ndarray((2, 3), dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=tile)
        if expert >= 2:
            with pytest.raises(errors.TensorAccessOutOfBound, match="lie outside the tensor"):
                nisa.dma_copy(dst=tile, src=experts)
        return out

    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    expected = np.full((2, 3), -1.0, np.float32)
    inside = x[expert : expert + 2]
    expected[: len(inside)] = inside
    np.testing.assert_array_equal(run(kernel, x, np.array([[expert]], np.int32)), expected)


def test_typing_annotations():
    assert nt.tensor[128, 512].shape == (128, 512)
    annotation = nt.tensor[[8192, 4096], nl.bfloat16]
    assert annotation.shape == (8192, 4096) and annotation.dtype == nl.bfloat16
    assert repr(nt.mutable_tensor) == "mutable_tensor"


# -- nisa ---------------------------------------------------------------------------------
def isa_kernel(instruction, out_shape, out_dtype=np.float32):
    """A kernel loading its arguments and running ``instruction(dst, *tiles)`` into a new
    SBUF tile of ``out_shape``."""

    def kernel(*arrays):
        dst = nl.ndarray(out_shape, dtype=out_dtype, buffer=nl.sbuf)
        instruction(dst, *(nl.load(a) for a in arrays))
        out = nl.ndarray(out_shape, dtype=out_dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=dst)
        return out

    return kernel


def test_activation_scale_bias_and_reduction(rng):
    x = rng.normal(size=(8, 16)).astype(np.float32)
    scale = rng.normal(size=(8, 1)).astype(np.float32)
    bias = rng.normal(size=(8, 1)).astype(np.float32)

    def kernel(data, s, b):
        tiles = [nl.load(a) for a in (data, s, b)]
        dst = nl.ndarray(data.shape, dtype=nl.float32)
        total = nl.ndarray((8, 1), dtype=nl.float32)
        nisa.activation(
            dst=dst,
            op=nl.tanh,
            data=tiles[0],
            scale=tiles[1],
            bias=tiles[2],
            reduce_op=nl.add,
            reduce_res=total,
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )
        nisa.activation_reduce(dst=dst, op=nl.copy, data=dst, reduce_op=nl.add, reduce_res=total)
        out = nl.ndarray((8, 17), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:16], dst)
        nl.store(out[:, 16:17], total)
        return out

    out = run(kernel, x, scale, bias)
    expected = np.tanh(x * scale + bias)
    np.testing.assert_allclose(out[:, :16], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[:, 16], expected.sum(axis=1), rtol=1e-4, atol=1e-5)


def test_tensor_tensor_scan_recurrence(rng):
    """result[:, i] = op1(op0(data0[:, i], result[:, i-1]), data1[:, i])."""
    a = rng.uniform(0, 1, (4, 32)).astype(np.float32)
    b = rng.uniform(0, 1, (4, 32)).astype(np.float32)
    out = run(
        isa_kernel(
            lambda d, x, y: nisa.tensor_tensor_scan(d, x, y, 0.5, nl.multiply, nl.add), (4, 32)
        ),
        a,
        b,
    )
    expected = np.zeros_like(a, dtype=np.float64)
    state = np.full(4, 0.5)
    for i in range(32):
        state = a[:, i] * state + b[:, i]
        expected[:, i] = state
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_tensor_reduce_subtract_and_bitwise(rng):
    x = rng.normal(size=(4, 6)).astype(np.float32)
    out = run(isa_kernel(lambda d, t: nisa.tensor_reduce(d, nl.subtract, t, axis=1), (4, 1)), x)
    np.testing.assert_allclose(out[:, 0], x[:, 0] - x[:, 1:].sum(axis=1), rtol=1e-5)
    bits = rng.integers(0, 2**16, (4, 6)).astype(np.int32)
    out = run(
        isa_kernel(lambda d, t: nisa.tensor_reduce(d, nl.bitwise_or, t, axis=1), (4, 1), np.int32),
        bits,
    )
    np.testing.assert_array_equal(out[:, 0], np.bitwise_or.reduce(bits, axis=1))


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        (nl.average, lambda x: x.mean(axis=0)),
        (nl.mean, lambda x: x.mean(axis=0)),  # NKI 0.7's name for it
        (nl.bitwise_and, lambda x: np.bitwise_and.reduce(x, axis=0)),
        (nl.bitwise_or, lambda x: np.bitwise_or.reduce(x, axis=0)),
        (nl.bitwise_xor, lambda x: np.bitwise_xor.reduce(x, axis=0)),  # NKI 0.7
    ],
)
def test_tensor_partition_reduce_documented_ops(op, expected, rng):
    x = rng.integers(0, 64, (8, 4)).astype(np.int32)
    out = run(
        isa_kernel(
            lambda d, t: nisa.tensor_partition_reduce(d, op, t),
            (1, 4),
            np.float32 if op in (nl.average, nl.mean) else np.int32,
        ),
        x,
    )
    np.testing.assert_allclose(out[0], expected(x))


def test_tensor_scalar_on_gpsimd_for_rsqrt(rng):
    x = rng.uniform(0.5, 2, (4, 8)).astype(np.float32)
    out = run(
        isa_kernel(
            lambda d, t: nisa.tensor_scalar(d, t, nl.rsqrt, 0.0, engine=nisa.engine.gpsimd), (4, 8)
        ),
        x,
    )
    np.testing.assert_allclose(out, 1 / np.sqrt(x), rtol=1e-6)
    assert nki.last_counters()["gpsimd_instructions"] == 1


def matmul_kernel(stationary_dtype, moving_dtype, **options):
    def kernel(stationary, moving):
        s = nl.load(stationary, dtype=stationary_dtype)
        m = nl.load(moving, dtype=moving_dtype)
        shape = (s.shape[-1], m.shape[-1])
        dst = nl.ndarray(shape, dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst, s, m, **options)
        out = nl.ndarray(shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(dst))
        return out

    return kernel


@pytest.mark.parametrize(
    ("stationary", "moving", "storage"),
    [
        ("float8_e4m3", "float8_e5m2", (ml_dtypes.float8_e4m3, ml_dtypes.float8_e5m2)),
        ("float8_e4m3fn", "bfloat16", (ml_dtypes.float8_e4m3fn, ml_dtypes.bfloat16)),
        ("tfloat32", "float32", ("tfloat32", np.float32)),
    ],
)
def test_matmul_takes_fp8_and_tfloat32_operands(stationary, moving, storage, rng):
    k_m = rng.normal(size=(64, 32)).astype(np.float32)
    k_n = rng.normal(size=(64, 48)).astype(np.float32)
    out = run(matmul_kernel(getattr(nl, stationary), getattr(nl, moving)), k_m, k_n)
    s = to_tfloat32(k_m) if storage[0] == "tfloat32" else k_m.astype(storage[0])
    m = k_n.astype(storage[1])
    expected = s.astype(np.float64).T @ m.astype(np.float64)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def to_tfloat32(x):
    """float32 with the mantissa rounded to 10 bits (ties away: no ties in random data)."""
    return ((x.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def test_matmul_tiling_and_double_row(rng):
    k_m = rng.normal(size=(32, 32)).astype(np.float32)
    k_n = rng.normal(size=(32, 64)).astype(np.float32)
    tiled = matmul_kernel(nl.bfloat16, nl.bfloat16, tile_position=(32, 0), tile_size=(32, 128))
    bf = (
        k_m.astype(ml_dtypes.bfloat16).astype(np.float64),
        k_n.astype(ml_dtypes.bfloat16).astype(np.float64),
    )
    np.testing.assert_allclose(run(tiled, k_m, k_n), bf[0].T @ bf[1], rtol=1e-5, atol=1e-5)
    pairs_m = rng.normal(size=(16, 2, 8)).astype(np.float32)
    pairs_n = rng.normal(size=(16, 2, 12)).astype(np.float32)
    double = matmul_kernel(
        nl.float8_e4m3, nl.float8_e4m3, perf_mode=nisa.matmul_perf_mode.double_row
    )
    s = pairs_m.astype(ml_dtypes.float8_e4m3).astype(np.float64).reshape(32, 8)
    m = pairs_n.astype(ml_dtypes.float8_e4m3).astype(np.float64).reshape(32, 12)
    np.testing.assert_allclose(run(double, pairs_m, pairs_n), s.T @ m, rtol=1e-5, atol=1e-5)


def test_bn_stats_then_bn_aggr_give_mean_and_variance(rng):
    x = rng.normal(size=(8, 100)).astype(np.float32)

    def stats(dst, tile):
        partial = nl.ndarray((8, 12), dtype=nl.float32)
        nisa.bn_stats(partial[:, 0:6], tile[:, 0:50])
        nisa.bn_stats(partial[:, 6:12], tile[:, 50:100])
        nisa.bn_aggr(dst, partial)

    out = run(isa_kernel(stats, (8, 2)), x)
    np.testing.assert_allclose(out[:, 0], x.mean(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[:, 1], x.var(axis=1), rtol=1e-4)


def test_affine_select_causal_mask(rng):
    x = rng.normal(size=(8, 8)).astype(np.float32)
    # keep column <= row: row - column >= 0
    out = run(
        isa_kernel(
            lambda d, t: nisa.affine_select(d, [[-1, 8]], 1, t, -9.0, cmp_op=nl.greater_equal),
            (8, 8),
        ),
        x,
    )
    np.testing.assert_array_equal(out, np.where(np.tril(np.ones((8, 8))) > 0, x, -9.0))


def test_nc_transpose_reciprocal_and_scalar_tensor_tensor(rng):
    x = rng.uniform(1, 2, (16, 24)).astype(np.float32)

    def transpose(dst, t):
        psum = nl.ndarray((24, 16), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(psum, t)
        nisa.tensor_copy(dst, psum)

    np.testing.assert_array_equal(run(isa_kernel(transpose, (24, 16)), x), x.T)

    # a dst whose free axis has several dimensions, as nki-library's mlp_cte writes one
    # ([hidden, 1, bxs] through .ap); its free elements must number data's partitions
    def into_3d(dst, t):
        psum = nl.ndarray((24, 2, 8), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(psum, t)
        nisa.tensor_copy(dst, psum.reshape((24, 16)))

    np.testing.assert_array_equal(run(isa_kernel(into_3d, (24, 16)), x), x.T)

    def mismatched(dst, t):
        nisa.nc_transpose(nl.ndarray((24, 3, 8), dtype=nl.float32, buffer=nl.psum), t)

    with pytest.raises(errors.ShapeMismatch, match="24 partitions with 16 elements"):
        run(isa_kernel(mismatched, (24, 16)), x)

    # past the docs' 32x32 on the Vector engine, as public kernels ran it on trn1: a warning
    def on_vector(dst, t):
        nisa.nc_transpose(dst, t, engine=nisa.engine.vector)

    wide = rng.normal(size=(128, 64)).astype(np.float32)
    with pytest.warns(errors.DeviceRanItWarning, match="up to 32x32"):
        np.testing.assert_array_equal(run(isa_kernel(on_vector, (64, 128)), wide), wide.T)
    np.testing.assert_allclose(run(isa_kernel(nisa.reciprocal, (16, 24)), x), 1 / x, rtol=1e-6)
    y = rng.normal(size=(16, 24)).astype(np.float32)
    out = run(
        isa_kernel(
            lambda d, a, b: nisa.scalar_tensor_tensor(d, a, nl.subtract, 1.0, nl.multiply, b),
            (16, 24),
        ),
        x,
        y,
    )
    np.testing.assert_allclose(out, (x - 1) * y, rtol=1e-6)


def test_vector_accumulators(rng):
    x = rng.uniform(-1, 1, (4, 10)).astype(np.float32)

    def kernel(data):
        t = nl.load(data)
        scaled = nl.ndarray((4, 10), dtype=nl.float32)
        total = nl.ndarray((4, 1), dtype=nl.float32)
        nisa.tensor_scalar_reduce(scaled, t, nl.multiply, 2.0, nl.add, reduce_res=total)
        running = nl.ndarray((4, 10), dtype=nl.float32)
        nisa.tensor_scalar_cumulative(running, t, nl.add, nl.maximum, 0.0)
        out = nl.ndarray((4, 21), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:10], scaled)
        nl.store(out[:, 10:11], total)
        nl.store(out[:, 11:21], running)
        return out

    out = run(kernel, x)
    np.testing.assert_allclose(out[:, :10], 2 * x, rtol=1e-6)
    np.testing.assert_allclose(out[:, 10], 2 * x.sum(axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out[:, 11:], np.maximum.accumulate(x, axis=1))


def test_exponential_select_reduce_and_range_select(rng):
    x = rng.normal(size=(4, 8)).astype(np.float32)

    def kernel(data):
        t = nl.load(data)
        e = nl.ndarray((4, 8), dtype=nl.float32)
        total = nl.ndarray((4, 1), dtype=nl.float32)
        nisa.exponential(
            e, t, max_value=1.0, reduce_res=total, reduce_cmd=nisa.reduce_cmd.reset_reduce
        )
        bounds = nl.ndarray((4, 1), dtype=nl.float32)
        nisa.memset(bounds, 3.0)
        ranged = nl.ndarray((4, 8), dtype=nl.float32)
        best = nl.ndarray((4, 1), dtype=nl.float32)
        nisa.range_select(
            ranged,
            t,
            nl.greater_equal,
            nl.less,
            bounds,
            nl.full((4, 1), 6.0, nl.float32),
            reduce_res=best,
        )
        out = nl.ndarray((4, 18), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:8], e)
        nl.store(out[:, 8:9], total)
        nl.store(out[:, 9:17], ranged)
        nl.store(out[:, 17:18], best)
        return out

    out = run(kernel, x)
    np.testing.assert_allclose(out[:, :8], np.exp(x - 1), rtol=1e-6)
    np.testing.assert_allclose(out[:, 8], np.exp(x - 1).sum(axis=1), rtol=1e-5)
    fill = np.finfo(np.float32).min
    np.testing.assert_array_equal(out[:, 9:12], fill)
    np.testing.assert_array_equal(out[:, 12:15], x[:, 3:6])
    np.testing.assert_array_equal(out[:, 17], x[:, 3:6].max(axis=1))


def test_top8_family_follows_the_documented_duplicate_order():
    data = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8]], np.float32)
    vals = np.array([[3, 8, 8, 8, 8, 8, 8, 8]], np.float32)

    def kernel(d, v):
        dt, vt = nl.load(d), nl.load(v)
        top = nl.ndarray((1, 8), dtype=nl.float32)
        nisa.max8(top, dt)
        found = nl.ndarray((1, 8), dtype=nl.uint32)
        nisa.nc_find_index8(found, dt, vt)
        replaced = nl.ndarray((1, 11), dtype=nl.float32)
        where = nl.ndarray((1, 8), dtype=nl.uint32)
        nisa.nc_match_replace8(replaced, dt, vt, -1.0, dst_idx=where)
        out = nl.ndarray((1, 35), dtype=nl.float32, buffer=nl.shared_hbm)
        for column, tile in ((0, top), (8, found), (16, where), (24, replaced)):
            nl.store(out[:, column : column + tile.shape[1]], nl.copy(tile, dtype=nl.float32))
        return out

    out = run(kernel, data, vals)[0]
    np.testing.assert_array_equal(out[:8], [8] * 7 + [4])
    np.testing.assert_array_equal(out[8:16], [2, 4, 5, 6, 7, 8, 9, 10])  # ascending
    np.testing.assert_array_equal(out[16:24], [2, 10, 9, 8, 7, 6, 5, 4])  # the docs' example
    np.testing.assert_array_equal(out[24:35], [1, 2, -1, 4] + [-1] * 7)


def test_gathers_nonzero_and_dma_transpose(rng):
    x = rng.normal(size=(4, 8)).astype(np.float32)
    idx = rng.integers(0, 8, (4, 3)).astype(np.uint32)
    out = run(isa_kernel(nisa.nc_n_gather, (4, 3)), x, idx)
    np.testing.assert_array_equal(out, np.take_along_axis(x, idx.astype(np.int64), axis=1))
    flags = np.array([[0, 1, 1, 0, 0, 1, 0, 0]], np.int32)
    out = run(
        isa_kernel(lambda d, s: nisa.nonzero_with_count(d, s, index_offset=16), (1, 9), np.int32),
        flags,
    )
    np.testing.assert_array_equal(out[0], [17, 18, 21, -1, -1, -1, -1, -1, 3])  # the docs' example
    halves = rng.normal(size=(16, 8)).astype(np.float16)

    def transposed(src):
        out = nl.ndarray((8, 16), dtype=src.dtype, buffer=nl.shared_hbm)
        nisa.dma_transpose(out, src)
        return out

    np.testing.assert_array_equal(run(transposed, halves), halves.T)


def test_random_instructions(rng):
    x = rng.normal(size=(4, 64)).astype(np.float32)
    np.testing.assert_array_equal(
        run(isa_kernel(lambda d, t: nisa.dropout(d, t, 0.0), (4, 64)), x), x
    )
    np.testing.assert_array_equal(
        run(isa_kernel(lambda d, t: nisa.dropout(d, t, 1.0), (4, 64)), x), 0
    )
    values = run(isa_kernel(lambda d, t: nisa.rand2(d, -2.0, 3.0), (4, 64)), x)
    assert values.min() >= -2 and values.max() <= 3 and values.std() > 0.5
    bits = run(isa_kernel(lambda d, t: nisa.rng(d), (4, 64), np.uint8), x)
    assert len(np.unique(bits)) > 16


@pytest.mark.parametrize("free_dims", [1, 2])
def test_quantize_mx_then_matmul_mx_recovers_the_product(rng, monkeypatch, free_dims):
    """quantize_mx's scale is 2**(floor(log2(amax)) - (Emax - 1)); nc_matmul_mx multiplies
    the dequantized values, so the product matches the bf16 inputs' within fp8 rounding.
    Either's operands may split their free axis in two, as nki-library's MX kernels do."""
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    a = rng.normal(size=(32, 64)).astype(ml_dtypes.bfloat16)
    b = rng.normal(size=(32, 32)).astype(ml_dtypes.bfloat16)

    def split(shape):  # [P, F] -> [P, 2, F / 2] for free_dims == 2
        return shape if free_dims == 1 else (shape[0], 2, shape[1] // 2)

    def kernel(left, right):
        tiles = []
        for src in (left, right):
            data = nl.ndarray(split((32, src.shape[1] // 4)), dtype=nl.float8_e4m3fn_x4)
            scale = nl.ndarray(split((4, src.shape[1] // 4)), dtype=nl.uint8)
            loaded = nl.load(src).reshape(split((32, src.shape[1])))
            nisa.quantize_mx(dst=data, src=loaded, dst_scale=scale)
            tiles.append((data, scale))
        psum = nl.ndarray(split((16, 8)), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(psum, tiles[0][0], tiles[1][0], tiles[0][1], tiles[1][1])
        psum = psum.reshape((16, 8))
        out = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(psum))
        return out

    result = run(kernel, a, b)
    left = mx_round_trip(a).reshape(32, 16, 4)
    right = mx_round_trip(b).reshape(32, 8, 4)
    np.testing.assert_allclose(result, np.einsum("kiq,kjq->ij", left, right), rtol=1e-5, atol=1e-5)


def mx_round_trip(x, max_exponent=8):
    """x quantized to MXFP8 (float8_e4m3fn, groups of 8 partitions x 4 values) as the
    quantize_mx docs define the scale, then dequantized."""
    values = x.astype(np.float64)
    groups = values.reshape(values.shape[0] // 8, 8, values.shape[1] // 4, 4)
    amax = np.abs(groups).max(axis=(1, 3), keepdims=True)
    scale = 2.0 ** (np.floor(np.log2(amax)) - (max_exponent - 1))
    quantized = (groups / scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float64) * scale
    return quantized.reshape(values.shape)


def test_matmul_never_mixes_the_two_e4m3_formats(monkeypatch, rng):
    """nki.isa.nc_matmul, "Data types": float8_e4m3fn (NeuronCore-v4) and the legacy
    float8_e4m3 cannot be mixed in one matmul."""
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    x = rng.normal(size=(16, 8)).astype(np.float32)
    with pytest.raises(errors.UnsupportedDtype, match="cannot mix"):
        run(matmul_kernel(nl.float8_e4m3, nl.float8_e4m3fn), x, x)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    with pytest.raises(errors.UnsupportedDtype, match="float8_e4m3fn"):
        run(matmul_kernel(nl.float8_e4m3fn, nl.float8_e4m3fn), x, x)


def test_registers_drive_dynamic_loops():
    """NKI 0.6's dynamic loops: registers, nl.dynamic_range and ``while reg:``, which NKI 0.7
    removed and 0.8 deprecated (registers): they still run, each warning."""

    def kernel(x):
        bound = nl.ndarray((1, 1), dtype=nl.int32)
        nisa.memset(bound, 3)
        count = nisa.register_alloc()
        nisa.register_load(count, bound)
        steps = nisa.register_alloc(0)
        for _ in nl.dynamic_range(count):
            nisa.register_move(steps, int(steps) + 2)
        remaining = nisa.register_alloc(2)
        while remaining:
            nisa.register_move(remaining, int(remaining) - 1)
        out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.register_store(out, steps)
        return out

    with pytest.warns(errors.DeprecatedApiWarning) as caught:
        assert run(kernel, np.zeros((1, 1), np.float32))[0, 0] == 6
    named = {str(w.message).split(" was ")[0] for w in caught}
    assert named == {
        "nki.language.dynamic_range",
        "nki.isa.VirtualRegister.__bool__",
        "nki.isa.VirtualRegister.__index__",
        *(f"nki.isa.register_{op}" for op in ("alloc", "load", "move", "store")),
    }


def test_stream_shuffle_and_dma_compute(rng):
    x = rng.normal(size=(64, 4)).astype(np.float32)
    mask = [31 - i for i in range(32)]
    out = run(isa_kernel(lambda d, t: nisa.nc_stream_shuffle(d, t, mask), (64, 4)), x)
    np.testing.assert_array_equal(out, np.concatenate([x[31::-1], x[63:31:-1]]))
    y = rng.normal(size=(64, 4)).astype(np.float32)
    out = run(isa_kernel(lambda d, a, b: nisa.dma_compute(d, [a, b], nl.add), (64, 4)), x, y)
    np.testing.assert_allclose(out, x + y, rtol=1e-6)


def test_sendrecv_and_core_barrier_under_lnc2(monkeypatch):
    """A ring exchange between the two logical cores (the sendrecv docs' example)."""
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")

    @nki.jit
    def ring(x):
        out = nl.ndarray((2, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        rank = nl.program_id()
        mine = nl.full((1, 4), float(rank + 1), nl.float32)
        received = nl.ndarray((1, 4), dtype=nl.float32)
        nisa.sendrecv(
            src=mine,
            dst=received,
            send_to_rank=(rank + 1) % 2,
            recv_from_rank=(rank - 1) % 2,
            pipe_id=0,
        )
        nisa.core_barrier(out, (0, 1))
        nl.store(out[rank : rank + 1, :], received)
        return out

    with pytest.warns(errors.DeprecatedApiWarning, match="NKI 0.8"):  # nki.lnc's in 0.8
        result = ring[2](np.zeros((1, 1), np.float32))
    np.testing.assert_array_equal(result, [[2.0] * 4, [1.0] * 4])


def test_activate2_stages_prelu_and_reduction(monkeypatch, rng):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    x = rng.normal(size=(8, 16)).astype(np.float32)

    def kernel(data):
        t = nl.load(data)
        dst = nl.ndarray((8, 16), dtype=nl.float32)
        peak = nl.ndarray((8, 1), dtype=nl.float32)
        nisa.activate2(
            dst,
            nl.prelu,
            t,
            2.0,
            0.5,
            nl.multiply,
            nl.subtract,
            relu_param=0.1,
            reduce_op=nl.maximum,
            reduce_res=peak,
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )
        out = nl.ndarray((8, 17), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:16], dst)
        nl.store(out[:, 16:17], peak)
        return out

    out = run(kernel, x)
    staged = x * 2 - 0.5
    expected = np.where(staged >= 0, staged, 0.1 * staged)
    np.testing.assert_allclose(out[:, :16], expected, rtol=1e-6)
    np.testing.assert_allclose(out[:, 16], expected.max(axis=1), rtol=1e-6)


def test_a_failing_core_does_not_leave_its_peer_waiting(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")

    @nki.jit
    def lopsided(x):
        tile = nl.load(x)
        if nl.program_id() == 1:
            nisa.memset(dst=nl.ndarray((129, 4), dtype=nl.float32), value=0.0)  # breaks a rule
        nisa.sendrecv(
            src=tile,
            dst=nl.ndarray(tile.shape, dtype=tile.dtype),
            send_to_rank=1,
            recv_from_rank=1,
            pipe_id=0,
        )
        nisa.core_barrier(x, (0, 1))

    with (
        pytest.raises(errors.NumPartitionExceedArchLimit),
        pytest.warns(errors.DeprecatedApiWarning, match="nki.isa.sendrecv"),
    ):
        lopsided[2](np.zeros((4, 4), np.float32))


def test_vector_select_gathers_and_scatters_rows(rng):
    table = rng.normal(size=(10, 6)).astype(np.float32)
    rows = np.array([[7], [2], [2], [9]], np.int32)

    def kernel(data, index):
        offsets = nl.load(index)
        picked = nl.ndarray((4, 6), dtype=nl.float32)
        nisa.dma_copy(dst=picked, src=data.vector_select(0, offsets))
        doubled = nl.multiply(picked, 2.0)
        nisa.dma_copy(dst=data.vector_select(0, offsets), src=doubled)  # scatter back
        out = nl.ndarray((4, 6), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, picked)
        return out

    original = table.copy()
    np.testing.assert_array_equal(run(kernel, table, rows), original[[7, 2, 2, 9]])
    np.testing.assert_array_equal(table[[7, 2, 9]], 2 * original[[7, 2, 9]])
    np.testing.assert_array_equal(table[[0, 1, 3]], original[[0, 1, 3]])


def test_sequence_bounds_documented_example():
    ids = np.array([[0, 1, 1, 2, 2, 2, 0, 3, 3]], np.int32)
    out = run(isa_kernel(nisa.sequence_bounds, (1, 2, 9), np.int32), ids)
    np.testing.assert_array_equal(
        out[0], [[9, 1, 1, 3, 3, 3, 9, 7, 7], [-1, 3, 3, 6, 6, 6, -1, 9, 9]]
    )


def test_local_gather_follows_the_documented_numpy_semantics(rng):
    """nki/test/test_nki_isa_local_gather.py: each 16-partition core gathers with its own
    column-major-flattened indices (element offsets, num_elem_per_idx wide)."""
    source = rng.normal(size=(32, 64, 4)).astype(np.float32)
    per_core = rng.integers(0, 64, (32, 2)).astype(np.uint16)
    out = run(
        isa_kernel(lambda d, s, i: nisa.local_gather(d, s, i, 4, 24), (32, 24, 4)),
        source,
        per_core * 4,
    )
    expected = np.empty((32, 24, 4), np.float32)
    for start in (0, 16):
        indices = per_core[start : start + 16].flatten(order="F")[:24]
        expected[start : start + 16] = np.take(source[start : start + 16], indices, axis=1)
    np.testing.assert_array_equal(out, expected)


def test_local_gather_without_num_valid_indices_warns_as_nki_0_8_does(rng):
    source = rng.normal(size=(16, 8)).astype(np.float32)
    index = np.tile(np.arange(2, dtype=np.uint16), (16, 1))  # 32 slots a core
    with pytest.warns(errors.DeprecatedApiWarning, match="num_valid_indices"):
        out = run(isa_kernel(nisa.local_gather, (16, 32)), source, index)
    np.testing.assert_array_equal(out, source[:, index.flatten(order="F")])


def test_access_pattern_with_vector_offset_gathers_rows(rng):
    """ap(vector_offset=): partition i reads from row vector_offset[i] (times the stride of
    indirect_dim) with the remaining pairs; DMAs write back through it."""
    table = rng.normal(size=(10, 8)).astype(np.float32)
    rows = np.array([[4], [0], [9]], np.int32)

    def kernel(data, index):
        offsets = nl.load(index)
        picked = nl.ndarray((3, 4), dtype=nl.float32)
        nisa.dma_copy(dst=picked, src=data.ap([[8, 3], [2, 4]], offset=1, vector_offset=offsets))
        nisa.dma_copy(
            dst=data.ap([[8, 3], [1, 4]], vector_offset=offsets), src=nl.zeros((3, 4), nl.float32)
        )
        out = nl.ndarray((3, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, picked)
        return out

    original = table.copy()
    np.testing.assert_array_equal(run(kernel, table, rows), original[[4, 0, 9]][:, 1::2])
    np.testing.assert_array_equal(table[[4, 0, 9], :4], 0)
    np.testing.assert_array_equal(table[[4, 0, 9], 4:], original[[4, 0, 9], 4:])


# -- names AWS's kernels use (issue 24) ------------------------------------------------------
def test_range_is_a_python_range_without_a_warning(rng):
    """``nl.range``, which nki-library's MX kernels loop with (not in the reference): the
    iterations of Python's ``range``, no deprecation warning."""
    data = rng.normal(size=(4, 6)).astype(np.float32)

    def kernel(src):
        assert list(nl.range(3)) == [0, 1, 2] and list(nl.range(1, 7, 2)) == [1, 3, 5]
        out = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.shared_hbm)
        tile = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=src)
        for column in nl.range(src.shape[1]):
            nisa.tensor_scalar(tile[:, column], tile[:, column], nl.multiply, float(column))
        nisa.dma_copy(dst=out, src=tile)
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = run(kernel, data)
    np.testing.assert_array_equal(out, data * np.arange(6, dtype=np.float32))


def test_fori_loop_hands_its_body_a_register_for_scalar_offset():
    """The ``nl.fori_loop`` docstring's example: the body reads ``i`` as ``scalar_offset``."""

    def kernel(data, upper):
        output = nl.ndarray(data.shape, dtype=data.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=output, src=nl.zeros(data.shape, dtype=data.dtype))
        ub_sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=ub_sb, src=upper)
        ub_reg = nisa.register_alloc()
        nisa.register_load(ub_reg, ub_sb)
        temp = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)

        def body(i):
            assert isinstance(i, nisa.VirtualRegister)
            nisa.dma_copy(dst=temp, src=data.ap([[1, 1], [1, 1]], scalar_offset=i, indirect_dim=1))
            nisa.dma_copy(
                dst=output.ap([[1, 1], [1, 1]], scalar_offset=i, indirect_dim=1), src=temp
            )

        nl.fori_loop(0, ub_reg, body)
        return output

    data = np.arange(1, 9, dtype=np.float32).reshape(1, 8)
    with pytest.warns(errors.DeprecatedApiWarning, match="register_"):  # NKI 0.6's registers
        out = run(kernel, data, np.array([[5]], np.int32))
    np.testing.assert_array_equal(out, np.where(np.arange(8) < 5, data, 0))


def test_nki_object_and_dtype_module():
    class Config(nl.NKIObject):
        pass

    config = Config(tile=128, dtype=nl.bfloat16)
    assert (config.tile, config.dtype) == (128, nl.bfloat16)
    assert isinstance(nl.tile_size, nl.NKIObject)
    assert nki.dtype.float8_e4m3fn_x4 is nl.float8_e4m3fn_x4
    assert nki.dtype.bfloat16 is nl.bfloat16


def test_tensor_copy_dtype_rounds_to_it_then_stores_in_dst():
    """nki-samples@6905a68's tutorials pass ``dtype=`` to ``tensor_copy``."""

    def kernel(x):
        tile = nl.load(x)
        dst = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=dst, src=tile, dtype=nl.bfloat16)
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=dst)
        return out

    x = np.array([[1.0 + 2**-10, 3.0]], np.float32)
    np.testing.assert_array_equal(run(kernel, x), x.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_benchmark_and_profile_run_in_the_simulator_and_measure_no_device_time():
    from asickernels.simulate.nki.benchmarking import NoDeviceTimeWarning

    def add(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=nl.add(nl.load(a), 1.0))
        return out

    bench = nki.benchmark(warmup=2, iters=3)(add)
    x = np.ones((4, 8), np.float32)
    with pytest.warns(NoDeviceTimeWarning, match="no device time was measured"):
        np.testing.assert_array_equal(bench(x), x + 1)
    result = bench.benchmark_result
    assert result.device_time_measured is False and "no device time" in result.note
    assert result.nc_latency.estimated and not result.nc_latency.measured  # a model estimate
    assert result.nc_latency.get_latency_percentile(99) == result.estimate.latency_us > 0
    with pytest.raises(ValueError, match="percentile"):
        result.nc_latency.get_latency_percentile(95)
    with pytest.warns(NoDeviceTimeWarning):  # a placeholder runs as zeros
        np.testing.assert_array_equal(bench(nt.tensor[[4, 8], nl.float32]), np.ones((4, 8)))
    with pytest.raises(ValueError, match="iters"):
        nki.benchmark(add, iters=0)
    with pytest.raises(ValueError, match="absolute"):
        nki.profile(add, working_directory="relative/dir")
    profiled = nki.profile(working_directory="/tmp/profiles", profile_nth=2)(add)
    with pytest.warns(NoDeviceTimeWarning):
        assert profiled(x) is None


def test_memory_region_predicates_and_enums():
    assert nl.is_hbm(nl.hbm) and nl.is_hbm(nl.shared_hbm) and not nl.is_hbm(nl.sbuf)
    assert nl.is_on_chip(nl.psum) and not nl.is_on_chip(nl.private_hbm)
    assert nl.is_psum(nl.psum) and nl.is_sbuf(nl.sbuf) and not nl.is_sbuf(nl.psum)
    assert {r.name for r in nl.MemoryRegion} == {"sbuf", "psum", "private_hbm", "shared_hbm"}
    assert {e.name for e in nisa.dma_engine} == {"dma", "gpsimd_dma"}
    assert nisa.get_nc_sub_version() == 0  # the first silicon revision (nki.isa.get_nc_sub_version)


def test_expand_dim_logical_not_and_shared_constant(rng):
    x = rng.normal(size=(4, 6)).astype(np.float32)
    table = rng.normal(size=(4, 6)).astype(np.float32)

    def kernel(src):
        tile = nl.load(src)
        assert tile.expand_dim(1).shape == (4, 1, 6)
        with pytest.raises(errors.LeadingDimensionOfTensorMustBePartition):
            tile.expand_dim(0)
        flags = nl.logical_not(nl.greater(tile, 0.0), dtype=nl.float32)
        constant = nl.load(nl.shared_constant(table))
        out = nl.ndarray((2, 4, 6), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[0], flags)
        nl.store(out[1], constant)
        return out

    flags, copied = run(kernel, x)
    np.testing.assert_array_equal(flags, (x <= 0).astype(np.float32))
    np.testing.assert_array_equal(copied, table)
