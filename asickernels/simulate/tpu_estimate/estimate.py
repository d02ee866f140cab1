"""TPU kernel time estimates from the real TPU compiler's schedule (no TPU needed).

libtpu compiles our kernels on this machine for a TPU topology and, when asked, dumps each
compiled program's final VLIW schedule. :mod:`.walk` walks
that schedule (trip counts, predicated regions, DMA waits against the HBM bandwidth);
this module compiles a kernel for a generation in a subprocess with the dump flags, turns
the walk into seconds with the generation's clock, calibrates the two effects a schedule
cannot show against published TPU v5e timings, and uses the estimate to tune block sizes.

These are compiler-schedule estimates, not measurements. What the walk does not model: MXU
or VMEM bank stalls the static schedule does not show, DMA engine concurrency beyond one
HBM queue, and the second TensorCore's traffic on v5p (its HBM share is halved instead).
Two calibrated constants stand in for what no schedule shows: a fixed latency per DMA and
the per-call host overhead that wall-clock (``timeit``) timings include.

Commands (:mod:`asickernels.estimates.command`): ``asickernels estimate`` (estimates for
v5e/v6e/v5p), ``--tune`` (block-size sweeps), ``--markdown PATH`` (calibration, estimates
and tuning as markdown). With ``--neuron``, our NKI kernels on NeuronCores instead, from
the NKI simulator's cost model (no libtpu; :mod:`asickernels.estimates.nki_estimates`).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from asickernels import tpu_generations as generations
from asickernels.simulate import tpu_compile
from asickernels.simulate.tpu_estimate import parsing, program_facts, scalar, walk
from asickernels.simulate.tpu_estimate.observed import KernelRun
from asickernels.simulate.tpu_estimate.roofline import Work

# Generations the estimate covers: those libtpu compiles for whose clock is known.
GENERATIONS = tuple(
    name for name in generations.COMPILABLE if generations.GENERATIONS[name].clock_hz
)


def hbm_bytes_per_cycle(generation: str) -> float:
    """One TensorCore's share of its device's HBM bandwidth, at the share a copy gets
    (:attr:`~asickernels.tpu_generations.Generation.hbm_efficiency`), in bytes per cycle."""
    facts = generations.get(generation)
    assert facts.clock_hz is not None
    device = facts.per_device(facts.hbm_bytes_per_s) * facts.hbm_efficiency
    return device / facts.cores_per_device / facts.clock_hz


# MXUs per TensorCore and their width (jax/_src/pallas/mosaic/tpu_info.py in jax 0.10.2:
# num_mxus, mxu_column_size); the listings name the same units (mxu0..mxu3 on v5e and v5p,
# mxu0..mxu1 on v6e and v7x).
MXU_GEOMETRY = {"v4": (4, 128), "v5e": (4, 128), "v5p": (4, 128), "v6e": (2, 256), "v7x": (2, 256)}
# Branch delay slots where they are not walk.BRANCH_DELAY_SLOTS (see there).
BRANCH_DELAY_SLOTS = {"v7x": 6}
_INTEGER_MXU_TYPES = ("s8", "u8", "s4", "u4")
_FLOAT8_MXU_TYPES = ("e4m3", "e5m2")


def mxu_op_cycles(generation: str) -> dict[str, float]:
    """Cycles one ``vmatmul`` occupies its MXU, per operand type: it pushes one vreg of
    ``8 x 32 / bits`` rows through a ``width x width`` array, at the MXU's share of the
    device's datasheet peak (int8 for integer types, fp8 for 8-bit floats where the
    datasheet gives an fp8 peak, bfloat16 otherwise; float32 at the bfloat16 rate per row,
    an assumption). E.g. v5e bf16: 16 x 128 x 128 multiply-adds at
    197e12 / 2 / 4 MXUs per second = 16 cycles at 1.5 GHz."""
    facts = generations.get(generation)
    if facts.clock_hz is None or generation not in MXU_GEOMETRY:
        raise ValueError(f"no MXU facts for {generation!r}")
    mxus, width = MXU_GEOMETRY[generation]
    cycles = {}
    for operand_type, bits in parsing.MXU_OPERAND_BITS.items():
        peak = facts.peak_bf16_ops_per_s
        if operand_type in _INTEGER_MXU_TYPES:
            peak = facts.peak_int8_ops_per_s or peak
        elif operand_type in _FLOAT8_MXU_TYPES:
            peak = facts.peak_fp8_ops_per_s or peak
        macs_per_s = facts.per_device(peak) / 2 / facts.cores_per_device / mxus
        rows = 8 * 32 // bits
        cycles[operand_type] = rows * width * width / macs_per_s * facts.clock_hz
    return cycles


def product_ops_per_cycle(generation: str) -> tuple[float, float]:
    """One TensorCore's (integer, other) matrix-product operations per cycle at the chip's
    datasheet peaks (int8, bf16)."""
    facts = generations.get(generation)
    assert facts.clock_hz is not None
    per_cycle = facts.cores_per_chip * facts.clock_hz
    bf16 = facts.peak_bf16_ops_per_s / per_cycle
    return (facts.peak_int8_ops_per_s or facts.peak_bf16_ops_per_s) / per_cycle, bf16


DEFAULT_GENERATIONS = ("v5e", "v6e", "v5p")

# Fitted to the published TPU v5e timings of :mod:`.published` (the JAX Pallas TPU matmul
# guide's and the seed's; `asickernels estimate --markdown` prints the fit from the current
# compiler beside these, with each source held out). A schedule cannot show either:
# DMA_LATENCY_S: issue-to-completion time of one DMA on top of its bytes / bandwidth; it
#   dominates loops that fetch small blocks and wait for them (128^3 matmul blocks, NMS).
# CALL_OVERHEAD_S: per-call time outside the device program (host dispatch, launch,
#   synchronisation) that `timeit` around `block_until_ready` includes; in "per call" only.
DMA_LATENCY_S = 0.50e-6
CALL_OVERHEAD_S = 109e-6

# What the walk does not model, named wherever an estimate comes out below its floor.
BELOW_FLOOR_NOTE = (
    "work it did not walk (a loop or branch it assumed: see 'assumes') or a cost it does not "
    "model (MXU result-path latency, VMEM bank conflicts)"
)

DUMP_PASSES = "final_bundles|deduplication-map|final_hlo-static"
COMPILE_TIMEOUT_S = 900


class EstimateError(RuntimeError):
    """A kernel could not be compiled or its schedule could not be walked."""


# --------------------------------------------------------------------------------------
# What to compile
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EstimateTarget:
    """A program to estimate: ``builder`` (``"module:function"``) called with ``kwargs``
    returns ``(function, [(shape, dtype), ...])``.

    ``loop_trips`` gives trip counts for loops whose exit depends on data (the walk cannot
    compute them): ``(program, ((loop number, trips), ...))`` pairs, the loop numbered in
    preorder of :func:`~asickernels.simulate.tpu_estimate.walk.loop_tree` and ``trips`` an
    int or a tuple taken in turn on successive entries of that loop. ``observed_trips``: the
    trips a run on example inputs took in the function's ``while`` loops, in entry order
    (:func:`~.observed.observe`), for the data-dependent loops ``loop_trips``
    does not name; ``arguments``: the function's arguments (:func:`argument`), whose values
    (small ones given as example arrays) the walk computes with; ``kernel_runs``: what that
    run saw inside each Pallas kernel (grid
    steps, how often each data-dependent branch ran its region, loop trips).

    ``op``, ``impl`` (``"pallas_tpu"``, ``"xla"`` or ``"seed"``) and ``shape`` label the
    case in tables and JSON; ``work`` gives its roofline (None: none stated).
    """

    name: str
    builder: str
    kwargs: tuple[tuple[str, Any], ...] = ()
    loop_trips: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    observed_trips: tuple[int | None, ...] = ()
    kernel_runs: tuple[KernelRun, ...] = ()
    arguments: tuple[Argument, ...] = ()
    op: str = ""
    impl: str = ""
    shape: str = ""
    work: Work | None = None

    def build(self) -> tuple[Callable[..., Any], list[tuple[tuple[int, ...], Any]]]:
        module, _, function = self.builder.partition(":")
        built: tuple[Callable[..., Any], list[tuple[tuple[int, ...], Any]]]
        built = getattr(importlib.import_module(module), function)(**dict(self.kwargs))
        return built


# An argument of the function: its HLO type (``"s32[8]"``) and, when its values are known
# and small, its elements' little-endian bytes in C order (None: a shape only, or too big to
# matter to the scalar unit).
Argument = tuple[str, bytes | None]
_HLO_TYPES = {"b": "pred", "i": "s", "u": "u", "f": "f"}


def argument(value: Any) -> Argument:
    """An example argument (an array, or anything with ``shape`` and ``dtype``) as the walk
    takes it: its values when it is an array of at most
    :data:`~.scalar.MAX_TRACKED_WORDS` elements (group sizes, loop bounds, block masks)."""
    import numpy as np

    dtype = np.dtype(value.dtype)
    kind = "bf" if dtype.name == "bfloat16" else _HLO_TYPES.get(dtype.kind, "?")
    bits = "" if kind == "pred" else str(dtype.itemsize * 8)
    shape = tuple(int(d) for d in value.shape)
    hlo_type = f"{kind}{bits}[{','.join(map(str, shape))}]"
    small = math.prod(shape) <= scalar.MAX_TRACKED_WORDS and hasattr(value, "__array__")
    if not small or dtype.kind not in "biuf" or dtype.name == "bfloat16":
        return hlo_type, None
    data = np.ascontiguousarray(np.asarray(value), dtype.newbyteorder("<")).tobytes()
    return hlo_type, data


def parameter_words(
    layouts: Sequence[str], arguments: Sequence[Argument]
) -> dict[int, dict[int, int]]:
    """The known words of the top-level program's parameters (by number): each parameter
    (type and TPU layout, :attr:`~.parsing.Dump.parameter_layouts`) takes the next argument
    of its type (arguments the compiler dropped as unused are skipped), laid out in memory as
    the layout says."""
    words: dict[int, dict[int, int]] = {}
    position = 0
    for number, layout in enumerate(layouts):
        hlo_type = layout.partition("{")[0]
        while position < len(arguments) and arguments[position][0] != hlo_type:
            position += 1
        if position == len(arguments):
            break
        data = arguments[position][1]
        position += 1
        if data is not None:
            words[number] = dict(enumerate(scalar.memory_words(layout, data)))
    return words


# --------------------------------------------------------------------------------------
# Compiling with dumps (in a subprocess: libtpu reads its flags once per process)
# --------------------------------------------------------------------------------------


def compile_with_dumps(case: EstimateTarget, generation: str, directory: Path) -> Path:
    """Compiles ``case`` for ``generation`` in a fresh process with libtpu's schedule dumps
    in ``directory``; returns the folder holding the listings."""
    if generation not in GENERATIONS:
        raise ValueError(f"unknown generation {generation!r}; known: {sorted(GENERATIONS)}")
    listings = Path(directory) / "jf"
    env = dict(os.environ)
    flags = f"--xla_jf_dump_to={listings} --xla_jf_dump_llo_pass_label_regex={DUMP_PASSES}"
    env["LIBTPU_INIT_ARGS"] = f"{env.get('LIBTPU_INIT_ARGS', '')} {flags}".strip()
    tpu_compile.set_libtpu_environment(env)
    request = json.dumps(
        {
            "builder": case.builder,
            "kwargs": dict(case.kwargs),
            "generation": generation,
            "facts": str(Path(directory) / FACTS_FILE),
        }
    )
    command = [sys.executable, "-m", __name__, "--compile-child", request]
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise EstimateError(f"{case.name} on {generation}: compile timed out") from None
    if done.returncode != 0:
        tail = [line for line in done.stderr.splitlines() if line.strip()][-6:]
        raise EstimateError(f"{case.name} on {generation}: compile failed:\n" + "\n".join(tail))
    if not listings.is_dir():
        raise EstimateError(f"{case.name} on {generation}: libtpu wrote no schedule dumps")
    return listings


FACTS_FILE = "program_facts.json"


def load_facts(listings: Path) -> program_facts.ProgramFacts | None:
    """The :class:`~.program_facts.ProgramFacts` the compile child wrote beside the
    listings of :func:`compile_with_dumps` (None if it could not read the jaxpr)."""
    path = Path(listings).parent / FACTS_FILE
    if not path.exists():
        return None
    return program_facts.ProgramFacts.from_json(json.loads(path.read_text()))


def _compile_child(request_json: str) -> int:
    """The subprocess side of :func:`compile_with_dumps`."""
    from asickernels.simulate import tpu_compile

    request = json.loads(request_json)
    function, specs = EstimateTarget(
        "child", request["builder"], tuple(request["kwargs"].items())
    ).build()
    tpu_compile.lower_for_tpu(function, specs, request["generation"]).compile()
    facts = program_facts.program_facts(function, specs)
    Path(request["facts"]).write_text(json.dumps(facts.as_json()))
    return 0


# --------------------------------------------------------------------------------------
# Estimating
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Estimate:
    """One compiled function on one generation.

    ``device_s`` is the whole jitted function's device program (all fusions and kernels);
    ``kernel_s`` the Pallas kernels (custom calls) in it; ``per_call_s`` adds the calibrated
    per-call overhead. ``mxu_stall_cycles`` is the part of ``device_s`` spent waiting for a
    busy MXU (the schedule issues pushes faster than the MXU takes them), ``dma_wait_cycles``
    waiting for DMAs. ``utilization`` is issued slots / capacity per unit over the kernels'
    (else the whole program's) estimated cycles. ``floor_s`` is the least time the
    function's work can take (:class:`~.program_facts.Floor`; None when unknown), ``bound``
    the resource that limits the estimate. ``assumptions`` says, in sentences, everything
    the estimate assumed (loops and branches the walk could not decide, TensorCore splits).
    """

    case: str
    generation: str
    device_s: float
    kernel_s: float
    per_call_s: float
    schedule_cycles: float
    dma_wait_cycles: float
    hbm_bytes: float
    utilization: dict[str, float]
    programs: dict[str, tuple[int, float]]  # name -> (calls, seconds)
    kernels: tuple[str, ...]
    unresolved: tuple[str, ...]
    loops: tuple[str, ...]
    mxu_stall_cycles: float = 0.0
    step_floor_cycles: float = 0.0
    floor_s: float | None = None
    floor_bound: str = ""
    bound: str = ""
    assumptions: tuple[str, ...] = ()

    @property
    def call_overhead_s(self) -> float:
        return self.per_call_s - self.device_s

    def report(self) -> str:
        """The estimate as text: device time, floor, bound, per-call time, assumptions."""
        clock = generations.get(self.generation).clock_hz or 1.0
        floor = (
            "unknown"
            if self.floor_s is None
            else f"{self.floor_s * 1e3:.4f} ms ({self.floor_bound}-bound)"
        )
        lines = [
            f"{self.case or 'function'} on TPU {self.generation} (an estimate from the "
            "compiler's schedule, not a measurement):",
            f"  device time   {self.device_s * 1e3:.4f} ms (MXU-busy stalls "
            f"{self.mxu_stall_cycles / clock * 1e3:.4f} ms, DMA waits "
            f"{self.dma_wait_cycles / clock * 1e3:.4f} ms"
            + (
                f", raised to kernels' step floors {self.step_floor_cycles / clock * 1e3:.4f} ms"
                if self.step_floor_cycles
                else ""
            )
            + ")",
            f"  Pallas kernels {self.kernel_s * 1e3:.4f} ms" if self.kernels else "",
            f"  floor         {floor}",
            f"  bound by      {self.bound}",
            f"  per call      {self.per_call_s * 1e3:.4f} ms (device + "
            f"{self.call_overhead_s * 1e6:.0f} us host dispatch, calibrated)",
        ]
        if self.floor_s is not None and self.device_s < self.floor_s:
            lines.append(f"  BELOW THE FLOOR: the walk misses {BELOW_FLOOR_NOTE}")
        lines += [f"  assumes: {line}" for line in self.assumptions]
        return "\n".join(line for line in lines if line)


def _assumptions(
    walker: walk.Walker, facts: program_facts.ProgramFacts | None, generation: str
) -> tuple[str, ...]:
    machine = walker.machine
    notes: list[str] = []
    for note in machine.unresolved_loops:
        notes.append(note)
    sites: dict[str, list[tuple[int, int]]] = {}
    for (program, bundle), count in sorted(machine.unresolved_branch_sites.items()):
        sites.setdefault(program, []).append((bundle, count))
    for program, branches in sites.items():
        where = ", ".join(f"{bundle:#x}" for bundle, _ in branches[:6])
        more = f" and {len(branches) - 6} more" if len(branches) > 6 else ""
        notes.append(
            f"{program}: {len(branches)} branch(es) at bundle {where}{more} depend on data "
            "(e.g. pl.when on a loaded value); assumed to run their region, "
            f"{sum(count for _, count in branches)} time(s) in all"
        )
    if machine.unknown_mxu_types:
        notes.append(
            f"MXU pushes of {sorted(machine.unknown_mxu_types)} cost only their bundle "
            "(no rate known)"
        )
    notes += [f"no listing for {name}: not counted" for name in sorted(machine.missing_programs)]
    notes += [
        f"{kernel}: walked without counts from the run on the example inputs ({why})"
        for kernel, why in walker.uncounted_kernels.items()
    ]
    facts_cores = generations.get(generation).cores_per_device
    if facts is None:
        notes.append("the function's jaxpr could not be read: floor and core split unknown")
    else:
        notes += [call.megacore(generation) for call in facts.pallas_calls]
    if facts_cores > 1:
        notes.append(
            f"{generation} has {facts_cores} TensorCores per device: the walk follows core 0, "
            "with half the chip's HBM bandwidth (XLA fusions split their work over both)"
        )
    return tuple(notes)


def estimate_dump(
    dump: parsing.Dump,
    generation: str,
    *,
    case: str = "",
    loop_trips: Mapping[str, Mapping[int, Any]] | None = None,
    dma_latency_s: float = DMA_LATENCY_S,
    call_overhead_s: float = CALL_OVERHEAD_S,
    facts: program_facts.ProgramFacts | None = None,
    mxu_occupancy: bool = True,
    observed_trips: Sequence[int | None] = (),
    kernel_runs: Sequence[KernelRun] = (),
    arguments: Sequence[Argument] = (),
) -> Estimate:
    """Walks a loaded dump for ``generation``; see :class:`Estimate`. ``mxu_occupancy``
    False walks the schedule as issued (MXU pushes cost only their bundle)."""
    clock = generations.get(generation).clock_hz
    assert clock is not None
    options: dict[str, Any] = {
        "bytes_per_cycle": hbm_bytes_per_cycle(generation),
        "dma_latency_cycles": dma_latency_s * clock,
        "loop_trips": loop_trips or {},
        "mxu_op_cycles": mxu_op_cycles(generation) if mxu_occupancy else None,
        "observed_trips": observed_trips,
        "kernel_runs": kernel_runs,
        "parameters": parameter_words(dump.parameter_layouts, arguments),
        "delay_slots": BRANCH_DELAY_SLOTS.get(generation, walk.BRANCH_DELAY_SLOTS),
        "product_ops_per_cycle": product_ops_per_cycle(generation),
    }
    walker = walk.Walker(dump, charge_steady_calls=True, **options)
    cycles = walker.run()
    charged: tuple[str, ...] = ()
    if walker.charged:
        calls = ", ".join(f"{name} x{count}" for name, count in sorted(walker.charged.items()))
        charged = (
            f"calls charged at the cost of the last {walk.STEADY_CALLS} identical ones walked "
            "(same DMA/MXU state, nothing decided or written from the arguments' values) "
            f"instead of walked: {calls}",
        )
    kernels = tuple(name for name in walker.stats if name in dump.mosaic_kernels)
    kernel_cycles = sum(walker.stats[name].cycles for name in kernels)
    measured = kernels or tuple(walker.stats)
    span = kernel_cycles if kernels else cycles
    busy = walker.unit_busy(measured)
    utilization = {
        unit: busy.get(unit, 0.0) / (capacity * span)
        for unit, capacity in walker.capacity().items()
        if capacity and span
    }
    machine = walker.machine
    device_s = cycles / clock
    floor_s = facts.floor.seconds(generation) if facts else None
    shares = {
        "HBM (DMA waits)": machine.dma_wait_cycles / cycles if cycles else 0.0,
        "MXU (busy stalls + issue)": (machine.mxu_stall_cycles + machine.mxu_pushes) / cycles
        if cycles
        else 0.0,
    }
    top = max(shares, key=lambda name: shares[name])
    bound = top if shares[top] >= 0.3 else "instruction issue (the schedule's bundles)"
    return Estimate(
        case=case,
        generation=generation,
        device_s=device_s,
        kernel_s=kernel_cycles / clock,
        per_call_s=device_s + call_overhead_s,
        schedule_cycles=cycles
        - machine.dma_wait_cycles
        - machine.mxu_stall_cycles
        - machine.step_floor_cycles,
        dma_wait_cycles=machine.dma_wait_cycles,
        hbm_bytes=machine.hbm_bytes,
        utilization=utilization,
        programs={
            name: (stats.calls, stats.cycles / clock) for name, stats in walker.stats.items()
        },
        kernels=kernels,
        unresolved=tuple(machine.unresolved_loops)
        + (
            (
                f"{machine.unresolved_branches} data-dependent branch(es) assumed to run their region",
            )
            if machine.unresolved_branches
            else ()
        )
        + tuple(f"no listing for {name}" for name in sorted(machine.missing_programs)),
        loops=tuple(walker.describe_loops(kernels or None)),
        mxu_stall_cycles=machine.mxu_stall_cycles,
        step_floor_cycles=machine.step_floor_cycles,
        floor_s=floor_s,
        floor_bound=facts.floor.bound(generation) if facts else "",
        bound=bound,
        assumptions=charged + _assumptions(walker, facts, generation),
    )


def estimate_case(case: EstimateTarget, generation: str, **options: Any) -> Estimate:
    """Compiles ``case`` for ``generation`` with dumps in a temporary folder and walks it."""
    with tempfile.TemporaryDirectory(prefix="asickernels-tpu-dump-") as directory:
        listings = compile_with_dumps(case, generation, Path(directory))
        try:
            dump = parsing.load_dump(listings)
        except parsing.ScheduleError as error:
            raise EstimateError(f"{case.name} on {generation}: {error}") from None
        facts = load_facts(listings)
    return estimate_case_dump(case, generation, dump, facts, **options)


def estimate_case_dump(
    case: EstimateTarget,
    generation: str,
    dump: parsing.Dump,
    facts: program_facts.ProgramFacts | None,
    **options: Any,
) -> Estimate:
    """:func:`estimate_dump` of ``case``'s loaded ``dump`` and ``facts``, with the case's loop
    trips, observed trips, kernel runs and arguments.

    Raises:
      EstimateError: the schedule cannot be walked, naming the case and generation.
    """
    trips = {program: dict(entries) for program, entries in case.loop_trips}
    try:
        return estimate_dump(
            dump,
            generation,
            case=case.name,
            loop_trips=trips,
            facts=facts,
            observed_trips=case.observed_trips,
            kernel_runs=case.kernel_runs,
            arguments=case.arguments,
            **options,
        )
    except parsing.ScheduleError as error:
        raise EstimateError(f"{case.name} on {generation}: {error}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m asickernels.simulate.tpu_estimate.estimate --compile-child REQUEST`` (internal)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "--compile-child":
        return _compile_child(args[1])
    print("internal entry point; use `asickernels estimate`", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
