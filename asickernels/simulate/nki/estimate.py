"""An NKI cost model: schedules a simulator instruction trace on one NeuronCore's engines.

This is a model estimate, not a measurement. It sees the instructions the kernel issues (as
the simulator runs them, in program order), their operand shapes, dtypes and memories, and
the tiles they read and write. It does not see the compiler's scheduling, instruction fusion
or buffer allocation, nor other NeuronCores sharing HBM.

The model:

* one in-order queue per compute engine (``tensor``, ``vector``, ``scalar``, ``gpsimd``); an
  instruction starts when its engine is free and every earlier instruction that wrote an
  element it reads or writes has finished (dependencies through tiles: storage and element
  range);
* an instruction whose engine the kernel left to the compiler (an ``nl`` call, or an
  ``nisa`` call without ``engine``; :attr:`Instruction.pinned` False) runs on whichever of
  the engines documented for it (:data:`ALTERNATIVES`) finishes it first, at that engine's
  cost;
* the 16 DMA engines, each serving 8 of the 128 partitions, serve transfers in the order
  their data is ready, not in program order (a store waiting for a result does not hold
  back the loads behind it);
* per-instruction cycle counts from the ISA's "estimated instruction cost" formulas and the
  architecture guide's cost models, at each engine's clock (:class:`Generation`), plus the
  static overhead of a short instruction that depends on the one before it on its engine;
* a DMA transfer occupies each engine serving its partitions for ``buffers * DMA_BUFFER_NS
  + bytes / rate`` (its share of both), the rate one engine's bandwidth, or
  ``DMA_EFFICIENCY`` of all of them shared by the engines it uses, no faster than the core's
  share of HBM bandwidth; a "buffer" is one contiguous piece of one partition (A2: "DMA
  buffers"); a DMA transpose moves at its documented share of a copy's rate;
* each transfer goes to one of the DMA queues (one per engine sequencer, or the one the
  kernel chose), and a queue starts at most one transfer per DMA_LATENCY_NS (the fixed
  cost per transfer);
* an instruction that repeats an earlier one (same parameters, same tiles read, none of them
  written since) is computed once, as a compiler's common-subexpression elimination does: a
  loop-invariant ``tensor_tensor`` inside a loop costs one instruction. Only instructions
  whose trace records every parameter qualify;
* the SBUF holds each value (what one write leaves in a tile) from its write to its last
  read, 192 KiB a partition on trn1; when the live values do not fit, the one read
  furthest ahead leaves: stored to HBM and reloaded before its next read (a spill), or,
  if it is an unchanged copy of HBM data, fetched again. A load that repeats an earlier
  one (same HBM elements, not stored to since) is the earlier value again while that is
  still held and the data loaded since leaves room for it, as the current compiler hoists
  a load out of a loop whose loads fit (``hoist_loads``);
* a write that places a value in SBUF space freed before it (space is reused in the order
  it was freed) waits until the last reader of what was there has finished.

``assign`` (``tile[...] = value``) costs nothing: the compiler has the producing instruction
write into the destination (the tutorials' ``lhsT_tile[...] = nl.load(...)``). A PSUM
``+=`` of a matmul result is the matmul accumulating (no instruction either; what reads the
accumulator waits for the matmuls), and zeroing a PSUM tile costs nothing (the next matmul
starts a new accumulation group).

Sources (aws-neuron-sdk, file@commit):

* ``A2`` = general/nki/trainium_inferentia2_arch.rst@72825d5 (NeuronCore-v2);
* ``IS`` = general/nki/api/nki/isa/__init__.py@2086a70 (the ISA docstrings of SDK 2.21);
* ``A3`` = nki/guides/architecture/trainium2_arch.rst@81ce03a (NeuronCore-v3);
* ``A4`` = nki/guides/architecture/trainium3_arch.rst@81ce03a (NeuronCore-v4);
* ``BW`` = nki/deep-dives/nki-dma-bandwidth-guide.rst@81ce03a;
* ``DO`` = nki/get-started/about/nki-dma-overview.rst@81ce03a;
* ``PG`` = nki/deep-dives/nki_perf_guide.rst@81ce03a.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import heapq
import json
import math
from collections.abc import Sequence
from typing import Any

from asickernels.simulate.nki.trace import Access, Instruction

__all__ = [
    "GENERATIONS",
    "UNCALIBRATED_BAND_FACTOR",
    "Estimate",
    "Generation",
    "estimate",
    "generation_of",
]

COMPUTE_ENGINES = ("tensor", "vector", "scalar", "gpsimd")
ENGINES = (*COMPUTE_ENGINES, "dma")
BOUND_NAMES = {
    "tensor": "TensorE",
    "vector": "VectorE",
    "scalar": "ScalarE",
    "gpsimd": "GpSimdE",
    "dma": "DMA/HBM",
}

# A2 "Tensor Engine", Cost Model: back-to-back matmuls issue every max(N, MM_INIT_LATENCY)
# TensorE cycles, MM_INIT_LATENCY = 64 on NeuronCore-v2; FP32 inputs cost "roughly 4x" (IS
# nc_matmul: ``4 * max(min(64, N_stationary), N_moving)`` for float32). A TensorE transpose
# is that matmul with an identity as ``moving`` (IS nc_transpose: ``max(P, min(64, F))``,
# nc_matmul's formula with N_moving = P), so fp32 transposes pay the factor too: NKIBench's
# trn1 profiles count an fp32 transpose's flops twice, as an fp32 matmul's
# (zhang677/AccelOpt@47e29a7 experiments/full_complete_local/profile_results.csv,
# add_rmsnorm_matmul: transpose_flops 8.59e9 for 1024 [128, 128] transposes).
MATMUL_MIN_CYCLES = 64
FP32_MATMUL_FACTOR = 4
# IS, each instruction's "Estimated instruction cost": max(MIN_II, cost), MIN_II "roughly 64
# engine cycles"; GpSimd instructions pay GPSIMD_START, "roughly 150 engine cycles" (IS
# affine_select, iota).
MIN_II = 64
GPSIMD_START_CYCLES = 150
# A2 (Vector Engine, applicable to Scalar Engine too): "many back-to-back instructions
# either with N << 128 or with every instruction depending on the output tile of the
# previous instruction" add "a static instruction overhead of 100 engine cycles", and such
# an instruction cannot hide the "Tensor access overhead" (~60 cycles, otherwise hidden
# "through instruction level parallelism") behind its predecessor. Charged to a short
# instruction (its cost the MIN_II floor) that reads what the one before it on the same
# engine wrote: PG Opt #5 measured 264 cycles between dependent one-element ScalarE
# instructions, while the mamba tutorial's profiles (VectorE 99.63% of mamba_v2's 1.61 ms,
# aws-neuron-sdk@72825d5 general/nki/tutorials/fused_mamba.rst) leave no room for it on
# its dependent [128, 512] instructions.
DEPENDENT_CYCLES = 100 + 60
# Fitted on the calibration data (benchmarks/nki_estimate/), shared by every kernel: the
# overhead per DMA buffer (one contiguous piece; A2 names it, no document gives a figure),
# and the fraction of the engines' aggregate bandwidth (16 x BW's per-engine rate) they
# sustain together (one engine alone moves at its full rate: DO Example 1, 32 KiB in
# 1416 ns on trn2; the fixed cost per transfer is DMA_LATENCY_NS). That fraction depends
# on the compiler and runtime release, not on the transfer: the SDK 2.20 tutorial figures
# (aws-neuron-sdk@72825d5 general/nki/tutorials/matrix_multiplication.rst) move 5.4 / 4.4 /
# 2.3 / 0.74 GB in 51.8 / 42.96 / 22.07 / 6.97 ms, 103-106 GB/s whatever their pieces (256 B
# - 4 KiB per partition; the last in 512 KiB transfers of 4 KiB pieces), ~0.4 of the 16
# engines' 272 GB/s; the current compiler's trn1 profiles of NKIBench
# (zhang677/AccelOpt@47e29a7 experiments/full_complete_local/profile_results.csv) move the
# same 512 KiB transfers of 4 KiB pieces (silu, adamw, bmm, whose HBM bytes the model counts
# exactly) at 176-240 GB/s. DMA_EFFICIENCY is the current release's (fitted on NKIBench),
# DMA_EFFICIENCY_SDK_2_20 the tutorials' (fitted on them; with ``hoist_loads=False``, that
# release's compiler).
DMA_BUFFER_NS = 10.0
DMA_EFFICIENCY = 0.7
DMA_EFFICIENCY_SDK_2_20 = 0.425
# Every estimate carries the band over the two releases' rates and over how far the
# engines overlap (:attr:`Estimate.band_us`).
DMA_EFFICIENCY_RANGE = (0.4, 0.92)
# Hoisting loop-invariant loads. NKIBench's add_rmsnorm_matmul loads the same weight tiles
# in each of its 32 row-tile iterations (zhang677/AccelOpt@47e29a7
# NKIBench/kernels/add_rmsnorm_matmul_M4096_N2048_K1024_0.py); its trn1 profile (same
# commit, experiments/full_complete_local/profile_results.csv, the current compiler) reads
# 42.0 MB from HBM: the inputs once (40 MB) and not the 302 MB the source issues. SDK 2.20's
# compiler did not: the matmul tutorial's hoist_load step (aws-neuron-sdk@72825d5
# general/nki/tutorials/matrix_multiplication.rst) moves 4.4 GB instead of the tiled
# kernel's 5.4 GB and ran 51.80 -> 42.96 ms, the same ratio. ``hoist_loads=False`` models
# that compiler (benchmarks/nki_estimate/calibrate.py, whose figures are SDK 2.20's).
# Repeated ``nisa.dma_copy`` loads are hoisted alike, although the trn2 tutorial says its
# v2's were not (benchmarks/nki_estimate/README.md, trn2 section).
# The engines the compiler may place an instruction on when the kernel did not choose
# (IS): ``tensor_copy`` "Vector, Scalar or GpSimd Engine" (an ``nl.copy`` is one);
# ``tensor_scalar`` "Vector or Scalar Engine" for arithmetic operators (an ``nl`` add or
# multiply of one full tile by a scalar or a [P, 1] tile is one); ``reciprocal``
# Scalar (N cycles) or Vector (8N). GpSimd is left out: NKIBench's trn1 profiles
# (zhang677/AccelOpt@47e29a7 experiments/full_complete_local/profile_results.csv) put
# GpSimdE at <= 2.6% active in all 14 kernels, while ScalarE does the PSUM -> SBUF copies
# the kernels leave unpinned (bmm: VectorE 0.0%, ScalarE 1.72 ms, the copies' N cycles at
# 1.4 GHz: 1.69 ms) and the unpinned tensor_scalar/reciprocal of silu and adamw (ScalarE
# 0.42 / 1.23 ms active against their activations' 0.16 / 0.13 ms).
ALTERNATIVES = {
    "tensor_copy": ("vector", "scalar"),
    "copy": ("vector", "scalar"),
    "tensor_scalar": ("vector", "scalar"),
    "reciprocal": ("vector", "scalar"),
}
# IS tensor_scalar: "the Scalar Engine only supports ... op0=np.multiply and op1=np.add,
# op0=np.multiply and op1=None, op0=add and op1=None" (operators as the trace names them).
SCALAR_ENGINE_OPERATORS = (("multiply", "add"), ("multiply", "None"), ("add", "None"))
# BW: "every DMA transfer incurs descriptor setup, synchronization, and semaphore-to-start
# latency (~1300 ns cross-engine)": a DMA's result is ready this long after its data has
# moved (it delays dependants), and a queue starts at most one transfer per this long
# (:class:`_DmaEngines`; DO's graph: the time per transfer is flat below ~2.5 KiB a
# partition, 8 x 2.5 KiB at 0.7 x 23 B/ns per engine = 1270 ns).
DMA_LATENCY_NS = 1300.0
# The queues a transfer the kernel did not put on one may take. DO: "DMA transfers can be
# triggered by any engine sequencer in the NeuronCore" and "The queue ID is typically tied
# to the trigger engine"; A2: each compute engine has its own sequencer, and "there is also
# a Sync Engine ... most commonly used to trigger DMA transfers": one queue per sequencer.
DMA_QUEUES = ("sync", "tensor", "vector", "scalar", "gpsimd")
# A3 "DMA Transpose": "up to 90% DMA throughput utilization ... compared to up to 100% ...
# for a DMA copy" (HBM -> SBUF); "SBUF2SBUF transpose can achieve up to 50% of DMA
# throughput on Trainium2": a transpose's rate over a copy's, by where it reads.
DMA_TRANSPOSE_SHARE = {"hbm": 0.9, "sbuf": 0.5}


# A generation no measured latency calibrates (trn2, trn3: AWS publishes no latency the
# model could be fitted on; the trn2 figures it is checked against are engine utilisations
# and an upper bound, benchmarks/nki_estimate/README.md) has its band widened by the largest
# error the model makes on data it was not fitted on, where it is: 35%, the worst family
# left out of the fit on trn1 (nkibench.py's leave-one-family-out, same README).
UNCALIBRATED_BAND_FACTOR = 1.35


@dataclasses.dataclass(frozen=True)
class Generation:
    """One NeuronCore generation's engine clocks and bandwidths."""

    name: str
    clock_ghz: dict[str, float]  # per compute engine
    # Elements per cycle per partition, for 2-byte and for other dtypes.
    vector_rate: tuple[int, int]
    scalar_rate: tuple[int, int]
    dma_engines: int
    dma_engine_bytes_per_ns: float
    hbm_bytes_per_ns: float  # this core's share of the device's HBM bandwidth
    sbuf_bytes: int  # the SBUF's capacity over its 128 partitions
    # The measured latencies the model's fitted constants were fitted or checked on, on this
    # generation; "" when none: its estimates carry the wider band (UNCALIBRATED_BAND_FACTOR).
    calibration: str = ""


GENERATIONS = {
    # A2 table "Data-path Width / Frequency": Tensor 2.8 GHz, Vector 1.12, Scalar and GpSimd
    # 1.4; 128 elements/cycle (one per partition). DMA: A2 says 27 GiB/s per engine, DO
    # 27.2 GB/s, BW 17 B/ns: we use BW's, the sustained rate with large payloads (the other
    # two are theoretical peaks). HBM: 820 GB/s per device (A2) over 2 NeuronCores.
    2: Generation(
        "trn1/inf2 (NeuronCore-v2)",
        {"tensor": 2.8, "vector": 1.12, "scalar": 1.4, "gpsimd": 1.4},
        (1, 1),
        (1, 1),
        16,
        17.0,
        820.0 / 2,
        24 << 20,  # A2: "a 24MiB SBUF"
        "SDK 2.20 tutorial latencies and NKIBench's trn1 profiles (benchmarks/nki_estimate)",
    ),
    # A3: Tensor 2.4 GHz, Vector 0.96, Scalar and GpSimd 1.2 (128 elements per cycle); BW
    # 23 B/ns per DMA engine; 3 TB/s over 8 NeuronCores. VectorE: A3's table says "512
    # BF16/FP16 input/output; 256 input/output for other data types", but its "Vector
    # Engine Performance Mode" lifts only BF16/FP16 ("4x" or "2x" by instruction, taken
    # as 4x here) and its "1.0 TFLOPS of FP32" over 8 NeuronCores at 0.96 GHz is one FP32
    # element per partition per cycle, as on NeuronCore-v2 (the trn2 tutorial's v5, whose
    # VectorE adds fp32 PSUM tiles into SBUF, is active 10.55% of the run: 9% at one).
    # DMA: trn1's fitted DMA_EFFICIENCY and DMA_BUFFER_NS; DO's throughput graph (trn2
    # profiles) agrees with 0.7 at DMA_LATENCY_NS (its knee, 8 x ~2.5 KiB in 1300 ns per
    # engine), the trn2 tutorial's v3 asks for >= 0.85 (benchmarks/nki_estimate/README.md).
    3: Generation(
        "trn2 (NeuronCore-v3)",
        {"tensor": 2.4, "vector": 0.96, "scalar": 1.2, "gpsimd": 1.2},
        (4, 1),
        (1, 1),
        16,
        23.0,
        3000.0 / 8,
        28 << 20,  # A3: "SBUF capacity is 28MiB"
    ),
    # A4: Tensor 2.4 GHz, Vector 1.2 (512 bf16/fp16/fp8; other dtypes one per cycle as
    # on v3: "1.2 TFLOPS of FP32" over 8 NeuronCores at 1.2 GHz), Scalar 1.2 (256
    # bf16/fp16/fp8, 128 other), GpSimd 1.2; BW 33 B/ns per DMA engine; 4.7 TB/s over 8.
    4: Generation(
        "trn3 (NeuronCore-v4)",
        {"tensor": 2.4, "vector": 1.2, "scalar": 1.2, "gpsimd": 1.2},
        (4, 1),
        (2, 1),
        16,
        33.0,
        4700.0 / 8,
        32 << 20,  # A4: "SBUF capacity is 32 MiB"
    ),
}


def generation_of(version: int) -> Generation:
    """The :class:`Generation` of NeuronCore-v``version`` (2, 3 or 4)."""
    if version not in GENERATIONS:
        raise ValueError(f"no cost model for NeuronCore-v{version}; use one of {list(GENERATIONS)}")
    return GENERATIONS[version]


@dataclasses.dataclass(frozen=True)
class Estimate:
    """The modelled latency of one kernel run (an estimate; nothing was measured)."""

    latency_us: float
    bound: str  # the busiest engine: TensorE, VectorE, ScalarE, GpSimdE or DMA/HBM
    busy_share: dict[str, float]  # engine -> busy time / latency
    instructions: int
    generation: str
    timeline: tuple[tuple[str, str, float, float], ...] = ()  # (engine, api, start, end) ns
    # (low, high) us: low, the busiest engine alone (perfect overlap) at the fastest DMA rate
    # of DMA_EFFICIENCY_RANGE; high, the dependency schedule at the slowest. None: not asked.
    band_us: tuple[float, float] | None = None
    # HBM bytes the modelled transfers read and write (hoisted loads counted once).
    hbm_read_bytes: int = 0
    hbm_write_bytes: int = 0
    # SBUF values that did not fit, stored to HBM and reloaded (bytes of both ways).
    spill_bytes: int = 0
    # False: no measured latency calibrates this generation; band_us is widened by
    # UNCALIBRATED_BAND_FACTOR.
    calibrated: bool = True

    def describe(self) -> str:
        """``"12.3 us (band 8.1-20.4 us; DMA/HBM-bound)"``: the estimate in one phrase (it
        says when no measured latency calibrates the generation)."""
        band = (
            "" if self.band_us is None else f"band {self.band_us[0]:.1f}-{self.band_us[1]:.1f} us; "
        )
        uncalibrated = (
            ""
            if self.calibrated
            else f"; uncalibrated: no latency measured on {self.generation}, band widened "
            f"x{UNCALIBRATED_BAND_FACTOR:g}"
        )
        return f"{self.latency_us:.1f} us ({band}{self.bound}-bound{uncalibrated})"

    def chrome_trace(self) -> dict[str, Any]:
        """The engine timeline as a Chrome/Perfetto trace (open it in ui.perfetto.dev)."""
        lanes = {engine: index for index, engine in enumerate(ENGINES)}
        events: list[dict[str, Any]] = [
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": lanes[e],
             "args": {"name": BOUND_NAMES[e]}}
            for e in ENGINES
        ]  # fmt: skip
        events += [
            {"name": api, "ph": "X", "pid": 0, "tid": lanes[engine], "ts": start / 1000.0,
             "dur": (end - start) / 1000.0}
            for engine, api, start, end in self.timeline
        ]  # fmt: skip
        other = {"estimate": True, "generation": self.generation, "calibrated": self.calibrated}
        if self.band_us is not None:
            other["band_us"] = list(self.band_us)
        return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": other}

    def write_chrome_trace(self, path: str) -> None:
        with open(path, "w") as file:
            json.dump(self.chrome_trace(), file)


def _lanes(rate: tuple[int, int], accesses: Sequence[Access]) -> int:
    return rate[0] if all(a.itemsize == 2 for a in accesses) else rate[1]


def _tensor_cycles(instruction: Instruction) -> float:
    """TensorE cycles: matmul max(64, N_moving); a transpose (a matmul by an identity)
    max(P, min(64, F)) (IS nc_transpose); either x4 for fp32 inputs."""
    reads = instruction.reads
    if not reads:
        return MATMUL_MIN_CYCLES
    fp32 = any(a.itemsize >= 4 for a in reads)
    if instruction.api in ("transpose", "nc_transpose"):
        cycles = max(reads[0].partitions, min(MATMUL_MIN_CYCLES, reads[0].free_size))
    else:
        cycles = max(MATMUL_MIN_CYCLES, reads[-1].free_size)
    return cycles * (FP32_MATMUL_FACTOR if fp32 else 1)


def _engine_cycles(instruction: Instruction, generation: Generation, engine: str) -> float:
    """Vector, Scalar or GpSimd cycles by the IS formulas: N elements per partition per
    full-size input tile (A2: one input ~N, two ~2N; [P, 1] per-partition scalars ride
    along), with the IS exceptions below; N counts the wider v3/v4 data paths' lanes."""
    reads, writes, api = instruction.reads, instruction.writes, instruction.api
    tiles = reads + writes
    n = max((a.free_size for a in tiles), default=1)
    on_chip = [a for a in reads if a.memory != "hbm" and a.free_size >= n]
    inputs = max(1, len(on_chip))
    if engine == "vector":
        n = math.ceil(n / _lanes(generation.vector_rate, tiles))
    elif engine == "scalar":
        n = math.ceil(n / _lanes(generation.scalar_rate, tiles))
    if engine == "gpsimd":
        return GPSIMD_START_CYCLES + inputs * n
    cycles: float = inputs * n
    if inputs == 2 and api != "tensor_tensor_scan":
        # IS tensor_tensor: N when one input is in PSUM and the other in SBUF, or when
        # every operand is bfloat16 in SBUF; 2N otherwise (and always for the scan).
        psum = sum(a.memory == "psum" for a in on_chip)
        bf16_sbuf = psum == 0 and all(a.dtype == "bfloat16" for a in tiles)
        if psum == 1 or bf16_sbuf:
            cycles = n
    if api == "bn_aggr":
        cycles = 13 * n / 3
    elif api == "reciprocal" and engine == "vector":
        cycles = 8 * n
    elif api == "tensor_reduce" and all(a.dtype == "bfloat16" for a in tiles):
        cycles = n / 2
    elif api in ("activation_reduce", "tensor_scalar_reduce") or (
        api == "activation" and len(writes) > 1  # with reduce_res
    ):
        return max(MIN_II, cycles) + MIN_II
    return max(MIN_II, cycles)


def _dma_part(
    instruction: Instruction, generation: Generation, buffer_ns: float, efficiency: float
) -> tuple[int, float]:
    """One transfer's DMA engines and the time it occupies each: the engines serving its
    partitions (DO: each engine serves ``PARTITIONS / dma_engines`` = 8 partitions, so a
    [4, 4096] load runs on one; the trace does not record a tile's first partition, so its
    partitions are taken from 0), each moving its share of the pieces and bytes."""
    accesses = instruction.reads + instruction.writes
    if not accesses:
        return 1, buffer_ns
    nbytes = max(a.nbytes for a in accesses)
    # Descriptors, one per partition of the on-chip tile (of the source, HBM to HBM): "a
    # *descriptor* that tells the hardware the source address, destination address,
    # transfer shape, and stride pattern" (nki/deep-dives/nki-dge.rst@81ce03a), so a
    # strided row is one, not one per contiguous piece (the nki-samples SD attention's
    # element-strided K loads).
    on_chip = next((a for a in accesses if a.memory != "hbm"), None)
    buffers = (on_chip or accesses[0]).partitions
    if on_chip is None:  # HBM to HBM: no partitions to follow
        engines = min(generation.dma_engines, buffers)
    else:
        per_engine = PARTITIONS // generation.dma_engines
        engines = min(generation.dma_engines, -(-on_chip.partitions // per_engine))
    # One engine moves at BW's per-engine rate (DO Example 1: 32 KiB in 1416 ns on one
    # trn2 engine, 23.1 B/ns); the engines together sustain ``efficiency`` of their
    # aggregate (the release's fitted DMA_EFFICIENCY), shared by those the transfer uses.
    rate = generation.dma_engine_bytes_per_ns * min(
        1.0, efficiency * generation.dma_engines / engines
    )
    if instruction.api == "dma_transpose":
        # A3: HBM -> SBUF DMA transposes run at up to 90% of a copy's throughput, SBUF ->
        # SBUF ones at up to 50%.
        rate *= DMA_TRANSPOSE_SHARE[instruction.reads[0].memory if instruction.reads else "hbm"]
    engine_ns = math.ceil(buffers / engines) * buffer_ns + nbytes / engines / rate
    return engines, max(engine_ns, nbytes / generation.hbm_bytes_per_ns)


def _engines(instruction: Instruction) -> tuple[str, ...]:
    """The engines ``instruction`` may run on: its own when pinned, else
    :data:`ALTERNATIVES` (its recorded engine first)."""
    api, params = instruction.api, instruction.params
    if api in ("add", "multiply") and instruction.writes:  # an nl call
        width = instruction.writes[0].free_size
        if sum(a.free_size == width for a in instruction.reads) == 1:
            api, params = "tensor_scalar", (api, "", "", "None")  # a tile and a scalar
    if instruction.pinned or api not in ALTERNATIVES:
        return (instruction.engine,)
    if api == "tensor_scalar" and params and (params[0], params[3]) not in SCALAR_ENGINE_OPERATORS:
        return ("vector",)
    return (instruction.engine, *(e for e in ALTERNATIVES[api] if e != instruction.engine))


def _overlaps(reads: Sequence[Access], writes: Sequence[Access]) -> bool:
    """Whether ``reads`` touch an element ``writes`` wrote."""
    return any(
        r.key == w.key and r.low <= w.high and w.low <= r.high for r in reads for w in writes
    )


def _elided(instruction: Instruction) -> bool:
    """Instructions the compiler removes: ``assign`` (the producer writes the destination
    directly), ``accumulate`` (a PSUM ``+=`` of a matmul result: the matmul accumulates;
    its result is ready when the matmul's is) and zeroing a PSUM tile (the next matmul into
    it starts a new accumulation group instead: the tutorials'
    ``nl.zeros(..., buffer=nl.psum)`` before ``+=``)."""
    if instruction.api in ("assign", "accumulate"):
        return True
    writes = instruction.writes
    zeroing = instruction.api in ("full", "memset") and not instruction.reads
    return zeroing and bool(writes) and all(a.memory == "psum" for a in writes)


class _Ranges:
    """Element ranges of one storage, each with a value, found by overlap. Ranges are filed
    by width (the bit length of ``high - low``), each width's sorted by first element, so a
    lookup bisects to the ranges of each width that can reach it: its work follows the
    ranges near it, whether a storage holds a few wide ranges or thousands of small tiles."""

    def __init__(self) -> None:
        self.values: dict[tuple[int, int], Any] = {}
        self.by_width: dict[int, list[tuple[int, int]]] = {}  # bit length -> sorted spans

    def overlapping(self, low: int, high: int) -> list[tuple[tuple[int, int], Any]]:
        found = []
        for width, spans in self.by_width.items():
            # a span of this width starting before ``low - 2**width + 1`` ends before ``low``
            at = bisect.bisect_left(spans, (low - (1 << width) + 1,))
            while at < len(spans) and spans[at][0] <= high:
                span = spans[at]
                if low <= span[1]:
                    found.append((span, self.values[span]))
                at += 1
        return found

    def set(self, span: tuple[int, int], value: Any) -> None:
        if span not in self.values:
            bisect.insort(self.by_width.setdefault((span[1] - span[0]).bit_length(), []), span)
        self.values[span] = value

    def remove(self, span: tuple[int, int]) -> None:
        del self.values[span]
        spans = self.by_width[(span[1] - span[0]).bit_length()]
        del spans[bisect.bisect_left(spans, span)]


class _Regions:
    """When each written element range of each storage is ready, and how many times each
    storage has been written (to tell whether a tile still holds what an earlier
    instruction read)."""

    def __init__(self) -> None:
        self.written: dict[int, _Ranges] = {}  # storage -> range -> end (float | _Transfer)
        self.versions: dict[int, int] = {}

    def ready(self, accesses: Sequence[Access], dma: _DmaEngines) -> float:
        """When every element range ``accesses`` touch was last written (a transfer still
        waiting in ``dma`` is booked first)."""
        when = 0.0
        for a in accesses:
            if a.key in self.written:
                for _, end in self.written[a.key].overlapping(a.low, a.high):
                    when = max(when, dma.end(end))
        return when

    def write(self, accesses: Sequence[Access], end: float | _Transfer) -> None:
        for a in accesses:
            self.written.setdefault(a.key, _Ranges()).set((a.low, a.high), end)
            self.versions[a.key] = self.versions.get(a.key, 0) + 1

    def repeat_key(self, instruction: Instruction) -> tuple[Any, ...] | None:
        """What makes ``instruction`` the same computation as an earlier one: engine, API,
        parameters, the tiles read (and their contents' versions) and the result's shape
        and dtype; None when its parameters are unknown."""
        if instruction.params is None or not instruction.reads:
            return None
        reads = tuple((a.key, a.low, a.high, a.shape, self.versions.get(a.key, 0))
                      for a in instruction.reads)  # fmt: skip
        writes = tuple((a.shape, a.dtype) for a in instruction.writes)
        return (instruction.engine, instruction.api, instruction.params, reads, writes)


PARTITIONS = 128  # A2: SBUF and PSUM have 128 partitions, each addressed alike


@dataclasses.dataclass
class _Spill:
    """A value the SBUF cannot hold: after instruction ``after`` it leaves the SBUF (stored
    to HBM unless ``stored`` is False: an unchanged copy of HBM data, which is fetched
    again instead) and, when read again, comes back for instruction ``reload``, which
    waits for it. ``tile`` is the SBUF access that wrote it."""

    value: int
    after: int
    tile: Access
    stored: bool
    reload: int | None = None


@dataclasses.dataclass
class _Plan:
    """What :func:`_sbuf_plan` decides: the spills; each load's value (``copies``: load
    instruction -> value), and the repeated loads not issued because their copy is still
    in SBUF (``reused``)."""

    spills: list[_Spill]
    copies: dict[int, int]
    reused: set[int]
    # instruction -> the instruction it waits for: the last reader of what last held the
    # SBUF space its write takes
    space_waits: dict[int, int]


def _load_source(instruction: Instruction, hbm_versions: dict[int, int]) -> tuple[Any, ...] | None:
    """What makes ``instruction`` the same load as an earlier one (HBM elements, their
    version, the tile written); None: not a load from HBM into one SBUF tile."""
    reads, writes = instruction.reads, instruction.writes
    if len(reads) != 1 or reads[0].memory != "hbm" or len(writes) != 1:
        return None
    a, w = reads[0], writes[0]
    if w.memory != "sbuf":
        return None
    version = hbm_versions.get(a.key, 0)
    return (a.key, a.low, a.high, a.shape, a.runs_per_partition, version, w.shape, w.dtype)


class _LoadedSince:
    """Bytes per partition of the distinct loaded values (copies of HBM data) read or loaded
    between two instructions: a least-recently-used stack distance, each value's bytes
    counted at the instruction that last touched it (a Fenwick tree over the trace)."""

    def __init__(self, length: int) -> None:
        self.tree = [0] * (length + 1)
        self.last: dict[int, tuple[int, int]] = {}  # value -> (instruction, bytes)

    def _add(self, index: int, amount: int) -> None:
        index += 1
        while index < len(self.tree):
            self.tree[index] += amount
            index += index & -index

    def _before(self, index: int) -> int:
        """The bytes counted at instructions 0 .. ``index`` - 1."""
        total = 0
        while index > 0:
            total += self.tree[index]
            index -= index & -index
        return total

    def touch(self, value: int, index: int, nbytes: int) -> None:
        if value in self.last:
            at, counted = self.last[value]
            self._add(at, -counted)
        self._add(index, nbytes)
        self.last[value] = (index, nbytes)

    def since(self, value: int, index: int) -> int:
        """The bytes of the other loaded values touched after ``value`` last was, before
        instruction ``index``."""
        at, _ = self.last[value]
        return self._before(index) - self._before(at + 1)


def _sbuf_plan(trace: Sequence[Instruction], generation: Generation, hoist_loads: bool) -> _Plan:
    """What the SBUF holds over ``trace``: which values spill, and which repeated loads the
    compiler need not issue.

    A value is what one write leaves in an SBUF element range, live from that write to its
    last read before the range is written again (what a compiler that allocates by
    liveness must hold; a read-modify-write of the range keeps the value). With
    ``hoist_loads`` (the current compiler), a load of HBM elements already loaded into a
    value that is unchanged, and not stored to since, is that value again: the compiler
    keeps the copy instead of loading it twice (hoists a loop-invariant load), as long as
    the distinct data loaded since its last use fits beside it. A load invariant in an
    inner loop is kept; one invariant only across an outer loop whose loads exceed the SBUF
    is loaded again every time, not kept in part, so the matmul tutorial's tiled kernel
    reads what its hand-hoisted step does (aws-neuron-sdk@72825d5
    general/nki/tutorials/matrix_multiplication.rst, hoist_load). A tile takes
    its bytes on every partition it spans at the same address, so capacity is per
    partition. When the live values exceed it, the one read furthest in the future leaves
    (Belady's rule, the choice that moves least, as the compiler's allocator is not
    documented): stored and reloaded, or fetched again if it is an unchanged copy of HBM.

    NKIBench's bmm_softmax keeps each batch's [4096, 4096] fp32 scores (64 MiB) between its
    max and its exp loop nests: the rule spills 1.4 GB, its trn1 profile 1.5 GB
    (zhang677/AccelOpt@47e29a7 experiments/full_complete_local/profile_results.csv).

    Space is reused in the order it was freed (a ring, as tiles allocated in a loop rotate
    through their buffers), and reusing it is a write-after-read hazard: a write that places
    a value where the live values and the space not yet reused leave no room waits for the
    last reader of the values whose space it takes (``space_waits``). When the values fit
    with room to spare, that reader finished long before; when they fill the SBUF, loads
    can no longer run ahead of the compute that frees their space (NKIBench's ``mamba``
    holds ~10 [128, 7168] fp32 tiles of 28 KiB a partition, of 192 KiB)."""
    capacity = generation.sbuf_bytes // PARTITIONS
    uses: list[list[int]] = []  # each value's instructions, its write first
    size: list[int] = []  # bytes per partition
    tiles: list[Access] = []
    clean: list[bool] = []  # an unchanged copy of HBM elements
    current: dict[int, _Ranges] = {}  # storage -> element range -> value
    sources: dict[tuple[Any, ...], int] = {}  # a load's source -> its value
    hbm_versions: dict[int, int] = {}
    copies: dict[int, int] = {}
    repeats: set[int] = set()  # loads of a value already loaded
    # instruction -> (value, bytes): a write into part of a value frees that part of it
    # (an accumulator zeroed whole and then written a slice at a time)
    shrinks: dict[int, list[tuple[int, int]]] = {}
    loaded = _LoadedSince(len(trace))
    for index, instruction in enumerate(trace):
        read = set()
        for a in instruction.reads:
            if a.memory == "sbuf" and a.key in current:
                for _, value in current[a.key].overlapping(a.low, a.high):
                    if value not in read:
                        read.add(value)
                        uses[value].append(index)
                        if clean[value]:
                            loaded.touch(value, index, size[value])
        source = _load_source(instruction, hbm_versions) if instruction.engine == "dma" else None
        known = sources.get(source) if source is not None and hoist_loads else None
        if known is not None and loaded.since(known, index) + size[known] > capacity:
            known = None  # the data loaded since its last use left no room for the copy
        for a in instruction.writes:
            if a.memory == "hbm":
                hbm_versions[a.key] = hbm_versions.get(a.key, 0) + 1
                continue
            if a.memory != "sbuf":
                continue
            ranges = current.setdefault(a.key, _Ranges())
            value = ranges.values.get((a.low, a.high))
            if value is not None and value in read:
                clean[value] = False  # a read-modify-write: the same value, changed
                continue
            for span, older in ranges.overlapping(a.low, a.high):
                if a.low <= span[0] and span[1] <= a.high:
                    ranges.remove(span)  # overwritten: those values end at their last read
                elif span[0] <= a.low and a.high <= span[1] and older not in read:
                    shrinks.setdefault(index, []).append((older, a.free_size * a.itemsize))
            if known is not None and clean[known]:
                ranges.set((a.low, a.high), known)  # the kept copy, loaded again
                uses[known].append(index)
                loaded.touch(known, index, size[known])
                copies[index] = known
                repeats.add(index)
                continue
            ranges.set((a.low, a.high), len(uses))
            if source is not None and a.free_size * a.itemsize <= capacity:
                sources[source] = copies[index] = len(uses)
            uses.append([index])
            # a value larger than the SBUF is not one allocation (a whole tensor zeroed,
            # then used a tile at a time): not planned
            size.append(a.free_size * a.itemsize if a.free_size * a.itemsize <= capacity else 0)
            tiles.append(a)
            clean.append(source is not None)
            if source is not None:
                loaded.touch(len(uses) - 1, index, size[-1])
    events: dict[int, list[int]] = {}  # instruction -> the values it uses
    for value, at in enumerate(uses):
        for index in at:
            events.setdefault(index, []).append(value)
    spills: list[_Spill] = []
    spilled: dict[int, _Spill] = {}  # value -> its spill, until back
    reused: set[int] = set()
    resident: set[int] = set()
    later: list[tuple[int, int]] = []  # (-next use, value), entries may be out of date
    nexts = [0] * len(uses)  # each value's next use after the current instruction
    held = 0
    # freed space not yet reused, oldest first: (its value's last reader, bytes)
    freed_space: collections.deque[tuple[int, int]] = collections.deque()
    unused = 0  # its bytes
    space_waits: dict[int, int] = {}

    def release(value: int, reader: int) -> None:
        nonlocal held, unused
        resident.remove(value)
        held -= size[value]
        if size[value]:
            freed_space.append((reader, size[value]))
            unused += size[value]

    for index in range(len(trace)):
        placed = False
        for value in events.get(index, ()):
            if value in spilled:
                back = spilled.pop(value)
                if back.stored or index not in repeats:
                    back.reload = index  # else the repeated load fetches it again
            elif index in repeats:
                reused.add(index)
            if value not in resident:
                resident.add(value)
                held += size[value]
                placed = True
            following = bisect.bisect_right(uses[value], index)
            nexts[value] = uses[value][following] if following < len(uses[value]) else -1
            if nexts[value] != -1 and size[value]:
                heapq.heappush(later, (-nexts[value], value))
            elif uses[value][0] < index:  # an input read for the last time: its result
                release(value, index)  # may take its place (an in-place update)
        for value, freed in shrinks.get(index, ()):
            freed = min(freed, size[value])
            size[value] -= freed
            held -= freed if value in resident else 0
        while held > capacity and later:
            negative, value = heapq.heappop(later)
            if value in resident and nexts[value] == -negative and size[value]:
                release(value, index)
                spilled[value] = _Spill(value, index, tiles[value], not clean[value])
                spills.append(spilled[value])
        if placed:  # take the oldest freed space until the values fit
            reader = -1
            while held + unused > capacity and freed_space:
                last_reader, nbytes = freed_space.popleft()
                unused -= nbytes
                reader = max(reader, last_reader)
            if 0 <= reader < index:
                space_waits[index] = reader
        for value in events.get(index, ()):
            if value in resident and nexts[value] == -1:  # written, never read
                release(value, index)
    return _Plan(spills, copies, reused, space_waits)


@dataclasses.dataclass
class _Transfer:
    """A DMA transfer of the trace: its API, when its data is ready, its program position,
    the DMA engines it runs on (the first ``engines``) and how long it occupies each, the
    queue the kernel put it on ("": the compiler's choice), and (once booked) when it
    starts and its result is ready."""

    api: str
    ready: float
    order: int
    engines: int
    duration: float
    trigger: str = ""
    start: float = math.nan
    done: float | None = None


class _Timeline:
    """One DMA engine's booked time: ``gaps`` are the idle stretches before ``free``."""

    def __init__(self, free: float = 0.0, gaps: Sequence[tuple[float, float]] = ()) -> None:
        self.free = free
        self.gaps = list(gaps)

    def fits(self, ready: float, duration: float) -> float:
        """The earliest time >= ``ready`` with ``duration`` ns idle in one piece."""
        at = bisect.bisect_right(self.gaps, ready, key=lambda gap: gap[1])
        for low, high in self.gaps[at:]:
            if high - max(low, ready) >= duration:
                return max(low, ready)
        return max(ready, self.free)

    def place(self, ready: float, duration: float) -> tuple[float, float]:
        """Books ``duration`` ns in the earliest idle time >= ``ready``; returns when the
        transfer starts and ends."""
        # the gaps are in time order and do not overlap: those that end by ``ready`` stay
        # as they are, and so do those after the ones this transfer fills
        at = end = bisect.bisect_right(self.gaps, ready, key=lambda gap: gap[1])
        first, left, kept = math.inf, duration, []
        while left > 0 and end < len(self.gaps):
            low, high = self.gaps[end]
            end += 1
            begin = max(low, ready)
            taken = min(high - begin, left)
            first, left, last = min(first, begin), left - taken, begin + taken
            kept += [(a, b) for a, b in ((low, begin), (last, high)) if b - a > 1.0]
        if left > 0:
            begin = max(ready, self.free)
            if begin - self.free > 1.0:
                kept.append((self.free, begin))
            first, last = min(first, begin), begin + left
            self.free = last
        self.gaps[at:end] = kept
        return first, last


class _DmaEngines:
    """The DMA engines, each its own :class:`_Timeline`, serving transfers in the order their
    data is ready, not in program order (A2: the compiler synchronises on data dependencies
    and instructions without one run in parallel): a store waiting for a result leaves the
    engines to the loads behind it, even a load later in the program whose data is ready
    first. Transfers wait in ``pending`` until something needs one's result; then the
    pending ones ready before it are booked first, earliest ready first. A transfer takes
    whatever time its engines have idle from its ready time on (DO: the engines interleave
    the queues round robin), so it may be split around transfers booked before it.

    Queues (DO): a transfer goes to one queue; each transfer pays a fixed cost, BW's
    "descriptor setup, synchronization, and semaphore-to-start latency (~1300 ns)", which
    the queue overlaps with the data of the transfer before it: a queue starts at most one
    transfer per DMA_LATENCY_NS (its own :class:`_Timeline` books that much per transfer,
    from the transfer's start). That is DO's throughput graph:
    a stream of transfers from one queue (its profiles trigger them from qGpSimdDynamic)
    runs at a rate proportional to their size up to ~2.5 KiB a partition, 1300 ns at the
    engines' rate. A transfer whose queue the kernel did not choose takes whichever of
    ``queues`` can start it first.

    ``lanes`` are runs of engines whose timelines are the same so far (a transfer over all
    partitions books every engine alike), each booked once: ``[first, end, timeline]``."""

    def __init__(self, engines: int, queues: Sequence[str]) -> None:
        self.lanes: list[list[Any]] = [[0, engines, _Timeline()]]
        self.queues = {queue: _Timeline() for queue in queues}
        self.pending: list[tuple[float, int, _Transfer]] = []
        self.booked: list[_Transfer] = []  # in booking order

    def submit(self, transfer: _Transfer) -> _Transfer:
        heapq.heappush(self.pending, (transfer.ready, transfer.order, transfer))
        return transfer

    def end(self, value: float | _Transfer) -> float:
        """``value``'s time: a transfer's (booking the pending ones ready before it)."""
        if not isinstance(value, _Transfer):
            return value
        while value.done is None:
            _, _, transfer = heapq.heappop(self.pending)
            if transfer.trigger:
                queue = self.queues.setdefault(transfer.trigger, _Timeline())
                earliest = queue.fits(transfer.ready, DMA_LATENCY_NS)
            else:
                earliest, queue = min(
                    ((q.fits(transfer.ready, DMA_LATENCY_NS), q) for q in self.queues.values()),
                    key=lambda found: found[0],
                )
            transfer.start, moved_by = self.place(earliest, transfer.engines, transfer.duration)
            queue.place(transfer.start, DMA_LATENCY_NS)
            transfer.done = moved_by + DMA_LATENCY_NS
            self.booked.append(transfer)
        return value.done

    def drain(self) -> None:
        """Books every pending transfer."""
        while self.pending:
            self.end(self.pending[0][2])

    def place(self, ready: float, engines: int, duration: float) -> tuple[float, float]:
        """Books ``duration`` ns on each of the first ``engines`` engines, in each one's
        earliest idle time >= ``ready``; returns when the transfer starts and ends."""
        for index, (first, end, timeline) in enumerate(self.lanes):
            if first < engines < end:  # the lane splits: its engines' times part here
                copy = _Timeline(timeline.free, timeline.gaps)
                self.lanes[index : index + 1] = [[first, engines, timeline], [engines, end, copy]]
                break
        start, last = math.inf, 0.0
        for first, _, timeline in self.lanes:
            if first >= engines:
                break
            begin, finish = timeline.place(ready, duration)
            start, last = min(start, begin), max(last, finish)
        return start, last


def estimate(
    trace: Sequence[Instruction],
    version: int,
    timeline: bool = False,
    dma_buffer_ns: float = DMA_BUFFER_NS,
    dma_efficiency: float = DMA_EFFICIENCY,
    band: bool = True,
    hoist_loads: bool = True,
) -> Estimate:
    """Schedules ``trace`` (one NeuronCore's instructions in program order) on
    NeuronCore-v``version`` and returns the :class:`Estimate`; ``timeline`` keeps each
    instruction's (engine, api, start, end) for :meth:`Estimate.chrome_trace`;
    ``dma_buffer_ns`` and ``dma_efficiency`` override the fitted DMA constants; ``band``
    adds :attr:`Estimate.band_us` (two more schedules, at the ends of DMA_EFFICIENCY_RANGE;
    widened by UNCALIBRATED_BAND_FACTOR where no measured latency calibrates the generation);
    ``hoist_loads`` (the current compiler) issues a repeated load of unchanged HBM elements
    once while its copy fits in SBUF, False models SDK 2.20's compiler, which reloaded.

    An instruction that repeats an earlier one (same parameters, same tiles read, none
    rewritten since) is computed once: its result is the earlier one's (a loop-invariant
    computation in a loop, as the tutorial's ``mamba_v2`` has)."""
    generation = generation_of(version)
    plan = _sbuf_plan(trace, generation, hoist_loads)
    finish, busy, events, moved = _schedule(
        trace, generation, plan, dma_buffer_ns, dma_efficiency, timeline
    )
    share = {engine: (busy[engine] / finish if finish else 0.0) for engine in ENGINES}
    bound = max(ENGINES, key=lambda e: busy[e])
    band_us = None
    if band:
        slow, fast = DMA_EFFICIENCY_RANGE
        _, fast_busy, _, _ = _schedule(trace, generation, plan, dma_buffer_ns, fast, False)
        slow_finish, _, _, _ = _schedule(trace, generation, plan, dma_buffer_ns, slow, False)
        band_us = (min(finish, max(fast_busy.values())) / 1000.0,
                   max(finish, slow_finish) / 1000.0)  # fmt: skip
        if not generation.calibration:
            band_us = (band_us[0] / UNCALIBRATED_BAND_FACTOR, band_us[1] * UNCALIBRATED_BAND_FACTOR)
    return Estimate(
        finish / 1000.0,
        BOUND_NAMES[bound],
        share,
        len(trace),
        generation.name,
        tuple(events),
        band_us,
        *moved,
        calibrated=bool(generation.calibration),
    )


def _schedule(
    trace: Sequence[Instruction],
    generation: Generation,
    plan: _Plan,
    dma_buffer_ns: float,
    dma_efficiency: float,
    timeline: bool,
) -> tuple[float, dict[str, float], list[tuple[str, str, float, float]], tuple[int, int, int]]:
    """The dependency schedule of ``trace`` with the SBUF ``plan`` of :func:`_sbuf_plan`: its
    end (ns), each engine's busy ns, (with ``timeline``) each instruction's (engine, api,
    start, end), and the HBM bytes read, written and spilled."""
    free = dict.fromkeys(COMPUTE_ENGINES, 0.0)
    last: dict[str, tuple[Access, ...]] = dict.fromkeys(COMPUTE_ENGINES, ())  # its writes
    busy = dict.fromkeys(ENGINES, 0.0)
    regions = _Regions()
    computed: dict[tuple[Any, ...], float | _Transfer] = {}
    dma = _DmaEngines(generation.dma_engines, DMA_QUEUES)
    stores: dict[int, list[_Spill]] = {}  # after instruction -> the values it spills
    reloads: dict[int, list[_Spill]] = {}
    for spill in plan.spills:
        stores.setdefault(spill.after, []).append(spill)
        if spill.reload is not None:
            reloads.setdefault(spill.reload, []).append(spill)
    left: dict[int, float | _Transfer] = {}  # id(spill) -> its store, or when it left
    copied: dict[int, float | _Transfer] = {}  # value -> when its load's data was ready
    moved = [0, 0, 0]  # HBM bytes read, written, spilled (stored and reloaded)
    events: list[tuple[int, tuple[str, str, float, float]]] = []  # in program order
    finish = 0.0
    finished: dict[int, float | _Transfer] = {}  # instruction -> when its writes are ready

    def complete(order: int, writes: Sequence[Access], when: float | _Transfer) -> None:
        finished[order] = when
        regions.write(writes, when)

    def transfer_of(api: str, tile: Access, ready: float, order: int, side: int) -> _Transfer:
        engines, duration = _dma_part(
            Instruction("dma", api, (tile,), ()), generation, dma_buffer_ns, dma_efficiency
        )
        busy["dma"] += duration
        moved[side] += tile.nbytes
        return dma.submit(_Transfer(api, ready, order, engines, duration))

    for order, instruction in enumerate(trace):
        for spill in stores.get(order - 1, ()):  # its value is the last write of its tile
            written = regions.ready((spill.tile,), dma)
            left[id(spill)] = (
                transfer_of("spill store", spill.tile, written, order, 2)
                if spill.stored
                else written
            )
        waits = 0.0
        for spill in reloads.get(order, ()):
            gone = dma.end(left[id(spill)])
            api, side = ("spill reload", 2) if spill.stored else ("load again", 0)
            copied[spill.value] = transfer_of(api, spill.tile, gone, order, side)
            waits = max(waits, dma.end(copied[spill.value]))
        ready = max(waits, regions.ready(instruction.reads + instruction.writes, dma))
        if order in plan.space_waits:
            ready = max(ready, dma.end(finished[plan.space_waits[order]]))
        if _elided(instruction):
            complete(order, instruction.writes, ready)
            continue
        engine = instruction.engine
        repeat = regions.repeat_key(instruction)
        if repeat is not None and repeat in computed:
            complete(order, instruction.writes, max(ready, dma.end(computed[repeat])))
            if order in plan.copies:
                copied[plan.copies[order]] = computed[repeat]
            continue
        if engine == "dma" and order in plan.reused:
            copy = copied[plan.copies[order]]
            complete(order, instruction.writes, max(ready, dma.end(copy)))
            continue
        if engine == "dma":
            engines, duration = _dma_part(instruction, generation, dma_buffer_ns, dma_efficiency)
            transfer = dma.submit(
                _Transfer(instruction.api, ready, order, engines, duration, instruction.trigger)
            )
            for side, accesses in enumerate((instruction.reads, instruction.writes)):
                moved[side] += sum(a.nbytes for a in accesses if a.memory == "hbm")
            if order in plan.copies:
                copied[plan.copies[order]] = transfer
            busy[engine] += duration
            complete(order, instruction.writes, transfer)
            if repeat is not None:
                computed[repeat] = transfer
            continue
        end = math.inf
        for candidate in _engines(instruction):  # the one that finishes first
            cycles = _tensor_cycles(instruction) if candidate == "tensor" else _engine_cycles(
                instruction, generation, candidate)  # fmt: skip
            if (
                candidate != "tensor"
                and cycles <= MIN_II
                and _overlaps(instruction.reads, last[candidate])
            ):
                cycles += DEPENDENT_CYCLES
            time = cycles / generation.clock_ghz[candidate]
            if max(ready, free[candidate]) + time < end:
                engine, duration = candidate, time
                start = max(ready, free[candidate])
                end = start + duration
        free[engine] = end
        last[engine] = instruction.writes
        busy[engine] += duration
        complete(order, instruction.writes, end)
        if repeat is not None:
            computed[repeat] = end  # keyed by the versions it read
        finish = max(finish, end)
        if timeline:
            events.append((order, (engine, instruction.api, start, end)))
    dma.drain()
    for transfer in dma.booked:
        assert transfer.done is not None
        finish = max(finish, transfer.done)
        if timeline:
            events.append((transfer.order, ("dma", transfer.api, transfer.start, transfer.done)))
    return finish, busy, [event for _, event in sorted(events)], (moved[0], moved[1], moved[2])
