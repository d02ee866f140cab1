"""Scalars computed on device (NKI 0.7+): ``nki.isa.NkiScalar``, ``scalar_load``,
``scalar_store`` and ``scalar_alu`` (the reference pages of those names and the "NKI Scalar
Values" deep dive, https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/).

A scalar holds one integer of a fixed width (``nl.int32``, ``nl.uint32`` or ``nl.int64``):
arithmetic wraps at that width and never widens. Its value is known only on device: it is
used as an operand of scalar arithmetic, as ``scalar_offset`` of an access pattern and as a
bound of ``nl.fori_loop``, and Python control flow on it warns (see
:meth:`NkiScalar._python_value`). The simulator knows the value as it runs
(:attr:`NkiScalar.value`, for debugging).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from asickernels.simulate.nki import alu, errors, language, reference, runtime
from asickernels.simulate.nki.tensor import NKIObject, NkiTensor, dtype_name, nki_dtype

# nki.isa.scalar_alu, "Data types": int32 and uint32 take every operation, int64 only these.
_WIDE_OPS = (language.add, language.subtract, language.multiply)
_COMPARISONS: dict[Any, Callable[[int, int], Any]] = {
    language.less: np.less,
    language.less_equal: np.less_equal,
    language.greater: np.greater,
    language.greater_equal: np.greater_equal,
    language.equal: np.equal,
    language.not_equal: np.not_equal,
}


def _divide(a: int, b: int) -> int:
    """Integer division rounded toward zero (nki.isa.scalar_alu: -17 / 4 gives -4)."""
    if b == 0:
        raise ZeroDivisionError("scalar division by zero")
    quotient = abs(a) // abs(b)
    return quotient if (a < 0) == (b < 0) else -quotient


def _fmod(a: int, b: int) -> int:
    """The remainder with the sign of the dividend (-17 fmod 4 gives -1)."""
    return a - b * _divide(a, b)


_ARITHMETIC: dict[Any, Callable[[int, int], int]] = {
    language.add: lambda a, b: a + b,
    language.subtract: lambda a, b: a - b,
    language.multiply: lambda a, b: a * b,
    language.divide: _divide,
    language.fmod: _fmod,
    language.maximum: max,
    language.minimum: min,
}
SCALAR_DTYPES = (language.int32, language.uint32, language.int64)


def _wrap(value: int, dtype: np.dtype[Any]) -> int:
    """``value`` wrapped to ``dtype``'s width (two's complement for signed types)."""
    bits = 8 * dtype.itemsize
    value &= (1 << bits) - 1
    if dtype.kind == "i" and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


class NkiScalar(NKIObject):
    """One integer computed on device, of a fixed width ``dtype`` (nki.isa.NkiScalar).
    Arithmetic operators (``+ - *``, unary ``-``, and ``// %`` as the scalar ALU's only
    division, rounded toward zero) and comparisons (an ``int32`` 1 or 0) are those of
    :func:`scalar_alu`; the other operand is a Python int or a scalar of the same dtype."""

    __slots__ = ("_value", "dtype", "is_comparison")

    def __init__(self, state: Any, dtype: Any = None, is_comparison: bool = False) -> None:
        self.dtype = nki_dtype(language.int32 if dtype is None else dtype)
        if self.dtype not in SCALAR_DTYPES:
            raise errors.UnsupportedDtype(
                f"a scalar is nl.int32, nl.uint32 or nl.int64, not {dtype_name(self.dtype)}"
            )
        self._value = _wrap(int(state), self.dtype)
        self.is_comparison = is_comparison

    @property
    def value(self) -> int:
        """The simulated value (for debugging; kernels cannot read it)."""
        return self._value

    def __repr__(self) -> str:
        return f"NkiScalar({self._value}, {dtype_name(self.dtype)})"

    def _python_value(self, *args: Any) -> int:
        """Python control flow (``if``/``while``/``int()``/``range()``) on a value computed on
        device: the tracer of NKI 0.7+ raises ``TypeError``, the parser frontend before it
        read the value (0.6 kernels do so with ``nl.fori_loop``'s index). It runs here, with
        the warning the reference list records."""
        reference.warn_changed("nki.isa.NkiScalar.__index__")
        return self._value

    __index__ = __int__ = _python_value

    def __bool__(self) -> bool:
        return self._python_value() != 0

    __hash__ = None  # type: ignore[assignment]

    def __neg__(self) -> NkiScalar:
        return scalar_alu(0, self, language.subtract)


def _operators() -> None:
    """NkiScalar's binary operators (and their reflected forms): :func:`scalar_alu`."""
    arithmetic = {"add": language.add, "sub": language.subtract, "mul": language.multiply,
                  "floordiv": language.divide, "mod": language.fmod}  # fmt: skip
    comparisons = {"lt": language.less, "le": language.less_equal, "gt": language.greater,
                   "ge": language.greater_equal, "eq": language.equal,
                   "ne": language.not_equal}  # fmt: skip

    def forward(op: Any) -> Any:
        return lambda self, other: scalar_alu(self, other, op)

    def reflected(op: Any) -> Any:
        return lambda self, other: scalar_alu(other, self, op)

    for name, op in arithmetic.items():
        setattr(NkiScalar, f"__{name}__", forward(op))
        setattr(NkiScalar, f"__r{name}__", reflected(op))
    for name, op in comparisons.items():
        setattr(NkiScalar, f"__{name}__", forward(op))


_operators()


def _operand(api: str, value: Any) -> int:
    if isinstance(value, NkiScalar):
        return value.value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"'{api}' operands are NkiScalars or Python ints, got {value!r}")
    return int(value)


def scalar_alu(data1: NkiScalar | int, data2: NkiScalar | int, op: Any, name: Any = None) -> Any:
    """``op(data1, data2)`` on the scalar ALU: add, subtract, multiply, divide (rounded
    toward zero), fmod (sign of ``data1``), maximum, minimum, or a comparison (an ``int32``
    scalar, 1 or 0). Two Python ints are folded now into an int (a bool for comparisons)."""
    api = "scalar_alu"
    a, b = _operand(api, data1), _operand(api, data2)
    if op not in _ARITHMETIC and op not in _COMPARISONS:
        raise errors.UnsupportedOperator(f"'{api}' does not take op={op!r}")
    scalars = [s for s in (data1, data2) if isinstance(s, NkiScalar)]
    if not scalars:
        return bool(_COMPARISONS[op](a, b)) if op in _COMPARISONS else _ARITHMETIC[op](a, b)
    runtime.active_run(api)
    dtype = scalars[0].dtype
    if any(s.dtype != dtype for s in scalars):
        raise errors.UnsupportedDtype(
            f"'{api}' scalars must have one width and signedness, got "
            f"{' and '.join(dtype_name(s.dtype) for s in scalars)}"
        )
    if dtype.itemsize == 8 and op not in _WIDE_OPS:
        raise errors.UnsupportedOperator(
            f"'{api}': nl.int64 scalars take add, subtract and multiply only, not {op!r}"
        )
    if op in _COMPARISONS:
        return NkiScalar(int(_COMPARISONS[op](a, b)), language.int32, is_comparison=True)
    return NkiScalar(_ARITHMETIC[op](a, b), dtype)


def _one_value(api: str, name: str, tensor: Any) -> NkiTensor:
    alu.require(api, name, tensor, (*alu.HBM, *alu.SBUF))
    if tensor.size != 1:
        raise errors.ShapeMismatch(f"'{api}' {name} must be a 1x1 tensor, got {tensor!r}")
    if tensor.dtype not in (language.int32, language.int64):
        raise errors.UnsupportedDtype(
            f"'{api}' {name} must be nl.int32 or nl.int64 (signed), got {tensor!r}"
        )
    return tensor


def scalar_load(src: NkiTensor) -> NkiScalar:
    """The value of the 1x1 ``nl.int32``/``nl.int64`` tensor ``src`` (SBUF or HBM) as a
    scalar of that width, not truncated (nki.isa.scalar_load)."""
    api = "scalar_load"
    runtime.active_run(api)
    src = _one_value(api, "src", src)
    return NkiScalar(int(src.values.reshape(-1)[0]), src.dtype)


def scalar_store(dst: NkiTensor, value: NkiScalar) -> None:
    """Writes the scalar ``value`` into the 1x1 tensor ``dst`` of the same width
    (nki.isa.scalar_store); a Python int is refused, as on the tracer (use nisa.memset)."""
    api = "scalar_store"
    runtime.active_run(api)
    dst = _one_value(api, "dst", dst)
    if not isinstance(value, NkiScalar):
        raise TypeError(
            f"'{api}' stores an NkiScalar, got {value!r}; write constants with nisa.memset"
        )
    if value.dtype.itemsize != dst.dtype.itemsize:
        raise errors.UnsupportedDtype(
            f"'{api}' of a {dtype_name(value.dtype)} scalar into {dst!r}: the widths differ"
        )
    alu.write(dst, np.array([value.value], dst.dtype), api)


def value_of(value: Any) -> int:
    """A run-time integer operand's simulated value: an NkiScalar's, a register's, or a
    one-element tensor's."""
    if isinstance(value, NkiScalar):
        return value.value
    if isinstance(value, NkiTensor):
        return int(np.asarray(value.values).reshape(-1)[0])
    return int(getattr(value, "value", value))  # a register's, without its warning
