"""Scalar semantics of the schedule: the TPU scalar unit's registers, SMEM spill slots,
ALU and compare ops, and the DMA/HBM clock shared by all programs of a walk."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from asickernels.simulate.tpu_estimate.parsing import U32, Addr, Instruction, Operand, Value


def as_signed(value: int) -> int:
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


class Machine:
    """Register file, SMEM spill slots, DMA/HBM and MXU timing shared by all programs."""

    def __init__(self, bytes_per_cycle: float, dma_latency_cycles: float) -> None:
        self.registers: dict[str, Value] = {}
        self.smem: dict[Addr, Value] = {}
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
        self.unknown_mxu_types: set[str] = set()
        self.hbm_bytes = 0.0
        self.walked = 0
        self.unresolved_branches = 0
        # (program, bundle) of each forward branch the walk could not decide -> executions.
        self.unresolved_branch_sites: dict[tuple[str, int], int] = {}
        self.unresolved_loops: list[str] = []
        self.missing_programs: set[str] = set()
        # Results of scalar divisions (``%id = sdivrem a, b /* kRem */``), popped later by
        # ``spop.drf %id``.
        self.divisions: dict[str, Value] = {}

    _TOTALS = ("dma_wait_cycles", "hbm_bytes", "mxu_stall_cycles", "mxu_pushes")

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
            self.divisions[ident.group(1)] = result

    def read(self, operand: Operand) -> Value:
        if operand.register is not None:
            return self.registers.get(operand.register)
        if operand.constant is not None:
            return operand.constant
        return operand.address

    def address(self, op: Instruction) -> Addr | None:
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

    def predicate(self, op: Instruction) -> bool | None:
        """Whether a predicated op executes (None: unknown)."""
        if op.predicate is None:
            return True
        value = self.registers.get(op.predicate[0])
        if not isinstance(value, bool):
            return None
        return value != op.predicate[1]

    def evaluate(self, op: Instruction) -> Value:
        """The value a register-writing op produces (None when not computable)."""
        family, _, kind = op.opcode.partition(".")
        values = [self.read(operand) for operand in op.operands]
        if family in ("smov", "pmov") or family.startswith("int_to_ptr"):
            return values[-1] if values else None
        if op.opcode == "spop.drf":
            source = re.search(r"spop\.drf\s+%(\w+)", op.text)
            return self.divisions.get(source.group(1)) if source else None
        if family == "scalar_lea" and len(values) == 2:
            base, offset = values
            if isinstance(base, Addr) and isinstance(offset, int):
                return Addr(base.base, base.offset + offset)
            return None
        if family == "sld":
            address = self.address(op)
            value = None if address is None else self.smem.get(address)
            # The walk follows core 0 of a multi-core chip (its share of a "parallel" grid).
            return 0 if value is None and "core id" in op.text else value
        if family == "scalar_select" and len(values) == 3:
            chosen, on_true, on_false = values
            if isinstance(chosen, bool):
                return on_true if chosen else on_false
            # An unknown choice between two integers takes the larger. The case that matters:
            # XLA's cross-program prefetch sizes its parameter DMA this way (0 when a flag
            # says the previous call left the data in VMEM): count the copy, as a first
            # call or a call with new weights must.
            if type(on_true) is int and type(on_false) is int:
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
