"""The NKI simulator's semantics: what instructions compute, how views and memory behave,
what a run counts. (Its rule enforcement is in test_nki_violations.py.)"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from asickernels.simulate import nki
from asickernels.simulate.nki import isa as nisa
from asickernels.simulate.nki import language as nl


def run(kernel, *args, **kwargs):
    return nki.simulate(kernel)(*args, **kwargs)


def test_jit_kernel_runs_on_numpy_and_counts(rng):
    @nki.jit
    def add_one(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.add(nl.load(x), 1.0))
        return out

    x = rng.normal(size=(100, 7)).astype(np.float32)
    np.testing.assert_array_equal(add_one(x), x + 1)
    counters = nki.last_counters()
    assert counters["vector_instructions"] == 1 and counters["dma_transfers"] == 2
    assert counters["hbm_to_sbuf_bytes"] == x.nbytes == counters["sbuf_to_hbm_bytes"]
    assert counters["peak_sbuf_bytes_per_partition"] == 2 * 7 * 4  # the loaded and the sum tile
    np.testing.assert_array_equal(run(add_one, x), x + 1)  # nki.simulate(jit kernel)


def test_kernel_outputs_are_new_arrays_and_inputs_stay_in_place(rng):
    def scale_in_place(x):
        nl.store(x, nl.multiply(nl.load(x), 2.0))  # writes its argument, as the SDK allows
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x))
        return out, x

    x = np.ones((4, 3), np.float32)
    out, same = run(scale_in_place, x)
    np.testing.assert_array_equal(x, 2.0)
    np.testing.assert_array_equal(out, 2.0)
    out[...] = 0
    np.testing.assert_array_equal(same, 2.0)


def test_uninitialised_integers_read_as_4():
    def kernel():
        out = nl.ndarray((2, 3), dtype=nl.int32, buffer=nl.shared_hbm)
        nl.store(out, nl.ndarray((2, 3), dtype=nl.int32))
        return out

    np.testing.assert_array_equal(run(kernel), 4)


def test_views_index_reshape_permute_broadcast(rng):
    def kernel(x):
        # x [6, 8]: a row block, its transpose, a reshaped view and a broadcast column.
        out = nl.ndarray((4, 6), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x[1:5, 0:6]))
        transposed = nl.ndarray((8, 6), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(transposed, nl.load(x.permute((1, 0))))
        split = nl.ndarray((6, 2, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(split, nl.load(x.reshape((6, 2, 4))))
        column = nl.load(x[:, 3:4])
        spread = nl.ndarray((6, 5), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(spread, nl.copy(column.broadcast(1, 5)))
        last = nl.ndarray((1, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(last, nl.load(x[-1:]))
        return out, transposed, split, spread, last

    x = rng.normal(size=(6, 8)).astype(np.float32)
    out, transposed, split, spread, last = run(kernel, x)
    np.testing.assert_array_equal(out, x[1:5, 0:6])
    np.testing.assert_array_equal(transposed, x.T)
    np.testing.assert_array_equal(split, x.reshape(6, 2, 4))
    np.testing.assert_array_equal(spread, np.repeat(x[:, 3:4], 5, axis=1))
    np.testing.assert_array_equal(last, x[-1:])


def test_on_chip_integer_index_keeps_the_partition_axis():
    def kernel(x):
        tile = nl.load(x)
        assert tile[2].shape == (1, 4)
        assert tile[:, 1].shape == (8, 1)  # on-chip views stay 2-D (nki-language-guide.rst)
        assert x[2].shape == (4,)  # HBM drops the axis

    run(kernel, np.zeros((8, 4), np.float32))


def test_bfloat16_is_rounded_where_stored():
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x, dtype=nl.bfloat16))
        return out

    x = np.array([[1.0 + 2**-9, 3.14159]], np.float32)
    got = run(kernel, x)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got, x.astype(ml_dtypes.bfloat16))


def test_float_to_int_rounds_down_and_saturates():
    """Floor, as AWS's resize test expects (nki-samples test_resize_nearest.py@8370e11)."""

    def kernel(x):
        out = nl.ndarray(x.shape, dtype=nl.int8, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(nl.load(x), dtype=nl.int8))
        return out

    x = np.array([[0.5, 1.5, -2.5, 300.0, -300.0, np.nan]], np.float32)
    np.testing.assert_array_equal(run(kernel, x), [[0, 1, -3, 127, -128, 0]])


def test_matmul_accumulates_in_fp32_psum(rng):
    def kernel(a, b, accumulate_twice):
        out = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
        stationary, moving = nl.load(a, dtype=nl.bfloat16), nl.load(b, dtype=nl.bfloat16)
        psum = nl.ndarray(out.shape, dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(psum, stationary, moving, accumulate=False)
        nisa.nc_matmul(psum, stationary, moving, accumulate=accumulate_twice)
        nl.store(out, nl.copy(psum))
        return out

    a = rng.integers(-128, 128, (128, 16)).astype(np.float32)
    b = rng.integers(-128, 128, (128, 300)).astype(np.float32)
    np.testing.assert_array_equal(run(kernel, a, b, True), 2 * a.T @ b)
    np.testing.assert_array_equal(run(kernel, a, b, False), a.T @ b)
    np.testing.assert_array_equal(run(kernel, a, b, None), 2 * a.T @ b)  # written before
    assert nki.last_counters()["tensor_instructions"] == 2
    assert nki.last_counters()["peak_psum_banks"] == 1


def test_matmul_default_accumulate_tracks_each_psum_element():
    def kernel(a):
        out = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        ones = nl.load(a, dtype=nl.bfloat16)  # [1, 4] of ones
        psum = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(psum[:, 0:4], ones, ones)  # first write: overwrite NaN
        nisa.nc_matmul(psum[:, 2:6], ones, ones)  # columns 2-3 add, 4-5 overwrite
        nl.store(out, nl.copy(psum))
        return out

    got = run(kernel, np.ones((1, 4), np.float32))
    np.testing.assert_array_equal(got[:, :6], [[1, 1, 2, 2, 1, 1]] * 4)
    assert np.isnan(got[:, 6:]).all()  # never written


def test_vector_engine_computes_in_fp32_gpsimd_keeps_int32_exact():
    def kernel(x, engine):
        out = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.shared_hbm)
        tile = nl.load(x)
        total = nl.ndarray(x.shape, dtype=nl.int32)
        nisa.tensor_tensor(dst=total, data1=tile, data2=tile, op=nl.add, engine=engine)
        nl.store(out, total)
        return out

    x = np.array([[2**24 + 1]], np.int32)
    assert run(kernel, x, nisa.engine.gpsimd)[0, 0] == 2**25 + 2
    assert nki.last_counters()["gpsimd_instructions"] == 1
    assert run(kernel, x, nisa.engine.vector)[0, 0] == 2**25  # 2**24 + 1 rounds in fp32
    assert run(kernel, x, nisa.engine.unknown)[0, 0] == 2**25 + 2  # int32 defaults to GpSimd


def test_iota_reductions_and_predicated_copy():
    def kernel():
        index = nl.ndarray((3, 2, 4), dtype=nl.float32)
        nisa.iota(index, [[10, 2], [1, 4]], offset=5, channel_multiplier=100)
        iota_out = nl.ndarray((3, 2, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(iota_out, index)
        row_max = nl.max(index, axis=(1, 2), keepdims=True)  # [3, 1, 1]
        column = nl.ndarray((1, 2, 4), dtype=nl.float32)
        nisa.tensor_partition_reduce(column, nl.add, index)
        reduced = nl.ndarray((1, 2, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(reduced, column)
        picked = nl.ndarray((3, 2, 4), dtype=nl.float32)
        nisa.memset(picked, -1.0)
        odd = nl.ndarray((3, 2, 4), dtype=nl.uint8)
        nisa.iota(odd, [[0, 2], [1, 4]], channel_multiplier=0)
        nisa.tensor_scalar(odd, odd, nl.less, 2.0)
        nisa.tensor_copy_predicated(dst=picked, src=index, predicate=odd)
        picked_out = nl.ndarray((3, 2, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(picked_out, picked)
        maxima = nl.ndarray((3, 1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(maxima, row_max)
        return iota_out, reduced, picked_out, maxima

    iota_out, reduced, picked, maxima = run(kernel)
    want = 5 + 100 * np.arange(3)[:, None, None] + 10 * np.arange(2)[:, None] + np.arange(4)
    np.testing.assert_array_equal(iota_out, want)
    np.testing.assert_array_equal(reduced, want.sum(axis=0, keepdims=True))
    np.testing.assert_array_equal(picked, np.where(np.arange(4) < 2, want, -1))
    np.testing.assert_array_equal(maxima, want.max(axis=(1, 2), keepdims=True))
    counters = nki.last_counters()
    assert counters["gpsimd_instructions"] == 3  # two iotas and the partition reduce


def test_tensor_scalar_broadcasts_a_column_and_reverses():
    def kernel(x, column):
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        result = nl.ndarray(x.shape, dtype=nl.float32)
        nisa.tensor_scalar(
            result,
            nl.load(x),
            nl.subtract,
            nl.load(column),
            reverse0=True,
            op1=nl.multiply,
            operand1=3.0,
        )
        nl.store(out, result)
        return out

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    column = np.array([[1.0], [2.0], [3.0]], np.float32)
    np.testing.assert_array_equal(run(kernel, x, column), (column - x) * 3)


def test_nested_jit_kernel_runs_inline():
    @nki.jit
    def inner(tile):
        return nl.add(tile, 1.0)

    @nki.jit
    def outer(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, inner(nl.load(x)))
        return out

    np.testing.assert_array_equal(outer(np.zeros((2, 2), np.float32)), 1.0)
    assert nki.last_counters()["vector_instructions"] == 1


def test_target_from_environment(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    assert nl.tile_size.sbuf_fmax_bytes == 224 * 1024
    assert nisa.get_nc_version() is nisa.nc_version.gen3
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE")
    # unset: trn3, as the SDK's simulator off-device (nki/guides/nki_simulator.rst)
    assert nl.tile_size.sbuf_fmax_bytes == 256 * 1024
    assert nisa.get_nc_version() is nisa.nc_version.gen4
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn9")
    with pytest.raises(ValueError, match="trn9"):
        nisa.get_nc_version()


def test_lnc2_runs_two_logical_cores_sharing_hbm():
    """kernel[2]: two threads, program_id 0 and 1, one shared_hbm output (each core writes
    its half)."""

    @nki.jit
    def halves(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        core = nl.program_id(0)
        rows = slice(core * 64, core * 64 + 64)
        tile = nl.load(x[rows, :])
        nl.store(out[rows, :], nl.add(tile, float(core + 1)))
        return out

    x = np.zeros((128, 4), np.float32)
    result = halves[2](x)
    np.testing.assert_array_equal(result[:64], 1.0)
    np.testing.assert_array_equal(result[64:], 2.0)
    np.testing.assert_array_equal(nki.simulate(halves[2])(x), result)
    assert nki.last_counters()["dma_transfers"] == 4  # two loads, two stores
    with pytest.raises(ValueError, match="1 or 2"):
        halves[4]


def test_non_contiguous_arguments_are_read_and_written_back(rng):
    """Access patterns address row-major storage: a strided argument runs on a contiguous
    copy, written back to the caller's array; a read-only one stays read-only."""

    def double_in_place(x):
        nl.store(x, nl.multiply(nl.load(x), 2.0))
        return x

    base = rng.normal(size=(8, 6)).astype(np.float32)
    strided = base.copy()[:, ::2]
    expected = 2 * strided
    np.testing.assert_array_equal(run(double_in_place, strided), expected)
    np.testing.assert_array_equal(strided, expected)
    frozen = base.copy()[:, ::2]
    frozen.flags.writeable = False

    def read_only(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(x))
        return out

    np.testing.assert_array_equal(run(read_only, frozen), frozen)
    with pytest.raises(ValueError, match="read-only"):
        run(double_in_place, frozen)
