"""The planted-violation suite: one small kernel per hardware rule the NKI simulator
enforces, each proving the rule raises its named error (and its SDK-style code)."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np
import pytest

from asickernels.simulate import nki
from asickernels.simulate.nki import errors
from asickernels.simulate.nki import isa as nisa
from asickernels.simulate.nki import language as nl

F32 = np.float32


def _x(shape=(128, 4), dtype=F32):
    return np.ones(shape, dtype)


# Each planted kernel, the argument it is called on, and the error it must raise.
VIOLATIONS: list[tuple[Callable[[np.ndarray], object], np.ndarray, type[Exception]]] = []


def violates(error: type[Exception], argument: np.ndarray | None = None):
    """Plants the kernel below: called on ``argument`` (``_x()`` when None) it must raise
    ``error``."""

    def plant(kernel):
        VIOLATIONS.append((kernel, _x() if argument is None else argument, error))
        return kernel

    return plant


# -- one kernel per rule -------------------------------------------------------------------
@violates(errors.NumPartitionExceedArchLimit)
def partition_over_128(x):
    # NKI 0.7 allocates SBUF over 128 partitions (nki.language.NkiBlockGrid example); an
    # engine instruction reaches at most 128 of them
    nisa.memset(dst=nl.ndarray((129, 4), dtype=nl.float32), value=0.0)


@violates(errors.NumPartitionExceedArchLimit, _x((256, 4)))
def load_over_128_partitions(x):
    nl.load(x)  # x is [256, 4]: the SBUF tile would span 256 partitions


@violates(errors.NumPartitionMismatch)
def partition_mismatch(x):
    a = nl.load(x)
    b = nl.load(x[0:64])
    nisa.tensor_tensor(dst=nl.ndarray((128, 4), dtype=nl.float32), data1=a, data2=b, op=nl.add)


@violates(errors.NumPartitionMismatch)
def matmul_contraction_mismatch(x):
    stationary = nl.load(x, dtype=nl.bfloat16)
    moving = nl.load(x[0:64], dtype=nl.bfloat16)
    nisa.nc_matmul(nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.psum), stationary, moving)


@violates(errors.SizeOfDimensionExceedArchLimit)
def psum_tile_over_one_bank(x):
    nl.ndarray((128, 513), dtype=nl.float32, buffer=nl.psum)  # 2052 bytes > 2 KiB


def psum_over_8_banks(x):
    live = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(8)]
    live.append(nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.psum))


def psum_tile_over_8_banks(x):
    nl.ndarray((128, 4097), dtype=nl.float32, buffer=nl.psum)  # NeuronCore-v4: 9 banks


@violates(errors.SbufCapacityExceeded)
def sbuf_over_capacity(x):
    nl.ndarray((128, 192 * 1024 + 1), dtype=nl.uint8)


def sbuf_live_allocations_add_up(x):
    first = nl.ndarray((128, 100 * 1024), dtype=nl.uint8)
    second = nl.ndarray((128, 100 * 1024), dtype=nl.uint8)
    del first, second


@violates(errors.SizeOfDimensionExceedArchLimit)
def matmul_stationary_over_128(x):
    stationary = nl.ndarray((128, 129), dtype=nl.bfloat16)
    moving = nl.ndarray((128, 4), dtype=nl.bfloat16)
    nisa.nc_matmul(nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.psum), stationary, moving)


@violates(errors.SizeOfDimensionExceedArchLimit)
def matmul_moving_over_512(x):
    stationary = nl.ndarray((128, 4), dtype=nl.bfloat16)
    moving = nl.ndarray((128, 513), dtype=nl.bfloat16)
    nisa.nc_matmul(nl.ndarray((4, 513), dtype=nl.bfloat16, buffer=nl.psum), stationary, moving)


@violates(errors.UnsupportedDtype, _x(dtype=np.int8))
def matmul_int8(x):
    tile = nl.load(x)  # int8
    nisa.nc_matmul(nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.psum), tile, tile)


@violates(errors.UnsupportedDtype)
def matmul_fp32_with_bf16(x):
    stationary = nl.load(x)
    moving = nl.load(x, dtype=nl.bfloat16)
    nisa.nc_matmul(nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.psum), stationary, moving)


@violates(errors.UnsupportedDtype)
def matmul_result_not_fp32(x):
    tile = nl.load(x, dtype=nl.bfloat16)
    nisa.nc_matmul(nl.ndarray((4, 4), dtype=nl.bfloat16, buffer=nl.psum), tile, tile)


@violates(errors.UnsupportedMemory)
def matmul_input_in_psum(x):
    tile = nl.load(x, dtype=nl.bfloat16)
    in_psum = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.psum), in_psum, tile)


@violates(errors.UnsupportedMemory)
def matmul_result_in_sbuf(x):
    tile = nl.load(x, dtype=nl.bfloat16)
    nisa.nc_matmul(nl.ndarray((4, 4), dtype=nl.float32), tile, tile)


@violates(errors.ExceedMaxSupportedDimension)
def matmul_3d_operand(x):
    tile = nl.ndarray((128, 2, 2), dtype=nl.bfloat16)
    nisa.nc_matmul(nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.psum), tile, tile)


@violates(errors.UnsupportedMemory)
def load_from_sbuf(x):
    nl.load(nl.load(x))


@violates(errors.UnsupportedMemory)
def store_to_sbuf(x):
    tile = nl.load(x)
    nl.store(nl.ndarray((128, 4), dtype=nl.float32), tile)


@violates(errors.UnsupportedMemory)
def store_from_psum(x):
    out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.psum))


@violates(errors.UnsupportedMemory)
def compute_on_hbm(x):
    nl.add(x, 1.0)


@violates(errors.UnsupportedMemory)
def gpsimd_reads_psum(x):
    in_psum = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.psum)
    nisa.tensor_copy(
        dst=nl.ndarray((128, 4), dtype=nl.float32), src=in_psum, engine=nisa.engine.gpsimd
    )


@violates(errors.UnsupportedMemory)
def tensor_tensor_both_in_psum(x):
    a = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.psum)
    b = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.psum)
    nisa.tensor_tensor(dst=nl.ndarray((128, 4), dtype=nl.float32), data1=a, data2=b, op=nl.add)


@violates(errors.UnsupportedReduceAxis)
def reduce_over_partitions(x):
    nl.sum(nl.load(x), axis=0)


@violates(errors.UnsupportedReduceAxis)
def reduce_not_trailing(x):
    tile = nl.load(x.reshape((128, 2, 2)))
    nisa.tensor_reduce(nl.ndarray((128, 2), dtype=nl.float32), nl.add, tile, axis=1)


@violates(errors.TensorAccessOutOfBound)
def slice_out_of_bound(x):
    x[0:129]


@violates(errors.TensorAccessOutOfBound)
def index_out_of_bound(x):
    nl.load(x)[:, 4]


def read_uninitialised(x):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, nl.ndarray(x.shape, dtype=nl.float32))  # never written: NaN
    return out


@violates(errors.StoreDstShapeSmallerThanOtherShape)
def write_into_broadcast_view(x):
    row = nl.ndarray((128, 1), dtype=nl.float32)
    nisa.memset(row.broadcast(1, 4), 0.0)


@violates(errors.LeadingDimensionOfTensorMustBePartition)
def permute_partition_axis(x):
    nl.load(x).permute((1, 0))


@violates(errors.UnsupportedDtype, _x(dtype=np.float64))
def float64_argument(x):
    nl.load(x)


@violates(errors.UnsupportedMemory)
def return_sbuf_tile(x):
    return nl.load(x)


@violates(errors.HbmTensorWithInitValueNotSupported)
def hbm_with_initial_value(x):
    nl.zeros((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)


@violates(errors.ShapeMismatch)
def elementwise_shape_mismatch(x):
    tile = nl.load(x)
    nl.add(tile, tile[:, 0:2])


@violates(errors.UnsupportedOperator)
def partition_reduce_min(x):
    nisa.tensor_partition_reduce(nl.ndarray((1, 4), dtype=nl.float32), nl.minimum, nl.load(x))


@violates(errors.UnsupportedEngine)
def scalar_engine_copy_on_v2(x):
    tile = nl.load(x)
    nisa.tensor_copy(
        dst=nl.ndarray((128, 4), dtype=nl.float32), src=tile, engine=nisa.engine.scalar
    )


@violates(errors.UnsupportedEngine)
def tensor_scalar_add_on_gpsimd(x):
    """nki.isa.tensor_scalar: the GpSimd engine is "only allowed for rsqrt"."""
    nisa.tensor_scalar(
        dst=nl.ndarray((128, 4), dtype=nl.float32),
        data=nl.load(x),
        op0=nl.add,
        operand0=1.0,
        engine=nisa.engine.gpsimd,
    )


def _matmul_operands(x, dtype=nl.bfloat16):
    tile = nl.load(x, dtype=dtype)
    return nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.psum), tile, tile


@violates(errors.UnsupportedOperator)
def matmul_tile_size_32_on_v2(x):
    """Row tiles of 32 need NeuronCore-v3 (nki.isa.nc_matmul, "Tiling mode")."""
    dst, stationary, moving = _matmul_operands(x[0:32])
    nisa.nc_matmul(dst, stationary, moving, tile_position=(0, 0), tile_size=(32, 128))


@violates(errors.SizeOfDimensionExceedArchLimit)
def matmul_stationary_over_its_row_tile(x):
    dst, stationary, moving = _matmul_operands(x)
    nisa.nc_matmul(dst, stationary, moving, tile_position=(64, 0), tile_size=(64, 128))


@violates(errors.UnsupportedOperator)
def matmul_double_row_on_v2(x):
    dst, stationary, moving = _matmul_operands(x.reshape((64, 2, 4)), nl.float8_e4m3)
    nisa.nc_matmul(dst, stationary, moving, perf_mode=nisa.matmul_perf_mode.double_row)


@violates(errors.UnsupportedDtype)
def matmul_mixes_fp8_formats(x):
    stationary = nl.load(x, dtype=nl.float8_e4m3)
    moving = nl.load(x, dtype=nl.float8_e4m3fn)
    nisa.nc_matmul(nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.psum), stationary, moving)


@violates(errors.UnsupportedOperator)
def matmul_mx_before_v4(x):
    data = nl.ndarray((32, 4), dtype=nl.float8_e5m2_x4)
    scale = nl.ndarray((4, 4), dtype=nl.uint8)
    psum = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(psum, data, data, scale, scale)


@violates(errors.TensorAccessOutOfBound)
def access_pattern_past_the_tile(x):
    nisa.memset(dst=nl.load(x).ap([[4, 128], [1, 5]]), value=0.0)


@violates(errors.TensorAccessOutOfBound)
def placed_past_the_partition(x):
    nl.ndarray((128, 4), dtype=nl.float32, address=(0, 192 * 1024 - 8))


@violates(errors.InvalidAddress)
def placed_at_an_odd_partition(x):
    nl.ndarray((32, 4), dtype=nl.float32, address=(16, 0))  # starts at 0, 32, 64 or 96


@violates(errors.InvalidAddress)
def psum_placed_inside_a_bank(x):
    nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.psum, address=(0, 1024))


@pytest.fixture(autouse=True)
def _neuroncore_v2(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")


@pytest.mark.parametrize(
    ("kernel", "argument", "error"), VIOLATIONS, ids=[v[0].__name__ for v in VIOLATIONS]
)
def test_violation_raises_its_named_error(kernel, argument, error):
    with pytest.raises(error, match=f"^{error.code}: "):
        nki.simulate(kernel)(argument)


def test_every_rule_has_a_planted_violation():
    rules = {
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.NkiValidationError) and cls is not errors.NkiValidationError
    } - set(errors.LEGACY_RULES)  # planted in test_nki_legacy.py
    rules -= set(errors.COLLECTIVE_RULES)  # planted in test_nki_collectives.py
    planted = {error for _, _, error in VIOLATIONS} | {
        errors.NkiApiOutsideOfNkiKernel,
        errors.PsumCapacityExceeded,  # test_a_psum_tile_over_all_eight_banks (on trn3)
    }
    assert rules == planted


def test_api_outside_a_kernel():
    with pytest.raises(errors.NkiApiOutsideOfNkiKernel):
        nl.ndarray((128, 4), dtype=nl.float32)


def test_uninitialised_memory_reads_as_nan():
    out = nki.simulate(read_uninitialised)(_x())
    assert np.isnan(out).all()


def test_sbuf_capacity_follows_the_target(monkeypatch):
    """192 KiB per partition on trn1/inf2, 224 KiB on trn2: what overflows one fits the other."""
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    nki.simulate(sbuf_over_capacity)(_x())
    nki.simulate(sbuf_live_allocations_add_up)(_x())
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "inf2")
    with pytest.raises(errors.SbufCapacityExceeded):
        nki.simulate(sbuf_over_capacity)(_x())
    with pytest.warns(errors.SpillWarning, match="spills"):
        nki.simulate(sbuf_live_allocations_add_up)(_x())


@pytest.mark.parametrize("kernel", [sbuf_live_allocations_add_up, psum_over_8_banks])
def test_live_tiles_over_capacity_spill_with_a_warning(kernel):
    """The compiler's default allocation spills what does not fit (the kernel-optimization
    tutorial's v4 needs 320 KiB a partition on trn2 and AWS profiles it); one warning a run."""
    with pytest.warns(errors.SpillWarning, match="spills") as warned:
        nki.simulate(kernel)(_x())
    assert len([w for w in warned if w.category is errors.SpillWarning]) == 1


def test_a_psum_tile_over_all_eight_banks(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")  # tiles may span banks
    with pytest.raises(errors.PsumCapacityExceeded, match=f"^{errors.PsumCapacityExceeded.code}"):
        nki.simulate(psum_tile_over_8_banks)(_x())


def test_freed_tiles_return_their_sbuf():
    """Capacity counts live tiles only: a loop reallocating a large tile never overflows."""

    def kernel(x):
        for _ in range(4):
            tile = nl.ndarray((128, 100 * 1024), dtype=nl.uint8)
            nisa.memset(tile, 0)
            del tile

    nki.simulate(kernel)(_x())
    assert nki.last_counters()["peak_sbuf_bytes_per_partition"] == 100 * 1024


def test_psum_banks_are_reused_once_freed():
    def kernel(x):
        for _ in range(20):
            bank = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
            del bank

    nki.simulate(kernel)(_x())
    assert nki.last_counters()["peak_psum_banks"] == 1
