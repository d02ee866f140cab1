"""The NKI cost model (asickernels.simulate.nki.estimate) over the simulator's trace, and
``nki.benchmark`` reporting its estimate."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import warnings

import numpy as np
import pytest
from conftest import REPO, SHARED, VENDOR, VENDOR_MISSING, load_module, vendor_present

from asickernels.simulate import nki
from asickernels.simulate.nki import estimate as cost_model
from asickernels.simulate.nki import isa as nisa
from asickernels.simulate.nki import language as nl
from asickernels.simulate.nki import runtime
from asickernels.simulate.nki import typing as nt
from asickernels.simulate.nki.benchmarking import NoDeviceTimeWarning
from asickernels.simulate.nki.install import install
from asickernels.simulate.nki.trace import Access, Instruction

TUTORIAL = VENDOR / "aws-neuron-sdk@72825d5/general/nki/examples/matrix_multiplication"
KERNELS = (
    "nki_matmul_tiled_",
    "nki_matmul_hoist_load_",
    "nki_matmul_block_free_dimension_",
    "nki_matmul_fully_optimized_",
)


def tile(key, shape, dtype="bfloat16", memory="sbuf", low=0, high=None, runs=1):
    itemsize = 4 if dtype == "float32" else 2
    size = math.prod(shape)
    high = size - 1 if high is None else high
    return Access(memory, shape[0], key, low, high, shape, dtype, itemsize, runs)


def op(engine, api, reads=(), writes=()):
    return Instruction(engine, api, tuple(reads), tuple(writes))


# -- per-instruction costs ---------------------------------------------------------------
def test_matmul_costs_max_of_64_and_moving_free_size_and_4x_for_fp32():
    """trainium_inferentia2_arch.rst@72825d5: max(N, MM_INIT_LATENCY=64) TensorE cycles at
    2.8 GHz on NeuronCore-v2, roughly 4x for fp32 inputs."""

    def matmul_ns(n, dtype="bfloat16"):
        reads = (tile(1, (128, 128), dtype), tile(2, (128, n), dtype))
        trace = [op("tensor", "matmul", reads, (tile(3, (128, n), "float32", "psum"),))]
        return cost_model.estimate(trace, 2).latency_us * 1000

    assert matmul_ns(512) == pytest.approx(512 / 2.8)
    assert matmul_ns(16) == pytest.approx(64 / 2.8)  # the initiation interval's floor
    assert matmul_ns(512, "float32") == pytest.approx(4 * matmul_ns(512))


def test_vector_costs_follow_the_isa_cost_formulas():
    """IS (isa/__init__.py@2086a70): max(MIN_II=64, N) cycles for one input tile, 2N for two
    (tensor_tensor), N when one of the two is in PSUM or all are bfloat16 in SBUF; at
    1.12 GHz on NeuronCore-v2; NeuronCore-v3's VectorE takes 4 bf16 per cycle."""

    def vector_ns(reads, version=2, api="tensor_tensor"):
        trace = [op("vector", api, reads, (tile(9, reads[0].shape, reads[0].dtype),))]
        return cost_model.estimate(trace, version).latency_us * 1000

    fp32 = "float32"
    one = (tile(1, (128, 1024), fp32),)
    two = (*one, tile(3, (128, 1024), fp32))
    assert vector_ns(one, api="tensor_copy") == pytest.approx(1024 / 1.12)
    assert vector_ns(two) == pytest.approx(2048 / 1.12)
    assert vector_ns(two, api="tensor_tensor_scan") == pytest.approx(2048 / 1.12)
    with_psum = (tile(1, (128, 1024), fp32, "psum"), tile(3, (128, 1024), fp32))
    assert vector_ns(with_psum) == pytest.approx(1024 / 1.12)
    bf16 = (tile(1, (128, 1024)), tile(3, (128, 1024)))
    assert vector_ns(bf16) == pytest.approx(1024 / 1.12)
    assert vector_ns((tile(1, (128, 16), fp32),), api="tensor_copy") == pytest.approx(64 / 1.12)
    assert vector_ns((tile(1, (128, 1024)),), 3, "tensor_copy") == pytest.approx(256 / 0.96)


def test_gpsimd_instructions_pay_the_startup_overhead():
    """IS affine_select / iota: GPSIMD_START (~150 cycles) + N, at 1.4 GHz on v2."""
    trace = [op("gpsimd", "iota", (), (tile(1, (128, 512), "float32"),))]
    assert cost_model.estimate(trace, 2).latency_us * 1000 == pytest.approx((150 + 512) / 1.4)


def test_a_repeated_computation_on_unchanged_tiles_is_computed_once():
    """The loop-invariant ``tensor_tensor`` of the Mamba tutorial's v2 kernel: the same
    operator on the same tiles, none rewritten since, costs one instruction."""
    a, b = tile(1, (128, 512), "float32"), tile(2, (128, 512), "float32")

    def product(out, params=("multiply",), reads=(a, b)):
        return Instruction("vector", "tensor_tensor", reads, (tile(out, (128, 512), "float32"),),
                           params)  # fmt: skip

    once = cost_model.estimate([product(10)], 2).latency_us
    assert cost_model.estimate([product(10), product(11)], 2).latency_us == pytest.approx(once)
    other_op = [product(10), product(11, ("add",))]
    assert cost_model.estimate(other_op, 2).latency_us == pytest.approx(2 * once)
    unknown = [product(10, None), product(11, None)]
    assert cost_model.estimate(unknown, 2).latency_us == pytest.approx(2 * once)
    rewrite_a = op("vector", "tensor_copy", (tile(5, (128, 512), "float32"),), (a,))
    rewritten = cost_model.estimate([product(10), rewrite_a, product(11)], 2).latency_us
    assert rewritten > 2 * once


def _weights_per_row_tile(rows, weight_hbm=(128, 2048), weights=1):
    """add_rmsnorm_matmul's loop nest (AccelOpt@47e29a7): each row tile loads its own x
    and the same ``weights`` weight tiles again; each loaded tile is a new SBUF allocation."""
    trace, key = [], 100
    for row in range(rows):
        x = tile(key, (128, 2048), "float32")
        trace.append(op("dma", "load", (tile(1, (128, 2048), "float32", "hbm", low=row * 262144,
                                             high=row * 262144 + 262143),), (x,)))  # fmt: skip
        for weight in range(2, 2 + weights):
            w = tile(key + weight, weight_hbm, "float32")
            trace.append(op("dma", "load", (tile(weight, weight_hbm, "float32", "hbm"),), (w,)))
            trace.append(op("vector", "tensor_tensor", (x, w),
                            (tile(key + 10 + weight, (128, 2048), "float32"),)))  # fmt: skip
        key += 20
    return trace


def test_a_loop_invariant_load_is_issued_once_as_the_current_compiler_hoists_it():
    """The weight load repeats per row tile on unchanged HBM elements: the current
    compiler's trn1 profile reads it once (hoist_loads), SDK 2.20's reloaded it."""
    trace = _weights_per_row_tile(8)
    tile_bytes = 128 * 2048 * 4
    hoisted = cost_model.estimate(trace, 2, band=False)
    reloaded = cost_model.estimate(trace, 2, band=False, hoist_loads=False)
    assert hoisted.hbm_read_bytes == (8 + 1) * tile_bytes
    assert reloaded.hbm_read_bytes == 16 * tile_bytes
    assert hoisted.latency_us < reloaded.latency_us
    # a store into the weights between the loads makes the second load a new one
    store = op("dma", "store", (tile(99, (128, 2048), "float32"),),
               (tile(2, (128, 2048), "float32", "hbm"),))  # fmt: skip
    rewritten = cost_model.estimate([*trace[:3], store, *trace[3:6]], 2, band=False)
    assert rewritten.hbm_read_bytes == 4 * tile_bytes and rewritten.hbm_write_bytes == tile_bytes


def test_hoisted_loads_are_kept_only_while_the_sbuf_has_room():
    """One 128 KiB-a-partition weight stays in trn1's 192 KiB a partition beside the row
    tiles; two do not, and each leaves for the other (the one read furthest ahead leaves):
    both are loaded again in every row, with nothing to store (an unchanged copy)."""
    x_bytes, w_bytes = 128 * 2048 * 4, 128 * 32 * 1024 * 4
    one = cost_model.estimate(_weights_per_row_tile(4, (128, 32 * 1024)), 2, band=False)
    two = cost_model.estimate(_weights_per_row_tile(4, (128, 32 * 1024), 2), 2, band=False)
    assert one.hbm_read_bytes == 4 * x_bytes + w_bytes
    assert two.hbm_read_bytes == 4 * (x_bytes + 2 * w_bytes)
    assert one.spill_bytes == two.spill_bytes == 0


def test_a_repeated_load_is_kept_only_while_the_data_loaded_since_fits_beside_it():
    """Each row tile loads the same weights again. Three 48 KiB weights and the row tile
    fit in trn1's 192 KiB a partition: each weight is loaded once. Five do not (the row
    tile and four other weights, 200 KiB, are loaded between two uses of each): every
    weight is loaded again in every row, none kept in part."""
    weight, x_bytes = (128, 12 * 1024), 128 * 2048 * 4
    w_bytes = 128 * 12 * 1024 * 4
    fits = cost_model.estimate(_weights_per_row_tile(4, weight, 3), 2, band=False)
    cycles = cost_model.estimate(_weights_per_row_tile(4, weight, 5), 2, band=False)
    assert fits.hbm_read_bytes == 4 * x_bytes + 3 * w_bytes
    assert cycles.hbm_read_bytes == 4 * (x_bytes + 5 * w_bytes)
    assert fits.spill_bytes == cycles.spill_bytes == 0


def _stream(tiles, free, sums):
    """Loads ``tiles`` fp32 [128, ``free``] tiles of one HBM tensor, each read by ``sums``
    VectorE reductions right after its load (compute-bound: the sums outlast the load)."""
    trace, size = [], 128 * free
    for i in range(tiles):
        x = tile(100 + i, (128, free), "float32")
        source = tile(1, (128, free), "float32", "hbm", low=i * size, high=(i + 1) * size - 1)
        trace.append(op("dma", "load", (source,), (x,)))
        for j in range(sums):
            total = tile(1000 + sums * i + j, (128, 1), "float32")
            trace.append(op("vector", "tensor_reduce", (x,), (total,)))
    return trace


def test_a_load_into_reused_sbuf_space_waits_for_the_last_reader_of_what_was_there():
    """Tiles of 80 KiB a partition: two fit in trn1's 192 KiB, so the third load takes the
    first tile's space and starts only once the last sum reading that tile has finished.
    Tiles of 16 KiB leave room: the loads run ahead of the sums."""

    sums_per_tile = 8

    def third_load_and_first_tile_read(free):
        trace = _stream(4, free, sums_per_tile)
        result = cost_model.estimate(trace, 2, band=False, timeline=True)
        loads = [e for e in result.timeline if e[0] == "dma"]
        sums = [e for e in result.timeline if e[0] == "vector"]
        return loads[2][2], sums[sums_per_tile - 1][3]

    load_start, read_end = third_load_and_first_tile_read(20 * 1024)
    assert load_start >= read_end
    load_start, read_end = third_load_and_first_tile_read(4 * 1024)
    assert load_start < read_end


def _keep_then_read(tiles, per_partition_floats=16 * 1024):
    """Computes ``tiles`` SBUF tiles of ``per_partition_floats`` fp32 per partition from
    one input, then reads each again: all are live at once, as bmm_softmax's scores are
    between its max and exp loop nests."""
    shape = (128, per_partition_floats)
    trace = [op("dma", "load", (tile(1, shape, "float32", "hbm"),), (tile(2, shape, "float32"),))]
    for key in range(10, 10 + tiles):
        trace.append(op("vector", "tensor_copy", (tile(2, shape, "float32"),),
                        (tile(key, shape, "float32"),)))  # fmt: skip
    for key in range(10, 10 + tiles):
        trace.append(op("scalar", "activation", (tile(key, shape, "float32"),),
                        (tile(key + 100, (128, 1), "float32"),)))  # fmt: skip
    return trace


def test_values_that_do_not_fit_in_sbuf_are_spilled_and_reloaded():
    """trn1's SBUF holds 192 KiB per partition (24 MiB), three 64 KiB fp32 tiles: the input
    and two results fit; a third result does not (one is spilled: stored and reloaded);
    the fourth takes the input's place, read for the last time."""
    tile_bytes = 128 * 16 * 1024 * 4
    fits = cost_model.estimate(_keep_then_read(2), 2, band=False)
    spills = cost_model.estimate(_keep_then_read(4), 2, band=False, timeline=True)
    assert fits.spill_bytes == 0
    assert spills.spill_bytes == 2 * tile_bytes
    assert spills.latency_us > 2 * fits.latency_us  # the reload waits for the store
    ((store,), (reload,)) = ([e for e in spills.timeline if e[1] == f"spill {way}"]
                             for way in ("store", "reload"))  # fmt: skip
    assert reload[2] >= store[3]
    # the same instructions in the other loop order (each result read as it is made): no
    # spill, and faster
    trace = _keep_then_read(4)
    interleaved = [trace[0]] + [i for pair in zip(trace[1:5], trace[5:], strict=True) for i in pair]
    reordered = cost_model.estimate(interleaved, 2, band=False)
    assert reordered.spill_bytes == 0 and reordered.latency_us < spills.latency_us


def test_a_tile_rewritten_each_iteration_or_updated_in_place_holds_its_space_once():
    """A value lives from its write to its last read: a buffer rewritten in every
    iteration of a loop, or an input whose last read writes the output, never adds up."""
    shape = (128, 40 * 1024)  # 160 KiB of fp32 per partition: one fits, two do not
    buffer = tile(2, shape, "float32")
    loop = []
    for row in range(8):
        source = tile(1, shape, "float32", "hbm", low=row * 128 * 40 * 1024,
                      high=(row + 1) * 128 * 40 * 1024 - 1)  # fmt: skip
        loop += [op("dma", "load", (source,), (buffer,)),
                 op("scalar", "activation", (buffer,), (tile(3, (128, 1), "float32"),))]  # fmt: skip
    chain = [op("dma", "load", (tile(1, shape, "float32", "hbm"),), (tile(10, shape, "float32"),))]
    for key in range(10, 18):  # each step reads its input for the last time
        chain.append(op("vector", "tensor_copy", (tile(key, shape, "float32"),),
                        (tile(key + 1, shape, "float32"),)))  # fmt: skip
    assert cost_model.estimate(loop, 2, band=False).spill_bytes == 0
    assert cost_model.estimate(chain, 2, band=False).spill_bytes == 0


def test_a_store_waiting_for_its_result_does_not_hold_back_later_loads():
    """DMA transfers start when their data is ready, not in program order."""
    compute = op("vector", "tensor_copy", (tile(1, (128, 4096), "float32"),),
                 (tile(2, (128, 4096), "float32"),))  # fmt: skip
    store = op("dma", "store", (tile(2, (128, 4096), "float32"),),
               (tile(20, (128, 4096), "float32", "hbm"),))  # fmt: skip
    load = op("dma", "load", (tile(30, (128, 512), memory="hbm"),), (tile(3, (128, 512)),))
    use = op("scalar", "activation", (tile(3, (128, 512)),), (tile(4, (128, 512)),))
    alone = cost_model.estimate([load, use], 2).latency_us
    result = cost_model.estimate([compute, store, load, use], 2, timeline=True)
    ends = {api: end for _, api, _, end in result.timeline}
    assert ends["activation"] / 1000 == pytest.approx(alone)
    assert result.latency_us == pytest.approx(cost_model.estimate([compute, store], 2).latency_us)


def test_dependent_instructions_wait_and_independent_engines_overlap():
    load = op("dma", "load", (tile(10, (128, 512), memory="hbm"),), (tile(1, (128, 512)),))
    scale = op("scalar", "activation", (tile(1, (128, 512)),), (tile(2, (128, 512)),))
    other = op("vector", "copy", (tile(5, (128, 512)),), (tile(6, (128, 512)),))
    alone = {name: cost_model.estimate([x], 2).latency_us for name, x in
             (("load", load), ("scale", scale), ("other", other))}  # fmt: skip
    chained = cost_model.estimate([load, scale], 2).latency_us
    assert chained == pytest.approx(alone["load"] + alone["scale"])
    parallel = cost_model.estimate([load, other], 2).latency_us
    assert parallel == pytest.approx(max(alone["load"], alone["other"]))


def test_reading_a_disjoint_part_of_a_tile_does_not_wait_for_the_other_part():
    first = op(
        "dma",
        "load",
        (tile(10, (128, 512), memory="hbm"),),
        (tile(1, (128, 512), low=0, high=999),),
    )
    read_other = op(
        "vector", "copy", (tile(1, (128, 512), low=1000, high=1999),), (tile(2, (128, 512)),)
    )
    read_same = op(
        "vector", "copy", (tile(1, (128, 512), low=500, high=1500),), (tile(2, (128, 512)),)
    )
    load_us = cost_model.estimate([first], 2).latency_us
    assert cost_model.estimate([first, read_other], 2).latency_us == pytest.approx(load_us)
    assert cost_model.estimate([first, read_same], 2).latency_us > load_us


def test_dma_pays_one_descriptor_per_partition_however_strided_its_rows():
    """A descriptor carries a "transfer shape, and stride pattern" (nki-dge.rst@81ce03a):
    a strided row costs what a contiguous one does, each partition's descriptor pays
    DMA_BUFFER_NS on its engine, and the bytes never move faster than the engines' peak."""
    nbytes = 128 * 4096
    few = op("dma", "load", (tile(10, (128, 2048), memory="hbm"),), (tile(1, (128, 2048)),))
    many = op(
        "dma", "load", (tile(10, (128, 2048), memory="hbm", runs=32),), (tile(1, (128, 2048)),)
    )
    fast = cost_model.estimate([few], 2).latency_us - cost_model.DMA_LATENCY_NS / 1000
    assert nbytes / (fast * 1000) <= 16 * 17.0  # never above the 16 engines' peak
    assert cost_model.estimate([many], 2).latency_us == cost_model.estimate([few], 2).latency_us
    free = cost_model.estimate([few], 2, dma_buffer_ns=0.0).latency_us
    assert 1000 * (cost_model.estimate([few], 2).latency_us - free) == pytest.approx(
        128 / 16 * cost_model.DMA_BUFFER_NS
    )


def _dma_ns(trace, version=3):
    """The DMA engine time ``trace``'s transfers take (the semaphore latency left out)."""
    result = cost_model.estimate(trace, version, band=False)
    return result.busy_share["dma"] * result.latency_us * 1000


def test_each_dma_engine_serves_eight_partitions_at_its_own_rate():
    """nki-dma-overview.rst@81ce03a: "each DMA engine corresponds to 8 partition lanes": a
    [4, 4096] load runs on one engine at its full rate; a [128, F] load on all 16, which
    together sustain DMA_EFFICIENCY of their aggregate."""
    trn2 = cost_model.generation_of(3)
    narrow = op("dma", "load", (tile(10, (4, 4096), memory="hbm"),), (tile(1, (4, 4096)),))
    wide = op("dma", "load", (tile(10, (128, 4096), memory="hbm"),), (tile(1, (128, 4096)),))
    buffers = 4 * cost_model.DMA_BUFFER_NS
    assert _dma_ns([narrow]) == pytest.approx(buffers + 32768 / trn2.dma_engine_bytes_per_ns)
    rate = 16 * trn2.dma_engine_bytes_per_ns * cost_model.DMA_EFFICIENCY
    assert _dma_ns([wide]) == pytest.approx(8 * cost_model.DMA_BUFFER_NS + 128 * 8192 / rate)


def test_a_dma_queue_starts_one_transfer_per_fixed_cost():
    """A stream of small transfers from one queue takes DMA_LATENCY_NS each (the DMA
    overview's graph is flat below ~2.5 KiB a partition); left to the compiler, they
    spread over the DMA_QUEUES and overlap their fixed costs."""

    def loads(trigger):
        return [Instruction("dma", "load", (tile(2 * i, (128, 64), memory="hbm"),),
                            (tile(2 * i + 1, (128, 64)),), trigger=trigger)
                for i in range(10)]  # fmt: skip

    latency, data = cost_model.DMA_LATENCY_NS, _dma_ns(loads("")[:1])
    one_queue = cost_model.estimate(loads("gpsimd"), 3, band=False).latency_us * 1000
    assert one_queue == pytest.approx(9 * latency + data + latency)
    spread = cost_model.estimate(loads(""), 3, band=False).latency_us * 1000
    assert spread < one_queue / 3  # two transfers per queue here, against ten


@pytest.mark.parametrize("source, share", [("hbm", 0.9), ("sbuf", 0.5)])
def test_dma_transposes_move_at_their_documented_share_of_a_copys_rate(source, share):
    """trainium2_arch.rst@81ce03a: HBM -> SBUF DMA transposes reach "up to 90%" of a copy's
    throughput, SBUF -> SBUF ones "up to 50%"; a transpose moves whole partitions, not the
    source's element-sized pieces."""
    runs = 128 if source == "hbm" else 1  # a transposed HBM view: one piece per element
    copy = op("dma", "dma_copy", (tile(10, (128, 128), memory=source),), (tile(1, (128, 128)),))
    transpose = op("dma", "dma_transpose", (tile(10, (128, 128), memory=source, runs=runs),),
                   (tile(1, (128, 128)),))  # fmt: skip
    pieces = 8 * cost_model.DMA_BUFFER_NS
    assert (_dma_ns([transpose]) - pieces) * share == pytest.approx(_dma_ns([copy]) - pieces)


def test_a_short_instruction_depending_on_the_one_before_pays_the_static_overhead():
    """trainium_inferentia2_arch.rst@81ce03a: back-to-back instructions "with every
    instruction depending on the output tile of the previous instruction" add 100 cycles,
    and cannot hide the ~60-cycle access overhead; a long one (N = 512) pays neither."""

    def chain(width, dependent):
        return [op("scalar", "activation", (tile(i if dependent else 100 + i, (128, width)),),
                   (tile(i + 1, (128, width)),)) for i in range(4)]  # fmt: skip

    def span(trace):
        return cost_model.estimate(trace, 2, band=False).latency_us * 1000

    extra = span(chain(1, True)) - span(chain(1, False))
    assert extra == pytest.approx(3 * cost_model.DEPENDENT_CYCLES / 1.4)
    assert span(chain(512, True)) == pytest.approx(span(chain(512, False)))


def test_dma_copy_records_the_queue_the_kernel_chose():
    @nki.jit
    def kernel(a):
        tile_ = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile_, src=a, engine=nisa.engine.gpsimd)
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=tile_)
        return out

    with runtime.recording(trace_only=True):
        nki.simulate(kernel)(np.zeros((128, 64), np.float32))
    ((_, trace),) = runtime.last_traces()
    assert [i.trigger for i in trace if i.engine == "dma"] == ["gpsimd", ""]


def test_assign_and_zeroing_psum_cost_nothing_but_keep_dependencies():
    load = op("dma", "load", (tile(10, (128, 512), memory="hbm"),), (tile(1, (128, 512)),))
    assign = op("vector", "assign", (tile(1, (128, 512)),), (tile(2, (128, 512)),))
    use = op("scalar", "activation", (tile(2, (128, 512)),), (tile(3, (128, 512)),))
    zero_psum = op("vector", "full", (), (tile(4, (128, 512), "float32", "psum"),))
    zero_sbuf = op("vector", "full", (), (tile(5, (128, 512)),))
    direct = op("scalar", "activation", (tile(1, (128, 512)),), (tile(3, (128, 512)),))
    chained = cost_model.estimate([load, assign, use], 2).latency_us
    assert chained == pytest.approx(cost_model.estimate([load, direct], 2).latency_us)
    assert cost_model.estimate([zero_psum], 2).latency_us == 0
    assert cost_model.estimate([zero_sbuf], 2).latency_us > 0


def test_unknown_generation_is_a_clear_error():
    with pytest.raises(ValueError, match="NeuronCore-v9"):
        cost_model.estimate([], 9)


def test_chrome_trace_has_one_lane_per_engine_and_one_event_per_instruction(tmp_path):
    load = op("dma", "load", (tile(10, (128, 512), memory="hbm"),), (tile(1, (128, 512)),))
    scale = op("scalar", "activation", (tile(1, (128, 512)),), (tile(2, (128, 512)),))
    result = cost_model.estimate([load, scale], 2, timeline=True)
    path = tmp_path / "timeline.json"
    result.write_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert [e["name"] for e in spans] == ["load", "activation"]
    assert spans[1]["ts"] >= spans[0]["ts"] + spans[0]["dur"]  # the dependency
    assert {e["args"]["name"] for e in events if e["ph"] == "M"} >= {"TensorE", "DMA/HBM"}


# -- nki.benchmark ---------------------------------------------------------------------------
def _scaled_add(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=nl.multiply(nl.load(a), 2.0))
    return out


def test_benchmark_reports_an_estimate_marked_as_such_and_the_bound_engine():
    bench = nki.benchmark(warmup=1, iters=2)(_scaled_add)
    x = np.ones((128, 2048), np.float32)
    with pytest.warns(
        NoDeviceTimeWarning,
        match="no device time was measured; latencies are a cost-model estimate",
    ):
        np.testing.assert_array_equal(bench(x), 2 * x)
    result = bench.benchmark_result
    assert result.device_time_measured is False and "estimate" in result.note
    assert result.nc_latency.estimated and not result.nc_latency.measured
    p99 = result.nc_latency.get_latency_percentile(99)
    assert p99 == result.estimate.latency_us > 0
    assert result.estimate.bound in {"DMA/HBM", "VectorE", "ScalarE", "GpSimdE", "TensorE"}
    assert max(result.estimate.busy_share.values()) <= 1.0 + 1e-9
    assert result.estimate.instructions == 3  # load, multiply, dma_copy
    low, high = result.nc_latency.band_us
    assert low <= p99 <= high and "band" in repr(result.nc_latency) and "band" in result.note


def test_the_band_spans_the_dma_rate_and_overlap_assumptions():
    """A DMA-bound trace: the band runs from the busiest engine alone at the fastest DMA rate
    of DMA_EFFICIENCY_RANGE to the schedule at the slowest; a compute-only trace has none."""
    load = op("dma", "load", (tile(1, (128, 8192), "float32", "hbm"),), (tile(2, (128, 8192)),))
    add = op("vector", "tensor_scalar", (tile(2, (128, 8192)),), (tile(3, (128, 8192)),))
    result = cost_model.estimate([load, add], 2)
    slow, fast = cost_model.DMA_EFFICIENCY_RANGE
    at = {
        e: cost_model.estimate([load, add], 2, dma_efficiency=e, band=False) for e in (slow, fast)
    }
    low, high = result.band_us
    assert high == pytest.approx(at[slow].latency_us)
    assert low < at[fast].latency_us < result.latency_us < high
    compute = cost_model.estimate([add], 2)
    assert compute.band_us == (compute.latency_us, compute.latency_us)
    assert cost_model.estimate([add], 2, band=False).band_us is None


def test_benchmark_result_writes_its_timeline_as_a_chrome_trace(tmp_path):
    bench = nki.benchmark(_scaled_add)
    with pytest.warns(NoDeviceTimeWarning):
        bench(nt.tensor[[128, 512], nl.float32])
    path = tmp_path / "timeline.json"
    bench.benchmark_result.write_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in spans] == ["load", "multiply", "dma_copy"]
    assert trace["otherData"]["estimate"] is True
    end = max(e["ts"] + e["dur"] for e in spans)
    assert end == pytest.approx(bench.benchmark_result.estimate.latency_us)


def test_placeholder_inputs_trace_only_and_estimate_as_arrays_do():
    bench = nki.benchmark(_scaled_add)
    with pytest.warns(NoDeviceTimeWarning):
        bench(np.zeros((128, 4096), np.float32))
    from_values = bench.benchmark_result.estimate.latency_us
    with pytest.warns(NoDeviceTimeWarning):
        bench(nt.tensor[[128, 4096], nl.float32])
    assert bench.benchmark_result.estimate.latency_us == pytest.approx(from_values)


def test_benchmark_estimates_for_the_simulated_target(monkeypatch):
    """NEURON_PLATFORM_TARGET_OVERRIDE picks the generation whose clocks and bandwidths
    price the trace; a DMA-heavy kernel is faster on trn3's faster DMA engines."""
    latency = {}
    for target in ("trn1", "trn3"):
        monkeypatch.setenv(runtime.TARGET_ENV, target)
        bench = nki.benchmark(_scaled_add)
        with pytest.warns(NoDeviceTimeWarning):
            bench(nt.tensor[[128, 8192], nl.float32])
        assert target in bench.benchmark_result.estimate.generation
        latency[target] = bench.benchmark_result.estimate.latency_us
    assert latency["trn3"] < latency["trn1"]


def _matmul_kernel(a, b):
    a_tile = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    b_tile = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a_tile, src=a)
    nisa.dma_copy(dst=b_tile, src=b)
    product = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=product, stationary=a_tile, moving=b_tile)
    result = nl.ndarray(product.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=result, src=product)
    out = nl.ndarray(product.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=result)
    return out


def test_trace_only_runs_skip_the_matmul_arithmetic():
    """Placeholder runs never compute values: under a trace-only recording even array
    inputs give a zero product (a normal run gives the real one)."""
    a = np.ones((128, 128), np.float32)
    b = np.ones((128, 512), np.float32)
    np.testing.assert_array_equal(nki.simulate(_matmul_kernel)(a, b), a.T @ b)
    with runtime.recording(trace_only=True):
        skipped = nki.simulate(_matmul_kernel)(a, b)
    assert skipped.shape == (128, 512) and not np.any(skipped)


CURRENT_TUTORIAL = SHARED / "corpus/nki/aws-neuron-sdk@81ce03a/nki/examples/matrix_multiplication"


def test_current_api_benchmark_takes_placeholders(monkeypatch):
    """The current generation's tutorial kernel (``import nki``) under ``nki.benchmark``:
    ``nt.tensor[shape, dtype]`` placeholders estimate as arrays of those shapes do (and
    arrays still compute the product)."""
    if not CURRENT_TUTORIAL.is_dir():
        pytest.skip(f"vendor kernel corpus not found at {CURRENT_TUTORIAL}")
    for name, module in {"nki": nki, "nki.language": nl, "nki.isa": nisa, "nki.typing": nt}.items():
        monkeypatch.setitem(sys.modules, name, module)
    path = CURRENT_TUTORIAL / "matrix_multiplication_nki_kernels.py"
    tutorial = load_module(path, "current_matmul_tutorial")
    sys.modules.pop("current_matmul_tutorial")
    bench = nki.benchmark(warmup=5, iters=10)(tutorial.nki_matmul_hoist_load_)
    rng = np.random.default_rng(0)
    lhs_t, rhs = (rng.standard_normal(s).astype(np.float32) for s in ((256, 128), (256, 1024)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoDeviceTimeWarning)
        product = bench(lhs_t, rhs)
        from_arrays = bench.benchmark_result.estimate.latency_us
        placeholders = bench(nt.tensor[[256, 128], nl.float32], nt.tensor[[256, 1024], nl.float32])
    np.testing.assert_allclose(product, lhs_t.T @ rhs, rtol=1e-4, atol=1e-3)
    assert placeholders.shape == (128, 1024)
    assert bench.benchmark_result.estimate.latency_us == pytest.approx(from_arrays)


def _legacy_api():
    install()
    import neuronxcc.nki as legacy_nki  # type: ignore[import-not-found]
    import neuronxcc.nki.language as legacy_nl  # type: ignore[import-not-found]
    import neuronxcc.nki.typing as legacy_nt  # type: ignore[import-not-found]

    return legacy_nki, legacy_nl, legacy_nt


def _legacy_trace(kernel, *inputs):
    """The trace of one trace-only ``nki.benchmark`` run of the legacy ``kernel``."""
    legacy_nki, _, _ = _legacy_api()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoDeviceTimeWarning)
        legacy_nki.benchmark(kernel)(*inputs)
    ((_, trace),) = runtime.last_traces()
    return trace


def _require_tutorials():
    if not vendor_present("aws-neuron-sdk@72825d5"):
        pytest.skip(VENDOR_MISSING)


def _legacy_tutorial():
    _require_tutorials()
    api = _legacy_api()
    if str(TUTORIAL) not in sys.path:
        sys.path.insert(0, str(TUTORIAL))
    import matrix_multiplication_nki_kernels as tutorial  # type: ignore[import-not-found]

    return tutorial, *api


# Recorded estimates (us, trn1) of the tutorial's kernels at K=1024, M=2048, N=1024: a
# change to the model or the trace that moves one fails here; re-record deliberately. At
# this size both inputs fit in SBUF: the current compiler's hoisting (the model's default)
# loads each tile once whichever of the first three steps issues the loads. The last step
# has one block per dimension here: its first PSUM accumulation group needs all eight
# K tiles of lhsT, which it loads after all of rhs (6 MB, 16 large loads), so TensorE
# starts only when every load is done (at 4096x8192x8192 the next K block's loads overlap
# the matmuls instead); at this size that costs more than its fewer bytes save.
RECORDED_US = {
    "nki_matmul_tiled_": 72.83243697478981,
    "nki_matmul_hoist_load_": 72.87193277310915,
    "nki_matmul_block_free_dimension_": 71.55462184873943,
    "nki_matmul_fully_optimized_": 84.73445378151312,
}


@pytest.mark.parametrize("name", KERNELS)
def test_tutorial_estimates_stay_at_their_recorded_values(name):
    tutorial, legacy_nki, legacy_nl, legacy_nt = _legacy_tutorial()
    shapes = ([1024, 2048], [1024, 1024], [2048, 1024])
    placeholders = [legacy_nt.tensor[s, legacy_nl.bfloat16] for s in shapes]
    bench = legacy_nki.benchmark(warmup=5, iters=10)(getattr(tutorial, name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoDeviceTimeWarning)
        bench(*placeholders)
    got = bench.benchmark_result.nc_latency.get_latency_percentile(99)
    assert got == pytest.approx(RECORDED_US[name], rel=1e-6)


def test_tutorial_kernel_computes_the_product_with_array_inputs():
    """Array inputs still compute values (only placeholders skip them)."""
    tutorial, legacy_nki, _, _ = _legacy_tutorial()
    rng = np.random.default_rng(0)
    lhs_t = rng.standard_normal((256, 128)).astype(np.float32)
    rhs = rng.standard_normal((256, 512)).astype(np.float32)
    out = np.zeros((128, 512), np.float32)
    bench = legacy_nki.benchmark(warmup=1, iters=1)(tutorial.nki_matmul_tiled_)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NoDeviceTimeWarning)
        bench(lhs_t, rhs, out)
    np.testing.assert_allclose(out, lhs_t.T @ rhs, rtol=1e-4, atol=1e-3)
    assert bench.benchmark_result.estimate.latency_us > 0
    assert runtime.last_traces()[0][0] == 2  # the legacy API's default target: trn1


@pytest.mark.slow
def test_sdk_tutorial_main_prints_four_estimated_latencies():
    """``python -m asickernels.simulate.nki`` runs the 2.20 tutorial file unchanged: its
    ``__main__`` benchmarks [4096, 8192] @ [8192, 8192] bf16 placeholders four times."""
    import subprocess

    _require_tutorials()
    script = TUTORIAL / "matrix_multiplication_nki_kernels.py"
    done = subprocess.run(
        [sys.executable, "-m", "asickernels.simulate.nki", str(script)],
        capture_output=True,
        text=True,
        timeout=3600,
        check=True,
    )
    latencies = [
        float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("Latency:")
    ]
    assert len(latencies) == 4 and all(ms > 0 for ms in latencies), done.stdout
    # the tutorial's order, except that the current compiler hoists the tiled kernel's
    # loop-invariant loads itself (what the hoist_load step does by hand): those two
    # differ only in which loads the SBUF plan keeps
    assert latencies[3] < latencies[2] < min(latencies[:2])
    assert latencies[1] == pytest.approx(latencies[0], rel=0.1)
    assert "cost-model estimate" in done.stderr
    # The same kernels and shapes as calibration.json's matmul rows: their recorded
    # estimates (current compiler), as the tutorial prints them (ms, 2 decimals).
    _, record = _calibration()
    rows = {r["kernel"]: r["current_compiler_estimate_us"] for r in record["model"]["rows"]}
    assert latencies == [round(rows[name] / 1000, 2) for name in KERNELS]


def _engines_run(trace):
    result = cost_model.estimate(trace, 2, timeline=True, band=False)
    return [(engine, api) for engine, api, _, _ in result.timeline], result


def test_unpinned_work_runs_on_the_documented_engine_that_finishes_it_first():
    """An instruction whose engine the kernel left to the compiler runs where it finishes
    first at that engine's documented cost: a reciprocal on ScalarE (N cycles, not VectorE's
    8N), a PSUM copy on VectorE while ScalarE is busy; a pinned one stays where it was put."""
    data = tile(1, (128, 512), "float32")
    recip = Instruction("vector", "reciprocal", (data,), (tile(2, (128, 512), "float32"),),
                        pinned=False)  # fmt: skip
    placed, unpinned = _engines_run([recip])
    assert placed == [("scalar", "reciprocal")]
    assert unpinned.latency_us * 1000 == pytest.approx(512 / 1.4)
    pinned = dataclasses.replace(recip, pinned=True)
    assert _engines_run([pinned])[0] == [("vector", "reciprocal")]
    assert cost_model.estimate([pinned], 2).latency_us * 1000 == pytest.approx(8 * 512 / 1.12)

    def copy(key):
        return Instruction("vector", "copy", (tile(key, (128, 512), "float32", "psum"),),
                           (tile(key + 100, (128, 512), "float32"),), pinned=False)  # fmt: skip

    busy = op("scalar", "activation", (data,), (tile(3, (128, 512), "float32"),))
    assert _engines_run([copy(10)])[0] == [("scalar", "copy")]  # ScalarE's faster clock
    assert _engines_run([busy, copy(10), copy(11)])[0] == [
        ("scalar", "activation"), ("vector", "copy"), ("scalar", "copy")]  # fmt: skip
    # two full tiles: a tensor_tensor, which only VectorE runs
    product = Instruction("vector", "multiply", (data, tile(4, (128, 512), "float32")),
                          (tile(5, (128, 512), "float32"),), pinned=False)  # fmt: skip
    assert _engines_run([busy, product])[0][1] == ("vector", "multiply")
    by_scalar = dataclasses.replace(product, reads=(data,))
    assert _engines_run([by_scalar])[0] == [("scalar", "multiply")]
    # ScalarE takes only multiply-add, multiply or add (IS tensor_scalar)
    shift = Instruction("vector", "tensor_scalar", (data,), (tile(6, (128, 512), "float32"),),
                        ("subtract", "tile", "False", "multiply", "tile", "False"), False)  # fmt: skip
    assert _engines_run([shift])[0] == [("vector", "tensor_scalar")]
    scale = dataclasses.replace(shift, params=("multiply", "2.0", "False", "add", "1.0", "False"))
    assert _engines_run([scale])[0] == [("scalar", "tensor_scalar")]


def _load_work_store_load():
    load = op("dma", "load", (tile(10, (128, 1024), "float32", "hbm"),),
              (tile(1, (128, 1024), "float32"),))  # fmt: skip
    work = op("vector", "tensor_copy", (tile(1, (128, 1024), "float32"),),
              (tile(2, (128, 1024), "float32"),))  # fmt: skip
    store = op("dma", "store", (tile(2, (128, 1024), "float32"),),
               (tile(20, (128, 1024), "float32", "hbm"),))  # fmt: skip
    second = op("dma", "load", (tile(11, (128, 1024), "float32", "hbm"),),
                (tile(3, (128, 1024), "float32"),))  # fmt: skip
    return load, work, store, second


def _dma_spans(trace):
    result = cost_model.estimate(trace, 2, timeline=True, band=False)
    return result, [(start, end) for engine, _, start, end in result.timeline if engine == "dma"]


def test_the_dma_engines_serve_transfers_in_the_order_their_data_is_ready():
    """A load traced after a store that waits for a result, but ready before it, moves
    first (the tutorial layernorm's next row tile loads while this one computes)."""
    load, work, store, second = _load_work_store_load()
    result, (first, kept, then) = _dma_spans([load, work, store, second])
    latency = cost_model.DMA_LATENCY_NS
    assert then[0] == pytest.approx(first[1] - latency)  # right after the first load,
    assert then[1] - latency <= kept[0]  # all of it before the store
    busy = result.busy_share["dma"] * result.latency_us * 1000
    assert result.latency_us * 1000 == pytest.approx(busy + latency)  # no idle DMA time


def test_a_transfer_fills_the_dma_time_left_idle_around_earlier_ones():
    """A load ready at 0 but traced after a store that was booked first (a later load
    needed the stored data) uses the idle DMA time before that store and continues after
    it, instead of waiting for a gap it fits whole (the 16 engines interleave queues)."""
    load, work, store, second = _load_work_store_load()
    reload = op("dma", "load", (tile(20, (128, 1024), "float32", "hbm"),),
                (tile(4, (128, 1024), "float32"),))  # fmt: skip
    needs_reload = op("vector", "tensor_copy", (tile(4, (128, 1024), "float32"),),
                      (tile(5, (128, 1024), "float32"),))  # fmt: skip
    _, (first, kept, _, then) = _dma_spans([load, work, store, reload, needs_reload, second])
    latency = cost_model.DMA_LATENCY_NS
    assert then[0] == pytest.approx(first[1] - latency)  # right after the first load,
    assert then[0] < kept[0]  # before the store
    assert then[1] > kept[1]  # and the rest after it


def test_what_reads_a_psum_accumulation_waits_for_the_matmuls():
    """``psum_tile += nisa.nc_matmul(...)`` issues no instruction of its own (the matmul
    accumulates), but the copy out of PSUM still waits for the matmuls (both ways of
    writing it: the tutorials' ``res[...] +=`` and ``res +=``)."""
    legacy_nki, legacy_nl, legacy_nt = _legacy_api()
    import neuronxcc.nki.isa as legacy_nisa  # type: ignore[import-not-found]

    def kernel(lhs_t, rhs, out, sliced):
        res = legacy_nl.zeros((128, 512), legacy_nl.float32, buffer=legacy_nl.psum)
        for k in legacy_nl.affine_range(2):
            a = legacy_nl.load(lhs_t[k * 128 : (k + 1) * 128, :])
            b = legacy_nl.load(rhs[k * 128 : (k + 1) * 128, :])
            if sliced:
                res[...] += legacy_nisa.nc_matmul(a, b)
            else:
                res += legacy_nisa.nc_matmul(a, b)
        legacy_nl.store(out, legacy_nl.copy(res, dtype=legacy_nl.bfloat16))

    for sliced in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NoDeviceTimeWarning)
            bench = legacy_nki.benchmark(kernel)
            bench(legacy_nt.tensor[[256, 128], legacy_nl.bfloat16],
                  legacy_nt.tensor[[256, 512], legacy_nl.bfloat16],
                  legacy_nt.tensor[[128, 512], legacy_nl.bfloat16], sliced)  # fmt: skip
        timeline = cost_model.estimate(runtime.last_traces()[0][1], 2, timeline=True).timeline
        matmuls_done = max(end for engine, _, _, end in timeline if engine == "tensor")
        copy_start = next(start for _, api, start, _ in timeline if api == "copy")
        assert copy_start >= matmuls_done, sliced


def test_the_trace_records_whether_the_kernel_chose_the_engine():
    """``nisa`` calls with ``engine`` unset and ``nl`` arithmetic leave the engine to the
    compiler (``pinned`` False); an explicit ``engine`` pins it (both API generations)."""
    _, legacy_nl, legacy_nt = _legacy_api()
    import neuronxcc.nki.isa as legacy_nisa  # type: ignore[import-not-found]

    def kernel(x, out):
        tile = legacy_nl.load(x)
        scaled = legacy_nisa.tensor_scalar(tile, op0=legacy_nl.multiply, operand0=2.0)
        fixed = legacy_nisa.tensor_scalar(scaled, op0=legacy_nl.add, operand0=1.0,
                                          engine=legacy_nisa.vector_engine)  # fmt: skip
        inverse = legacy_nisa.reciprocal(fixed)
        legacy_nl.store(out, legacy_nl.multiply(inverse, tile))

    trace = _legacy_trace(kernel, legacy_nt.tensor[[128, 512], legacy_nl.float32],
                          legacy_nt.tensor[[128, 512], legacy_nl.float32])  # fmt: skip
    assert [(i.api, i.pinned) for i in trace] == [
        ("load", True), ("tensor_scalar", False), ("tensor_scalar", True),
        ("reciprocal", False), ("multiply", False), ("store", True)]  # fmt: skip


def test_legacy_isa_adapters_trace_the_kernels_tiles():
    """Legacy ``nisa`` calls that run through the current API's implementation are traced
    with the kernel's own tiles, so they depend on the load that wrote their input."""
    _, legacy_nl, legacy_nt = _legacy_api()
    import neuronxcc.nki.isa as legacy_nisa  # type: ignore[import-not-found]

    def kernel(x, out):
        tile = legacy_nl.load(x)
        summed = legacy_nisa.tensor_tensor(tile, tile, op=legacy_nl.add)
        legacy_nl.store(out, summed)

    trace = _legacy_trace(kernel, legacy_nt.tensor[[128, 512], legacy_nl.float32],
                          legacy_nt.tensor[[128, 512], legacy_nl.float32])  # fmt: skip
    load, add, store = trace
    assert (load.api, add.api, store.api) == ("load", "tensor_tensor", "store")
    assert add.reads[0].key == load.writes[0].key and store.reads[0].key == add.writes[0].key


def test_load_transpose2d_is_one_transfer_traced_with_its_tiles_in_both_apis():
    """``nl.load_transpose2d`` is a DMA that reads the HBM tensor and writes the SBUF tile
    (so what reads the tile waits for it), named as the kernel called it."""
    _, legacy_nl, legacy_nt = _legacy_api()

    def legacy_kernel(x, out):
        legacy_nl.store(out, legacy_nl.load_transpose2d(x))

    def current_kernel(x):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.load_transpose2d(x))
        return out

    legacy = _legacy_trace(legacy_kernel, legacy_nt.tensor[[64, 128], legacy_nl.float32],
                           legacy_nt.tensor[[128, 64], legacy_nl.float32])  # fmt: skip
    with runtime.recording(trace_only=True):
        nki.simulate(current_kernel)(np.zeros((64, 128), np.float32))
    ((_, current),) = runtime.last_traces()
    for load, store in (legacy, current):
        assert (load.engine, load.api) == ("dma", "load_transpose2d")
        assert [a.memory for a in load.reads + load.writes] == ["hbm", "sbuf"]
        assert load.reads[0].nbytes == 64 * 128 * 4
        assert store.reads[0].key == load.writes[0].key


def test_a_legacy_reduce_res_is_traced_as_written_and_costs_the_accumulator_read():
    """``reduce_res`` is an output of ``activation_reduce``: what reads it waits for the
    activation, which pays ActReadAccumulator's "roughly 64 ScalarE cycles"
    (nki/guides/architecture/trainium_inferentia2_arch.rst@81ce03a)."""
    _, legacy_nl, legacy_nt = _legacy_api()
    import neuronxcc.nki.isa as legacy_nisa  # type: ignore[import-not-found]

    def kernel(x, out):
        tile = legacy_nl.load(x)
        sums = legacy_nl.ndarray((128, 1), dtype=legacy_nl.float32, buffer=legacy_nl.sbuf)
        legacy_nisa.activation_reduce(legacy_nl.exp, tile, reduce_op=legacy_nl.add,
                                      reduce_res=sums)  # fmt: skip
        legacy_nl.store(out, legacy_nl.copy(sums))

    trace = _legacy_trace(kernel, legacy_nt.tensor[[128, 512], legacy_nl.float32],
                          legacy_nt.tensor[[128, 1], legacy_nl.float32])  # fmt: skip
    activation = next(i for i in trace if i.api == "activation")
    copy = next(i for i in trace if i.api in ("copy", "tensor_copy"))
    sums_key = copy.reads[0].key
    assert sums_key in {a.key for a in activation.writes}
    assert sums_key not in {a.key for a in activation.reads}
    result = cost_model.estimate(trace, 2, band=False, timeline=True)
    ((_, _, start, end),) = [e for e in result.timeline if e[1] == "activation"]
    assert end - start == pytest.approx((512 + 64) / 1.4)
    copy_start = next(e[2] for e in result.timeline if e[1] in ("copy", "tensor_copy"))
    assert copy_start >= end


def test_a_legacy_loop_reduce_is_traced_as_writing_its_destination():
    """``dst[...] = nl.loop_reduce(x, ...)`` combines into ``dst``: the store of ``dst``
    waits for it (NKIBench's bmm_softmax and lora reduce their row maxima this way)."""
    _, legacy_nl, legacy_nt = _legacy_api()

    def kernel(x, out):
        acc = legacy_nl.zeros((128, 512), dtype=legacy_nl.float32, buffer=legacy_nl.sbuf)
        for i in legacy_nl.affine_range(2):
            acc[...] = legacy_nl.loop_reduce(legacy_nl.load(x), op=np.add, loop_indices=(i,))
        legacy_nl.store(out, acc)

    trace = _legacy_trace(kernel, legacy_nt.tensor[[128, 512], legacy_nl.float32],
                          legacy_nt.tensor[[128, 512], legacy_nl.float32])  # fmt: skip
    reductions = [i for i in trace if i.api == "loop_reduce"]
    store = trace[-1]
    assert len(reductions) == 2 and store.api == "store"
    assert all(r.writes[0].key == store.reads[0].key for r in reductions)
    timeline = cost_model.estimate(trace, 2, band=False, timeline=True).timeline
    last_reduction = max(e[3] for e in timeline if e[1] == "loop_reduce")
    assert next(e[2] for e in timeline if e[1] == "store") >= last_reduction


def test_recorded_calibration_matches_the_models_constants():
    """benchmarks/nki_estimate/calibration.json was recorded with the model's DMA constants;
    re-run the script when a constant changes."""
    path = REPO / "benchmarks/nki_estimate/calibration.json"
    record = json.loads(path.read_text())
    assert record["model"]["dma_buffer_ns"] == cost_model.DMA_BUFFER_NS
    assert record["model"]["dma_efficiency"] == cost_model.DMA_EFFICIENCY_SDK_2_20
    rows = [r for r in record["model"]["rows"] if r["absolute"]]
    errors = sorted(abs(r["estimate_ms"] / r["published_ms"] - 1) for r in rows)
    assert record["model"]["median_abs_error"] == pytest.approx(errors[len(errors) // 2], abs=1e-3)


# -- the calibration's recorded estimates ---------------------------------------------------
def _calibration():
    """benchmarks/nki_estimate/calibrate.py (not a package: loaded from its path) and the
    calibration.json it recorded (the tutorial kernels it runs: tests/fetch_vendor.py)."""
    _require_tutorials()
    path = REPO / "benchmarks/nki_estimate/calibrate.py"
    module = sys.modules.get("nki_estimate_calibrate")
    if module is None:
        module = load_module(path, "nki_estimate_calibrate")
    record = json.loads((path.parent / "calibration.json").read_text())
    return module, record


# (kernel, workload) rows of calibration.json re-estimated here: the fast tier takes the
# rows that simulate in about a second, the slow tier those under a minute on this machine
# (the matmul rows, 40-75 s each, are left to calibrate.py).
FAST_ROWS = (
    ("mamba_v1", "mamba seq 512, 256 channels"),
    ("nki_layernorm_kernel_v1", "layernorm [300, 1000] fp32"),
    ("nki_layernorm_kernel_v2", "layernorm [300, 1000] fp32"),
)
SLOW_ROWS = (
    ("mamba_v1", "mamba seq 512, 4096 channels"),
    ("mamba_v2", "mamba seq 512, 4096 channels"),
    ("mamba_v2", "mamba seq 2048, 4096 channels"),
    ("mamba_v3", "mamba seq 2048, 4096 channels"),
)


@pytest.mark.parametrize(
    ("kernel", "family"),
    [*FAST_ROWS, *(pytest.param(*row, marks=pytest.mark.slow) for row in SLOW_ROWS)],
)
def test_calibration_estimate_has_not_drifted_from_its_recorded_value(kernel, family):
    """A change to the model or the simulator's trace that moves a calibration estimate
    fails here; re-run benchmarks/nki_estimate/calibrate.py to re-record deliberately."""
    calibrate, record = _calibration()
    (figure,) = [f for f in calibrate.FIGURES if (f.kernel, f.family) == (kernel, family)]
    (row,) = [r for r in record["model"]["rows"] if (r["kernel"], r["family"]) == (kernel, family)]
    trace, _ = calibrate.trace_of(figure)
    got = cost_model.estimate(  # SDK 2.20's compiler
        trace, 2, hoist_loads=False, dma_efficiency=cost_model.DMA_EFFICIENCY_SDK_2_20
    ).latency_us
    assert got == pytest.approx(row["estimate_us"], rel=1e-9)
    assert row["instructions"] == len(trace)


def test_mamba_v2_is_estimated_faster_than_v1():
    """The fused Mamba tutorial's loop reordering (v2: delta and u loaded once per channel
    tile, ``delta * u`` loop-invariant) is faster on device (1.61 against 2.34 ms); the
    estimates order the two kernels the same way at a small shape too."""
    import dataclasses

    calibrate, _ = _calibration()
    (v1,) = [f for f in calibrate.FIGURES if f.kernel == "mamba_v1" and "256" in f.family]
    v2 = dataclasses.replace(v1, kernel="mamba_v2")
    # the figures are SDK 2.20's compiler, which did not hoist v1's reloads
    latency = {f.kernel: cost_model.estimate(calibrate.trace_of(f)[0], 2, hoist_loads=False,
                                             dma_efficiency=cost_model.DMA_EFFICIENCY_SDK_2_20
                                             ).latency_us
               for f in (v1, v2)}  # fmt: skip
    assert latency["mamba_v2"] < 0.8 * latency["mamba_v1"]


# -- the NKIBench check's fit and cross-validation ------------------------------------------
def _nkibench():
    module = sys.modules.get("nki_estimate_nkibench")
    if module is None:
        module = load_module(REPO / "benchmarks/nki_estimate/nkibench.py", "nki_estimate_nkibench")
    return module


def test_nkibench_fit_recovers_each_releases_dma_rate_and_cross_validates_held_out_families():
    """Kernels whose 'published' times are the model's own, at DMA_EFFICIENCY 0.6 for the
    current compiler (loads hoisted) and 0.45 for SDK 2.20 (reloaded): the grid fit finds
    both rates in-sample and, leaving each family out, from the other families alone (no
    per-kernel constant can help a held-out family); the generated README table says so."""
    nkibench = _nkibench()
    problems = ["matmul", "silu", "mamba", "gqa_full"]  # four families
    found, cases = [], []
    for index, problem in enumerate(problems):
        size = 2048 * (index + 1)
        load = op("dma", "load", (tile(1, (128, size), "float32", "hbm", runs=4),),
                  (tile(2, (128, size), "float32"),))  # fmt: skip
        add = op("vector", "tensor_scalar", (tile(2, (128, size), "float32"),),
                 (tile(3, (128, size), "float32"),))  # fmt: skip
        trace = [load, add, load, add]  # the second load repeats the first
        device_ms = cost_model.estimate(trace, 2, dma_efficiency=0.6, band=False).latency_us / 1e3
        profile = {"latency": device_ms, "hbm_read_bytes": 128 * size * 4,
                   "hbm_write_bytes": 0, "spill_save_bytes": 0, "spill_reload_bytes": 0}  # fmt: skip
        profile |= {f"{e}_engine_active_time_percent": 0.1 for e in ("scalar", "vector", "gpsimd")}
        counters = {"hbm_to_sbuf_bytes": 128 * size * 4, "sbuf_to_hbm_bytes": 0}
        row = {"problem": problem, "kernel": f"{problem}_0.py", "profile": profile}
        found.append((row, (trace, counters, 0.0)))
        old_ms = cost_model.estimate(trace, 2, dma_efficiency=0.45, band=False,
                                     hoist_loads=False).latency_us / 1e3  # fmt: skip
        cases.append({"problem": f"tutorial {index}", "family": f"tutorial {index % 2}",
                      "published_ms": old_ms, "trace": trace, "release": "sdk-2.20"})  # fmt: skip
    cases = nkibench.cases_of(found) + cases
    table = nkibench.grid(cases)
    fitted = nkibench.fit(cases, table, list(range(len(cases))))
    assert (fitted["current"], fitted["sdk-2.20"]) == (0.6, 0.45)
    held_out = nkibench.cross_validate(cases, table)
    assert held_out["max_abs_error"] < 0.01
    assert len(held_out["by_family"]) == 6
    assert {c["current"] for c in held_out["constants_fitted_without"].values()} == {0.6}
    shipped = {"dma_buffer_ns": 10.0, "current": 0.425, "sdk-2.20": 0.425}
    every = list(range(len(cases)))
    record = {
        "command": "nkibench.py ACCELOPT",
        "source": nkibench.SOURCE,
        "rows": nkibench.rows_at(found, 10.0, 0.425, band=True),
        "current_constants": shipped | nkibench.summary(nkibench.errors_at(cases, table, shipped, every)),
        "fitted_constants": fitted | nkibench.summary(nkibench.errors_at(cases, table, fitted, every)),
        "leave_one_family_out": held_out,
    }  # fmt: skip
    section = nkibench.render(record)
    assert section.startswith(nkibench.START) and section.endswith(nkibench.END)
    assert "| leave one family out (refitted without it, then estimated) | 0% |" in section
