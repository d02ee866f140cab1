"""Parses the TPU compiler's final VLIW schedule listings (libtpu ``--xla_jf_dump_to``).

libtpu writes, per compiled program (the top-level program ``TLP``, each XLA fusion, each
Mosaic kernel), a listing of its final bundles (``*-final_bundles.txt``: one VLIW bundle per
cycle, with loop-body / predicated-region markers, branches, DMA descriptors and calls to
other programs) and a per-bundle unit utilisation table
(``*-final_hlo-static-per-bundle-utilization.txt``). This module reads them into
:class:`Program` and :class:`Dump` objects; :mod:`.walk` executes them.

It needs no JAX or libtpu: only the text files, so it also runs on stored dumps.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

TOP_LEVEL_PROGRAM = "TLP"
U32 = 0xFFFFFFFF


class ScheduleError(RuntimeError):
    """A dump is missing, malformed, or its walk cannot finish."""


@dataclasses.dataclass(frozen=True)
class Addr:
    """A symbolic address: an allocation (``#allocation3``) plus a word offset."""

    base: str
    offset: int


Value = int | Addr | bool | None  # None: not computable here


_BUNDLE_START = re.compile(r"^\s*(0x[0-9a-f]+|\d+)\s+([A-Z]{2})?\s*:\s*(>*)\s*\{", re.M)
_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_REGION_START = re.compile(r"Start(?:/End empty)? region (\d+)")
_REGISTER = re.compile(r"^%[a-z]*\d+_([a-z]+\d+)$")
_PREDICATE = re.compile(r"^\((!?)%[a-z]*\d+_(p\d+)(?:\s*,\s*([^)]+))?\)\s*,?\s*")
_STATIC_ADDRESS = re.compile(r"^\[?(#allocation\w+)(?:\s*\+\s*\$?(0x[0-9a-f]+|\d+))?\]?$")
_CALL_TARGET = re.compile(r"/\*\s*(?:%([^\s=]+)\s*=|(<[\w\-]+>))")
KEYWORD_OPERAND = re.compile(r"/\*(\w+)=\*/\s*(\[[^\]]*\]|[^,\s]+)")


@dataclasses.dataclass(frozen=True)
class Operand:
    """A parsed operand: a register, an integer, a static address, or something opaque."""

    register: str | None = None
    constant: int | None = None
    address: Addr | None = None


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One instruction of a VLIW bundle (not an asickernels op), reduced to what the walk
    needs."""

    opcode: str
    dest: str | None  # physical register written (``s10``, ``p3``), if scalar/predicate
    operands: tuple[Operand, ...]
    predicate: tuple[str, bool] | None  # (register, negated)
    text: str  # the instruction with its comments, for DMA/call details
    target_region: int | None = None  # branches
    memory: tuple[Operand, ...] = ()  # sld/sst: the SMEM address's terms (summed)
    fallback: Operand | None = None  # ``op (!%p, %s_old), x``: the result when %p is off

    @property
    def guard(self) -> tuple[Operand, ...]:
        """The predicate register as an operand (none when unpredicated)."""
        return () if self.predicate is None else (Operand(register=self.predicate[0]),)


@dataclasses.dataclass
class Bundle:
    address: int
    marker: str  # "LB", "PF", ... or ""
    ops: list[Instruction]
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


def _relevant(dest: str | None, opcode: str) -> bool:
    """Whether the walk needs this op: scalar/predicate results, SMEM stores, control flow,
    DMAs, calls, delays, MXU pushes (``vmatmul``: they occupy their MXU), vector words pushed
    to the scalar unit (``vpush``). Other vector work only costs its bundle."""
    if opcode == "sphi":  # after register allocation a phi leaves its register as it is
        return False
    if dest and dest[0] in "sp" and _REGISTER.match("%" + dest):
        return True
    return opcode in (
        "sbr.rel",
        "sst",
        "inlined_call",
        "call",
        "vdelay",
        "vpush",
    ) or opcode.startswith(("dma.", "sdivrem", "vmatmul."))


_VMEM_ADDRESS = re.compile(r"\[vmem:\[([^\]]*)\]")


def _vector_load(opcode: str, text: str) -> tuple[Operand, ...] | None:
    """A ``vld``'s VMEM address terms (``vld [vmem:[#allocation13 + %s2] sm:$0xff]``), None
    for any other op or an address it cannot read."""
    if opcode != "vld":
        return None
    match = _VMEM_ADDRESS.search(_COMMENT.sub(" ", text))
    if not match:
        return None
    terms = tuple(parse_operand(term) for term in match.group(1).split("+"))
    return terms if all(t != Operand() for t in terms) else None


_ALLOCATION_NOTE = re.compile(r"\s+\[#allocation\w+\]$")  # ``%s161_s22, 1 [#allocation5]``


def parse_operand(text: str) -> Operand:
    text = _ALLOCATION_NOTE.sub("", text.strip())
    register = _REGISTER.match(text)
    if register:
        return Operand(register=register.group(1))
    if re.fullmatch(r"-?\d+", text):
        return Operand(constant=int(text) & U32)
    if re.fullmatch(r"\$?0x[0-9a-f]+", text):
        return Operand(constant=int(text.lstrip("$"), 16) & U32)
    static = _STATIC_ADDRESS.match(text)
    if static:
        offset = static.group(2)
        return Operand(address=Addr(static.group(1), int(offset, 0) if offset else 0))
    return Operand()


def _parse_op(text: str) -> Instruction:
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
        fallback = parse_operand(pred.group(3)) if pred.group(3) else None
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
            memory = tuple(parse_operand(term) for term in match.group(1).split("+"))
            value = match.group(2).strip()
            pred = _PREDICATE.match(value)  # a predicated store: sst [smem:[X]] (%p), VALUE
            if pred and predicate is None:
                predicate = (pred.group(2), pred.group(1) == "!")
                value = value[pred.end() :]
            operands = (parse_operand(value),) if value else ()
    elif opcode.startswith("int_to_ptr"):  # int_to_ptr.hbm [resolvable:$true] %sN
        operands = (parse_operand(rest.split()[-1]),) if rest else ()
    else:
        operands = tuple(parse_operand(part) for part in _split_top_level(rest, ","))
    return Instruction(opcode, dest, operands, predicate, text, target_region, memory, fallback)


_MXU_PUSH = re.compile(
    r"^vmatmul(?:\.[a-z]+)*?\.(bf16|f32|s8|u8|s4|u4|e4m3|e5m2|f8\w*)\..*?mxu(\d+)$"
)
MXU_OPERAND_BITS = {"f32": 32, "bf16": 16, "s8": 8, "u8": 8, "e4m3": 8, "e5m2": 8, "s4": 4, "u4": 4}


def mxu_push(op: Instruction) -> tuple[str, str] | None:
    """A ``vmatmul`` instruction's (operand type, MXU): ``vmatmul.bf16.gmra.mxu2`` ->
    ``("bf16", "mxu2")``; None for any other instruction."""
    match = _MXU_PUSH.match(op.opcode)
    if not match:
        return None
    kind = match.group(1)
    return ("e4m3" if kind.startswith("f8") else kind), f"mxu{match.group(2)}"


_CALL_OPERAND = re.compile(
    r"^inlined_call_operand\.(<[^>]*>|\S+)\s*\[shape:\s*(\w+\[[^\]]*\])[^\]]*?index:\s*(\d+)"
)


def call_operand(op: Instruction) -> tuple[str, str, int] | None:
    """A kernel's ``inlined_call_operand`` (the register holding one of its operands):
    (memory space, HLO type, operand index), e.g. ``("vmem", "s32[9]", 1)``; a scalar
    passed in the register has memory space ``"<no memory space>"``."""
    text = _COMMENT.sub(" ", op.text)
    text = text.split("=", 1)[1].strip() if "=" in text else text.strip()
    match = _CALL_OPERAND.match(text)
    return (match.group(1), match.group(2), int(match.group(3))) if match else None


def call_target(op: Instruction) -> str | None:
    """An ``inlined_call``'s (or ``call``'s) callee program, from its comment (``/* %name =
    fusion(...) */`` or ``/* <late-initialization> */``)."""
    match = _CALL_TARGET.search(op.text)
    return (match.group(1) or match.group(2)) if match else None


def parse_bundles(text: str) -> list[Bundle]:
    """Parses a ``*-final_bundles.txt`` listing into bundles, in address order."""
    starts = list(_BUNDLE_START.finditer(text))
    bundles = []
    vector_loads: dict[str, tuple[Operand, ...] | None] = {}  # vector register -> its vld
    for number, start in enumerate(starts):
        end = starts[number + 1].start() if number + 1 < len(starts) else len(text)
        chunk = text[start.start() : end]
        body, trailer = _bundle_body(chunk)
        ops, loads = [], []
        for part in body.split(" ;; "):
            head = _OP_HEAD.match(part)
            if not head:
                continue
            dest, opcode = head.group(1), head.group(2)
            if _relevant(dest, opcode):
                op = _parse_op(part)
                if opcode == "vpush" and op.operands and op.operands[0].register:
                    # The words it pushes: those of the vector load that last set its register.
                    op = dataclasses.replace(
                        op, memory=vector_loads.get(op.operands[0].register) or ()
                    )
                ops.append(op)
            if dest and dest[0] == "v":
                loads.append((dest.rpartition("_")[2], _vector_load(opcode, part)))
        vector_loads.update(loads)  # a bundle's reads happen before its writes
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
_MOSAIC_CALL = re.compile(
    r'%([\w.\-]+) = [^\n]*?custom-call\(([^)]*)\)[^\n]*custom_call_target="tpu_custom_call"'
)
_HLO_DEFINITION = re.compile(
    r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(\w+\[[\d,]*\](?:\{[^}]*\})?)", re.M
)


_ENTRY_LAYOUT = re.compile(r"entry_computation_layout=\{\(")


def entry_parameters(hlo: str) -> tuple[str, ...]:
    """The entry computation's parameter types with their layouts (``"s32[8]{0:T(128)}"``),
    from an HLO module's ``entry_computation_layout`` (empty if it has none)."""
    match = _ENTRY_LAYOUT.search(hlo)
    if not match:
        return ()
    parts, depth, start = [], 0, match.end()
    for index in range(match.end(), len(hlo)):
        char = hlo[index]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:  # the parameter list's closing parenthesis
                parts.append(hlo[start:index])
                break
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(hlo[start:index])
            start = index + 1
    return tuple(part.strip() for part in parts if part.strip())


@dataclasses.dataclass
class Dump:
    """All programs of one compiled executable; ``aliases`` maps deduplicated HLO names to
    the program compiled for them, ``mosaic_kernels`` names the Pallas/Mosaic custom calls,
    ``kernel_operands`` each one's operand types with their TPU layouts (``"s32[8,8]{1,0:
    T(8,128)}"``: how its scalar-prefetch arrays lie in memory)."""

    programs: dict[str, Program]
    aliases: dict[str, str]
    mosaic_kernels: frozenset[str] = frozenset()
    kernel_operands: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # The top-level program's parameters, with their TPU layouts, in parameter order.
    parameter_layouts: tuple[str, ...] = ()

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
    operands: dict[str, tuple[str, ...]] = {}
    parameters: tuple[str, ...] = ()
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
            text = path.read_text()
            parameters = entry_parameters(text)
            types = dict(_HLO_DEFINITION.findall(text))
            for name, arguments in _MOSAIC_CALL.findall(text):
                mosaic.add(name)
                names = re.findall(r"%([\w.\-]+)", _COMMENT.sub(" ", arguments))
                operands[name] = tuple(types.get(operand, "") for operand in names)
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
    return Dump(
        programs,
        aliases,
        mosaic_kernels=frozenset(mosaic),
        kernel_operands=operands,
        parameter_layouts=parameters,
    )
