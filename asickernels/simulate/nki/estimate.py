"""An NKI cost model: schedules a simulator instruction trace on one NeuronCore's engines.

This is a model estimate, not a measurement. It sees the instructions the kernel issues (as
the simulator runs them, in program order), their operand shapes, dtypes and memories, and
the tiles they read and write. It does not see the compiler's scheduling, instruction fusion
or buffer allocation, nor other NeuronCores sharing HBM.

The model:

* one in-order queue per compute engine (``tensor``, ``vector``, ``scalar``, ``gpsimd``) and
  one for the 16 DMA engines taken together;
* an instruction starts when its engine is free and every earlier instruction that wrote an
  element it reads or writes has finished (dependencies through tiles: storage and element
  range);
* per-instruction cycle counts from the architecture guide's cost models, at each engine's
  clock (:class:`Generation`);
* a DMA transfer occupies the DMA engines for ``(buffers * DMA_BUFFER_NS + bytes / engine
  bandwidth) / engines used``, no faster than the core's share of HBM bandwidth; a "buffer"
  is one contiguous piece of one partition (trainium_inferentia2_arch.rst: "DMA buffers").

``assign`` (``tile[...] = value``) costs nothing: the compiler has the producing instruction
write into the destination (the tutorials' ``lhsT_tile[...] = nl.load(...)``). A PSUM
``+=`` of a matmul result is the matmul accumulating (no instruction either), and zeroing a
PSUM tile costs nothing (the next matmul starts a new accumulation group).

Sources (aws-neuron-sdk, file@commit):

* ``A2`` = general/nki/trainium_inferentia2_arch.rst@72825d5 (NeuronCore-v2);
* ``A3`` = nki/guides/architecture/trainium2_arch.rst@81ce03a (NeuronCore-v3);
* ``A4`` = nki/guides/architecture/trainium3_arch.rst@81ce03a (NeuronCore-v4);
* ``BW`` = nki/deep-dives/nki-dma-bandwidth-guide.rst@81ce03a;
* ``DO`` = nki/get-started/about/nki-dma-overview.rst@81ce03a.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

from asickernels.simulate.nki.trace import Access, Instruction

__all__ = ["GENERATIONS", "Estimate", "Generation", "estimate", "generation_of"]

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
# TensorE cycles, MM_INIT_LATENCY = 64 on NeuronCore-v2; FP32 inputs cost "roughly 4x".
MATMUL_MIN_CYCLES = 64
FP32_MATMUL_FACTOR = 4
# The ISA docstrings of the 2.20-era SDK give other engines' costs as max(MIN_II, N); A2
# "Vector Engine": one input tile ~N cycles, two input tiles ~2N. We take MIN_II as the
# matmul's 64 cycles (no release states MIN_II's value on this page).
MIN_CYCLES = 64
# A2 "Tensor access overhead": starting an SBUF/PSUM access costs ~60 cycles on v2; engines
# hide part of it, so it is charged once per instruction (not per operand).
ACCESS_OVERHEAD_CYCLES = 60
# Fitted on the calibration set (benchmarks/nki_estimate/): DMA per-buffer overhead. BW says
# every transfer pays descriptor/packet overhead and that >= 2-4 KiB per partition is needed
# to approach peak; it gives no per-buffer figure, so this one shared constant is fitted.
DMA_BUFFER_NS = 90.0
# BW: "semaphore-to-start latency (~1300 ns cross-engine)": a DMA's result is ready this
# long after its data has moved; it delays dependants, not other transfers.
DMA_LATENCY_NS = 1300.0


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
    ),
    # A3: Tensor 2.4 GHz, Vector 0.96 (512 bf16/fp16 or 256 other elements per cycle),
    # Scalar and GpSimd 1.2 (128); BW 23 B/ns per DMA engine; 3 TB/s over 8 NeuronCores.
    3: Generation(
        "trn2 (NeuronCore-v3)",
        {"tensor": 2.4, "vector": 0.96, "scalar": 1.2, "gpsimd": 1.2},
        (4, 2),
        (1, 1),
        16,
        23.0,
        3000.0 / 8,
    ),
    # A4: Tensor 2.4 GHz, Vector 1.2 (512 bf16/fp16/fp8, 256 other), Scalar 1.2 (256
    # bf16/fp16/fp8, 128 other), GpSimd 1.2; BW 33 B/ns per DMA engine; 4.7 TB/s over 8.
    4: Generation(
        "trn3 (NeuronCore-v4)",
        {"tensor": 2.4, "vector": 1.2, "scalar": 1.2, "gpsimd": 1.2},
        (4, 2),
        (2, 1),
        16,
        33.0,
        4700.0 / 8,
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
        return {"traceEvents": events, "displayTimeUnit": "ns",
                "otherData": {"estimate": True, "generation": self.generation}}  # fmt: skip

    def write_chrome_trace(self, path: str) -> None:
        with open(path, "w") as file:
            json.dump(self.chrome_trace(), file)


def _lanes(rate: tuple[int, int], accesses: Sequence[Access]) -> int:
    return rate[0] if all(a.itemsize == 2 for a in accesses) else rate[1]


def _compute_ns(instruction: Instruction, generation: Generation, engine: str) -> float:
    """Duration of one compute instruction."""
    reads, writes = instruction.reads, instruction.writes
    if engine == "tensor":
        if instruction.api in ("transpose", "nc_transpose"):  # a matmul by an identity: N = P
            moving = reads[0].partitions if reads else MATMUL_MIN_CYCLES
            fp32 = False
        else:
            moving = reads[-1].free_size if reads else MATMUL_MIN_CYCLES
            fp32 = any(a.itemsize >= 4 for a in reads)
        cycles = max(MATMUL_MIN_CYCLES, moving) * (FP32_MATMUL_FACTOR if fp32 else 1)
        return cycles / generation.clock_ghz[engine]
    tiles = reads + writes
    n = max((a.free_size for a in tiles), default=1)
    # Input tiles of the full free size ([P, 1] per-partition scalars ride along for free).
    inputs = max(1, sum(a.memory != "hbm" and a.free_size >= n for a in reads))
    if engine == "vector":
        n = math.ceil(n / _lanes(generation.vector_rate, tiles))
    elif engine == "scalar":
        n = math.ceil(n / _lanes(generation.scalar_rate, tiles))
    cycles = ACCESS_OVERHEAD_CYCLES + max(MIN_CYCLES, inputs * n)
    return cycles / generation.clock_ghz[engine]


def _dma_ns(instruction: Instruction, generation: Generation, buffer_ns: float) -> float:
    """Time the DMA engines are busy with one transfer."""
    accesses = instruction.reads + instruction.writes
    if not accesses:
        return buffer_ns
    nbytes = max(a.nbytes for a in accesses)
    # Buffers: the HBM side's contiguous pieces (on-chip tiles are one piece per partition).
    side = next((a for a in accesses if a.memory == "hbm"), accesses[0])
    buffers = side.partitions * side.runs_per_partition
    engines = min(generation.dma_engines, buffers)
    engine_ns = (buffers * buffer_ns + nbytes / generation.dma_engine_bytes_per_ns) / engines
    return max(engine_ns, nbytes / generation.hbm_bytes_per_ns)


def _elided(instruction: Instruction) -> bool:
    """Instructions the compiler removes: ``assign`` (the producer writes the destination
    directly) and zeroing a PSUM tile (the next matmul into it starts a new accumulation
    group instead: the tutorials' ``nl.zeros(..., buffer=nl.psum)`` before ``+=``)."""
    if instruction.api == "assign":
        return True
    writes = instruction.writes
    zeroing = instruction.api in ("full", "memset") and not instruction.reads
    return zeroing and bool(writes) and all(a.memory == "psum" for a in writes)


class _Regions:
    """When each written element range of each storage is ready."""

    def __init__(self) -> None:
        self.written: dict[int, dict[tuple[int, int], float]] = {}

    def ready(self, accesses: Sequence[Access]) -> float:
        when = 0.0
        for a in accesses:
            for (low, high), end in self.written.get(a.key, {}).items():
                if low <= a.high and a.low <= high and end > when:
                    when = end
        return when

    def write(self, accesses: Sequence[Access], end: float) -> None:
        for a in accesses:
            self.written.setdefault(a.key, {})[(a.low, a.high)] = end


def estimate(
    trace: Sequence[Instruction],
    version: int,
    timeline: bool = False,
    dma_buffer_ns: float = DMA_BUFFER_NS,
) -> Estimate:
    """Schedules ``trace`` (one NeuronCore's instructions in program order) on
    NeuronCore-v``version`` and returns the :class:`Estimate`; ``timeline`` keeps each
    instruction's (engine, api, start, end) for :meth:`Estimate.chrome_trace`."""
    generation = generation_of(version)
    free = dict.fromkeys(ENGINES, 0.0)
    busy = dict.fromkeys(ENGINES, 0.0)
    regions = _Regions()
    events: list[tuple[str, str, float, float]] = []
    finish = 0.0
    for instruction in trace:
        ready = regions.ready(instruction.reads + instruction.writes)
        if _elided(instruction):
            regions.write(instruction.writes, ready)
            continue
        engine = instruction.engine
        if engine == "dma":
            duration = _dma_ns(instruction, generation, dma_buffer_ns)
            start = max(ready, free[engine])
            free[engine] = start + duration
            end = free[engine] + DMA_LATENCY_NS
        else:
            duration = _compute_ns(instruction, generation, engine)
            start = max(ready, free[engine])
            end = free[engine] = start + duration
        busy[engine] += duration
        regions.write(instruction.writes, end)
        finish = max(finish, end)
        if timeline:
            events.append((engine, instruction.api, start, end))
    share = {engine: (busy[engine] / finish if finish else 0.0) for engine in ENGINES}
    bound = max(ENGINES, key=lambda e: busy[e])
    return Estimate(
        finish / 1000.0,
        BOUND_NAMES[bound],
        share,
        len(trace),
        generation.name,
        tuple(events),
    )
