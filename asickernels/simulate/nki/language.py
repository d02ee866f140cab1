"""``nki.language`` (``nl``): the subset our kernels use, with the SDK's names and signatures.

Compute functions here allocate their result in SBUF and run on the Vector engine (one
instruction each); ``load``/``store`` are DMAs between HBM and SBUF. The binary functions
double as the ALU operators ``nki.isa`` instructions take (``op=nl.add``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from asickernels.simulate.nki import alu, errors, runtime
from asickernels.simulate.nki.tensor import (
    DTYPES,
    MemoryRegion,
    NkiTensor,
    allocate,
    is_float,
    new_tile,
    nki_dtype,
)
from asickernels.simulate.nki.tensor import is_hbm as _is_hbm_region

bool_ = DTYPES["bool_"]
int8 = DTYPES["int8"]
int16 = DTYPES["int16"]
int32 = DTYPES["int32"]
uint8 = DTYPES["uint8"]
uint16 = DTYPES["uint16"]
uint32 = DTYPES["uint32"]
float16 = DTYPES["float16"]
bfloat16 = DTYPES["bfloat16"]
float32 = DTYPES["float32"]

sbuf = MemoryRegion.sbuf
psum = MemoryRegion.psum
private_hbm = MemoryRegion.private_hbm
shared_hbm = MemoryRegion.shared_hbm
hbm = MemoryRegion.private_hbm


class _TileSize:
    """Hardware tile size constants (the SBUF ones follow the simulated target)."""

    pmax = runtime.PMAX
    psum_fmax = runtime.PSUM_BANK_BYTES // 4
    psum_bank_fmax = runtime.PSUM_BANK_BYTES // 4
    psum_bank_fmax_bytes = runtime.PSUM_BANK_BYTES
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512

    @property
    def psum_num_banks(self) -> int:
        return runtime.PSUM_BANKS

    @property
    def sbuf_fmax_bytes(self) -> int:
        return runtime.current_target().sbuf_bytes_per_partition

    @property
    def sbuf_fmax(self) -> int:
        return self.sbuf_fmax_bytes // 4

    @property
    def sbuf_size_bytes(self) -> int:
        return self.sbuf_fmax_bytes * runtime.PMAX

    @property
    def total_available_sbuf_size(self) -> int:
        return self.sbuf_fmax_bytes


tile_size = _TileSize()


def is_hbm(buffer: MemoryRegion) -> bool:
    return _is_hbm_region(buffer)


def is_on_chip(buffer: MemoryRegion) -> bool:
    return not _is_hbm_region(buffer)


def is_psum(buffer: MemoryRegion) -> bool:
    return buffer is MemoryRegion.psum


def is_sbuf(buffer: MemoryRegion) -> bool:
    return buffer is MemoryRegion.sbuf


# -- creation -------------------------------------------------------------------------------
def ndarray(
    shape: Sequence[int],
    dtype: Any,
    buffer: MemoryRegion = sbuf,
    name: str = "",
    address: Any = None,
) -> NkiTensor:
    """A new tensor; its contents read as NaN (integers: 4) until written."""
    if address is not None:
        raise NotImplementedError("the simulator allocates automatically; address= is not modelled")
    return allocate(shape, dtype, buffer, name, "ndarray")


def full(
    shape: Sequence[int], fill_value: float, dtype: Any, buffer: MemoryRegion = sbuf, name: str = ""
) -> NkiTensor:
    """A new on-chip tensor filled with ``fill_value`` (one memset instruction)."""
    if _is_hbm_region(buffer):
        raise errors.HbmTensorWithInitValueNotSupported(
            f"cannot create an HBM tensor with an initial value ({name or 'tensor'} {list(shape)})"
        )
    tile = allocate(shape, dtype, buffer, name, "full", fill=fill_value)
    runtime.active_run("full").count("vector")
    return tile


def zeros(
    shape: Sequence[int], dtype: Any, buffer: MemoryRegion = sbuf, name: str = ""
) -> NkiTensor:
    return full(shape, 0, dtype, buffer, name)


def ones(
    shape: Sequence[int], dtype: Any, buffer: MemoryRegion = sbuf, name: str = ""
) -> NkiTensor:
    return full(shape, 1, dtype, buffer, name)


# -- data movement ------------------------------------------------------------------------
def load(src: NkiTensor, dtype: Any = None) -> NkiTensor:
    """A new SBUF tile with the values of the HBM tensor ``src`` (a DMA)."""
    run = runtime.active_run("load")
    alu.require("load", "src", src, alu.HBM)
    out = new_tile(src.shape, nki_dtype(dtype) if dtype is not None else src.dtype, "load")
    alu.write(out, alu.dma_values(src, out.dtype), "load")
    run.count_dma(True, False, src.size * src.dtype.itemsize)
    return out


def store(dst: NkiTensor, value: NkiTensor) -> None:
    """Writes the SBUF tile ``value`` into the HBM tensor ``dst`` (a DMA); same shapes."""
    run = runtime.active_run("store")
    alu.require("store", "dst", dst, alu.HBM)
    alu.require("store", "value", value, alu.SBUF)
    if dst.shape != value.shape:
        raise errors.ShapeMismatch(f"'store' of {value!r} into {dst!r}: shapes differ")
    alu.write(dst, alu.dma_values(value, dst.dtype), "store")
    run.count_dma(False, True, dst.size * dst.dtype.itemsize)


def copy(x: NkiTensor, dtype: Any = None) -> NkiTensor:
    """A new SBUF tile with the values of the on-chip tile ``x`` (e.g. PSUM -> SBUF): a bit
    copy for the same dtype, else a cast through float32 (Vector engine)."""
    run = runtime.active_run("copy")
    alu.require("copy", "x", x, alu.ON_CHIP)
    out = new_tile(x.shape, nki_dtype(dtype) if dtype is not None else x.dtype, "copy")
    alu.write(out, x.data if out.dtype == x.dtype else alu.as_f32(x), "copy")
    run.count("vector")
    return out


# -- element-wise -------------------------------------------------------------------------
def _result_dtype(tiles: list[NkiTensor]) -> np.dtype[Any]:
    dtypes = {t.dtype for t in tiles}
    if len(dtypes) == 1:
        return tiles[0].dtype
    floats = [d for d in dtypes if is_float(d)]
    if len(floats) == 1:
        return floats[0]
    return float32 if floats else np.promote_types(*dtypes)


def _elementwise(
    api: str, function: Callable[..., Any], operands: dict[str, Any], dtype: Any
) -> NkiTensor:
    """One Vector-engine instruction: float32 math on same-shaped tiles (and scalars)."""
    run = runtime.active_run(api)
    tiles = alu.check_on_chip(api, operands)
    if not tiles:
        raise TypeError(f"'{api}' needs at least one tile operand")
    alu.check_not_both_psum(api, *tiles)
    alu.check_partitions(api, operands)
    if len({t.shape for t in tiles}) > 1:
        listed = ", ".join(
            f"{n}{list(t.shape)}" for n, t in operands.items() if isinstance(t, NkiTensor)
        )
        raise errors.ShapeMismatch(f"'{api}' needs tiles of one shape, got {listed}")
    out_dtype = nki_dtype(dtype) if dtype is not None else _result_dtype(tiles)
    out = new_tile(tiles[0].shape, out_dtype, api)
    alu.write(out, np.asarray(function(*(alu.as_f32(v) for v in operands.values()))), api)
    run.count("vector")
    return out


# The ALU operators ``nki.isa`` instructions accept (``op=nl.add``), with their numpy
# functions (applied to float32 values, or exact integers on GpSimd).
ALU_OPS: dict[Callable[..., Any], Any] = {}


def _binary(api: str, function: Callable[[Any, Any], Any]) -> Callable[..., NkiTensor]:
    def op(x: alu.Operand, y: alu.Operand, dtype: Any = None) -> NkiTensor:
        return _elementwise(api, function, {"x": x, "y": y}, dtype)

    op.__name__ = op.__qualname__ = api
    op.__doc__ = (
        f"``{api}(x, y)`` element-wise (``x``, ``y``: tiles of one shape or scalars); "
        "comparisons give 1 or 0 in the input dtype unless ``dtype`` says otherwise."
    )
    ALU_OPS[op] = function
    return op


add = _binary("add", np.add)
subtract = _binary("subtract", np.subtract)
multiply = _binary("multiply", np.multiply)
divide = _binary("divide", np.divide)
maximum = _binary("maximum", np.maximum)
minimum = _binary("minimum", np.minimum)
equal = _binary("equal", np.equal)
not_equal = _binary("not_equal", np.not_equal)
greater = _binary("greater", np.greater)
greater_equal = _binary("greater_equal", np.greater_equal)
less = _binary("less", np.less)
less_equal = _binary("less_equal", np.less_equal)


def where(condition: NkiTensor, x: alu.Operand, y: alu.Operand, dtype: Any = None) -> NkiTensor:
    """``x`` where ``condition`` is nonzero, else ``y`` (tiles of one shape or scalars)."""
    if dtype is None:
        dtype = next((v.dtype for v in (x, y) if isinstance(v, NkiTensor)), None)
    return _elementwise(
        "where",
        lambda c, a, b: np.where(c != 0, a, b),
        {"condition": condition, "x": x, "y": y},
        dtype,
    )


# -- reductions -----------------------------------------------------------------------------
def reduce_axes(api: str, tile: NkiTensor, axis: Any) -> tuple[int, ...]:
    """``axis`` normalised; it must be the trailing free axes (never the partition axis)."""
    axes = tuple(
        sorted(int(a) % tile.ndim for a in (axis if isinstance(axis, (tuple, list)) else [axis]))
    )
    if not axes or axes[0] == 0 or axes != tuple(range(axes[0], tile.ndim)):
        raise errors.UnsupportedReduceAxis(
            f"'{api}' over axis {axis} of {tile!r}: reductions run over free axes only, a "
            "contiguous run ending at the last axis ([1], [1, 2], ...)"
        )
    return axes


def _reduce(
    api: str, function: Any, x: NkiTensor, axis: Any, dtype: Any, keepdims: bool
) -> NkiTensor:
    run = runtime.active_run(api)
    alu.check_on_chip(api, {"x": x})
    axes = reduce_axes(api, x, axis)
    values = function.reduce(alu.as_f32(x), axis=axes, keepdims=keepdims)
    if values.ndim < 2:
        raise errors.LeadingDimensionOfTensorMustBePartition(
            f"'{api}' over every free axis of {x!r} leaves no free axis; pass keepdims=True"
        )
    out = new_tile(values.shape, nki_dtype(dtype) if dtype is not None else x.dtype, api)
    alu.write(out, values, api)
    run.count("vector")
    return out


def sum(x: NkiTensor, axis: Any, dtype: Any = None, keepdims: bool = False) -> NkiTensor:
    """Sum over the trailing free ``axis`` (float32 math)."""
    return _reduce("sum", np.add, x, axis, dtype, keepdims)


def max(x: NkiTensor, axis: Any, dtype: Any = None, keepdims: bool = False) -> NkiTensor:
    """Maximum over the trailing free ``axis``."""
    return _reduce("max", np.maximum, x, axis, dtype, keepdims)


def min(x: NkiTensor, axis: Any, dtype: Any = None, keepdims: bool = False) -> NkiTensor:
    """Minimum over the trailing free ``axis``."""
    return _reduce("min", np.minimum, x, axis, dtype, keepdims)


# -- loops, indexing, debugging -------------------------------------------------------------
def affine_range(start: int, stop: int | None = None, step: int = 1) -> range:
    return range(start, stop, step) if stop is not None else range(start)


sequential_range = affine_range
static_range = affine_range


def ds(start: int, size: int) -> slice:
    """The index range ``[start, start + size)``."""
    return slice(start, start + size)


def device_print(print_prefix: str, tensor: NkiTensor) -> None:
    """Prints ``tensor``'s values now (the simulator runs eagerly)."""
    print(print_prefix, tensor.data)
