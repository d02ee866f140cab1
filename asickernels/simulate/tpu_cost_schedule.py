"""Reads the TPU compiler's final VLIW schedule and walks it to count cycles.

libtpu writes, per compiled program (the top-level program ``TLP``, each XLA fusion, each
Mosaic kernel), a listing of its final bundles (``*-final_bundles.txt``: one VLIW bundle per
cycle, with loop-body / predicated-region markers, branches, DMA descriptors and calls to
other programs) and a per-bundle unit utilisation table
(``*-final_hlo-static-per-bundle-utilization.txt``). This module parses those listings and
*walks* them from the top-level program like the TPU's scalar unit would:

* scalar and predicate registers are tracked where they are computable (grid counters, loop
  bounds, spills to static SMEM slots), so loop trip counts and which ``pl.when`` regions run
  come out of the schedule itself; a branch that depends on data (e.g. a value popped from
  the vector unit) is *unresolved*: a forward branch is assumed not taken (its region runs)
  and a loop runs the trips the caller gives for it (``loop_trips``), else once; both are
  counted in the result;
* each bundle costs one cycle (``vdelay n`` adds ``n``), branches have 4 delay slots;
* DMAs go through one HBM queue of the generation's bandwidth; a ``dma.done.wait`` stalls
  until its DMAs are done, which is where HBM time enters the estimate;
* long counted loops (Mosaic grid loops) are walked for :data:`LOOP_SAMPLE_END` iterations
  and the rest extrapolated from the average of the last half of those.

It needs no JAX or libtpu: only the text files, so it also runs on stored dumps.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

BRANCH_DELAY_SLOTS = 4
GRANULE_BYTES = 32  # DMA sizes are in 32-byte granules (checked against window shapes).
LOOP_SAMPLE_START = 512
LOOP_SAMPLE_END = 1024
MAX_WALKED_BUNDLES = 60_000_000
TOP_LEVEL_PROGRAM = "TLP"
_U32 = 0xFFFFFFFF


class ScheduleError(RuntimeError):
    """A dump is missing, malformed, or its walk cannot finish."""


@dataclasses.dataclass(frozen=True)
class Addr:
    """A symbolic address: an allocation (``#allocation3``) plus a word offset."""

    base: str
    offset: int


Value = int | Addr | bool | None  # None: not computable here


# --------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------

_BUNDLE_START = re.compile(r"^\s*(0x[0-9a-f]+|\d+)\s+([A-Z]{2})?\s*:\s*(>*)\s*\{", re.M)
_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_REGION_START = re.compile(r"Start(?:/End empty)? region (\d+)")
_REGISTER = re.compile(r"^%[a-z]*\d+_([a-z]+\d+)$")
_PREDICATE = re.compile(r"^\((!?)%[a-z]*\d+_(p\d+)(?:\s*,\s*([^)]+))?\)\s*,?\s*")
_STATIC_ADDRESS = re.compile(r"^\[?(#allocation\w+)(?:\s*\+\s*\$?(0x[0-9a-f]+|\d+))?\]?$")
_CALL_TARGET = re.compile(r"/\*\s*(?:%([^\s=]+)\s*=|(<[\w\-]+>))")
_KEYWORD_OPERAND = re.compile(r"/\*(\w+)=\*/\s*(\[[^\]]*\]|[^,\s]+)")


@dataclasses.dataclass(frozen=True)
class Operand:
    """A parsed operand: a register, an integer, a static address, or something opaque."""

    register: str | None = None
    constant: int | None = None
    address: Addr | None = None


@dataclasses.dataclass(frozen=True)
class Op:
    """One instruction of a bundle, reduced to what the walk needs."""

    opcode: str
    dest: str | None  # physical register written (``s10``, ``p3``), if scalar/predicate
    operands: tuple[Operand, ...]
    predicate: tuple[str, bool] | None  # (register, negated)
    text: str  # the instruction with its comments, for DMA/call details
    target_region: int | None = None  # branches
    memory: tuple[Operand, ...] = ()  # sld/sst: the SMEM address's terms (summed)
    fallback: Operand | None = None  # ``op (!%p, %s_old), x``: the result when %p is off


@dataclasses.dataclass
class Bundle:
    address: int
    marker: str  # "LB", "PF", ... or ""
    ops: list[Op]
    regions: list[int]
    cost: int


@dataclasses.dataclass
class Program:
    """One compiled program's final schedule and per-bundle unit utilisation."""

    name: str
    bundles: list[Bundle]
    units: tuple[str, ...] = ()
    capacity: tuple[int, ...] = ()
    utilization: list[tuple[int, ...]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.region_index: dict[int, int] = {}
        for index, bundle in enumerate(self.bundles):
            for region in bundle.regions:
                self.region_index.setdefault(region, index)
        # Bundles the walk must look at (registers, control, DMAs, calls, delays).
        self.interesting = [bool(b.ops) or b.cost != 1 for b in self.bundles]
        self.next_interesting = [len(self.bundles)] * (len(self.bundles) + 1)
        for index in range(len(self.bundles) - 1, -1, -1):
            self.next_interesting[index] = (
                index if self.interesting[index] else self.next_interesting[index + 1]
            )

    def target(self, region: int, branch: int) -> int:
        """The bundle a branch at ``branch`` to ``$region`` lands on. A region no bundle
        starts is an empty exit region: the next fall-through bundle without region notes
        (the program's exit bundle, or the end)."""
        if region in self.region_index:
            return self.region_index[region]
        for index in range(branch + 1, len(self.bundles)):
            bundle = self.bundles[index]
            if bundle.marker == "PF" and not bundle.regions:
                return index
        return len(self.bundles)


def _split_top_level(text: str, separator: str) -> list[str]:
    """Splits on ``separator`` outside brackets and parentheses (operands hold neither
    comments with separators nor unbalanced brackets)."""
    if not any(char in text for char in "[("):
        return [part.strip() for part in text.split(separator) if part.strip()]
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in "[(":
            depth += 1
        elif char in "])":
            depth -= 1
        elif depth == 0 and text.startswith(separator, index):
            parts.append(text[start:index])
            start = index + len(separator)
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]


_TRAILER = re.compile(r"\}\s*(/\*(?:(?!\*/).)*\*/)?\s*$", re.S)
_OP_HEAD = re.compile(r"^\s*(?:%([\w]+)\s*=\s*)?([\w.\-]+)")


def _bundle_body(chunk: str) -> tuple[str, str]:
    """A bundle's text from its ``{`` -> (the ops between the braces, the trailing comment)."""
    trailer = _TRAILER.search(chunk)
    if not trailer:
        raise ScheduleError(f"unterminated bundle: {chunk[:120]!r}")
    return chunk[chunk.index("{") + 1 : trailer.start()], trailer.group(1) or ""


def _relevant(op_text: str) -> bool:
    """Whether the walk needs this op: scalar/predicate results, SMEM stores, control flow,
    DMAs, calls, delays. Vector work only costs its bundle."""
    head = _OP_HEAD.match(op_text)
    if not head:
        return False
    dest, opcode = head.group(1), head.group(2)
    if opcode == "sphi":  # after register allocation a phi leaves its register as it is
        return False
    if dest and dest[0] in "sp" and _REGISTER.match("%" + dest):
        return True
    return opcode in ("sbr.rel", "sst", "inlined_call", "vdelay") or opcode.startswith("dma.")


def _parse_operand(text: str) -> Operand:
    text = text.strip()
    register = _REGISTER.match(text)
    if register:
        return Operand(register=register.group(1))
    if re.fullmatch(r"-?\d+", text):
        return Operand(constant=int(text) & _U32)
    if re.fullmatch(r"\$?0x[0-9a-f]+", text):
        return Operand(constant=int(text.lstrip("$"), 16) & _U32)
    static = _STATIC_ADDRESS.match(text)
    if static:
        offset = static.group(2)
        return Operand(address=Addr(static.group(1), int(offset, 0) if offset else 0))
    return Operand()


def _parse_op(text: str) -> Op:
    clean = _COMMENT.sub(" ", text).strip()
    dest = None
    match = re.match(r"^(%[\w]+)\s*=\s*(.*)$", clean, re.S)
    if match:
        register = _REGISTER.match(match.group(1))
        if register and register.group(1)[0] in "sp":
            dest = register.group(1)
        clean = match.group(2)
    opcode, _, rest = clean.partition(" ")
    rest = rest.strip()
    if rest.startswith("[thread:"):  # DMA thread annotation precedes the predicate
        rest = rest[rest.index("]") + 1 :].strip()
    predicate, fallback = None, None
    pred = _PREDICATE.match(rest)
    if pred:
        predicate = (pred.group(2), pred.group(1) == "!")
        fallback = _parse_operand(pred.group(3)) if pred.group(3) else None
        rest = rest[pred.end() :]
    target_region = None
    memory: tuple[Operand, ...] = ()
    operands: tuple[Operand, ...] = ()
    if opcode == "sbr.rel":
        region = re.search(r"\$region(\d+)", rest)
        target_region = int(region.group(1)) if region else None
    elif opcode in ("sld", "sst"):
        # sld [smem:[TERM + TERM]] / sst [smem:[TERM + TERM]] VALUE
        match = re.match(r"^\[smem:\[(.*?)\]\]\s*(.*)$", rest, re.S)
        if match:
            memory = tuple(_parse_operand(term) for term in match.group(1).split("+"))
            operands = (_parse_operand(match.group(2)),) if match.group(2).strip() else ()
    elif opcode.startswith("int_to_ptr"):  # int_to_ptr.hbm [resolvable:$true] %sN
        operands = (_parse_operand(rest.split()[-1]),) if rest else ()
    else:
        operands = tuple(_parse_operand(part) for part in _split_top_level(rest, ","))
    return Op(opcode, dest, operands, predicate, text, target_region, memory, fallback)


def call_target(op: Op) -> str | None:
    """An ``inlined_call``'s callee program, from its comment (``/* %name = fusion(...) */``
    or ``/* <late-initialization> */``)."""
    match = _CALL_TARGET.search(op.text)
    return (match.group(1) or match.group(2)) if match else None


def parse_bundles(text: str) -> list[Bundle]:
    """Parses a ``*-final_bundles.txt`` listing into bundles, in address order."""
    starts = list(_BUNDLE_START.finditer(text))
    bundles = []
    for number, start in enumerate(starts):
        end = starts[number + 1].start() if number + 1 < len(starts) else len(text)
        chunk = text[start.start() : end]
        body, trailer = _bundle_body(chunk)
        ops = [_parse_op(part) for part in body.split(" ;; ") if _relevant(part)]
        delay = sum(
            op.operands[0].constant or 0
            for op in ops
            if op.opcode == "vdelay" and op.operands and op.operands[0].constant is not None
        )
        bundles.append(
            Bundle(
                address=int(start.group(1), 0),
                marker=start.group(2) or "",
                ops=ops,
                regions=[int(r) for r in _REGION_START.findall(trailer)],
                cost=1 + delay,
            )
        )
    if not bundles:
        raise ScheduleError("no bundles in listing")
    for index, bundle in enumerate(bundles):
        if bundle.address != index:
            raise ScheduleError(f"bundle {index} has address {bundle.address:#x}: gaps in listing")
    return bundles


def parse_utilization(text: str) -> tuple[tuple[str, ...], tuple[int, ...], list[tuple[int, ...]]]:
    """``*-final_hlo-static-per-bundle-utilization.txt`` -> (units, capacity, rows per bundle)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    try:
        units = tuple(u.strip() for u in lines[1].split(","))
        capacity = tuple(int(v) for v in lines[2].split())
        start = lines.index("== UTILIZATION:") + 1
    except (IndexError, ValueError) as error:
        raise ScheduleError(f"unrecognised utilisation table: {error}") from None
    rows = [tuple(int(v) for v in line.split()) for line in lines[start:]]
    if len(capacity) != len(units) or any(len(row) != len(units) for row in rows):
        raise ScheduleError("utilisation table rows do not match its unit list")
    return units, capacity, rows


def parse_program(name: str, bundles_text: str, utilization_text: str | None = None) -> Program:
    program = Program(name, parse_bundles(bundles_text))
    if utilization_text is not None:
        units, capacity, rows = parse_utilization(utilization_text)
        if len(rows) != len(program.bundles):
            raise ScheduleError(
                f"{name}: {len(rows)} utilisation rows for {len(program.bundles)} bundles"
            )
        program.units, program.capacity, program.utilization = units, capacity, rows
    return program


def parse_dedup_map(text: str) -> dict[str, str]:
    """The TLP deduplication map: every HLO name -> the program that was compiled for it."""
    aliases: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if line.startswith("key:"):
            key = line[4:].strip()
        elif line.startswith("  ") and key is not None:
            aliases[line.strip()] = key
    return aliases


_DUMP_FILE = re.compile(
    r"^(\d+)-(.+)-(\d+)-(final_bundles|final_hlo-static-per-bundle-utilization)\.txt$"
)
_DEDUP_FILE = re.compile(r"^(\d+)-TLP-\d+-deduplication-map\.txt$")
_HLO_FILE = re.compile(r"^(\d+)-TLP-hlo\.txt$")
_MOSAIC_CALL = re.compile(r'%([\w.\-]+) = [^\n]*custom_call_target="tpu_custom_call"')


@dataclasses.dataclass
class Dump:
    """All programs of one compiled executable; ``aliases`` maps deduplicated HLO names to
    the program compiled for them, ``mosaic_kernels`` names the Pallas/Mosaic custom calls."""

    programs: dict[str, Program]
    aliases: dict[str, str]
    mosaic_kernels: frozenset[str] = frozenset()

    def program(self, name: str) -> Program | None:
        return self.programs.get(name) or self.programs.get(self.aliases.get(name, ""))


def load_dump(directory: str | Path) -> Dump:
    """Reads the final schedules in a ``--xla_jf_dump_to`` folder (one compiled executable;
    when it holds several, the newest listing of each program name wins)."""
    directory = Path(directory)
    listings: dict[str, tuple[int, Path]] = {}
    tables: dict[str, tuple[int, Path]] = {}
    aliases: dict[str, str] = {}
    mosaic: set[str] = set()
    for path in sorted(directory.iterdir()):
        match = _DUMP_FILE.match(path.name)
        if match:
            stamp, name, kind = int(match.group(1)), match.group(2), match.group(4)
            store = listings if kind == "final_bundles" else tables
            if name not in store or store[name][0] < stamp:
                store[name] = (stamp, path)
        elif _DEDUP_FILE.match(path.name):
            aliases.update(parse_dedup_map(path.read_text()))
        elif _HLO_FILE.match(path.name):
            mosaic.update(_MOSAIC_CALL.findall(path.read_text()))
    if TOP_LEVEL_PROGRAM not in listings:
        raise ScheduleError(
            f"no top-level program listing (*-TLP-*-final_bundles.txt) in {directory}"
        )
    programs = {}
    for name, (_, path) in listings.items():
        table = tables.get(name)
        programs[name] = parse_program(
            name, path.read_text(), table[1].read_text() if table else None
        )
    return Dump(programs, aliases, mosaic_kernels=frozenset(mosaic))


# --------------------------------------------------------------------------------------
# Scalar semantics
# --------------------------------------------------------------------------------------


def _signed(value: int) -> int:
    return value - (1 << 32) if value & 0x80000000 else value


_ALU: dict[str, Callable[[int, int], int]] = {
    "sadd": lambda a, b: a + b,
    "ssub": lambda a, b: a - b,
    "smul": lambda a, b: a * b,
    "sand": lambda a, b: a & b,
    "sor": lambda a, b: a | b,
    "sxor": lambda a, b: a ^ b,
    "sshll": lambda a, b: a << (b & 31),
    "sshrl": lambda a, b: a >> (b & 31),
    "sshra": lambda a, b: _signed(a) >> (b & 31),
}
_COMPARE: dict[str, Callable[[int, int], bool]] = {
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
}
_PREDICATE_LOGIC: dict[str, Callable[[bool, bool], bool]] = {
    "por": lambda a, b: a or b,
    "pand": lambda a, b: a and b,
    "pnand": lambda a, b: not (a and b),
    "pnor": lambda a, b: not (a or b),
    "pxor": lambda a, b: a != b,
}


class _Machine:
    """Register file, SMEM spill slots and DMA/HBM timing shared by all programs."""

    def __init__(self, bytes_per_cycle: float, dma_latency_cycles: float) -> None:
        self.registers: dict[str, Value] = {}
        self.smem: dict[Addr, Value] = {}
        self.now = 0.0
        self.hbm_free = 0.0
        self.flags: dict[Any, float] = {}
        self.bytes_per_cycle = bytes_per_cycle
        self.dma_latency = dma_latency_cycles
        self.dma_wait_cycles = 0.0
        self.hbm_bytes = 0.0
        self.walked = 0
        self.unresolved_branches = 0
        self.unresolved_loops: list[str] = []
        self.missing_programs: set[str] = set()

    def read(self, operand: Operand) -> Value:
        if operand.register is not None:
            return self.registers.get(operand.register)
        if operand.constant is not None:
            return operand.constant
        return operand.address

    def address(self, op: Op) -> Addr | None:
        """The SMEM address of an sld/sst: one allocation plus integer terms."""
        base, offset = None, 0
        for term in (self.read(operand) for operand in op.memory):
            if isinstance(term, Addr) and base is None:
                base, offset = term.base, offset + term.offset
            elif type(term) is int:
                offset += term
            else:
                return None
        return None if base is None else Addr(base, offset)

    def predicate(self, op: Op) -> bool | None:
        """Whether a predicated op executes (None: unknown)."""
        if op.predicate is None:
            return True
        value = self.registers.get(op.predicate[0])
        if not isinstance(value, bool):
            return None
        return value != op.predicate[1]

    def evaluate(self, op: Op) -> Value:
        """The value a register-writing op produces (None when not computable)."""
        family, _, kind = op.opcode.partition(".")
        values = [self.read(operand) for operand in op.operands]
        if family in ("smov", "pmov") or family.startswith("int_to_ptr"):
            return values[-1] if values else None
        if family == "scalar_lea" and len(values) == 2:
            base, offset = values
            if isinstance(base, Addr) and isinstance(offset, int):
                return Addr(base.base, base.offset + offset)
            return None
        if family == "sld":
            address = self.address(op)
            return None if address is None else self.smem.get(address)
        if family == "scalar_select" and len(values) == 3:
            chosen, on_true, on_false = values
            return None if not isinstance(chosen, bool) else (on_true if chosen else on_false)
        if family == "pneg" and values and isinstance(values[0], bool):
            return not values[0]
        if len(values) != 2:
            return None
        a, b = values
        if family in _PREDICATE_LOGIC:
            return (
                _PREDICATE_LOGIC[family](a, b)
                if isinstance(a, bool) and isinstance(b, bool)
                else None
            )
        if type(a) is not int or type(b) is not int:
            return None
        if family in _ALU:
            return _ALU[family](a, b) & _U32
        if family in ("smin", "smax"):
            signed = kind.startswith("s")
            x, y = (_signed(a), _signed(b)) if signed else (a, b)
            return (min(x, y) if family == "smin" else max(x, y)) & _U32
        if family == "scmp":
            condition, number_type = [*kind.split("."), "", ""][:2]
            if number_type not in ("s32", "u32") or condition not in _COMPARE:
                return None
            if number_type == "s32":
                a, b = _signed(a), _signed(b)
            return _COMPARE[condition](a, b)
        return None


# --------------------------------------------------------------------------------------
# The walk
# --------------------------------------------------------------------------------------


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
class _LoopRun:
    iterations: int = 0
    planned: int | None = None  # trips decided for a data-dependent loop
    sample_now: float = 0.0
    sample_counts: list[float] | None = None
    sample_counter: int | None = None
    last_counter: int | None = None


@dataclasses.dataclass
class _ExitTest:
    """A loop's exit compare ``scmp.<condition> counter, bound`` (the back-edge branch is
    taken while the compare's result equals ``continue_when``)."""

    condition: str
    signed: bool
    counter: str
    bound: int
    continue_when: bool


def _exit_test(program: Program, branch_index: int, branch: Op, start: int) -> _ExitTest | None:
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
        bound = _signed(test.bound) if test.signed else test.bound
        return _COMPARE[test.condition](value, bound) == test.continue_when

    value = _signed(counter) if test.signed else counter
    if step == 0:
        return None
    if test.condition in ("eq", "ne"):
        bound = _signed(test.bound) if test.signed else test.bound
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
    ) -> None:
        """``loop_trips``: for loops whose exit depends on data, program name (or its name
        before a ``.N`` suffix) -> {loop number (preorder in :func:`loop_tree`): trips}, an int
        or a list taken in turn on successive entries. Unlisted data-dependent loops run
        once."""
        if bytes_per_cycle <= 0:
            raise ValueError("bytes_per_cycle must be > 0")
        self.dump = dump
        self.machine = _Machine(bytes_per_cycle, dma_latency_cycles)
        self.loop_trips = loop_trips or {}
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
                raise ScheduleError(f"walk exceeded {MAX_WALKED_BUNDLES} bundles in {program.name}")
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
            elif op.opcode == "inlined_call" and runs_op is not False:
                self._call(op)
            elif op.opcode == "dma.done.wait" and runs_op is not False:
                self._dma_wait(op)
            elif op.opcode.startswith("dma.") and runs_op is not False:
                self._dma_issue(op)
        for register, value in writes:
            machine.registers[register] = value
        for address, value in stores:
            machine.smem[address] = value
        return taken

    def _branch(
        self,
        program: Program,
        pc: int,
        op: Op,
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
                machine.unresolved_branches += 1
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
        if pc not in exit_tests:
            exit_tests[pc] = _exit_test(program, pc, op, target)
        test = exit_tests[pc]
        counter = machine.registers.get(test.counter) if test else None
        if run.iterations == LOOP_SAMPLE_START and type(counter) is int:
            run.sample_now = machine.now
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
            step_total = (_signed(counter) if test.signed else counter) - (
                _signed(run.sample_counter) if test.signed else run.sample_counter
            )
            if step_total % sampled == 0:
                remaining = _remaining_iterations(test, counter, step_total // sampled)
                if remaining is not None:
                    self._extrapolate(stats, run, remaining / sampled)
                    machine.registers[test.counter] = (
                        counter + remaining * (step_total // sampled)
                    ) & _U32
                    if loop is not None:
                        loop.iterations += run.iterations + remaining
                    runs[pc] = _LoopRun()
                    return None
        return target

    def _planned_trips(self, program: Program, loop: Loop | None) -> int:
        """Trips for an entry of a data-dependent loop: the caller's figure, else 1."""
        number = -1 if loop is None else _flatten(self.loops[program.name]).index(loop)
        base = program.name.rsplit(".", 1)[0]
        table = self.loop_trips.get(program.name, self.loop_trips.get(base, {}))
        given = table.get(number)
        if isinstance(given, (list, tuple)):
            trips = int(given[(loop.entries - 1) % len(given)]) if loop and given else 1
        else:
            trips = int(given) if given is not None else 1
        note = f"{program.name} loop #{number}: data-dependent exit, " + (
            "trips given by the case" if given is not None else "assumed 1 trip"
        )
        if note not in self.machine.unresolved_loops:
            self.machine.unresolved_loops.append(note)
        return max(trips, 1)

    def _extrapolate(self, stats: ProgramStats, run: _LoopRun, factor: float) -> None:
        """Adds ``factor`` times what the sampled iterations cost."""
        machine = self.machine
        extra = (machine.now - run.sample_now) * factor
        machine.now += extra
        machine.hbm_free += extra
        machine.flags = {key: done + extra for key, done in machine.flags.items()}
        assert run.sample_counts is not None
        current = _prefix_sums(stats.counts)
        for index, (now_count, then_count) in enumerate(
            zip(current, run.sample_counts, strict=True)
        ):
            delta = (now_count - then_count) * factor
            if delta:
                stats.counts[index] += delta
                stats.counts[index + 1] -= delta

    def _call(self, op: Op) -> None:
        name = call_target(op)
        callee = self.dump.program(name) if name else None
        if callee is None:
            self.machine.missing_programs.add(name or op.text[:60])
            return
        self._walk(callee)

    def _flag(self, operand: Operand) -> Any:
        value = self.machine.read(operand)
        return value if isinstance(value, Addr) else None

    def _dma_issue(self, op: Op) -> None:
        machine = self.machine
        keywords = dict(_KEYWORD_OPERAND.findall(op.text))
        size = _parse_operand(keywords.get("size_in_granules", "").strip())
        granules = machine.read(size)
        nbytes = granules * GRANULE_BYTES if type(granules) is int else 0
        flag = self._flag(_parse_operand(keywords.get("dst_syncflagno", "").strip()))
        kind = op.opcode.split(".", 1)[1]
        start = machine.now
        if "hbm" in kind and nbytes:
            start = max(machine.now, machine.hbm_free)
            machine.hbm_free = start + nbytes / machine.bytes_per_cycle
            machine.hbm_bytes += nbytes
            done = machine.hbm_free + machine.dma_latency
        else:
            done = start
        machine.flags[flag] = max(machine.flags.get(flag, 0.0), done)

    def _dma_wait(self, op: Op) -> None:
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


__all__ = [
    "Addr",
    "Dump",
    "Loop",
    "Program",
    "ScheduleError",
    "Walker",
    "load_dump",
    "loop_tree",
    "parse_bundles",
    "parse_program",
    "parse_utilization",
    "walk_dump",
]
