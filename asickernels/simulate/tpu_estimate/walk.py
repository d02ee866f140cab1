"""Walks the TPU compiler's final VLIW schedule to count cycles.

libtpu writes, per compiled program (the top-level program ``TLP``, each XLA fusion, each
Mosaic kernel), a listing of its final bundles (``*-final_bundles.txt``: one VLIW bundle per
cycle, with loop-body / predicated-region markers, branches, DMA descriptors and calls to
other programs) and a per-bundle unit utilisation table
(``*-final_hlo-static-per-bundle-utilization.txt``). This module parses those listings and
*walks* them from the top-level program like the TPU's scalar unit would:

* scalar and predicate registers are tracked where they are computable (grid counters, loop
  bounds, spills to static SMEM slots), so loop trip counts and which ``pl.when`` regions run
  come out of the schedule itself; a branch that depends on data (e.g. a value loaded from
  a scalar-prefetch ref) is *unresolved*. A Pallas kernel with counts from a run on
  example inputs (``kernel_runs``, :mod:`.observed`) gets that run's scalar operands (grid
  bounds in registers, scalar-prefetch arrays in SMEM, laid out as the program lays them
  out), so what follows from them (the grid's trips, index-map fetches, output
  write-backs, ``pl.when`` on prefetched data) is decided by the schedule; a long grid is
  extrapolated step by step in the run's order, and a call is never charged less than its
  steps' own floor. Its remaining unresolved forward branches take, in the order the walk meets them, the data-dependent branches of its body
  in preorder, each running its region at the rate the run saw (spread evenly over its
  executions); its data-dependent loops likewise take the run's trips per entry. Otherwise
  a forward branch is assumed not taken (its region runs) and a loop runs the trips the
  caller gives for it (``loop_trips``), else once; all are listed in the result;
* each bundle costs one cycle (``vdelay n`` adds ``n``), branches have 4 delay slots;
* each MXU push (``vmatmul``) occupies its MXU for the cycles the caller gives for its
  operand type (``mxu_op_cycles``: the rows it pushes through the array at the chip's
  datasheet rate); a push to a busy MXU stalls its bundle. The compiler issues pushes
  faster than that (dense matmuls would otherwise beat the datasheet peak on paper):
  the hardware interlocks, and this is where that time enters the estimate;
* DMAs go through one HBM queue of the generation's bandwidth; a ``dma.done.wait`` stalls
  until its DMAs are done, which is where HBM time enters the estimate;
* long counted loops (Mosaic grid loops) are walked for :data:`LOOP_SAMPLE_END` iterations
  and the rest extrapolated from the average of the last half of those.

It needs no JAX or libtpu: only the text files, so it also runs on stored dumps.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from asickernels.simulate.tpu_estimate.observed import KernelRun
from asickernels.simulate.tpu_estimate.parsing import (
    KEYWORD_OPERAND,
    TOP_LEVEL_PROGRAM,
    U32,
    Addr,
    Bundle,
    Dump,
    Instruction,
    Operand,
    Program,
    ScheduleError,
    Value,
    call_operand,
    call_target,
    mxu_push,
    parse_operand,
)
from asickernels.simulate.tpu_estimate.scalar import (
    COMPARE,
    DATA,
    MAX_TRACKED_WORDS,
    RUNTIME,
    SOMEWHERE,
    Machine,
    Origin,
    as_signed,
    joined,
    memory_words,
)

# Bundles after a branch that run whether it is taken or not. 4 on v4 to v6e; v7x's listings
# fill 6 (ops predicated on the branch not taken, up to the "End region" of the skipped
# region), so its walk takes 6 (Walker(delay_slots=...)).
BRANCH_DELAY_SLOTS = 4
GRANULE_BYTES = 32  # DMA sizes are in 32-byte granules (checked against window shapes).
GRANULE_WORDS = GRANULE_BYTES // 4
LOOP_SAMPLE_START = 512
LOOP_SAMPLE_END = 1024
MAX_WALKED_BUNDLES = 60_000_000
# A data-dependent loop given its trips (counted or stated) walks trips
# [PLANNED_SAMPLE_START, PLANNED_SAMPLE_END) and extrapolates the rest from them, when
# those trips met no data-dependent decision (which would consume counts in order).
PLANNED_SAMPLE_START = 1
PLANNED_SAMPLE_END = 3
# With ``charge_steady_calls``, a program called this many times in a row at the same cost
# from the same DMA/MXU state, walking only its own bundles (no calls, no count taken in
# order, nothing decided or written from the arguments' values; branches assumed to run
# their region are fine), is charged that cost on later calls instead of being walked again
# (XLA's fusions inside long loops). Approximate where a callee's cost depends on other
# scalar state its caller set.
STEADY_CALLS = 3
# A Mosaic grid loop runs its steps plus these trips (the pipeline's first fetch and last
# write-back; seen in libtpu's schedules of static grids, e.g. 34 trips for 32 steps).
PIPELINE_EXTRA_TRIPS = 2
# The longest repeating pattern of iterations the walk looks for before charging a loop's
# iterations in steady state (see Walker._steady).
MAX_PERIOD = 64
# Iterations walked before a steady period is looked for: a shorter pattern seen early (a
# grid's inner axis) may be part of a longer one (its outer axis) up to MAX_PERIOD.
STEADY_WINDOW = 2 * MAX_PERIOD


class WalkTooLong(ScheduleError):
    """The walk passed :data:`MAX_WALKED_BUNDLES` bundles."""


@dataclasses.dataclass
class ProgramStats:
    """What one program contributed (summed over all its calls)."""

    calls: int = 0
    cycles: float = 0.0
    counts: list[float] = dataclasses.field(default_factory=list)  # executions per bundle


@dataclasses.dataclass
class Loop:
    """A loop of a program's schedule: bundles ``[start, end]`` (the back-edge's delay slots
    included), how often it was entered and how many iterations it ran in total."""

    program: str
    start: int
    end: int
    entries: int = 0
    iterations: float = 0.0
    children: list[Loop] = dataclasses.field(default_factory=list)

    @property
    def bundles(self) -> int:
        return self.end - self.start + 1

    @property
    def trips(self) -> float:
        """Average iterations per entry."""
        return self.iterations / self.entries if self.entries else 0.0


def loop_tree(program: Program, delay_slots: int = BRANCH_DELAY_SLOTS) -> list[Loop]:
    """The program's loops (from its back-edges), nested by containment."""
    loops = []
    for index, bundle in enumerate(program.bundles):
        for op in bundle.ops:
            if op.opcode == "sbr.rel" and op.target_region is not None:
                start = program.target(op.target_region, index)
                if start <= index:
                    loops.append(Loop(program.name, start, index + delay_slots))
    loops.sort(key=lambda loop: (loop.start, -loop.end))
    roots: list[Loop] = []
    stack: list[Loop] = []
    for loop in loops:
        while stack and not (stack[-1].start <= loop.start and loop.end <= stack[-1].end):
            stack.pop()
        (stack[-1].children if stack else roots).append(loop)
        stack.append(loop)
    return roots


@dataclasses.dataclass
class _CallCost:
    """What one call of a program cost: cycles, the machine's totals (``Machine.totals``),
    per-bundle executions (a difference array) and the data-dependent branches it assumed
    to run; ``repeats``: consecutive calls at that same cost."""

    cycles: float
    totals: tuple[float, ...]
    counts: list[float]
    assumed: dict[tuple[str, int], int]  # branch site -> times assumed to run its region
    repeats: int = 1


class _LoopSite(NamedTuple):
    """Where a loop runs: its program, the loop (None: a back-edge loop_tree did not see),
    the program's statistics."""

    program: Program
    loop: Loop | None
    stats: ProgramStats


@dataclasses.dataclass
class _Sample:
    """Where a loop's sampled iterations started: the machine's time and totals, the
    program's executions per bundle, the decisions taken from counts, every program's calls
    and cycles, and the loop counter."""

    now: float
    totals: tuple[float, ...]
    counts: list[float]
    decisions: int
    programs: dict[str, tuple[int, float]]
    counter: int | None = None


@dataclasses.dataclass
class _LoopRun:
    iterations: int = 0
    planned: int | None = None  # trips decided for a data-dependent loop
    observed: int | None = None  # trips the CPU run counted for it (a valued top-level loop)
    sample: _Sample | None = None  # planned trips' sample, or the steady iteration's
    window: _Sample | None = None  # a long loop's LOOP_SAMPLE_START..END window
    # Steady state: the machine at the end of the last iteration; per recent iteration its
    # cost, decisions from counts, decisions and stores from the arguments' values, and
    # counter step; the period being sampled.
    last: tuple[Any, ...] | None = None
    history: list[tuple[tuple[float, ...], int, int, int]] = dataclasses.field(default_factory=list)
    period: int = 0
    pending: int = 0


@dataclasses.dataclass
class _ExitTest:
    """A loop's exit compare ``scmp.<condition> counter, bound`` (the back-edge branch is
    taken while the compare's result equals ``continue_when``); ``bound`` is a constant or
    the register holding it (a grid sized at run time, a while loop's bound argument)."""

    condition: str
    signed: bool
    counter: str
    bound: int | str
    continue_when: bool


def _definition(program: Program, register: str, before: int, start: int) -> Instruction | None:
    """The last op in bundles ``[start, before]`` that writes ``register``."""
    for index in range(before, start - 1, -1):
        for op in program.bundles[index].ops:
            if op.dest == register:
                return op
    return None


def _exit_test(
    program: Program, branch_index: int, branch: Instruction, start: int
) -> _ExitTest | None:
    """The compare deciding a loop's back-edge: the branch's predicate itself, or (as XLA
    writes a ``while`` condition) a compare turned into 0/1 by ``scalar_select``, masked by
    ``sand 1`` and tested against 0."""
    if branch.predicate is None:
        return None
    register, negated = branch.predicate
    continue_when = not negated
    for _ in range(4):
        op = _definition(program, register, branch_index, start)
        if op is None:
            return None
        family, _, kind = op.opcode.partition(".")
        condition, number_type = [*kind.split("."), "", ""][:2]
        if family != "scmp" or number_type not in ("s32", "u32") or len(op.operands) != 2:
            return None
        counter, bound = op.operands
        if counter.register is None:
            return None
        if condition in ("eq", "ne") and bound.constant == 0:
            flag = _zero_one_flag(program, counter.register, branch_index, start)
            if flag is not None:  # (flag ? 1 : 0) == 0 is "not flag"
                register = flag
                continue_when = continue_when != (condition == "eq")
                continue
        limit = bound.constant if bound.constant is not None else bound.register
        if limit is None:
            return None
        return _ExitTest(condition, number_type == "s32", counter.register, limit, continue_when)
    return None


def _zero_one_flag(program: Program, register: str, before: int, start: int) -> str | None:
    """The predicate a register holds as 0/1 (``sand 1, scalar_select p, 1, 0``), if so."""
    op = _definition(program, register, before, start)
    if op is not None and op.opcode.startswith("sand") and len(op.operands) == 2:
        one = [o for o in op.operands if o.constant == 1]
        other = [o for o in op.operands if o.register is not None]
        if not one or not other:
            return None
        op = _definition(program, other[0].register or "", before, start)
    if (
        op is not None
        and op.opcode == "scalar_select"
        and len(op.operands) == 3
        and op.operands[0].register is not None
        and (op.operands[1].constant, op.operands[2].constant) == (1, 0)
    ):
        return op.operands[0].register
    return None


def _remaining_iterations(test: _ExitTest, counter: int, step: int, bound: int) -> int | None:
    """Iterations still to run after one whose compare saw ``counter`` against ``bound``
    (the counter moving by ``step`` per iteration), or None if the loop would not end."""

    bound = as_signed(bound) if test.signed else bound

    def continues(value: int) -> bool:
        return COMPARE[test.condition](value, bound) == test.continue_when

    value = as_signed(counter) if test.signed else counter
    if step == 0:
        return None
    if test.condition in ("eq", "ne"):
        distance = bound - value
        if distance % step or distance // step < 1:
            return None
        steps = distance // step
        return steps if not continues(value + steps * step) else None
    high = 1
    while continues(value + high * step):
        high *= 2
        if high > 1 << 40:
            return None
    low = high // 2 if high > 1 else 0
    while high - low > 1:  # smallest m >= 1 with the loop exiting after iteration m
        middle = (low + high) // 2
        if continues(value + middle * step):
            low = middle
        else:
            high = middle
    return high


class Walker:
    """Walks a :class:`Dump` from its top-level program; see the module docstring."""

    def __init__(
        self,
        dump: Dump,
        *,
        bytes_per_cycle: float,
        dma_latency_cycles: float = 0.0,
        loop_trips: Mapping[str, Mapping[int, Any]] | None = None,
        mxu_op_cycles: Mapping[str, float] | None = None,
        observed_trips: Sequence[int | None] = (),
        kernel_runs: Sequence[KernelRun] = (),
        charge_steady_calls: bool = False,
        parameters: Mapping[int, Mapping[int, int]] | None = None,
        delay_slots: int = BRANCH_DELAY_SLOTS,
        product_ops_per_cycle: tuple[float, float] | None = None,
    ) -> None:
        """``loop_trips``: for loops whose exit depends on data, program name (or its name
        before a ``.N`` suffix) -> {loop number (preorder in :func:`loop_tree`): trips}, an int
        or a list taken in turn on successive entries. Unlisted data-dependent loops run
        once. ``mxu_op_cycles``: MXU operand type (``"bf16"``, ``"s8"``, ...) -> cycles one
        push occupies its MXU (none given: pushes cost only their bundle). ``observed_trips``:
        trips of the function's ``while`` loops in the order a run entered them
        (:func:`~.observed.observe`), taken in turn by the top-level program's
        data-dependent loops (where XLA puts ``while`` loops) that ``loop_trips`` does not
        name. ``kernel_runs``: what a run saw inside each Pallas kernel
        (:class:`~.observed.KernelRun`), taken in turn by the Mosaic kernel programs in the
        order the walk first calls them. ``charge_steady_calls``: see
        :data:`STEADY_CALLS` (for programs too long to walk call by call). ``parameters``:
        the 32-bit words of the top-level program's parameters (its HBM arguments, by
        parameter number) whose values are known: what the scalar unit computes from them
        (loop bounds, a grid's size, branch outcomes) then follows from them.
        ``delay_slots``: the generation's branch delay slots. ``product_ops_per_cycle``: one
        core's (integer, other) matrix-product operations per cycle; with it, a counted
        kernel's call is never cheaper than its grid steps' own floor (:meth:`_step_floor`)."""
        if bytes_per_cycle <= 0:
            raise ValueError("bytes_per_cycle must be > 0")
        self.dump = dump
        self.delay_slots = delay_slots
        self.machine = Machine(bytes_per_cycle, dma_latency_cycles)
        for number, words in (parameters or {}).items():
            self.machine.memory.fill(f"parameter {number}", words)
        self.mxu_op_cycles = dict(mxu_op_cycles or {})
        self.observed_trips = list(observed_trips)
        self.loop_trips = loop_trips or {}
        self.kernel_runs = list(kernel_runs)
        self.charge_steady_calls = charge_steady_calls
        self.product_ops_per_cycle = product_ops_per_cycle
        self.counted: dict[str, KernelRun] = {}  # Mosaic program -> its run's counts
        self._site_runs: dict[str, KernelRun] = {}  # kernel call site -> its run's counts
        # Kernel call sites walked without counts, though a run gave counts for others.
        self.uncounted_kernels: dict[str, str] = {}
        self._site_calls: dict[str, int] = {}
        # Per counted program, this call's scalar operands (:attr:`KernelRun.scalars`) and
        # which of them its schedule's operands took.
        self._scalars: dict[str, tuple[tuple[str, bytes], ...]] = {}
        self._layouts: dict[str, tuple[str, ...]] = {}  # its operands' memory layouts
        self._seeded: dict[str, set[int]] = {}
        self._sites: dict[str, dict[int, int]] = {}  # program -> {branch bundle: ordinal}
        self._data_loops: dict[str, dict[int, int]] = {}  # program -> {loop number: ordinal}
        self._encounters: dict[tuple[str, int], int] = {}
        self._fetch_sites: dict[tuple[str, float], dict[int, int]] = {}
        self._steps: dict[str, int] = {}  # counted kernel -> trips of its outer loops so far
        # Counted kernel -> when this call entered and each trip of its grid loop ended.
        self._step_times: dict[str, list[float]] = {}
        self._guarded: set[tuple[str, int]] = set()  # (program, loop number) with a guard
        self.decisions = 0  # data-dependent decisions taken from counts, in order
        self._calls = 0  # program calls walked
        self._call_costs: dict[Any, _CallCost] = {}  # (callee, state) -> its last call
        self.charged: dict[str, int] = {}  # program -> calls charged, not walked
        self._delaying = False  # walking the delay slots of a taken branch
        # The program being walked: its bundle ranges that run because of data (a region a
        # data-dependent branch entered, a loop whose trips follow from data).
        self._regions: list[tuple[int, int]] = []
        self.stats: dict[str, ProgramStats] = {}
        self.loops: dict[str, list[Loop]] = {}
        self._depth = 0

    def run(self) -> float:
        """Walks the executable once; returns its cycles."""
        top = self.dump.program(TOP_LEVEL_PROGRAM)
        if top is None:
            raise ScheduleError("the dump has no top-level program")
        self._walk(top)
        # The program has not finished before its last DMA has (its outputs land in HBM).
        machine = self.machine
        end = max([machine.now, machine.hbm_free, *machine.flags.values()])
        machine.dma_wait_cycles += end - machine.now
        machine.now = end
        return machine.now

    # The walk proper.
    def _walk(self, program: Program, site: str | None = None) -> None:
        self._depth += 1
        if self._depth > 16:
            raise ScheduleError(f"calls nested too deeply at {program.name}")
        machine = self.machine
        caller_scope, machine.scope = machine.scope, f"{program.name}:"
        caller_regions, self._regions = self._regions, []
        stats = self.stats.setdefault(
            program.name, ProgramStats(counts=[0.0] * (len(program.bundles) + 1))
        )
        if program.name not in self.loops:
            self.loops[program.name] = loop_tree(program, self.delay_slots)
        self._enter_kernel(program, site)
        loops = {loop.start: loop for loop in _flatten(self.loops[program.name])}
        diff = stats.counts  # a difference array: executions per bundle = prefix sums
        start_now = machine.now
        grid_trips = [loop.iterations for loop in self.loops[program.name]]
        runs: dict[int, _LoopRun] = {}
        exit_tests: dict[int, _ExitTest | None] = {}
        size = len(program.bundles)
        pc, jump_to, delay_left = 0, -1, 0
        while pc < size:
            if jump_to < 0 and not program.interesting[pc]:
                stop = program.next_interesting[pc]
                machine.now += stop - pc
                diff[pc] += 1
                diff[stop] -= 1
                machine.walked += stop - pc
                pc = stop
                continue
            bundle = program.bundles[pc]
            self._delaying = jump_to >= 0  # a branch here, in a taken one's slots, is not
            taken_target = self._execute(program, pc, bundle, stats, runs, exit_tests, loops)
            machine.now += bundle.cost
            machine.walked += 1
            diff[pc] += 1
            diff[pc + 1] -= 1
            if machine.walked > MAX_WALKED_BUNDLES:
                raise WalkTooLong(f"walk exceeded {MAX_WALKED_BUNDLES} bundles in {program.name}")
            if jump_to >= 0:
                delay_left -= 1
                if delay_left == 0:
                    pc, jump_to = jump_to, -1
                    continue
            elif taken_target is not None:
                jump_to, delay_left = taken_target, self.delay_slots
            pc += 1
        if program.name in self.counted:
            self._step_floor(program, start_now, grid_trips)
        stats.calls += 1
        stats.cycles += machine.now - start_now
        machine.scope, self._regions = caller_scope, caller_regions
        self._depth -= 1

    def _step_floor(self, program: Program, start: float, trips_before: list[float]) -> None:
        """Holds a counted kernel's call to its grid steps' own floor (each step at least
        its products at the MXU's rate and the transfers overlapped with it at the HBM
        rate: :meth:`~.observed.KernelRun.step_floor`), for the share of the run's steps
        this core's grid loop ran; what it adds is said."""
        run = self.counted[program.name]
        if self.product_ops_per_cycle is None or not run.step_work or not run.steps:
            return
        machine = self.machine
        trips = [
            loop.iterations - before
            for loop, before in zip(self.loops[program.name], trips_before, strict=True)
        ]
        steps = max(trips, default=0) - PIPELINE_EXTRA_TRIPS
        share = min(1.0, steps / (run.steps / run.calls)) if steps > 0 else 1.0
        ints, others = self.product_ops_per_cycle
        floor = run.step_floor(ints, others, machine.bytes_per_cycle) / run.calls * share
        walked = machine.now - start
        if walked >= floor:
            return
        machine.now = start + floor
        machine.step_floor_cycles += floor - walked
        self._assume(
            f"{program.name}: the walk of a call came under its grid steps' own floor (each "
            "step's products at the MXU's peak, the transfers it overlaps at the HBM "
            "rate); charged the floor"
        )

    def _enter_kernel(self, program: Program, site: str | None) -> None:
        """Pairs a Mosaic kernel's call site with the next kernel run (in the order the
        walk first calls them; calls deduplicated into one program keep their own runs)
        and takes this call's scalar operands."""
        kernels = self.dump.mosaic_kernels
        kernel = site if site in kernels else program.name if program.name in kernels else None
        if kernel is None:
            return
        if kernel not in self._site_runs and self.kernel_runs:
            self._site_runs[kernel] = self.kernel_runs.pop(0)
        run = self._site_runs.get(kernel)
        if run is None or run.uncounted:
            self.counted.pop(program.name, None)
            if run is not None or self._site_runs:
                self.uncounted_kernels[kernel] = (
                    run.uncounted if run is not None else "the run met fewer Pallas kernels"
                )
            return
        self.counted[program.name] = run
        call = self._site_calls.get(kernel, 0)
        self._site_calls[kernel] = call + 1
        self._scalars[program.name] = run.scalars[call % len(run.scalars)] if run.scalars else ()
        self._layouts[program.name] = self.dump.kernel_operands.get(kernel, ())
        self._seeded[program.name] = set()
        self._step_times[program.name] = [self.machine.now]
        if run.scalars:
            self.decisions += 1  # its cost depends on its scalars: never charged as steady

    def _operand(self, program: Program, op: Instruction) -> Value:
        """A kernel's operand register: a scalar operand's value when the run knows it,
        else a symbolic address of the operand, whose words (laid out as the program lays
        the operand out in memory) are seeded in SMEM, for reads and for the DMAs that
        copy scalar-prefetch arrays to SMEM, when the run knows them."""
        found = call_operand(op)
        if found is None:
            return None
        space, hlo_type, index = found
        base = f"%{program.name}/operand{index}"
        scalars = self._scalars.get(program.name, ())
        known = index < len(scalars) and _same_values(scalars[index][0], hlo_type)
        if not known:
            return None
        layouts = self._layouts.get(program.name, ())
        layout = layouts[index] if index < len(layouts) and layouts[index] else hlo_type
        words = memory_words(layout, scalars[index][1])
        if space == "<no memory space>":
            if not words:
                return None
            self._seeded[program.name].add(index)
            return words[0]
        self._seeded[program.name].add(index)
        self.machine.memory.fill(base, dict(enumerate(words)))
        return Addr(base, 0)

    def _seeded_all(self, program: str) -> bool:
        """Whether this call's schedule took every scalar operand of the kernel's run (it
        then decides what follows from them itself)."""
        scalars = self._scalars.get(program, ())
        return bool(scalars) and len(self._seeded.get(program, ())) == len(scalars)

    def _execute(
        self,
        program: Program,
        pc: int,
        bundle: Bundle,
        stats: ProgramStats,
        runs: dict[int, _LoopRun],
        exit_tests: dict[int, _ExitTest | None],
        loops: dict[int, Loop],
    ) -> int | None:
        """Executes one bundle's ops (reads before writes); returns a taken branch's target."""
        machine = self.machine
        writes: list[tuple[str, Value, Origin]] = []
        stores: list[tuple[Addr, Value, Origin]] = []
        taken: int | None = None
        delaying = self._delaying  # (a call in this bundle walks other programs)
        context: Origin = None  # what runs here only because of data (a region, a trip)
        if self._regions:
            self._regions = [region for region in self._regions if region[1] >= pc]
            context = DATA if any(start <= pc for start, _ in self._regions) else None
        for op in bundle.ops:
            runs_op = machine.predicate(op)
            if op.opcode == "sbr.rel":
                if not delaying:
                    taken = self._branch(program, pc, op, runs_op, runs, exit_tests, loops, stats)
            elif op.dest is not None and op.opcode.startswith("inlined_call_operand"):
                seeded = self._operand(program, op)
                if seeded is not None:  # else the caller left the operand in this register
                    writes.append((op.dest, seeded, DATA))
            elif op.dest is not None:
                if runs_op is False:
                    if op.fallback is not None:
                        writes.append(
                            (op.dest, machine.read(op.fallback), machine.origin_of([op.fallback]))
                        )
                    continue
                value, origin = machine.evaluate(op)
                origin = joined([origin, context, machine.origin_of(op.guard)])
                if not runs_op:
                    value = None
                source = op.operands[0].register if op.operands else None
                if op.opcode.startswith("int_to_ptr") and runs_op and source:
                    # A pointer cast is a renaming: it sees a value written in its bundle.
                    value, origin = next(
                        ((v, o) for r, v, o in reversed(writes) if r == source), (value, origin)
                    )
                if op.dest[0] == "p" and type(value) is int:
                    value = value != 0
                writes.append((op.dest, value, origin))
            elif op.opcode == "sst" and runs_op is not False and op.operands:
                address = machine.address(op)
                if address is None:  # what it overwrote is unknown from now on
                    machine.memory.lost([machine.read(term) for term in op.memory])
                    continue
                value = machine.read(op.operands[0]) if runs_op else None
                origin = joined([machine.origin_of(op.operands + op.guard), context])
                stores.append((address, value, origin))
            elif op.opcode.startswith("sdivrem") and runs_op is not False:
                machine.divide(op)
            elif op.opcode == "vpush" and runs_op is not False:
                machine.push(op)
            elif op.opcode in ("inlined_call", "call") and runs_op is not False:
                # A large program calls its fusions by address (``call``), others inline.
                self._call(op)
            elif op.opcode == "dma.done.wait" and runs_op is not False:
                self._dma_wait(op)
            elif op.opcode.startswith("dma.") and runs_op is not False:
                if runs_op is None and not self._counted_fetch(program, pc, op):
                    continue
                self._dma_issue(op)
            elif runs_op is not False and (push := mxu_push(op)):
                self._mxu_push(*push)
        for register, value, origin in writes:
            machine.registers[register] = value
            machine.origins[register] = origin
        for address, value, origin in stores:
            machine.memory.store(address, value, origin)
        return taken

    def _branch(
        self,
        program: Program,
        pc: int,
        op: Instruction,
        decision: bool | None,
        runs: dict[int, _LoopRun],
        exit_tests: dict[int, _ExitTest | None],
        loops: dict[int, Loop],
        stats: ProgramStats,
    ) -> int | None:
        if op.target_region is None:
            raise ScheduleError(f"{program.name}: branch without target at bundle {pc:#x}")
        target = program.target(op.target_region, pc)
        machine = self.machine
        origin = machine.origins.get(op.predicate[0]) if op.predicate else None
        machine.data_decisions += decision is not None and origin == DATA
        if target > pc:  # forward: skips a predicated region
            if decision is None and origin == RUNTIME:
                # The compiler's own control on the runtime's state (trace every 1024th run,
                # RNG seed set up once): its region runs, and it is no assumption about data.
                machine.runtime_branches += 1
                return None
            if decision is None:
                entered = self._counted_guard(program, pc, target)
                if entered is not None:
                    return None if entered else target
                counted = self._counted_branch(program, pc)
                if counted is not None:
                    return None if counted else target
                machine.unresolved_branches += 1
                site = (program.name, pc)
                machine.unresolved_branch_sites[site] = (
                    machine.unresolved_branch_sites.get(site, 0) + 1
                )
                return None
            if origin == DATA and not decision:  # what the region computes follows from data
                self._regions.append((pc + 1, target - 1))
            if decision and origin == DATA and self._guard_of(program, pc, target) is not None:
                self._skipped_loop(program, pc)
            return target if decision else None
        loop = loops.get(target)
        run = runs.setdefault(pc, _LoopRun())
        if run.iterations == 0:
            if loop is not None:
                loop.entries += 1
            if decision is not None and origin == DATA:
                run.observed = self._valued_loop(program, loop)
        if decision is None:
            if run.planned is None:
                run.planned = self._planned_trips(program, loop)
            decision = run.iterations + 1 < run.planned
        if not decision:
            self._loop_done(program, loop, run, run.iterations + 1)
            runs[pc] = _LoopRun()
            return None
        run.iterations += 1
        if origin == DATA and (target, pc + self.delay_slots) not in self._regions:
            self._regions.append((target, pc + self.delay_slots))  # its trips follow from data
        if run.planned is not None and self._extrapolate_planned(stats, run):
            self._loop_done(program, loop, run, run.planned)
            runs[pc] = _LoopRun()
            return None
        if program.name in self.counted and loop in self.loops[program.name]:
            # A new grid step: its branches and fetches take the step's pattern together.
            self._steps[program.name] = self._steps.get(program.name, 0) + 1
            self._step_times.setdefault(program.name, [machine.now]).append(machine.now)
        if pc not in exit_tests:
            exit_tests[pc] = _exit_test(program, pc, op, target)
        test = exit_tests[pc]
        if test is not None and run.planned is None:
            charged, done = self._steady(_LoopSite(program, loop, stats), run, test)
            if done:
                self._loop_done(program, loop, run, run.iterations + charged)
                runs[pc] = _LoopRun()
                return None
            run.iterations += charged
        return target

    def _loop_done(self, program: Program, loop: Loop | None, run: _LoopRun, trips: int) -> None:
        if loop is not None:
            loop.iterations += trips
        if run.observed is not None and run.observed != trips:
            self._assume(
                f"{program.name}: a while loop's trips computed from the arguments' values "
                f"({trips}) differ from the run on CPU ({run.observed}); the schedule's are taken"
            )

    def _guard_of(self, program: Program, pc: int, target: int) -> Loop | None:
        """The loop a forward branch at ``pc`` guards (it skips exactly that loop: a
        ``while`` that may take no trip), if it is a guard."""
        flat = _flatten(self.loops.get(program.name, []))
        return next((one for one in flat if one.end + 1 == target and pc < one.start), None)

    def _skipped_loop(self, program: Program, pc: int) -> None:
        """A guard decided from the arguments' values skips its loop: a top-level ``while``
        that took no trip, as the CPU run's next one should have."""
        self._assume(
            f"{program.name}: the guard at bundle {pc:#x} skips its loop: exit depends on the "
            "arguments; no trip, from the example inputs' values"
        )
        if program.name != TOP_LEVEL_PROGRAM or not self.observed_trips:
            return
        if self.observed_trips.pop(0):
            self._assume(
                f"{program.name}: the guard at bundle {pc:#x} skips its while loop from the "
                "arguments' values, where the run on CPU took trips; the schedule's is taken"
            )

    def _valued_loop(self, program: Program, loop: Loop | None) -> int | None:
        """A loop whose exit depends on the function's arguments, decided from their values
        (given as example inputs) as the scalar unit computes it. Returns the trips the CPU
        run counted for it (a top-level ``while``: the next in entry order), to compare."""
        number = -1 if loop is None else _flatten(self.loops[program.name]).index(loop)
        self._assume(
            f"{program.name} loop #{number}: exit depends on the arguments; trips computed from "
            "the example inputs' values as the compiled loop's own compare evaluates them"
        )
        if program.name == TOP_LEVEL_PROGRAM and self.observed_trips:
            return self.observed_trips.pop(0)
        return None

    def _steady(self, where: _LoopSite, run: _LoopRun, test: _ExitTest) -> tuple[int, bool]:
        """Steady state. Once the loop's iterations have repeated a pattern of period P (1
        to :data:`MAX_PERIOD`; a Mosaic grid's inner axis makes one) for three periods in a
        row, each iteration costing what its twin a period earlier cost (cycles and the
        machine's totals), moving the counter by the same step and taking no decision from
        counts nor deciding or storing anything from the arguments' values (a later
        iteration might not repeat it), whole periods are charged at the last one's cost
        instead of walked, leaving at least one period (and the loop's last iterations) to
        walk. Returns (iterations charged, whether the loop is done: a long loop's window,
        :meth:`_long_loop`, charges the rest)."""
        machine, stats = self.machine, where.stats
        counter = machine.registers.get(test.counter)
        bound = test.bound if isinstance(test.bound, int) else machine.registers.get(test.bound)
        if type(counter) is not int or type(bound) is not int:
            run.last, run.sample = None, None
            run.history.clear()
            return 0, False
        value = as_signed(counter) if test.signed else counter
        from_data = machine.memory.data_writes + machine.data_decisions
        state = (machine.now, machine.totals(), self.decisions, from_data, value)
        last, run.last = run.last, state
        if last is None:
            return 0, False
        cost = (state[0] - last[0], *(a - b for a, b in zip(state[1], last[1], strict=True)))
        run.history.append((cost, state[2] - last[2], state[3] - last[3], value - last[4]))
        del run.history[:-STEADY_WINDOW]
        step = value - last[4]
        if run.sample is not None:
            run.pending -= 1
            if run.pending == 0:
                period, sample = run.period, run.sample
                run.sample = None
                remaining = _remaining_iterations(test, counter, step, bound)
                periods = (remaining - period) // period if remaining else 0
                if _periodic(run.history, period) and periods > 0:
                    self._extrapolate(stats, sample, periods)
                    machine.registers[test.counter] = (counter + periods * period * step) & U32
                    run.last = None
                    run.history.clear()
                    return periods * period, False
        if run.sample is None and len(run.history) >= STEADY_WINDOW:  # walked since a charge
            period = next(
                (p for p in range(1, len(run.history) // 2 + 1) if _periodic(run.history, p)), 0
            )
            if period:  # the next period, if it repeats this one, is the sample
                run.sample, run.period, run.pending = self._sample(stats), period, period
        charged = self._long_loop(where, run, test, (counter, bound))
        return (0, False) if charged is None else (charged, True)

    def _long_loop(
        self, where: _LoopSite, run: _LoopRun, test: _ExitTest, now: tuple[int, int]
    ) -> int | None:
        """A long loop that never settles (a grid whose steps take different patterns):
        iterations LOOP_SAMPLE_START to LOOP_SAMPLE_END are walked and the rest charged at
        their average (a counted kernel's grid: step by step, :meth:`_grid_factor`). ``now``:
        the counter and the bound the exit compare sees."""
        program, loop, stats = where
        counter, bound = now
        if run.iterations == LOOP_SAMPLE_START:
            run.window = self._sample(stats, counter)
        if run.iterations != LOOP_SAMPLE_END or run.window is None:
            return None
        assert run.window.counter is not None
        sampled = LOOP_SAMPLE_END - LOOP_SAMPLE_START
        step_total = (
            (as_signed(counter) - as_signed(run.window.counter))
            if test.signed
            else (counter - run.window.counter)
        )
        if step_total % sampled:
            return None
        step = step_total // sampled
        remaining = _remaining_iterations(test, counter, step, bound)
        if remaining is None:
            return None
        factor = remaining / sampled
        if program.name in self.counted and loop in self.loops[program.name]:
            factor = self._grid_factor(program, run, remaining) or factor
        self._extrapolate(stats, run.window, factor)
        self.machine.registers[test.counter] = (counter + remaining * step) & U32
        return remaining

    def _grid_factor(self, program: Program, run: _LoopRun, remaining: int) -> float | None:
        """How many times the sampled trips' cost a counted kernel's remaining grid steps
        cost, step by step as the run ordered them: each step at the walked cost of steps
        with the same work (the same products and transfers; a kind of step the walk has
        not met yet: the nearest kind by floor, plus the difference of their floors), so
        a grid whose work changes along it (a triangular mask) is not extrapolated from
        its first steps. None without the run's order."""
        kernel = self.counted[program.name]
        order = kernel.ordered_steps()
        times = self._step_times.get(program.name, [])
        assert run.window is not None
        window = self.machine.now - run.window.now
        if not order or len(times) < 3 or window <= 0:
            return None
        floors = (
            kernel.step_floors(*self.product_ops_per_cycle, self.machine.bytes_per_cycle)
            if self.product_ops_per_cycle
            else [0.0] * len(kernel.step_work)
        )
        walked: dict[int, list[float]] = {}
        for trip in range(1, len(times) - 1):  # trip t computes step t - 1
            if trip - 1 < len(order):
                walked.setdefault(order[trip - 1], []).append(times[trip + 1] - times[trip])
        if not walked:
            return None
        means = {kind: sum(costs) / len(costs) for kind, costs in walked.items()}
        overall = sum(sum(costs) for costs in walked.values()) / sum(map(len, walked.values()))

        def cost(kind: int) -> float:
            if kind in means:
                return means[kind]
            near = min(means, key=lambda seen: abs(floors[seen] - floors[kind]))
            return max(means[near] + floors[kind] - floors[near], floors[kind])

        first = len(times) - 1  # the next trip
        predicted = sum(
            cost(order[trip - 1]) if 0 <= trip - 1 < len(order) else overall
            for trip in range(first, first + remaining)
        )
        return predicted / window

    def _counted_point(
        self, program: str, kind: str, ordinals: dict[int, int], key: int
    ) -> tuple[Any, int] | None:
        """The run's count for the ``kind`` point that the schedule's ``key`` (a branch
        bundle or loop number) of ``program`` stands for, ordinals in the order first met,
        and its number among the body's points of that kind. A walk given the kernel's
        scalar operands decides the points that follow from them itself: only the others
        are handed out."""
        run = self.counted.get(program)
        if run is None:
            return None
        ordinal = ordinals.setdefault(key, len(ordinals))
        seeded = self._seeded_all(program)
        points = [
            (point, number)
            for number, point in enumerate(p for p in run.points if p.kind == kind)
            if not (seeded and point.scalar)
        ]
        return points[ordinal] if ordinal < len(points) else None

    def _assume(self, note: str) -> None:
        """Names, once, an assumption the estimate rests on."""
        if note not in self.machine.unresolved_loops:
            self.machine.unresolved_loops.append(note)

    def _evenly(self, key: tuple[str, int], rate: float) -> bool:
        """Whether this encounter of ``key`` is one that happens, with its ``rate`` of
        encounters spread evenly (so the sampled part of a long loop sees the average)."""
        seen = self._encounters.get(key, 0)
        self._encounters[key] = seen + 1
        return _spread(seen + 1, rate) > _spread(seen, rate)

    def _counted_branch(self, program: Program, pc: int) -> bool | None:
        """Whether a data-dependent forward branch of a counted kernel runs its region this
        time (None: no count for it)."""
        sites = self._sites.setdefault(program.name, {})
        counted = self._counted_point(program.name, "branch", sites, pc)
        if counted is None or counted[0].rate is None:
            return None
        point, number = counted
        self.decisions += 1
        evenly = self._evenly((program.name, pc), point.rate)
        note = (
            f"{program.name}: data-dependent branch at bundle {pc:#x} taken as the kernel "
            f"body's data-dependent branch #{number} (in order); its region runs in "
            f"{point.rate:.1%} of executions, as in the run on the example inputs"
        )
        self._assume(note)
        bits = _step_pattern(self.counted[program.name], self._steps.get(program.name, 0))
        if bits is not None and number < len(bits[0]) and bits[0][number] is not None:
            return bool(bits[0][number])
        return evenly

    def _counted_guard(self, program: Program, pc: int, target: int) -> bool | None:
        """Whether a data-dependent loop is entered, when the forward branch at ``pc`` is
        its guard (it skips exactly the loop: a ``while`` that may take no trip); None
        when it is not a guard or the loop has no count. In a counted kernel, entries with
        no trip are spread evenly at the run's rate; in the top-level program, the guard
        skips the loop when the run's next ``while`` took no trip (and takes that count)."""
        loop = self._guard_of(program, pc, target)
        if loop is None:
            return None
        number = _flatten(self.loops[program.name]).index(loop)
        if program.name not in self.counted:
            base = program.name.rsplit(".", 1)[0]
            given = self.loop_trips.get(program.name, self.loop_trips.get(base, {}))
            if program.name != TOP_LEVEL_PROGRAM or not self.observed_trips or number in given:
                return None
            self.decisions += 1
            if self.observed_trips[0] is None or self.observed_trips[0]:
                return True  # entered: the loop takes the count
            self.observed_trips.pop(0)
            note = (
                f"{program.name}: the guard at bundle {pc:#x} of loop #{number} skips it "
                "where the run's while loop took no trip"
            )
            self._assume(note)
            return False
        ordinals = self._data_loops.setdefault(program.name, {})
        counted = self._counted_point(program.name, "loop", ordinals, number)
        if counted is None or not counted[0].entries:
            return None
        point = counted[0]
        self.decisions += 1
        self._guarded.add((program.name, number))
        rate = point.empty / point.entries
        note = (
            f"{program.name}: the guard at bundle {pc:#x} of loop #{number} skips it in "
            f"{point.empty / point.entries:.1%} of entries, as in the run on the example inputs"
        )
        self._assume(note)
        return not self._evenly((f"{program.name} guard", pc), rate)

    def _counted_fetch(self, program: Program, pc: int, op: Instruction) -> bool:
        """Whether a predicated pipeline fetch (``dma.hbm_to_vmem``) not ruled out by the
        schedule is issued this time: in a counted kernel, as the run fetched input blocks
        of its size (a block is fetched when its index changes; the walk cannot follow
        index maps that read scalar-prefetch values, and may take such a fetch for
        certain); else always."""
        run = self.counted.get(program.name)
        if run is None or not op.opcode.startswith("dma.hbm_to_vmem"):
            return True
        keywords = dict(KEYWORD_OPERAND.findall(op.text))
        granules = self.machine.read(parse_operand(keywords.get("size_in_granules", "").strip()))
        if not isinstance(granules, int):
            return True
        nbytes = granules * GRANULE_BYTES
        rate = run.fetch_rate(nbytes)
        if rate is None:
            return True
        self.decisions += 1
        evenly = self._evenly((program.name, -pc - 1), rate)
        note = (
            f"{program.name}: predicated fetches of input blocks run as often as the run "
            "fetched input blocks of their size (a block is fetched when its index changes)"
        )
        self._assume(note)
        # The fetch sites of one block size stand for that size's inputs, in order.
        sites = self._fetch_sites.setdefault((program.name, nbytes), {})
        ordinal = sites.setdefault(pc, len(sites))
        inputs = [i for i, (size, _) in enumerate(run.fetches) if size == nbytes]
        bits = _step_pattern(run, self._steps.get(program.name, 0))
        if bits is not None and ordinal < len(inputs) and inputs[ordinal] < len(bits[1]):
            return bool(bits[1][inputs[ordinal]])
        return evenly

    def _planned_trips(self, program: Program, loop: Loop | None) -> int:
        """Trips for an entry of a data-dependent loop: the caller's figure, else the
        run's (a counted kernel's loop, or an XLA ``while``), else 1."""
        self.decisions += 1
        number = -1 if loop is None else _flatten(self.loops[program.name]).index(loop)
        base = program.name.rsplit(".", 1)[0]
        table = self.loop_trips.get(program.name, self.loop_trips.get(base, {}))
        given = table.get(number)
        counted = None
        if given is None and program.name in self.counted:
            counted = self._kernel_loop_trips(program, loop, number)
        if counted is not None:
            trips, how = counted
        elif isinstance(given, (list, tuple)):
            trips = int(given[(loop.entries - 1) % len(given)]) if loop and given else 1
            how = "trips given by the caller (loop_trips)"
        elif given is not None:
            trips, how = int(given), "trips given by the caller (loop_trips)"
        elif self.observed_trips and program.name == TOP_LEVEL_PROGRAM:  # XLA's while loops
            seen = self.observed_trips.pop(0)
            trips, how = (
                (1, "its exit depends on an argument given as a shape only: assumed 1 trip")
                if seen is None
                else (seen, "trips from running the function on the example inputs on CPU")
            )
        else:
            trips, how = 1, "assumed 1 trip"
        note = f"{program.name} loop #{number}: data-dependent exit, {how}"
        self._assume(note)
        return max(trips, 1)

    def _kernel_loop_trips(
        self, program: Program, loop: Loop | None, number: int
    ) -> tuple[int, str] | None:
        """A counted kernel's data-dependent loop: its grid loop when the grid is sized at
        run time (the outermost loop: the run's steps per call, plus the pipeline's extra
        trips, which this schedule shows as its loop's trips beyond the static grid), else
        the body's data-dependent loops in order, at the run's trips per entry."""
        run = self.counted[program.name]
        if run.dynamic_grid and loop is not None and loop in self.loops[program.name]:
            steps = run.steps / max(run.calls, 1)
            return round(steps) + PIPELINE_EXTRA_TRIPS, (
                f"the grid sized at run time: {steps:.0f} steps per call in the run on the "
                f"example inputs, plus {PIPELINE_EXTRA_TRIPS} pipeline trips"
            )
        ordinals = self._data_loops.setdefault(program.name, {})
        counted = self._counted_point(program.name, "loop", ordinals, number)
        if counted is None or counted[0].rate is None:
            return None
        point, ordinal = counted
        rate, per = point.rate, "entry"
        if (program.name, number) in self._guarded and point.entries > point.empty:
            # Its guard already skipped the entries with no trip.
            rate, per = point.taken / (point.entries - point.empty), "entry with a trip"
        entry = loop.entries if loop is not None else 1
        trips = _spread(entry, rate) - _spread(entry - 1, rate)
        return trips, (
            f"the kernel body's data-dependent loop #{ordinal} (in order): "
            f"{rate:.2f} trips per {per} in the run on the example inputs"
        )

    def _extrapolate_planned(self, stats: ProgramStats, run: _LoopRun) -> bool:
        """For a loop of planned trips: samples trips PLANNED_SAMPLE_START to
        PLANNED_SAMPLE_END and, if they took no data-dependent decision, adds the rest as
        their average (True: the loop is done)."""
        assert run.planned is not None
        if run.planned <= PLANNED_SAMPLE_END + 1:
            return False
        if run.iterations == PLANNED_SAMPLE_START:
            run.sample = self._sample(stats)
            return False
        if (
            run.iterations != PLANNED_SAMPLE_END
            or run.sample is None
            or run.sample.decisions != self.decisions
        ):
            return False
        factor = (run.planned - run.iterations) / (PLANNED_SAMPLE_END - PLANNED_SAMPLE_START)
        self._extrapolate(stats, run.sample, factor)
        return True

    def _sample(self, stats: ProgramStats, counter: int | None = None) -> _Sample:
        """Where the sampled iterations of a loop start (see :meth:`_extrapolate`)."""
        return _Sample(
            self.machine.now,
            self.machine.totals(),
            _prefix_sums(stats.counts),
            self.decisions,
            {name: (other.calls, other.cycles) for name, other in self.stats.items()},
            counter,
        )

    def _extrapolate(self, stats: ProgramStats, sample: _Sample, factor: float) -> None:
        """Adds ``factor`` times what the sampled iterations cost: time, the machine's totals,
        the loop's program's executions per bundle, and its callees' calls and cycles (their
        per-bundle executions stay those of the sampled iterations)."""
        machine = self.machine
        extra = (machine.now - sample.now) * factor
        machine.now += extra
        machine.hbm_free += extra
        machine.flags = {key: done + extra for key, done in machine.flags.items()}
        machine.mxu_free = {unit: free + extra for unit, free in machine.mxu_free.items()}
        machine.add_totals(
            [
                (now - then) * factor
                for now, then in zip(machine.totals(), sample.totals, strict=True)
            ]
        )
        current = _prefix_sums(stats.counts)
        for index, (now_count, then_count) in enumerate(zip(current, sample.counts, strict=True)):
            delta = (now_count - then_count) * factor
            if delta:
                stats.counts[index] += delta
                stats.counts[index + 1] -= delta
        before = sample.programs
        for name, other in self.stats.items():
            if other is not stats:
                calls, cycles = before.get(name, (0, 0.0))
                other.calls += round((other.calls - calls) * factor)
                other.cycles += (other.cycles - cycles) * factor

    def _call(self, op: Instruction) -> None:
        name = call_target(op)
        callee = self.dump.program(name) if name else None
        if callee is None:
            self.machine.missing_programs.add(name or op.text[:60])
            return
        machine = self.machine
        # What the call's cost may depend on besides its own bundles: the DMAs and MXU
        # pushes still in flight when it starts.
        key = (
            callee.name,
            max(0.0, machine.hbm_free - machine.now),
            tuple(
                sorted(
                    (str(flag), max(0.0, done - machine.now))
                    for flag, done in machine.flags.items()
                )
            ),
            tuple(
                sorted(
                    (unit, max(0.0, free - machine.now)) for unit, free in machine.mxu_free.items()
                )
            ),
        )
        cost = self._call_costs.get(key)
        if not self.charge_steady_calls:
            self._walk(callee, name)
            return
        if cost is not None and cost.repeats >= STEADY_CALLS:
            self._charge(callee.name, cost)
            return
        start, totals = machine.now, machine.totals()
        before = (
            self._calls + 1,
            self.decisions,
            machine.data_decisions,
            machine.memory.data_writes,
        )
        sites = dict(machine.unresolved_branch_sites)
        stats = self.stats.get(callee.name)
        counts = list(stats.counts) if stats else [0.0] * (len(callee.bundles) + 1)
        self._calls += 1
        self._walk(callee, name)
        if (
            self._calls,
            self.decisions,
            machine.data_decisions,
            machine.memory.data_writes,
        ) != before:
            # It called others, took a count in order, or decided or wrote something from the
            # arguments' values (another call may not): walk it every time.
            self._call_costs.pop(key, None)
            return
        new = _CallCost(
            machine.now - start,
            tuple(now - then for now, then in zip(machine.totals(), totals, strict=True)),
            [now - then for now, then in zip(self.stats[callee.name].counts, counts, strict=True)],
            {  # the branches it assumed to run their region (they take no count)
                site: count - sites.get(site, 0)
                for site, count in machine.unresolved_branch_sites.items()
                if count != sites.get(site, 0)
            },
        )
        if (
            cost is not None
            and cost.assumed == new.assumed
            and _same_cost((cost.cycles, *cost.totals), (new.cycles, *new.totals))
        ):
            new.repeats = cost.repeats + 1
        self._call_costs[key] = new

    def _charge(self, name: str, cost: _CallCost) -> None:
        """A steady callee's call, charged at the cost of its last walked calls."""
        self.charged[name] = self.charged.get(name, 0) + 1
        machine = self.machine
        machine.now += cost.cycles
        machine.hbm_free += cost.cycles
        machine.flags = {key: done + cost.cycles for key, done in machine.flags.items()}
        machine.mxu_free = {unit: free + cost.cycles for unit, free in machine.mxu_free.items()}
        machine.add_totals(cost.totals)
        stats = self.stats[name]
        stats.calls += 1
        stats.cycles += cost.cycles
        stats.counts = [
            count + delta for count, delta in zip(stats.counts, cost.counts, strict=True)
        ]
        for site, count in cost.assumed.items():
            machine.unresolved_branch_sites[site] = (
                machine.unresolved_branch_sites.get(site, 0) + count
            )
            machine.unresolved_branches += count

    def _flag(self, operand: Operand) -> Any:
        value = self.machine.read(operand)
        return value if isinstance(value, Addr) else None

    def _dma_issue(self, op: Instruction) -> None:
        machine = self.machine
        keywords = dict(KEYWORD_OPERAND.findall(op.text))
        size = parse_operand(keywords.get("size_in_granules", "").strip())
        granules = machine.read(size)
        nbytes = granules * GRANULE_BYTES if type(granules) is int else 0
        flag = self._flag(parse_operand(keywords.get("dst_syncflagno", "").strip()))
        kind = op.opcode.split(".", 1)[1]
        self._copy_words(kind, keywords, granules)
        start = machine.now
        # dma.general (strided descriptors) is how XLA fusions stream operands from HBM.
        if ("hbm" in kind or kind == "general") and nbytes:
            start = max(machine.now, machine.hbm_free)
            machine.hbm_free = start + nbytes / machine.bytes_per_cycle
            machine.hbm_bytes += nbytes
            done = machine.hbm_free + machine.dma_latency
        else:
            done = start
        machine.flags[flag] = max(machine.flags.get(flag, 0.0), done)

    def _copy_words(self, kind: str, keywords: dict[str, str], granules: Value) -> None:
        """What a DMA moves, for the scalar unit's later reads: ``X_to_Y`` copies the
        source's known words (SMEM addresses count words, HBM and VMEM ones 32-byte
        granules); a strided ``general`` DMA leaves its destination unknown."""
        machine = self.machine
        source_space, _, destination_space = kind.partition("_to_")
        if kind == "general":
            source_space, destination_space = "src", "dst"
        if destination_space not in keywords:
            return
        words = granules * GRANULE_WORDS if type(granules) is int else MAX_TRACKED_WORDS + 1

        def pointer(space: str) -> Addr | None:
            value = machine.read(parse_operand(keywords.get(space, "").strip()))
            if not isinstance(value, Addr):
                return None
            scale = 1 if space == "smem" or value.offset == SOMEWHERE else GRANULE_WORDS
            return Addr(value.base, value.offset * scale)

        destination = pointer(destination_space)
        if destination is None and destination_space == "smem":
            machine.memory.untracked_smem_writes = True
        if kind == "general":
            machine.memory.copy(None, destination and Addr(destination.base, 0), 1 << 62)
        else:
            machine.memory.copy(pointer(source_space), destination, words)

    def _mxu_push(self, operand_type: str, unit: str) -> None:
        if not self.mxu_op_cycles:
            return
        machine = self.machine
        cycles = self.mxu_op_cycles.get(operand_type)
        if cycles is None:
            machine.unknown_mxu_types.add(operand_type)
            return
        free = machine.mxu_free.get(unit, 0.0)
        if free > machine.now:
            machine.mxu_stall_cycles += free - machine.now
            machine.now = free
        machine.mxu_free[unit] = machine.now + cycles
        machine.mxu_pushes += 1

    def _dma_wait(self, op: Instruction) -> None:
        machine = self.machine
        flag = self._flag(op.operands[0]) if op.operands else None
        done = machine.flags.pop(flag, None)
        if done is not None and done > machine.now:
            machine.dma_wait_cycles += done - machine.now
            machine.now = done

    # Results.
    def executions(self, program: str) -> list[float]:
        """How many times each bundle of ``program`` ran."""
        return _prefix_sums(self.stats[program].counts)[:-1]

    def describe_loops(self, programs: Iterable[str] | None = None) -> list[str]:
        """One line per executed loop: program, number, bundles, entries, trips per entry."""
        lines = []
        for name in programs or self.stats:
            for number, loop in enumerate(_flatten(self.loops.get(name, []))):
                if loop.entries:
                    lines.append(
                        f"{name} loop #{number} [{loop.start:#x}-{loop.end:#x}]: {loop.bundles} "
                        f"bundles, {loop.entries} entr{'y' if loop.entries == 1 else 'ies'}, "
                        f"{loop.trips:.1f} trips each"
                    )
        return lines

    def unit_busy(self, programs: Iterable[str] | None = None) -> dict[str, float]:
        """Issued slots per unit, summed over the executed bundles of ``programs`` (all)."""
        busy: dict[str, float] = {}
        for name in programs or self.stats:
            program = self.dump.programs.get(name)
            if program is None or not program.utilization:
                continue
            for count, row in zip(self.executions(name), program.utilization, strict=True):
                if count:
                    for unit, used in zip(program.units, row, strict=True):
                        busy[unit] = busy.get(unit, 0.0) + count * used
        return busy

    def capacity(self) -> dict[str, int]:
        for program in self.dump.programs.values():
            if program.capacity:
                return dict(zip(program.units, program.capacity, strict=True))
        return {}


def _same_values(one: str, other: str) -> bool:
    """Whether two HLO types (``"s32[1]"``, ``"s32[]"``) hold as many values of one type."""

    def parts(text: str) -> tuple[str, int]:
        kind, _, dims = text.partition("[")
        return kind, math.prod(int(d) for d in dims.rstrip("]").split(",") if d.strip())

    return parts(one) == parts(other)


def _periodic(history: Sequence[tuple[tuple[float, ...], int, int, int]], period: int) -> bool:
    """Whether the last ``period`` iterations repeat the ``period`` before them: the same
    costs and counter steps, with no data-dependent decision or store."""
    if len(history) < 2 * period:
        return False
    for back in range(1, period + 1):
        now, then = history[-back], history[-back - period]
        if now[1:3] != (0, 0) or then[1:3] != (0, 0) or now[3] != then[3]:
            return False
        if not _same_cost(now[0], then[0]):
            return False
    return True


def _same_cost(one: Sequence[float], other: Sequence[float]) -> bool:
    """Whether two costs (cycles and the machine's totals) are equal but for rounding."""
    return all(
        math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6) for a, b in zip(one, other, strict=True)
    )


def _flatten(loops: Iterable[Loop]) -> list[Loop]:
    out = []
    for loop in loops:
        out.append(loop)
        out.extend(_flatten(loop.children))
    return out


_GOLDEN = 0.6180339887498949


def _step_pattern(
    run: KernelRun, number: int
) -> tuple[tuple[int | None, ...], tuple[int, ...]] | None:
    """The step pattern (:attr:`~.observed.KernelRun.patterns`) a kernel's ``number``-th
    step takes: drawn in proportion to how often the run saw each, by a low-discrepancy
    sequence, so any stretch of steps (the sampled part of a long loop) sees the run's
    mix."""
    if not run.patterns:
        return None
    total = sum(weight for _, _, weight in run.patterns)
    point = ((number + 0.5) * _GOLDEN) % 1.0 * total
    for branches, fetches, weight in run.patterns:
        point -= weight
        if point < 0:
            return branches, fetches
    return run.patterns[-1][0], run.patterns[-1][1]


def _spread(count: int, rate: float) -> int:
    """How many of the first ``count`` events happen at ``rate`` per event, spread evenly."""
    return int(count * rate + 0.5)


def _prefix_sums(diff: list[float]) -> list[float]:
    total, out = 0.0, []
    for value in diff:
        total += value
        out.append(total)
    return out


def walk_dump(dump: Dump, **options: Any) -> Walker:
    """Convenience: a :class:`Walker` that has walked ``dump`` once."""
    walker = Walker(dump, **options)
    walker.run()
    return walker


__all__ = ["Loop", "ProgramStats", "WalkTooLong", "Walker", "loop_tree", "walk_dump"]
