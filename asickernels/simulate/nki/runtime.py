"""Simulator state: the target NeuronCore, the kernel run in progress (its on-chip memory
accounting and counters) and the counters of the last finished run."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from asickernels.simulate.nki import errors, trace

TARGET_ENV = "NEURON_PLATFORM_TARGET_OVERRIDE"
PMAX = 128
PSUM_BANKS = 8
PSUM_BANK_BYTES = 2048
ENGINES = ("tensor", "vector", "scalar", "gpsimd")


@dataclasses.dataclass(frozen=True)
class Target:
    """One NeuronCore generation: what the simulator enforces for it."""

    version: int  # 2 = NeuronCore-v2 (trn1/inf2), 3 = v3 (trn2), 4 = v4 (trn3)
    platforms: str
    sbuf_bytes_per_partition: int


TARGETS = {
    2: Target(2, "trn1/inf2", 192 * 1024),
    3: Target(3, "trn2", 224 * 1024),
    4: Target(4, "trn3", 256 * 1024),
}
_TARGET_NAMES = {"trn1": 2, "inf2": 2, "gen2": 2, "trn2": 3, "gen3": 3, "trn3": 4, "gen4": 4}
# Unset: trn3 (NeuronCore-v4), as the SDK's own simulator defaults off-device
# (nki/guides/nki_simulator.rst, "Target Platform": "otherwise defaults to trn3").
DEFAULT_TARGET = 4


def target_from_env() -> Target:
    """The target named by ``NEURON_PLATFORM_TARGET_OVERRIDE`` (as the SDK reads it), or
    trn3 (NeuronCore-v4) when it is unset, as in the SDK's simulator off-device."""
    value = os.environ.get(TARGET_ENV, "").strip().lower()
    if not value:
        return TARGETS[DEFAULT_TARGET]
    return target_named(value, TARGET_ENV)


LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"


def lnc_from_env() -> int:
    """The LNC degree of a kernel launched without ``kernel[lnc]``: ``NEURON_LOGICAL_NC_CONFIG``
    (1 or 2), else 1 ("kernel(...)  # Kernel implicitly defaults to LNC=1",
    compiler/error-codes/EVRF066.rst of the NKI 0.8 docs)."""
    value = os.environ.get(LNC_ENV, "").strip()
    if not value:
        return 1
    if value not in ("1", "2"):
        raise ValueError(f"{LNC_ENV}={value!r}: the LNC degree is 1 or 2")
    return int(value)


@contextlib.contextmanager
def targeting(name: str) -> Iterator[None]:
    """Kernels launched inside run on the target ``name`` (``trn1``, ``gen2``, ...: what
    ``NEURON_PLATFORM_TARGET_OVERRIDE`` takes), as if that variable were set."""
    previous = os.environ.get(TARGET_ENV)
    os.environ[TARGET_ENV] = name
    try:
        yield
    finally:
        if previous is None:
            del os.environ[TARGET_ENV]
        else:
            os.environ[TARGET_ENV] = previous


def target_named(name: str, where: str = "platform_target") -> Target:
    """The target a platform name (``trn1``, ``inf2``, ``gen2``, ``trn2``, ...) denotes."""
    value = name.strip().lower()
    if value not in _TARGET_NAMES:
        raise ValueError(
            f"{where}={name!r} is not a NeuronCore target; use one of {sorted(_TARGET_NAMES)}"
        )
    return TARGETS[_TARGET_NAMES[value]]


class Launch:
    """What the cores of one rank share: its HBM (the kernel's ``shared_hbm`` tensors). Every
    core runs the same program, so the n-th ``shared_hbm`` tensor a core creates is the n-th
    of every core: one storage, as on device. ``world`` is the launch's
    :class:`~asickernels.simulate.nki.world.World` (every rank and core)."""

    def __init__(self, cores: int, rank: int = 0, world: Any = None) -> None:
        self.cores = cores
        self.rank = rank
        self.world = world
        self._lock = threading.Lock()
        self._shared: list[Any] = []

    def shared_tensor(self, index: int, create: Any) -> Any:
        """The launch's ``index``-th shared HBM storage, made by ``create()`` on first use."""
        with self._lock:
            if index == len(self._shared):
                self._shared.append(create())
            return self._shared[index]


class Allocation:
    """The storage behind an on-chip tensor and all its views. Its bytes count against the
    run's SBUF or PSUM until the last view referencing it is gone (Python's reference
    counting plays the role of the compiler's liveness analysis). A tensor the kernel placed
    at an address (``address``: its first partition and byte) is a view of the run's
    :meth:`Run.physical` memory instead and counts nothing: the kernel owns its placement."""

    __slots__ = ("address", "bytes_per_partition", "in_psum", "matmul_written", "run", "serial")

    _serials = itertools.count(1)

    def __init__(
        self,
        run: Run,
        in_psum: bool,
        bytes_per_partition: int,
        address: tuple[int, int] | None = None,
    ) -> None:
        self.run = run
        self.serial = next(self._serials)  # names the storage in an instruction trace
        self.in_psum = in_psum
        self.bytes_per_partition = bytes_per_partition
        self.address = address
        # PSUM only: which elements a matmul has written (for ``accumulate=None``).
        self.matmul_written: Any = None

    def __del__(self) -> None:
        self.run.release(self)


class Run:
    """One kernel execution: memory in use and instruction/DMA counters."""

    def __init__(
        self,
        target: Target,
        program_id: int = 0,
        launch: Launch | None = None,
    ) -> None:
        self.target = target
        self.program_id = program_id  # the logical core running this instance (kernel[2])
        self.launch = launch or Launch(1)
        # Live tiles beyond capacity: an error, or (the legacy compiler) a spill warning.
        self.spills_when_full = False
        self.spill_warned = False
        self.shared_hbm_created = 0
        self.scalar_reduce_registers: Any = None  # nisa.activation's per-lane accumulators
        self.vector_reduce_registers: Any = None  # the Vector engine's accumulators
        self.random: Any = None  # nisa.dropout / rng / rand2 (a numpy Generator, seed 0)
        self.rng_states: dict[str, Any] = {}  # per engine: its lanes' PRNG states (nisa.rng)
        self.dynamic_loops: list[int] = []  # the nl.fori_loop/while_loop bodies running
        self.psum_tile_bytes = 0  # while a PSUM tile grid is allocated: its tiles' bytes
        # nl.ndarray on chip may span several 128-partition tiles (the nki.language.NkiBlockGrid
        # page allocates element_shape (256, 512) in SBUF); instructions then check operands
        self.partition_tiles = False  # while such an allocation is made
        self.wide_on_chip = False  # whether one was
        self.compile_config: Any = None  # the top-level kernel's nki.jit(compile_config=)
        self.specialization_config: Any = None
        self.meetings: dict[Any, int] = {}  # per channel, the meetings this core joined (world.py)
        self.prepared: Any = None  # the collective a *_prepare set up for its *_trigger
        self.instructions = dict.fromkeys(ENGINES, 0)
        self.dma_transfers = 0
        self.hbm_to_sbuf_bytes = 0
        self.sbuf_to_hbm_bytes = 0
        self.sbuf_in_use = 0
        self.psum_banks_in_use = 0
        self.peak_sbuf = 0
        self.peak_psum_banks = 0
        # Direct allocation: the SBUF and PSUM as bytes (in_psum -> [128, bytes per
        # partition]), made on first use, and the highest byte a placed tensor reaches.
        self._physical: dict[bool, np.ndarray] = {}
        self.placed_extent = {False: 0, True: 0}
        # Set by :func:`recording`: the instruction trace, and whether values are skipped.
        self.trace: list[trace.Instruction] | None = [] if _recording.get("trace") else None
        self.trace_only = bool(_recording.get("trace_only"))
        # False while an instruction runs inside another's adapter (the legacy API's over
        # the core's): its record keeps the engine and parameters, not the operands
        self.trace_accesses = True

    @property
    def core(self) -> tuple[int, int]:
        """``(rank, physical core)`` of this run in its launch."""
        return (self.launch.rank, self.program_id)

    def next_meeting(self, channel: Any) -> int:
        """How many meetings on ``channel`` this core joined before this one (meetings pair
        up by program order: the n-th of one core with the n-th of its peers)."""
        count = self.meetings.get(channel, 0)
        self.meetings[channel] = count + 1
        return count

    def allocate(self, in_psum: bool, bytes_per_partition: int, what: str) -> Allocation:
        if in_psum:
            # A tile grid's tiles (nl.alloc_tiles, NKI 0.7) each sit in whole banks, as many
            # to a bank as fit; any other tensor is one tile.
            tile = max(1, self.psum_tile_bytes or bytes_per_partition)
            per_bank = max(1, PSUM_BANK_BYTES // tile)
            tiles = -(-bytes_per_partition // tile)
            banks = -(-tiles // per_bank) * -(-tile // PSUM_BANK_BYTES)
            # NeuronCore-v4 matmuls write up to all 8 banks at once (nki.isa.nc_matmul, "Tile
            # size"); earlier cores keep a PSUM tile within one 2 KiB bank.
            if tile > PSUM_BANK_BYTES and self.target.version < 4:
                raise errors.SizeOfDimensionExceedArchLimit(
                    f"{what} needs {tile} bytes per partition; a PSUM tile must fit "
                    f"one bank of {PSUM_BANK_BYTES} bytes (512 fp32) before NeuronCore-v4"
                )
            if self.psum_banks_in_use + banks > PSUM_BANKS:
                self._over_capacity(
                    errors.PsumCapacityExceeded,
                    f"{what} needs {banks} PSUM bank(s) but {self.psum_banks_in_use} of "
                    f"{PSUM_BANKS} banks (16 KiB per partition) hold live tiles",
                    alone=banks > PSUM_BANKS,
                )
            self.psum_banks_in_use += banks
            self.peak_psum_banks = max(self.peak_psum_banks, self.psum_banks_in_use)
        else:
            capacity = self.target.sbuf_bytes_per_partition
            if self.sbuf_in_use + bytes_per_partition > capacity:
                self._over_capacity(
                    errors.SbufCapacityExceeded,
                    f"{what} needs {bytes_per_partition} bytes per partition with "
                    f"{self.sbuf_in_use} already live; NeuronCore-v{self.target.version} "
                    f"({self.target.platforms}) has {capacity} bytes of SBUF per partition",
                    alone=bytes_per_partition > capacity,
                )
            self.sbuf_in_use += bytes_per_partition
            self.peak_sbuf = max(self.peak_sbuf, self.sbuf_in_use)
        # PSUM: whole banks, which the release gives back
        return Allocation(
            self, in_psum, banks * PSUM_BANK_BYTES if in_psum else bytes_per_partition
        )

    def _over_capacity(
        self, error: type[errors.NkiValidationError], message: str, alone: bool
    ) -> None:
        """Live tiles exceed a memory: an error, unless this run spills (then one warning per
        run). A tile larger than the whole memory is always an error."""
        if alone or not self.spills_when_full:
            raise error(message)
        if not self.spill_warned:
            self.spill_warned = True
            warnings.warn(
                f"{message}: the compiler spills to HBM", errors.SpillWarning, stacklevel=4
            )

    def physical(self, in_psum: bool) -> np.ndarray:
        """The core's SBUF (or PSUM) as one ``[128, bytes per partition]`` uint8 array that
        tensors placed at addresses view, so that two placements overlapping in memory see
        each other's writes. It starts as 0xFF bytes: NaN in every float dtype (integers
        read as all ones)."""
        if in_psum not in self._physical:
            row = PSUM_BANKS * PSUM_BANK_BYTES if in_psum else self.target.sbuf_bytes_per_partition
            self._physical[in_psum] = np.full((PMAX, row), 0xFF, np.uint8)
        return self._physical[in_psum]

    def place(
        self, in_psum: bool, address: tuple[int, int], bytes_per_partition: int
    ) -> Allocation:
        """The allocation of a tensor the kernel placed at ``address`` (first partition,
        first byte of each partition; checked by the caller)."""
        end = address[1] + bytes_per_partition
        self.placed_extent[in_psum] = max(self.placed_extent[in_psum], end)
        return Allocation(self, in_psum, 0, address)

    def release(self, allocation: Allocation) -> None:
        if allocation.in_psum:
            self.psum_banks_in_use -= -(-allocation.bytes_per_partition // PSUM_BANK_BYTES)
        else:
            self.sbuf_in_use -= allocation.bytes_per_partition

    def count(
        self,
        engine: str,
        api: str = "",
        reads: Sequence[Any] = (),
        writes: Sequence[Any] = (),
        params: Sequence[Any] | None = None,
        pinned: bool = True,
    ) -> None:
        """One instruction on ``engine``; with a trace, also what it ``reads`` and ``writes``
        (simulator tensors; scalars are skipped), when the caller knows them all, its
        non-tile ``params``, and whether the kernel chose ``engine`` (``pinned``; False: the
        compiler chooses) (:class:`~asickernels.simulate.nki.trace.Instruction`)."""
        self.instructions[engine] += 1
        if self.wide_on_chip:
            _within_partitions(engine, api, (*reads, *writes))
        if self.trace is not None:
            if not self.trace_accesses:
                reads = writes = ()
            self.trace.append(trace.instruction(engine, api, reads, writes, params, pinned))

    def follow(self, api: str, reads: Sequence[Any], writes: Sequence[Any]) -> None:
        """With a trace, an operation that issues no instruction of its own (a PSUM ``+=``
        is the matmul accumulating): recorded so that what reads ``writes`` waits for
        ``reads``; the cost model charges nothing for it."""
        if self.trace is not None:
            self.trace.append(trace.instruction("tensor", api, reads, writes))

    def count_dma(
        self,
        src_in_hbm: bool,
        dst_in_hbm: bool,
        nbytes: int,
        api: str = "dma",
        reads: Sequence[Any] = (),
        writes: Sequence[Any] = (),
        trigger: str = "",
    ) -> None:
        """One DMA transfer; ``trigger``: the engine whose queue the kernel put it on ("":
        the compiler's choice)."""
        self.dma_transfers += 1
        if self.trace is not None:
            if not self.trace_accesses:
                reads = writes = ()
            self.trace.append(trace.instruction("dma", api, reads, writes, trigger=trigger))
        if src_in_hbm and not dst_in_hbm:
            self.hbm_to_sbuf_bytes += nbytes
        elif dst_in_hbm and not src_in_hbm:
            self.sbuf_to_hbm_bytes += nbytes

    def counters(self) -> dict[str, float]:
        report: dict[str, float] = {
            f"{engine}_instructions": float(n) for engine, n in self.instructions.items()
        }
        report.update(
            dma_transfers=float(self.dma_transfers),
            hbm_to_sbuf_bytes=float(self.hbm_to_sbuf_bytes),
            sbuf_to_hbm_bytes=float(self.sbuf_to_hbm_bytes),
            # placed tensors reach placed_extent; the compiler's tiles come on top
            peak_sbuf_bytes_per_partition=float(self.peak_sbuf + self.placed_extent[False]),
            peak_psum_banks=float(
                self.peak_psum_banks + -(-self.placed_extent[True] // PSUM_BANK_BYTES)
            ),
        )
        return report


# Each logical core (a thread under ``kernel[2]``) has its own run: its own SBUF and PSUM.
_local = threading.local()
_last_counters: dict[str, float] = {}
_last_traces: list[tuple[int, list[trace.Instruction]]] = []
_recording: dict[str, bool] = {}


@contextlib.contextmanager
def recording(trace_only: bool = False) -> Iterator[None]:
    """Runs started inside record an instruction trace (:func:`last_traces`); with
    ``trace_only`` they skip computing values (placeholder inputs: only shapes and dtypes
    matter, and every value read is zero)."""
    previous = dict(_recording)
    _recording.update(trace=True, trace_only=trace_only)
    try:
        yield
    finally:
        _recording.clear()
        _recording.update(previous)


def values_skipped() -> bool:
    """Whether the run in progress skips computing values (trace-only mode)."""
    run = _active()
    return run is not None and run.trace_only


def _active() -> Run | None:
    return getattr(_local, "run", None)


def active_run(api: str) -> Run:
    """The run in progress; NKI APIs exist only inside a kernel."""
    run = _active()
    if run is None:
        raise errors.NkiApiOutsideOfNkiKernel(
            f"'{api}' was called outside an NKI kernel; decorate the kernel with nki.jit and "
            "call it (or nki.simulate(kernel))"
        )
    return run


def current_target() -> Target:
    run = _active()
    return run.target if run is not None else target_from_env()


def start_run(
    program_id: int = 0, launch: Launch | None = None, target: Target | None = None
) -> Run:
    """A new run on ``target`` (default: :func:`target_from_env`)."""
    run = Run(target or target_from_env(), program_id, launch)
    _local.run = run
    return run


def finish_run() -> None:
    _local.run = None


def publish_counters(runs: list[Run]) -> None:
    """Makes the finished ``runs`` (one per logical core) the last run's counters: summed
    instructions and bytes, the largest peaks."""
    global _last_counters, _last_traces
    _last_traces = [(run.target.version, run.trace) for run in runs if run.trace is not None]
    reports = [run.counters() for run in runs]
    _last_counters = {
        key: (max if key.startswith("peak_") else sum)(r[key] for r in reports)
        for key in reports[0]
    }


def _within_partitions(engine: str, api: str, operands: Sequence[Any]) -> None:
    """A compute engine reads and writes at most 128 partitions: an on-chip tensor over more
    (see :func:`allocating`) is reached by DMA or one partition tile at a time."""
    for operand in operands:
        shape = getattr(operand, "shape", ())
        if getattr(operand, "on_chip", False) and shape and shape[0] > PMAX:
            raise errors.NumPartitionExceedArchLimit(
                f"'{api}' operand {operand!r}: size of partition dimension {shape[0]} exceeds "
                f"architecture limitation of {PMAX} for a {engine} engine instruction (a tensor "
                "over 128 partitions is reached by DMA or one 128-partition tile at a time)"
            )


@contextlib.contextmanager
def allocating(api: str, **settings: Any) -> Iterator[None]:
    """On-chip allocations inside are made with ``settings`` on the run: ``psum_tile_bytes``
    (the tiles' bytes per partition of a PSUM tile grid: :meth:`Run.allocate` gives each tile
    whole banks) or ``partition_tiles=True`` (a tensor may have more than 128 partitions: the
    memory holds it as 128-partition tiles side by side, its bytes per partition multiplied;
    engine instructions check their operands, :func:`_within_partitions`)."""
    run = active_run(api)
    saved = {key: getattr(run, key) for key in settings}
    for key, value in settings.items():
        setattr(run, key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(run, key, value)


def in_kernel() -> bool:
    return _active() is not None


def last_traces() -> list[tuple[int, list[trace.Instruction]]]:
    """``(NeuronCore version, instruction trace)`` per logical core of the most recent
    finished run started under :func:`recording`; empty otherwise."""
    return list(_last_traces)


def last_counters() -> dict[str, float]:
    """Counters of the most recent finished kernel run (summed over its logical cores):
    instructions per engine (``tensor``/``vector``/``scalar``/``gpsimd_instructions``),
    ``dma_transfers``, bytes moved ``hbm_to_sbuf_bytes`` / ``sbuf_to_hbm_bytes``, and peak
    on-chip use (``peak_sbuf_bytes_per_partition``, ``peak_psum_banks``). Empty before any
    run."""
    return dict(_last_counters)
