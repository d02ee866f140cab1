"""Direct allocation: tensors a kernel places at addresses are views of one physical SBUF or
PSUM per core (asickernels/simulate/nki/placement.py), in both API generations."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from current_api import run, stored

import asickernels.simulate.nki.legacy as legacy
from asickernels.simulate import nki
from asickernels.simulate.nki import errors, runtime
from asickernels.simulate.nki import isa as nisa
from asickernels.simulate.nki import language as nl
from asickernels.simulate.nki.estimate import estimate
from asickernels.simulate.nki.legacy import isa as lisa
from asickernels.simulate.nki.legacy import language as lnl

ncc = legacy.compiler
RNG = np.random.default_rng(0)


# -- the current API: nl.ndarray(..., address=(partition_offset, free_offset)) ----------------
def test_overlapping_placements_share_their_bytes():
    def kernel(x):
        a = nl.ndarray((128, 8), dtype=nl.float32, address=(0, 256))
        nisa.dma_copy(dst=a, src=x)
        bits = nl.ndarray((128, 8), dtype=nl.int32, address=(0, 256))  # a's bytes as int32
        shifted = nl.ndarray((128, 4), dtype=nl.float32, address=(0, 256 + 16))  # a[:, 4:]
        elsewhere = nl.ndarray((128, 8), dtype=nl.float32, address=(0, 256 + 32))
        nisa.memset(dst=elsewhere, value=0.0)  # after a: a is unchanged
        return stored(bits), stored(shifted), stored(a)

    x = RNG.normal(size=(128, 8)).astype(np.float32)
    bits, shifted, a = run(kernel, x)
    np.testing.assert_array_equal(bits, x.view(np.int32))
    np.testing.assert_array_equal(shifted, x[:, 4:])
    np.testing.assert_array_equal(a, x)


def test_a_later_placement_overwrites_an_earlier_one():
    def kernel(x):
        a = nl.ndarray((128, 8), dtype=nl.float32, address=(0, 0))
        nisa.dma_copy(dst=a, src=x)
        b = nl.ndarray((128, 2), dtype=nl.float32, address=(0, 8))  # a[:, 2:4]
        nisa.memset(dst=b, value=-1.0)
        return stored(a)

    x = RNG.normal(size=(128, 8)).astype(np.float32)
    expected = x.copy()
    expected[:, 2:4] = -1.0
    np.testing.assert_array_equal(run(kernel, x), expected)


def test_placements_on_other_partitions_are_separate():
    def kernel(x):
        low = nl.ndarray((64, 8), dtype=nl.float32, address=(0, 0))
        high = nl.ndarray((64, 8), dtype=nl.float32, address=(64, 0))
        nisa.dma_copy(dst=low, src=x[0:64])
        nisa.dma_copy(dst=high, src=x[64:128])
        whole = nl.ndarray((128, 8), dtype=nl.float32, address=(0, 0))  # both halves
        return stored(whole)

    x = RNG.normal(size=(128, 8)).astype(np.float32)
    np.testing.assert_array_equal(run(kernel, x), x)


def test_a_compiler_allocation_places_the_one_tile():
    """The current API's ``nki.compiler`` allocation functions place a tensor's one tile
    (it has no block dimensions): ``sbuf.mod_alloc(base_addr=a)`` is ``address=(0, a)``."""

    def kernel(x):
        a = nl.ndarray((128, 8), dtype=nl.float32, buffer=nki.compiler.sbuf.mod_alloc(base_addr=64))
        nisa.dma_copy(dst=a, src=x)
        with pytest.raises(TypeError, match="not both"):
            nl.ndarray((4, 4), dtype=nl.float32, buffer=nki.compiler.sbuf.mod_alloc(base_addr=0),
                       address=(0, 0))  # fmt: skip
        return stored(nl.ndarray((128, 8), dtype=nl.float32, address=(0, 64)))

    x = RNG.normal(size=(128, 8)).astype(np.float32)
    np.testing.assert_array_equal(run(kernel, x), x)


def test_placed_memory_reads_as_nan_until_written():
    def kernel(x):
        return stored(nl.ndarray((4, 8), dtype=nl.bfloat16, address=(0, 1024)))

    assert np.isnan(run(kernel, np.zeros((1, 1), np.float32)).astype(np.float32)).all()


def test_views_of_a_placed_tensor_address_its_own_layout():
    """offset and strides count in the tensor's row-major layout, wherever its partitions
    lie in memory (access patterns: test_nki_api.py's test with address=)."""

    def kernel(x):
        tile = nl.ndarray((4, 8), dtype=nl.float32, address=(0, 4096))
        nisa.dma_copy(dst=tile, src=x)
        assert tile.strides == (8, 1) and tile[1:, 2:].offset == 10
        assert tile.get_pattern() == [[8, 4], [1, 8]]
        bits = tile.view(nl.int32)
        assert bits.strides == (8, 1) and bits[1:, 2:].offset == 10
        return stored(bits)

    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(run(kernel, x), x.view(np.int32))


def test_a_new_psum_placement_starts_a_new_accumulation():
    def kernel(a, b):
        stationary, moving = nl.load(a), nl.load(b)
        first = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.psum, address=(0, 2048))
        nisa.nc_matmul(dst=first, stationary=stationary, moving=moving)
        again = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.psum, address=(0, 2048))
        nisa.nc_matmul(dst=again, stationary=stationary, moving=moving)  # overwrites
        return stored(nl.copy(again))

    a = RNG.normal(size=(16, 4)).astype(np.float32)
    b = RNG.normal(size=(16, 8)).astype(np.float32)
    np.testing.assert_allclose(run(kernel, a, b), a.T @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("target", "error"), [("trn2", errors.SizeOfDimensionExceedArchLimit), ("trn3", None)]
)
def test_a_placed_psum_tile_spans_banks_only_on_neuroncore_v4(monkeypatch, target, error):
    monkeypatch.setenv(runtime.TARGET_ENV, target)

    def kernel(x):
        nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.psum, address=(0, 4096))

    if error is None:
        run(kernel, np.zeros((1, 1), np.float32))
    else:
        with pytest.raises(error):
            run(kernel, np.zeros((1, 1), np.float32))


def test_unplaceable_addresses_are_refused():
    def kernel(x):
        with pytest.raises(TypeError, match="address must be"):
            nl.ndarray((4, 4), dtype=nl.float32, address=(0,))
        with pytest.raises(NotImplementedError, match="HBM"):
            nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm, address=(0, 0))
        with pytest.raises(errors.InvalidAddress, match="multiple of 64"):
            nl.ndarray((64, 4), dtype=nl.float32, address=(32, 0))
        nl.ndarray((32, 4), dtype=nl.float32, address=(96, 0))  # allowed for 32 partitions

    run(kernel, np.zeros((1, 1), np.float32))


def test_placed_tensors_count_outside_the_compilers_tiles():
    """A placed tensor does not count against the capacity the compiler's tiles are checked
    against; the peak counter adds the highest placed byte to theirs."""

    def kernel(x):
        placed = nl.ndarray((128, 1024), dtype=nl.float32, address=(0, 0))  # 4 KiB
        nisa.memset(dst=placed, value=1.0)
        tile = nl.ndarray((128, 256), dtype=nl.float32)  # 1 KiB, the compiler's
        nisa.memset(dst=tile, value=1.0)
        return stored(placed)

    run(kernel, np.zeros((1, 1), np.float32))
    assert nki.last_counters()["peak_sbuf_bytes_per_partition"] == 4096 + 1024


def _schedule(kernel, x):
    with runtime.recording():
        run(kernel, x)
    ((version, trace),) = runtime.last_traces()
    return estimate(trace, version, timeline=True, band=False).timeline


@pytest.mark.parametrize(("address", "waits"), [(0, True), (4096, False)])
def test_the_cost_model_orders_instructions_through_shared_bytes(address, waits):
    """A Vector instruction writing a placement that overlaps the one a DMA loads into waits
    for the load (it would overwrite it early); a placement elsewhere does not."""

    def kernel(x):
        loaded = nl.ndarray((128, 512), dtype=nl.float32, address=(0, 0))
        nisa.dma_copy(dst=loaded, src=x)
        other = nl.ndarray((128, 512), dtype=nl.float32, address=(0, address))
        nisa.memset(dst=other, value=0.0, engine=nisa.vector_engine)

    timeline = _schedule(kernel, np.zeros((128, 512), np.float32))
    (dma_end,) = [end for engine, _, _, end in timeline if engine == "dma"]
    (vector_start,) = [start for engine, _, start, _ in timeline if engine == "vector"]
    assert (vector_start >= dma_end) is waits


# -- the legacy API: nki.compiler.sbuf / psum allocation functions ---------------------------
def legacy_run(kernel, *arrays):
    return legacy.simulate_kernel(kernel, *arrays)


def test_mod_alloc_maps_blocks_to_physical_tiles_modulo():
    """The direct allocation guide's example: num_free_tiles=(2,) puts logical tiles 0 and 2
    (and 1 and 3) in one physical tile (general/nki/nki_direct_allocation_guide.rst@0521004c)."""

    def kernel(x):
        t = lnl.ndarray(
            (4, lnl.par_dim(128), 512),
            dtype=lnl.bfloat16,
            buffer=ncc.sbuf.mod_alloc(base_addr=0, num_free_tiles=(2,)),
        )
        t[0] = lnl.load(x[0])
        t[1] = lnl.load(x[1])
        out = lnl.ndarray((4, 128, 512), dtype=lnl.bfloat16, buffer=lnl.shared_hbm)
        for i in range(4):
            lnl.store(out[i], t[i])
        return out

    x = RNG.normal(size=(2, 128, 512)).astype(np.float32).astype(lnl.bfloat16)
    out = legacy_run(kernel, x)
    np.testing.assert_array_equal(out, x[[0, 1, 0, 1]])


def test_a_psum_tile_placed_over_another_starts_its_own_accumulation():
    """Logical PSUM tiles 0 and 2 share a bank (num_bank_tiles=(2,)): tile 2's first
    ``+=`` overwrites the bank, and tile 0 then reads tile 2's result."""

    def kernel(a, b):
        psum = lnl.ndarray(
            (4, lnl.par_dim(4), 8),
            dtype=lnl.float32,
            buffer=ncc.psum.mod_alloc(base_bank=3, num_bank_tiles=(2,)),
        )
        stationary, moving = lnl.load(a), lnl.load(b)
        psum[0] += lisa.nc_matmul(stationary, moving)
        psum[0] += lisa.nc_matmul(stationary, moving)
        psum[2] += lisa.nc_matmul(stationary, moving)
        out = lnl.ndarray((2, 4, 8), dtype=lnl.float32, buffer=lnl.shared_hbm)
        lnl.store(out[0], lnl.copy(psum[0]))
        lnl.store(out[1], lnl.copy(psum[2]))
        return out

    a = RNG.normal(size=(16, 4)).astype(np.float32)
    b = RNG.normal(size=(16, 8)).astype(np.float32)
    tile0, tile2 = legacy_run(kernel, a, b)
    np.testing.assert_allclose(tile2, a.T @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(tile0, tile2)


def test_alloc_calls_the_placement_function_by_keyword():
    """nki-samples@0898a77 allocated_attention.py passes ``functools.partial`` of a function
    whose first parameter is bound by keyword."""

    def banks(bank_map, idx, pdim_size, fdim_size):
        return bank_map[idx], 0, 0

    def kernel(x):
        buffer = ncc.psum.alloc(functools.partial(banks, bank_map={(0,): 1, (1,): 5}))
        t = lnl.ndarray((2, lnl.par_dim(4), 8), dtype=lnl.float32, buffer=buffer)
        t[1] = lnl.zeros((4, 8), dtype=lnl.float32, buffer=lnl.psum)
        return lnl.copy(t[1])

    with pytest.warns(errors.OnChipOutputWarning):
        np.testing.assert_array_equal(legacy_run(kernel, np.zeros((1, 1), np.float32)), 0)


@pytest.mark.parametrize(
    ("buffer", "match"),
    [
        (lambda: ncc.sbuf.alloc(lambda idx, pdim_size, fdim_size: (0, 0, 0)), "SBUF placement"),
        (lambda: ncc.psum.alloc(lambda idx, pdim_size, fdim_size: (0, 0, 512)), "must be 0"),
        (lambda: ncc.psum.alloc(lambda idx, pdim_size, fdim_size: (8, 0, 0)), "banks 0-7"),
        (lambda: ncc.sbuf.mod_alloc(base_addr=0, base_partition=32), "must be 0"),
        (lambda: ncc.psum.mod_alloc(base_bank=0, base_addr=64), "both must be 0"),
        (lambda: ncc.psum.mod_alloc(base_bank=0, num_free_tiles=(2,)), "all ones"),
    ],
)
def test_legacy_allocation_functions_keep_to_their_documented_range(buffer, match):
    def kernel(x):
        lnl.ndarray((2, lnl.par_dim(4), 8), dtype=lnl.float32, buffer=buffer())

    with pytest.raises(errors.InvalidAddress, match=match):
        legacy_run(kernel, np.zeros((1, 1), np.float32))


def test_the_legacy_compiler_keeps_the_top_16_kib_of_each_partition():
    def kernel(x):
        top = 192 * 1024 - 16 * 1024  # trn1: 192 KiB a partition
        lnl.ndarray((128, 4), dtype=lnl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=top - 16))
        lnl.ndarray((128, 4), dtype=lnl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=top))

    with pytest.raises(errors.TensorAccessOutOfBound, match="16384 are the compiler's"):
        legacy_run(kernel, np.zeros((1, 1), np.float32))


@pytest.mark.parametrize(("loop", "error"), [("affine_range", None), ("static_range", True)])
def test_a_traced_loop_body_is_placed_once(loop, error):
    """The SDK traces an affine_range/sequential_range body once, so an address counter the
    body advances places every iteration where the first went; static_range is unrolled."""

    def kernel(x):
        out = lnl.ndarray((4, 128, 4), dtype=lnl.float32, buffer=lnl.shared_hbm)
        address = 0
        for i in getattr(lnl, loop)(4):
            t = lnl.ndarray(
                (128, 4), dtype=lnl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=address)
            )
            address += 64 * 1024  # the fourth tile would start at 192 KiB
            t[...] = lnl.load(x[i])
            lnl.store(out[i], t)
        return out

    x = RNG.normal(size=(4, 128, 4)).astype(np.float32)
    if error:
        with pytest.raises(errors.TensorAccessOutOfBound):
            legacy_run(kernel, x)
    else:
        np.testing.assert_array_equal(legacy_run(kernel, x), x)
