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
  a scalar-prefetch ref) is *unresolved*. In a Pallas kernel with counts from a run on
  example inputs (``kernel_runs``, :mod:`.observed`), the kernel's unresolved forward
  branches take, in the order the walk meets them, the data-dependent branches of its body
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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

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
    call_target,
    mxu_push,
    parse_operand,
)
from asickernels.simulate.tpu_estimate.scalar import COMPARE, Machine, as_signed

BRANCH_DELAY_SLOTS = 4
GRANULE_BYTES = 32  # DMA sizes are in 32-byte granules (checked against window shapes).
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
# order; branches assumed to run their region are fine), is charged that cost on later
# calls instead of being walked again (XLA's fusions inside long loops). Approximate: a callee's cost may also depend on scalar state
# its caller set (on the xla matcher at batch 2: v5e and v6e exact, v5p 3% under).
STEADY_CALLS = 3
# A Mosaic grid loop runs its steps plus these trips (the pipeline's first fetch and last
# write-back; seen in libtpu's schedules of static grids, e.g. 34 trips for 32 steps).
PIPELINE_EXTRA_TRIPS = 2


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


def loop_tree(program: Program) -> list[Loop]:
    """The program's loops (from its back-edges), nested by containment."""
    loops = []
    for index, bundle in enumerate(program.bundles):
        for op in bundle.ops:
            if op.opcode == "sbr.rel" and op.target_region is not None:
                start = program.target(op.target_region, index)
                if start <= index:
                    loops.append(Loop(program.name, start, index + BRANCH_DELAY_SLOTS))
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


@dataclasses.dataclass
class _LoopRun:
    iterations: int = 0
    planned: int | None = None  # trips decided for a data-dependent loop
    sample_now: float = 0.0
    sample_totals: tuple[float, ...] = ()
    sample_counts: list[float] | None = None
    sample_counter: int | None = None
    last_counter: int | None = None
    sample_decisions: int = -1
    sample_programs: dict[str, tuple[int, float]] | None = None


@dataclasses.dataclass
class _ExitTest:
    """A loop's exit compare ``scmp.<condition> counter, bound`` (the back-edge branch is
    taken while the compare's result equals ``continue_when``)."""

    condition: str
    signed: bool
    counter: str
    bound: int
    continue_when: bool


def _exit_test(
    program: Program, branch_index: int, branch: Instruction, start: int
) -> _ExitTest | None:
    if branch.predicate is None:
        return None
    register, negated = branch.predicate
    for index in range(branch_index, start - 1, -1):
        for op in program.bundles[index].ops:
            if op.dest != register:
                continue
            family, _, kind = op.opcode.partition(".")
            condition, number_type = [*kind.split("."), "", ""][:2]
            if (
                family == "scmp"
                and number_type in ("s32", "u32")
                and len(op.operands) == 2
                and op.operands[0].register is not None
                and op.operands[1].constant is not None
            ):
                return _ExitTest(
                    condition,
                    number_type == "s32",
                    op.operands[0].register,
                    op.operands[1].constant,
                    not negated,
                )
            return None
    return None


def _remaining_iterations(test: _ExitTest, counter: int, step: int) -> int | None:
    """Iterations still to run after one whose compare saw ``counter`` (the counter moving by
    ``step`` per iteration), or None if the loop would not end."""

    def continues(value: int) -> bool:
        bound = as_signed(test.bound) if test.signed else test.bound
        return COMPARE[test.condition](value, bound) == test.continue_when

    value = as_signed(counter) if test.signed else counter
    if step == 0:
        return None
    if test.condition in ("eq", "ne"):
        bound = as_signed(test.bound) if test.signed else test.bound
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
        observed_trips: Sequence[int] = (),
        kernel_runs: Sequence[KernelRun] = (),
        charge_steady_calls: bool = False,
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
        :data:`STEADY_CALLS` (for programs too long to walk call by call)."""
        if bytes_per_cycle <= 0:
            raise ValueError("bytes_per_cycle must be > 0")
        self.dump = dump
        self.machine = Machine(bytes_per_cycle, dma_latency_cycles)
        self.mxu_op_cycles = dict(mxu_op_cycles or {})
        self.observed_trips = list(observed_trips)
        self.loop_trips = loop_trips or {}
        self.kernel_runs = list(kernel_runs)
        self.charge_steady_calls = charge_steady_calls
        self.counted: dict[str, KernelRun] = {}  # Mosaic program -> its run's counts
        self._sites: dict[str, dict[int, int]] = {}  # program -> {branch bundle: ordinal}
        self._data_loops: dict[str, dict[int, int]] = {}  # program -> {loop number: ordinal}
        self._encounters: dict[tuple[str, int], int] = {}
        self._fetch_sites: dict[tuple[str, float], dict[int, int]] = {}
        self._steps: dict[str, int] = {}  # counted kernel -> trips of its outer loops so far
        self._guarded: set[tuple[str, int]] = set()  # (program, loop number) with a guard
        self.decisions = 0  # data-dependent decisions taken from counts, in order
        self._calls = 0  # program calls walked
        self._call_costs: dict[Any, _CallCost] = {}  # (callee, state) -> its last call
        self.stats: dict[str, ProgramStats] = {}
        self.loops: dict[str, list[Loop]] = {}
        self._depth = 0

    def run(self) -> float:
        """Walks the executable once; returns its cycles."""
        top = self.dump.program(TOP_LEVEL_PROGRAM)
        if top is None:
            raise ScheduleError("the dump has no top-level program")
        self._walk(top)
        return self.machine.now

    # The walk proper.
    def _walk(self, program: Program) -> None:
        self._depth += 1
        if self._depth > 16:
            raise ScheduleError(f"calls nested too deeply at {program.name}")
        machine = self.machine
        stats = self.stats.setdefault(
            program.name, ProgramStats(counts=[0.0] * (len(program.bundles) + 1))
        )
        if program.name not in self.loops:
            self.loops[program.name] = loop_tree(program)
            if program.name in self.dump.mosaic_kernels and self.kernel_runs:
                self.counted[program.name] = self.kernel_runs.pop(0)
        loops = {loop.start: loop for loop in _flatten(self.loops[program.name])}
        diff = stats.counts  # a difference array: executions per bundle = prefix sums
        start_now = machine.now
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
                jump_to, delay_left = taken_target, BRANCH_DELAY_SLOTS
            pc += 1
        stats.calls += 1
        stats.cycles += machine.now - start_now
        self._depth -= 1

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
        writes: list[tuple[str, Value]] = []
        stores: list[tuple[Addr, Value]] = []
        taken: int | None = None
        for op in bundle.ops:
            runs_op = machine.predicate(op)
            if op.opcode == "sbr.rel":
                taken = self._branch(program, pc, op, runs_op, runs, exit_tests, loops, stats)
            elif op.dest is not None:
                if runs_op is False:
                    if op.fallback is not None:
                        writes.append((op.dest, machine.read(op.fallback)))
                    continue
                value = machine.evaluate(op) if runs_op else None
                if op.dest[0] == "p" and type(value) is int:
                    value = value != 0
                writes.append((op.dest, value))
            elif op.opcode == "sst" and runs_op is not False and op.operands:
                address = machine.address(op)
                if address is not None:
                    stores.append((address, machine.read(op.operands[0]) if runs_op else None))
            elif op.opcode.startswith("sdivrem") and runs_op is not False:
                machine.divide(op)
            elif op.opcode == "inlined_call" and runs_op is not False:
                self._call(op)
            elif op.opcode == "dma.done.wait" and runs_op is not False:
                self._dma_wait(op)
            elif op.opcode.startswith("dma.") and runs_op is not False:
                if op.predicate is not None and not self._counted_fetch(program, pc, op):
                    continue
                self._dma_issue(op)
            elif runs_op is not False and (push := mxu_push(op)):
                self._mxu_push(*push)
        for register, value in writes:
            machine.registers[register] = value
        for address, value in stores:
            machine.smem[address] = value
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
        if target > pc:  # forward: skips a predicated region
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
            return target if decision else None
        loop = loops.get(target)
        run = runs.setdefault(pc, _LoopRun())
        if loop is not None and run.iterations == 0:
            loop.entries += 1
        if decision is None:
            if run.planned is None:
                run.planned = self._planned_trips(program, loop)
            decision = run.iterations + 1 < run.planned
        if not decision:
            if loop is not None:
                loop.iterations += run.iterations + 1
            runs[pc] = _LoopRun()
            return None
        run.iterations += 1
        if run.planned is not None and self._extrapolate_planned(stats, run):
            if loop is not None:
                loop.iterations += run.planned
            runs[pc] = _LoopRun()
            return None
        if program.name in self.counted and loop in self.loops[program.name]:
            # A new grid step: its branches and fetches take the step's pattern together.
            self._steps[program.name] = self._steps.get(program.name, 0) + 1
        if pc not in exit_tests:
            exit_tests[pc] = _exit_test(program, pc, op, target)
        test = exit_tests[pc]
        counter = machine.registers.get(test.counter) if test else None
        if run.iterations == LOOP_SAMPLE_START and type(counter) is int:
            run.sample_now = machine.now
            run.sample_totals = machine.totals()
            run.sample_counts = _prefix_sums(stats.counts)
            run.sample_counter = counter
        if (
            run.iterations == LOOP_SAMPLE_END
            and test
            and run.sample_counts
            and type(counter) is int
        ):
            sampled = LOOP_SAMPLE_END - LOOP_SAMPLE_START
            assert run.sample_counter is not None
            step_total = (as_signed(counter) if test.signed else counter) - (
                as_signed(run.sample_counter) if test.signed else run.sample_counter
            )
            if step_total % sampled == 0:
                remaining = _remaining_iterations(test, counter, step_total // sampled)
                if remaining is not None:
                    self._extrapolate(stats, run, remaining / sampled)
                    machine.registers[test.counter] = (
                        counter + remaining * (step_total // sampled)
                    ) & U32
                    if loop is not None:
                        loop.iterations += run.iterations + remaining
                    runs[pc] = _LoopRun()
                    return None
        return target

    def _counted_point(self, program: str, kind: str, ordinals: dict[int, int], key: int) -> Any:
        """The run's count for the ``kind`` point that the schedule's ``key`` (a branch
        bundle or loop number) of ``program`` stands for: ordinals in the order first met."""
        run = self.counted.get(program)
        if run is None:
            return None
        ordinal = ordinals.setdefault(key, len(ordinals))
        points = [point for point in run.points if point.kind == kind]
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
        point = self._counted_point(program.name, "branch", sites, pc)
        if point is None or point.rate is None:
            return None
        self.decisions += 1
        evenly = self._evenly((program.name, pc), point.rate)
        note = (
            f"{program.name}: data-dependent branch at bundle {pc:#x} taken as the kernel "
            f"body's data-dependent branch #{sites[pc]} (in order); its region runs in "
            f"{point.rate:.1%} of executions, as in the run on the example inputs"
        )
        self._assume(note)
        bits = _step_pattern(self.counted[program.name], self._steps.get(program.name, 0))
        if bits is not None and sites[pc] < len(bits[0]) and bits[0][sites[pc]] is not None:
            return bool(bits[0][sites[pc]])
        return evenly

    def _counted_guard(self, program: Program, pc: int, target: int) -> bool | None:
        """Whether a data-dependent loop is entered, when the forward branch at ``pc`` is
        its guard (it skips exactly the loop: a ``while`` that may take no trip); None
        when it is not a guard or the loop has no count. In a counted kernel, entries with
        no trip are spread evenly at the run's rate; in the top-level program, the guard
        skips the loop when the run's next ``while`` took no trip (and takes that count)."""
        flat = _flatten(self.loops.get(program.name, []))
        loop = next((one for one in flat if one.end + 1 == target and pc < one.start), None)
        if loop is None:
            return None
        number = flat.index(loop)
        if program.name not in self.counted:
            base = program.name.rsplit(".", 1)[0]
            given = self.loop_trips.get(program.name, self.loop_trips.get(base, {}))
            if program.name != TOP_LEVEL_PROGRAM or not self.observed_trips or number in given:
                return None
            self.decisions += 1
            if self.observed_trips[0]:
                return True  # entered: the loop takes the count
            self.observed_trips.pop(0)
            note = (
                f"{program.name}: the guard at bundle {pc:#x} of loop #{number} skips it "
                "where the run's while loop took no trip"
            )
            self._assume(note)
            return False
        ordinals = self._data_loops.setdefault(program.name, {})
        point = self._counted_point(program.name, "loop", ordinals, number)
        if point is None or not point.entries:
            return None
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
            trips = self.observed_trips.pop(0)
            how = "trips from running the function on the example inputs on CPU"
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
        point = self._counted_point(program.name, "loop", ordinals, number)
        if point is None or point.rate is None:
            return None
        rate, per = point.rate, "entry"
        if (program.name, number) in self._guarded and point.entries > point.empty:
            # Its guard already skipped the entries with no trip.
            rate, per = point.taken / (point.entries - point.empty), "entry with a trip"
        entry = loop.entries if loop is not None else 1
        trips = _spread(entry, rate) - _spread(entry - 1, rate)
        return trips, (
            f"the kernel body's data-dependent loop #{ordinals[number]} (in order): "
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
            run.sample_now = self.machine.now
            run.sample_totals = self.machine.totals()
            run.sample_counts = _prefix_sums(stats.counts)
            run.sample_decisions = self.decisions
            run.sample_programs = {
                name: (other.calls, other.cycles) for name, other in self.stats.items()
            }
            return False
        if run.iterations != PLANNED_SAMPLE_END or run.sample_decisions != self.decisions:
            return False
        factor = (run.planned - run.iterations) / (PLANNED_SAMPLE_END - PLANNED_SAMPLE_START)
        self._extrapolate(stats, run, factor)
        before = run.sample_programs or {}
        for name, other in self.stats.items():  # the callees the sampled trips ran (their
            if other is not stats:  # per-bundle counts stay those of the sampled trips)
                calls, cycles = before.get(name, (0, 0.0))
                other.calls += round((other.calls - calls) * factor)
                other.cycles += (other.cycles - cycles) * factor
        return True

    def _extrapolate(self, stats: ProgramStats, run: _LoopRun, factor: float) -> None:
        """Adds ``factor`` times what the sampled iterations cost."""
        machine = self.machine
        extra = (machine.now - run.sample_now) * factor
        machine.now += extra
        machine.hbm_free += extra
        machine.flags = {key: done + extra for key, done in machine.flags.items()}
        machine.mxu_free = {unit: free + extra for unit, free in machine.mxu_free.items()}
        machine.add_totals(
            [
                (now - then) * factor
                for now, then in zip(machine.totals(), run.sample_totals, strict=True)
            ]
        )
        assert run.sample_counts is not None
        current = _prefix_sums(stats.counts)
        for index, (now_count, then_count) in enumerate(
            zip(current, run.sample_counts, strict=True)
        ):
            delta = (now_count - then_count) * factor
            if delta:
                stats.counts[index] += delta
                stats.counts[index + 1] -= delta

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
            self._walk(callee)
            return
        if cost is not None and cost.repeats >= STEADY_CALLS:
            self._charge(callee.name, cost)
            return
        start, totals, calls, decisions = machine.now, machine.totals(), self._calls, self.decisions
        sites = dict(machine.unresolved_branch_sites)
        stats = self.stats.get(callee.name)
        counts = list(stats.counts) if stats else [0.0] * (len(callee.bundles) + 1)
        self._calls += 1
        self._walk(callee)
        if (self._calls, self.decisions) != (calls + 1, decisions):
            # It called others or took a count in order: walk it every time.
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
        if cost is not None and (cost.cycles, cost.totals, cost.assumed) == (
            new.cycles,
            new.totals,
            new.assumed,
        ):
            new.repeats = cost.repeats + 1
        self._call_costs[key] = new

    def _charge(self, name: str, cost: _CallCost) -> None:
        """A steady callee's call, charged at the cost of its last walked calls."""
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
