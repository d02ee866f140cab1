"""Scalar semantics of the schedule: the TPU scalar unit's registers, ALU and compare ops, the
words of memory the scalar unit can come to read (SMEM, and HBM/VMEM through DMAs, vector
loads and ``vpush``/``spop``), and the DMA/HBM clock shared by all programs of a walk.

Every register and memory word carries, beside its value, where it came from: nothing (a
constant of the program), the function's arguments (:data:`DATA`: a parameter's words, given
or not, and anything computed from them or from vector results), or the runtime's own state
(:data:`RUNTIME`: SMEM words no program of the walk wrote, e.g. the trace counter and the RNG
seed flag XLA's prologue reads). A branch on runtime state is the compiler's, not the
function's: the walk takes its region without calling it data-dependent.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from asickernels.simulate.tpu_estimate.parsing import U32, Addr, Instruction, Operand, Value

DATA = "data"
RUNTIME = "runtime"
Origin = str | None  # None: a constant of the program


def as_signed(value: int) -> int:
    return value - (1 << 32) if value & 0x80000000 else value


def joined(origins: Sequence[Origin]) -> Origin:
    """The origin of a value computed from values of ``origins``: data wins over runtime."""
    if DATA in origins:
        return DATA
    return RUNTIME if RUNTIME in origins else None


_ALU: dict[str, Callable[[int, int], int]] = {
    "sadd": lambda a, b: a + b,
    "ssub": lambda a, b: a - b,
    "smul": lambda a, b: a * b,
    "sand": lambda a, b: a & b,
    "sor": lambda a, b: a | b,
    "sxor": lambda a, b: a ^ b,
    "sshll": lambda a, b: a << (b & 31),
    "sshrl": lambda a, b: a >> (b & 31),
    "sshra": lambda a, b: as_signed(a) >> (b & 31),
}
COMPARE: dict[str, Callable[[int, int], bool]] = {
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
# Address arithmetic on a symbolic allocation address (its base stays symbolic).
_ADDRESS_ALU: dict[str, Callable[[int, int], int]] = {
    "sadd": lambda offset, k: offset + k,
    "ssub": lambda offset, k: offset - k,
    "sshll": lambda offset, k: offset << (k & 31),
    "sshrl": lambda offset, k: offset >> (k & 31),
    "smul": lambda offset, k: offset * k,
}

# The offset of an address into a known allocation at a place not computable here.
SOMEWHERE = -(1 << 62)

# Memory words are tracked per allocation up to this many; a larger copy leaves its
# destination's words unknown (only small control data, group sizes or loop bounds, matters).
MAX_TRACKED_WORDS = 1 << 14


class Memory:
    """Words (32 bits) of the memories the walk tracks, by allocation (``Addr.base``) and word
    offset, each with its origin. A word no tracked store or copy wrote reads as unknown: the
    runtime's state if the reader says so (an SMEM word no program of the walk wrote), else
    the program's data (e.g. what vector stores, which the walk does not follow, left)."""

    def __init__(self) -> None:
        self.words: dict[str, dict[int, tuple[Value, Origin]]] = {}
        self.copied: set[str] = set()  # allocations a copy of unknown words reached
        self.untracked_smem_writes = False  # a DMA to SMEM at an unknown address
        self.data_writes = 0  # stores and copies of words computed from the arguments

    def load(self, address: Addr, unwritten: Origin = DATA) -> tuple[Value, Origin]:
        if address.offset == SOMEWHERE:
            return None, DATA
        word = self.words.get(address.base, {}).get(address.offset)
        if word is not None:
            return word
        if address.base in self.copied or self.untracked_smem_writes:
            return None, DATA
        return None, unwritten

    def store(self, address: Addr, value: Value, origin: Origin) -> None:
        if address.offset == SOMEWHERE:
            self.lost([address])
            return
        self.words.setdefault(address.base, {})[address.offset] = (value, origin)
        self.data_writes += origin == DATA

    def fill(self, base: str, words: Mapping[int, int]) -> None:
        """An argument's words (known values of :data:`DATA` origin)."""
        self.words[base] = {offset: (value, DATA) for offset, value in words.items()}
        self.copied.add(base)

    def lost(self, terms: Sequence[Value]) -> None:
        """A store to an address not computable here: the allocation among its terms, else
        any SMEM word, may hold unknown data from now on."""
        bases = [term.base for term in terms if isinstance(term, Addr)]
        if bases:
            self.words.pop(bases[0], None)
            self.copied.add(bases[0])
        else:
            self.untracked_smem_writes = True

    def copy(self, source: Addr | None, destination: Addr | None, count: int) -> None:
        """A DMA of ``count`` words: the source's known words land on the destination, the
        rest of the destination's range becomes unknown data."""
        if destination is None:
            return
        if destination.offset == SOMEWHERE:
            self.lost([destination])
            return
        held = self.words.setdefault(destination.base, {})
        end = destination.offset + count
        for offset in [o for o in held if destination.offset <= o < end]:
            del held[offset]
        self.copied.add(destination.base)
        if source is None or source.offset == SOMEWHERE or count > MAX_TRACKED_WORDS:
            return
        shift = destination.offset - source.offset
        for offset, word in list(self.words.get(source.base, {}).items()):
            if source.offset <= offset < source.offset + count:
                held[offset + shift] = word
                self.data_writes += word[1] == DATA


_LAYOUT = re.compile(r"^(\w+)\[([\d,]*)\](?:\{([\d,]*)(?::([^}]*))?\})?$")
_TILE = re.compile(r"T\(([\d,]+)\)|\(([\d,]+)\)")
_NUMPY_TYPES = {"s": "<i", "u": "<u", "f": "<f"}


def memory_words(layout: str, data: bytes) -> tuple[int, ...]:
    """An array's image in TPU memory as 32-bit words: ``data`` (its elements in C order)
    laid out as ``layout`` says (an HLO type with its layout, e.g. ``"s8[1,8,8]{2,1,0:
    T(8,128)(4,1)}"``): dimensions in minor-to-major order, each tile applied to the most
    minor dimensions of what the previous one left (XLA's tiled layouts), padded with
    zeros. A scalar-prefetch array's words, as the kernel reads them from SMEM. Without a
    layout (or one it cannot read), the elements packed in C order."""
    import numpy as np

    match = _LAYOUT.match(layout.replace(" ", ""))
    kind = match.group(1) if match else ""
    width = int(kind[1:]) // 8 if kind[1:].isdigit() else 1
    dtype = np.dtype(_NUMPY_TYPES.get(kind[:1], "<u") + str(width))
    array = np.frombuffer(data, dtype)
    if match:
        dims = [int(d) for d in match.group(2).split(",") if d]
        if math.prod(dims) == array.size:
            array = array.reshape(dims)
            order = [int(d) for d in (match.group(3) or "").split(",") if d]
            if sorted(order) == list(range(len(dims))):
                array = array.transpose(order[::-1])
            for groups in _TILE.findall(match.group(4) or ""):
                tile = [int(t) for t in (groups[0] or groups[1]).split(",")]
                array = _tiled(array, tile)
    raw = np.ascontiguousarray(array).tobytes()
    raw += bytes(-len(raw) % 4)
    return tuple(int(word) for word in np.frombuffer(raw, "<u4"))


def _tiled(array: Any, tile: Sequence[int]) -> Any:
    """``array`` with its most minor ``len(tile)`` dimensions split into tiles (padded):
    [..., d1, d2] -> [..., d1/t1, d2/t2, t1, t2]."""
    import numpy as np

    count = min(len(tile), array.ndim)
    if not count:
        return array
    tile = tile[len(tile) - count :]
    head, tail = array.shape[: array.ndim - count], array.shape[array.ndim - count :]
    padded = [-(-size // step) * step for size, step in zip(tail, tile, strict=True)]
    array = np.pad(
        array, [(0, 0)] * len(head) + [(0, p - s) for p, s in zip(padded, tail, strict=True)]
    )
    split = [part for p, t in zip(padded, tile, strict=True) for part in (p // t, t)]
    array = array.reshape(*head, *split)
    lead = list(range(len(head)))
    outer = [len(head) + 2 * n for n in range(count)]
    return array.transpose(lead + outer + [n + 1 for n in outer])


class Machine:
    """Register file, memory words, DMA/HBM and MXU timing shared by all programs."""

    def __init__(self, bytes_per_cycle: float, dma_latency_cycles: float) -> None:
        self.registers: dict[str, Value] = {}
        self.origins: dict[str, Origin] = {}  # register -> origin of its value
        self.memory = Memory()
        # The program being walked: static allocations (``#allocation3``) are its own.
        self.scope = ""
        self.now = 0.0
        self.hbm_free = 0.0
        self.flags: dict[Any, float] = {}
        self.bytes_per_cycle = bytes_per_cycle
        self.dma_latency = dma_latency_cycles
        self.dma_wait_cycles = 0.0
        # Each MXU is busy until mxu_free[unit]; a push to a busy MXU stalls the bundle.
        self.mxu_free: dict[str, float] = {}
        self.mxu_stall_cycles = 0.0
        self.mxu_pushes = 0.0
        # Added where a counted kernel's walk came under its grid steps' own floor.
        self.step_floor_cycles = 0.0
        self.unknown_mxu_types: set[str] = set()
        self.hbm_bytes = 0.0
        self.walked = 0
        self.unresolved_branches = 0
        self.runtime_branches = 0  # branches on the runtime's state (the compiler's own)
        self.data_decisions = 0  # branches decided from values computed from the arguments
        # (program, bundle) of each forward branch the walk could not decide -> executions.
        self.unresolved_branch_sites: dict[tuple[str, int], int] = {}
        self.unresolved_loops: list[str] = []
        self.missing_programs: set[str] = set()
        # Results of scalar divisions (``%id = sdivrem a, b /* kRem */``), popped later by
        # ``spop.drf %id``, and words pushed by ``vpush`` for ``spop``.
        self.divisions: dict[str, tuple[Value, Origin]] = {}
        self.pushed: dict[str, tuple[Value, Origin]] = {}

    _TOTALS = (
        "dma_wait_cycles",
        "hbm_bytes",
        "mxu_stall_cycles",
        "mxu_pushes",
        "step_floor_cycles",
    )

    def totals(self) -> tuple[float, ...]:
        """The running totals a loop's extrapolation scales (see :meth:`add_totals`)."""
        return tuple(getattr(self, name) for name in self._TOTALS)

    def add_totals(self, deltas: Sequence[float]) -> None:
        for name, delta in zip(self._TOTALS, deltas, strict=True):
            setattr(self, name, getattr(self, name) + delta)

    def divide(self, op: Instruction) -> None:
        """Executes an ``sdivrem``: keeps the quotient or remainder its comment asks for."""
        ident = re.match(r"\s*%(\w+)\s*=", op.text)
        values = [self.read(operand) for operand in op.operands]
        result: Value = None
        a, b = (values + [None, None])[:2]
        if len(values) == 2 and isinstance(a, int) and isinstance(b, int) and b:
            if op.opcode.endswith(".s32"):
                a, b = as_signed(a), as_signed(b)
            quotient = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
            remainder = a - quotient * b
            result = (remainder if "kRem" in op.text else quotient) & U32
        if ident:
            self.divisions[ident.group(1)] = (result, self.origin_of(op.operands))

    def push(self, op: Instruction) -> None:
        """A ``vpush`` of a vector register: the scalar unit's later ``spop`` gets its first
        word, known where the register was loaded (``vld``) from tracked memory."""
        ident = re.match(r"\s*%(\w+)\s*=", op.text)
        word: tuple[Value, Origin] = (None, DATA)
        address = self.address(op) if op.memory else None
        if address is not None and address.offset == 0:  # other offsets: unit unknown
            word = self.memory.load(address)
        if ident:
            self.pushed[ident.group(1)] = word

    def read(self, operand: Operand) -> Value:
        if operand.register is not None:
            return self.registers.get(operand.register)
        if operand.constant is not None:
            return operand.constant
        if operand.address is not None:
            return self.static(operand.address)
        return None

    def static(self, address: Addr) -> Addr:
        """A static allocation of the program being walked."""
        return Addr(f"{self.scope}{address.base}", address.offset)

    def origin_of(self, operands: Sequence[Operand]) -> Origin:
        return joined([self.origins.get(o.register) for o in operands if o.register is not None])

    def address(self, op: Instruction) -> Addr | None:
        """The memory address of an sld/sst (or a vld's): one allocation plus integer terms
        (offset :data:`SOMEWHERE` when a term is not known)."""
        base, offset, known = None, 0, True
        for term in (self.read(operand) for operand in op.memory):
            if isinstance(term, Addr) and base is None:
                base, offset = term.base, offset + term.offset
                known = known and term.offset != SOMEWHERE
            elif type(term) is int:
                offset += term
            else:
                known = False
        if base is None:
            return None
        return Addr(base, offset if known else SOMEWHERE)

    def predicate(self, op: Instruction) -> bool | None:
        """Whether a predicated op executes (None: unknown)."""
        if op.predicate is None:
            return True
        value = self.registers.get(op.predicate[0])
        if not isinstance(value, bool):
            return None
        return value != op.predicate[1]

    def evaluate(self, op: Instruction) -> tuple[Value, Origin]:
        """The value a register-writing op produces (None when not computable), and its
        origin."""
        family, _, kind = op.opcode.partition(".")
        if family == "sld":
            address = self.address(op)
            if address is None:
                return None, self.origin_of(op.memory) or DATA
            if "core id" in op.text:  # the walk follows core 0 (its share of a parallel grid)
                return 0, None
            value, origin = self.memory.load(address, unwritten=RUNTIME)
            return value, joined([origin, self.origin_of(op.memory)])
        if family == "spop":
            source = re.search(r"spop(?:\.drf)?\s+%(\w+)", op.text)
            table = self.divisions if kind == "drf" else self.pushed
            return table.get(source.group(1), (None, DATA)) if source else (None, DATA)
        if family == "scalar_parameter_address" and op.operands:
            index = op.operands[0].constant
            return (None, DATA) if index is None else (Addr(f"parameter {index}", 0), None)
        return self._evaluate(family, kind, op), self.origin_of(op.operands)

    def _evaluate(self, family: str, kind: str, op: Instruction) -> Value:
        values = [self.read(operand) for operand in op.operands]
        if family in ("smov", "pmov") or family.startswith("int_to_ptr"):
            return values[-1] if values else None
        if family == "scalar_lea" and len(values) == 2:
            family = "sadd"  # scalar_lea BASE, OFFSET: an address's sum
        if family == "scalar_select" and len(values) == 3:
            chosen, on_true, on_false = values
            if isinstance(chosen, bool):
                return on_true if chosen else on_false
            # An unknown choice on the runtime's state between two integers takes the
            # larger. The case that matters: XLA's cross-program prefetch sizes its
            # parameter DMA this way (0 when a flag says the previous call left the data in
            # VMEM): count the copy, as a first call or a call with new weights must. A
            # choice on unknown data stays unknown (a loop's exit must not be guessed).
            runtime = self.origin_of(op.operands[:1]) == RUNTIME
            if runtime and type(on_true) is int and type(on_false) is int:
                return max(on_true, on_false)
            return None
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
        if family in _ADDRESS_ALU:
            # Arithmetic on an address (an offset, a unit's scale): it still names its
            # allocation (e.g. the source of a copy to SMEM), at an unknown place when the
            # other term is unknown.
            if isinstance(b, Addr) and family == "sadd":
                a, b = b, a
            if isinstance(a, Addr):
                if type(b) is not int or a.offset == SOMEWHERE:
                    return Addr(a.base, SOMEWHERE)
                return Addr(a.base, _ADDRESS_ALU[family](a.offset, b) & U32)
        if type(a) is not int or type(b) is not int:
            return None
        if family in _ALU:
            return _ALU[family](a, b) & U32
        if family in ("smin", "smax"):
            signed = kind.startswith("s")
            x, y = (as_signed(a), as_signed(b)) if signed else (a, b)
            return (min(x, y) if family == "smin" else max(x, y)) & U32
        if family == "scmp":
            condition, number_type = [*kind.split("."), "", ""][:2]
            if number_type not in ("s32", "u32") or condition not in COMPARE:
                return None
            if number_type == "s32":
                a, b = as_signed(a), as_signed(b)
            return COMPARE[condition](a, b)
        return None
