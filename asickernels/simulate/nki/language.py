"""``nki.language`` (``nl``), with the names and signatures of the NKI 0.8 API reference
(nki/api/nki/language/__init__.py).

Compute functions here allocate their result in SBUF and run on the Vector engine (one
instruction each, float32 math); ``load``/``store`` are DMAs between HBM and SBUF. The
functions double as the ALU operators and activation functions ``nki.isa`` instructions
take (``op=nl.add``, ``op=nl.exp``).
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import scipy.special

from asickernels.simulate.nki import alu, errors, grid, prng, reference, runtime
from asickernels.simulate.nki.compiler import DirectAllocation
from asickernels.simulate.nki.tensor import (
    DTYPES,
    MemoryRegion,
    NKIObject,
    NkiTensor,
    allocate,
    is_float,
    new_tile,
    nki_dtype,
)
from asickernels.simulate.nki.tensor import is_hbm as _is_hbm_region

DType = np.dtype  # what the dtype constants below are (the reference's type alias)
bool_ = DTYPES["bool_"]
int8 = DTYPES["int8"]
int16 = DTYPES["int16"]
int32 = DTYPES["int32"]
int64 = DTYPES["int64"]
uint8 = DTYPES["uint8"]
uint16 = DTYPES["uint16"]
uint32 = DTYPES["uint32"]
float16 = DTYPES["float16"]
bfloat16 = DTYPES["bfloat16"]
float32 = DTYPES["float32"]
tfloat32 = DTYPES["tfloat32"]
float8_e4m3 = DTYPES["float8_e4m3"]
float8_e5m2 = DTYPES["float8_e5m2"]
float8_e4m3fn = DTYPES["float8_e4m3fn"]
float8_e8m0fnu = DTYPES["float8_e8m0fnu"]
float8_e5m2_x4 = DTYPES["float8_e5m2_x4"]
float8_e4m3fn_x4 = DTYPES["float8_e4m3fn_x4"]
float4_e2m1fn_x4 = DTYPES["float4_e2m1fn_x4"]

sbuf = MemoryRegion.sbuf
psum = MemoryRegion.psum
private_hbm = MemoryRegion.private_hbm
shared_hbm = MemoryRegion.shared_hbm
hbm = MemoryRegion.private_hbm


class TileSizes(NKIObject):
    """Hardware tile size constants (the SBUF ones follow the simulated target), with the
    names of both generations."""

    pmax = runtime.PMAX
    psum_bank_fmax = runtime.PSUM_BANK_BYTES // 4
    psum_bank_fmax_bytes = runtime.PSUM_BANK_BYTES
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512

    @property
    def psum_fmax(self) -> int:
        return self.psum_bank_fmax

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


class _TileSize(TileSizes):
    """``nl.tile_size`` of the current API: names a later release deprecated or removed
    warn, and those the reference gives no value for are refused (``reference.json``)."""

    @property
    def psum_fmax(self) -> int:
        reference.warn_changed("nki.language.tile_size.psum_fmax")
        return self.psum_bank_fmax

    @property
    def psum_fmax_bytes(self) -> int:
        reference.warn_changed("nki.language.tile_size.psum_fmax_bytes")
        return self.psum_bank_fmax_bytes

    @property
    def total_available_sbuf_size(self) -> int:
        reference.warn_changed("nki.language.tile_size.total_available_sbuf_size")
        return self.sbuf_fmax_bytes

    @property
    def psum_min_align(self) -> int:
        reference.refuse("nki.language.tile_size.psum_min_align")

    @property
    def sbuf_min_align(self) -> int:
        reference.refuse("nki.language.tile_size.sbuf_min_align")


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
    buffer: Any = sbuf,
    name: str = "",
    address: Any = None,
) -> NkiTensor:
    """A new tensor; its contents read as NaN (integers: 4) until written. ``address``
    ``(partition_offset, free_offset)`` (the first partition and the byte offset within each
    partition) places an SBUF or PSUM tensor by hand: it is then a view of the core's one
    physical memory, so tensors placed at overlapping addresses share their bytes, as on
    the device (:mod:`asickernels.simulate.nki.placement`, which lists the rules checked).
    ``buffer`` may be an ``nki.compiler`` allocation (``ncc.sbuf.mod_alloc(...)``), which
    places the tensor's one tile."""
    if isinstance(buffer, DirectAllocation):
        if address is not None:
            raise TypeError(f"'ndarray': give address= or buffer={buffer!r}, not both")
        tile = tuple(int(s) for s in shape)
        nbytes = math.prod(tile[1:]) * nki_dtype(dtype).itemsize
        address, buffer = buffer.address((), tile[0] if tile else 0, nbytes), buffer.region
    return _allocate(shape, dtype, buffer, name, "ndarray", address=address)


def full(
    shape: Sequence[int], fill_value: float, dtype: Any, buffer: MemoryRegion = sbuf, name: str = ""
) -> NkiTensor:
    """A new on-chip tensor filled with ``fill_value`` (one memset instruction)."""
    return _filled(_allocate, shape, fill_value, dtype, buffer, name)


def _allocate(
    shape: Sequence[int],
    dtype: Any,
    buffer: MemoryRegion,
    *named: str,
    fill: Any = None,
    address: Any = None,
) -> NkiTensor:
    """:func:`~asickernels.simulate.nki.tensor.allocate` (``named``: the tensor's name and
    the API allocating it), with a one-dimensional on-chip tensor as that many partitions of
    one element each: the nki.isa.register_load and register_store reference examples
    allocate ``nl.ones([1], ..., buffer=nl.sbuf)`` (nki/api/nki/isa/__init__.py@81ce03a).
    On chip a tensor may span several 128-partition tiles: the nki.language.NkiBlockGrid
    example allocates a block's element_shape (256, 512) in SBUF."""
    dims, (name, api) = tuple(shape), named
    if not isinstance(buffer, MemoryRegion) or _is_hbm_region(buffer):
        return allocate(dims, dtype, buffer, name, api, fill=fill, address=address)
    with runtime.allocating(api, partition_tiles=True):
        if len(dims) == 1:
            made = allocate((*dims, 1), dtype, buffer, name, api, fill=fill, address=address)
            return made.reshape(dims)
        return allocate(dims, dtype, buffer, name, api, fill=fill, address=address)


def _filled(
    allocate: Callable[..., Any],
    shape: Sequence[int],
    fill_value: Any,
    dtype: Any,
    buffer: MemoryRegion,
    name: str,
) -> Any:
    """``full`` of either generation: ``allocate(shape, dtype, buffer, name, api, fill=)``
    makes the tensor of its data model; an HBM tensor cannot start with values."""
    if _is_hbm_region(buffer):
        raise errors.HbmTensorWithInitValueNotSupported(
            f"cannot create an HBM tensor with an initial value ({name or 'tensor'} {list(shape)})"
        )
    tile = allocate(shape, dtype, buffer, name, "full", fill=fill_value)
    runtime.active_run("full").count("vector", "full", (), (tile,))
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
    run.count_dma(True, False, src.size * src.dtype.itemsize, "load", (src,), (out,))
    return out


def store(dst: NkiTensor, value: NkiTensor) -> None:
    """Writes the SBUF tile ``value`` into the HBM tensor ``dst`` (a DMA); same shapes."""
    run = runtime.active_run("store")
    alu.require("store", "dst", dst, alu.HBM)
    alu.require("store", "value", value, alu.SBUF)
    if dst.shape != value.shape:
        raise errors.ShapeMismatch(f"'store' of {value!r} into {dst!r}: shapes differ")
    alu.write(dst, alu.dma_values(value, dst.dtype), "store")
    run.count_dma(False, True, dst.size * dst.dtype.itemsize, "store", (value,), (dst,))


def copy(x: NkiTensor, dtype: Any = None) -> NkiTensor:
    """A new SBUF tile with the values of the on-chip tile ``x`` (e.g. PSUM -> SBUF): a bit
    copy for the same dtype, else a cast through float32 (Vector engine)."""
    run = runtime.active_run("copy")
    alu.require("copy", "x", x, alu.ON_CHIP)
    out = new_tile(x.shape, nki_dtype(dtype) if dtype is not None else x.dtype, "copy")
    alu.write(out, x.values if out.dtype == x.dtype else alu.as_f32(x), "copy")
    run.count("vector", "copy", (x,), (out,), pinned=False)
    return out


# -- element-wise -------------------------------------------------------------------------
def _result_dtype(tiles: list[NkiTensor]) -> np.dtype[Any]:
    """The result dtype of an element-wise function without ``dtype``: the tiles' one dtype,
    else their float dtype (float32 for several), else NumPy's integer promotion; scalars do not
    widen it. The legacy generation's rule (``legacy.language.promote``, the "NKI Type
    Promotion" table of general/nki/api/nki.api.shared.rst@0521004c) counts Python scalars
    as weakly typed int32/float32, so ``(bfloat16 tile, 0.5)`` gives float32 there."""
    dtypes = {t.dtype for t in tiles}
    if len(dtypes) == 1:
        return tiles[0].dtype
    floats = [d for d in dtypes if is_float(d)]
    if len(floats) == 1:
        return floats[0]
    return float32 if floats else np.promote_types(*dtypes)


def _elementwise(
    api: str,
    function: Callable[..., Any],
    operands: dict[str, Any],
    dtype: Any,
    read: Callable[[Any], Any] = alu.as_f32,
) -> NkiTensor:
    """One Vector-engine instruction: float32 math (``read``: how operands are read) on
    tiles of one partition count whose free axes broadcast as in NumPy (the functions are
    "similar to numpy.add" & co., and the nl.abs_max reference example combines a [128, 512]
    with a [128, 1] tile) and scalars, into a new SBUF tile."""
    tiles = _elementwise_tiles(api, operands)
    out_dtype = nki_dtype(dtype) if dtype is not None else _result_dtype(tiles)
    shape = alu.broadcast_shape(api, [t.shape for t in tiles], False, True)
    out = new_tile(shape, out_dtype, api)
    elementwise_into(out, api, function, operands, read, broadcast=(False, True))
    return out


def _elementwise_tiles(api: str, operands: dict[str, Any]) -> list[NkiTensor]:
    tiles = alu.check_on_chip(api, operands)
    if not tiles:
        raise TypeError(f"'{api}' needs at least one tile operand")
    return tiles


def elementwise_into(
    dst: NkiTensor,
    api: str,
    function: Callable[..., Any],
    operands: dict[str, Any],
    read: Callable[[Any], Any] = alu.as_f32,
    engine: str = "vector",
    broadcast: tuple[bool, bool] = (False, False),
) -> None:
    """``dst = function(*operands)``, one element-wise instruction of either generation
    (float32 math, or ``read_bits`` for bitvec operators), counted on ``engine``.
    ``broadcast`` (partitions, free axes): the generation's operand shape rule (see
    :func:`alu.broadcast_shape`). This generation's functions take tiles of one shape; the
    legacy ``nl`` functions broadcast partition-first (the rmsnorm and layernorm tutorials
    of general/nki/tutorials@0521004c add a ``[P]`` reduction result to a ``[P, F]`` tile),
    its operator overloads along the free axes only (general/nki/nki_known_issues.rst
    @0521004c: "use nki.language APIs instead")."""
    run = runtime.active_run(api)
    tiles = _elementwise_tiles(api, operands)
    alu.check_not_both_psum(api, *tiles)
    shape = alu.broadcast_shape(api, [t.shape for t in tiles], *broadcast)
    values = [alu.expand(read(v), shape) if isinstance(v, NkiTensor) else read(v)
              for v in operands.values()]  # fmt: skip
    alu.write(dst, np.asarray(function(*values)), api)
    run.count(engine, api, tiles, (dst,), pinned=False)


def read_bits(value: alu.Operand) -> Any:
    """An operand of a bitvec operator: integer bit patterns, never converted (nki.api.shared,
    "Supported Math Operators": bitvec operators expect integer data types)."""
    if isinstance(value, NkiTensor):
        if value.dtype.kind not in "iub":
            raise errors.UnsupportedDtype(f"bitvec operators take integer tiles, got {value!r}")
        return value.values.astype(np.int64)
    if isinstance(value, float) and not value.is_integer():
        raise errors.UnsupportedDtype(f"bitvec operators take integer scalars, got {value}")
    return np.int64(value)


# The ALU operators ``nki.isa`` instructions accept (``op=nl.add``), with their numpy
# functions (applied to float32 values, or exact integers on GpSimd); unary ones ignore their
# second operand. BITVEC_OPS read bit patterns; REDUCE_OPS may reduce (nki.api.shared.rst,
# "Legal Reduction op"); ACTIVATIONS are the Scalar Engine's functions ("Supported Activation
# Functions").
ALU_OPS: dict[Any, Any] = {}
# Every element-wise function's math by name: the ``nl`` functions of both generations
# compute with these (the legacy ones through ``legacy.language``).
FUNCTIONS: dict[str, Callable[..., Any]] = {}
BITVEC_OPS: set[Any] = set()
REDUCE_OPS: set[Any] = set()
ACTIVATIONS: dict[Any, Callable[[Any], Any]] = {copy: lambda x: x}  # identity


class Operator:
    """An operator constant that is not a function (``nl.prelu``, ``nl.bypass``,
    ``nl.average``)."""

    def __init__(self, name: str) -> None:
        self.__name__ = name

    def __repr__(self) -> str:
        return f"nl.{self.__name__}"


def _binary(
    api: str, function: Callable[[Any, Any], Any], bitvec: bool = False, reduce: bool = False
) -> Callable[..., NkiTensor]:
    read = read_bits if bitvec else alu.as_f32

    def op(x: alu.Operand, y: alu.Operand, dtype: Any = None) -> NkiTensor:
        return _elementwise(api, function, {"x": x, "y": y}, dtype, read)

    op.__name__ = op.__qualname__ = api
    op.__doc__ = (
        f"``{api}(x, y)`` element-wise (``x``, ``y``: tiles of one shape or scalars); "
        "comparisons give 1 or 0 in the input dtype unless ``dtype`` says otherwise."
    )
    ALU_OPS[op] = FUNCTIONS[api] = function
    if bitvec:
        BITVEC_OPS.add(op)
    if reduce:
        REDUCE_OPS.add(op)
    return op


add = _binary("add", np.add, reduce=True)
subtract = _binary("subtract", np.subtract, reduce=True)
multiply = _binary("multiply", np.multiply, reduce=True)
divide = _binary("divide", np.divide)
maximum = _binary("maximum", np.maximum, reduce=True)
minimum = _binary("minimum", np.minimum, reduce=True)
equal = _binary("equal", np.equal)
not_equal = _binary("not_equal", np.not_equal)
greater = _binary("greater", np.greater)
greater_equal = _binary("greater_equal", np.greater_equal)
less = _binary("less", np.less)
less_equal = _binary("less_equal", np.less_equal)
power = _binary("power", np.power)
# The signed input of larger (smaller) magnitude, ``y`` on a tie (nki.language.abs_max /
# abs_min: abs_max(-5, 3) is -5).
abs_max = _binary("abs_max", lambda x, y: np.where(np.abs(x) > np.abs(y), x, y))
abs_min = _binary("abs_min", lambda x, y: np.where(np.abs(x) < np.abs(y), x, y))
fmod = _binary("fmod", np.fmod)
mod = _binary("mod", np.mod)
logical_and = _binary("logical_and", np.logical_and, reduce=True)
logical_or = _binary("logical_or", np.logical_or, reduce=True)
logical_xor = _binary("logical_xor", np.logical_xor, reduce=True)
bitwise_and = _binary("bitwise_and", np.bitwise_and, bitvec=True, reduce=True)
bitwise_or = _binary("bitwise_or", np.bitwise_or, bitvec=True, reduce=True)
bitwise_xor = _binary("bitwise_xor", np.bitwise_xor, bitvec=True, reduce=True)
left_shift = _binary("left_shift", np.left_shift, bitvec=True)
right_shift = _binary("right_shift", np.right_shift, bitvec=True)  # logical (the docs)


def _unary(
    api: str, function: Callable[[Any], Any], alu_op: bool = False, activation: bool = True
) -> Callable[..., NkiTensor]:
    def op(x: alu.Operand, dtype: Any = None) -> NkiTensor:
        return _elementwise(api, function, {"x": x}, dtype)

    op.__name__ = op.__qualname__ = api
    op.__doc__ = f"``{api}(x)`` element-wise on a tile, in float32 math."
    FUNCTIONS[api] = function
    if alu_op:
        ALU_OPS[op] = lambda x, _unused: function(x)
    if activation:
        ACTIVATIONS[op] = function
    return op


_erf = scipy.special.erf
_sigmoid = scipy.special.expit  # no overflow for large negative x


def _gelu_dx(x: Any) -> Any:
    return 0.5 * (1.0 + _erf(x / math.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / math.sqrt(
        2 * math.pi
    )


def _silu_dx(x: Any) -> Any:
    return _sigmoid(x) * (1.0 + x * (1.0 - _sigmoid(x)))


# The sigmoid approximation of GELU uses the usual constant 1.702 (the docs name the
# approximation only).
_GELU_SIGMOID = 1.702

exp = _unary("exp", np.exp)
log = _unary("log", np.log)
sqrt = _unary("sqrt", np.sqrt)
rsqrt = _unary("rsqrt", lambda x: 1.0 / np.sqrt(x), alu_op=True)
reciprocal = _unary("reciprocal", lambda x: 1.0 / x, alu_op=True)
abs = _unary("abs", np.abs, alu_op=True)
square = _unary("square", np.square, alu_op=True)
relu = _unary("relu", lambda x: np.maximum(x, 0.0), alu_op=True)
tanh = _unary("tanh", np.tanh)
sigmoid = _unary("sigmoid", _sigmoid)
silu = _unary("silu", lambda x: x * _sigmoid(x))
silu_dx = _unary("silu_dx", _silu_dx)
gelu = _unary("gelu", lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))))
gelu_dx = _unary("gelu_dx", _gelu_dx)
gelu_apprx_tanh = _unary(
    "gelu_apprx_tanh",
    lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
)
gelu_apprx_sigmoid = _unary("gelu_apprx_sigmoid", lambda x: x * _sigmoid(_GELU_SIGMOID * x))
gelu_apprx_sigmoid_dx = _unary(
    "gelu_apprx_sigmoid_dx",
    lambda x: (
        _sigmoid(_GELU_SIGMOID * x)
        * (1.0 + _GELU_SIGMOID * x * (1.0 - _sigmoid(_GELU_SIGMOID * x)))
    ),
)
softplus = _unary("softplus", lambda x: np.logaddexp(0.0, x))
mish = _unary("mish", lambda x: x * np.tanh(np.logaddexp(0.0, x)))
erf = _unary("erf", _erf)
erf_dx = _unary("erf_dx", lambda x: 2.0 / math.sqrt(math.pi) * np.exp(-x * x))
sin = _unary("sin", np.sin)
cos = _unary("cos", np.cos, activation=False)
tan = _unary("tan", np.tan, activation=False)
arctan = _unary("arctan", np.arctan)
sign = _unary("sign", np.sign)
ceil = _unary("ceil", np.ceil, activation=False)
floor = _unary("floor", np.floor, activation=False)
trunc = _unary("trunc", np.trunc, activation=False)
negative = _unary("negative", np.negative, activation=False)
logical_not = _unary("logical_not", np.logical_not, activation=False)


def invert(x: alu.Operand, dtype: Any = None) -> NkiTensor:
    """Bitwise NOT of an integer tile."""
    return _elementwise("invert", np.invert, {"x": x}, dtype, read_bits)


ALU_OPS[invert] = lambda x, _unused: np.invert(x)
BITVEC_OPS.add(invert)
# Operator constants: PReLU (its slope is ``relu_param`` of the activation instructions),
# bypass (skip a stage), average (tensor_partition_reduce).
prelu = Operator("prelu")
bypass = Operator("bypass")
average = Operator("average")


def select(condition: Any, on_true: Any, on_false: Any) -> Any:
    """``nl.where``'s math (both generations): ``on_true`` where ``condition`` is nonzero."""
    return np.where(condition != 0, on_true, on_false)


def where(condition: NkiTensor, x: alu.Operand, y: alu.Operand, dtype: Any = None) -> NkiTensor:
    """``x`` where ``condition`` is nonzero, else ``y`` (tiles of one shape or scalars)."""
    if dtype is None:
        dtype = next((v.dtype for v in (x, y) if isinstance(v, NkiTensor)), None)
    return _elementwise("where", select, {"condition": condition, "x": x, "y": y}, dtype)


# -- reductions -----------------------------------------------------------------------------
def reduce_axes(api: str, tile: Any, axis: Any, trailing: bool = True) -> tuple[int, ...]:
    """``axis`` normalised: free axes only, never the partition axis. ``trailing``: a
    contiguous run ending at the last axis ([1], [1, 2], ...), as this generation's
    reductions and ``tensor_reduce`` of both take. The legacy ``nl`` reductions take any
    free axes: the average_pool2d tutorial
    (general/nki/tutorials/average_pool2d.rst@0521004c) sums ``axis=[2, 4]`` of a 5-D
    access pattern, which the compiler reorders."""
    listed = axis if isinstance(axis, (tuple, list)) else [axis]
    axes = tuple(sorted({int(a) % tile.ndim for a in listed}))
    contiguous = bool(axes) and axes == tuple(builtins.range(axes[0], tile.ndim))
    if not axes or axes[0] == 0 or (trailing and not contiguous):
        raise errors.UnsupportedReduceAxis(
            f"'{api}' over axis {axis} of {tile!r}: reductions run over free axes only"
            + (", a contiguous run ending at the last axis ([1], [1, 2], ...)" if trailing else "")
        )
    return axes


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    """``shape`` reduced over ``axes`` (kept as size 1 with ``keepdims``)."""
    return tuple(1 if i in axes else n for i, n in enumerate(shape) if keepdims or i not in axes)


# What masked-out inputs of a (legacy, masked) reduction take.
IDENTITIES: dict[Any, Any] = {
    np.add: 0.0,
    np.multiply: 1.0,
    np.maximum: -np.inf,
    np.minimum: np.inf,
    np.logical_and: True,
    np.logical_or: False,
    np.bitwise_or: 0,
    np.bitwise_xor: 0,
    np.bitwise_and: -1,
}


def _mean(values: np.ndarray, axis: Any, keepdims: bool, where: Any = True) -> np.ndarray:
    """The mean over ``axis`` of the ``where`` elements (0 where there are none)."""
    included = np.broadcast_to(where, values.shape)
    count = np.maximum(np.sum(included, axis=axis, keepdims=True), 1).astype(np.float32)
    mean = np.sum(values, axis=axis, keepdims=True, where=included) / count
    return mean if keepdims else np.squeeze(mean, axis=axis)


def _variance(values: np.ndarray, axis: Any, keepdims: bool, where: Any = True) -> np.ndarray:
    """The population variance over ``axis`` of the ``where`` elements."""
    return _mean((values - _mean(values, axis, True, where)) ** 2, axis, keepdims, where)


def _reduce(
    api: str, function: Any, x: NkiTensor, axis: Any, dtype: Any, keepdims: bool
) -> NkiTensor:
    """:func:`reduce_into` a new SBUF tile, which keeps a free axis."""
    alu.check_on_chip(api, {"x": x})
    axes = reduce_axes(api, x, axis)
    shape = reduced_shape(x.shape, axes, keepdims)
    if len(shape) < 2:
        raise errors.LeadingDimensionOfTensorMustBePartition(
            f"'{api}' over every free axis of {x!r} leaves no free axis; pass keepdims=True"
        )
    out = new_tile(shape, nki_dtype(dtype) if dtype is not None else x.dtype, api)
    reduce_into(out, api, function, x, axes, keepdims)
    return out


def reduce_into(
    dst: NkiTensor,
    api: str,
    function: Any,
    x: NkiTensor,
    axes: tuple[int, ...],
    keepdims: bool = False,
    included: np.ndarray | None = None,
    read: Callable[[Any], Any] = alu.as_f32,
    negate: bool = False,
) -> None:
    """``dst`` = ``x`` reduced over ``axes`` by ``function`` (Vector engine), the reduction
    of ``nl.sum`` & co. and ``nisa.tensor_reduce`` of both generations: a numpy ufunc (its
    ``reduce``) or ``f(values, axis, keepdims, where)``, on the values ``read`` gives
    (float32, or ``read_bits`` for bitvec operators), times -1 with ``negate``.
    ``included``: the elements that take part (a legacy ``mask``: the others take the
    operator's identity); all of them by default."""
    run = runtime.active_run(api)
    alu.check_on_chip(api, {"x": x})
    values = read(x)
    if not isinstance(function, np.ufunc):
        result = function(values, axes, keepdims, True if included is None else included)
    elif included is None:
        result = function.reduce(values, axis=axes, keepdims=keepdims)
    elif function in IDENTITIES:
        result = function.reduce(
            values, axis=axes, keepdims=keepdims, where=included, initial=IDENTITIES[function]
        )
    else:
        raise errors.UnsupportedOperator(f"'{api}' cannot mask a reduction by {function!r}")
    alu.write(dst, -np.asarray(result) if negate else np.asarray(result), api)
    run.count("vector", api, (x,), (dst,))


def sum(x: NkiTensor, axis: Any, dtype: Any = None, keepdims: bool = False) -> NkiTensor:
    """Sum over the trailing free ``axis`` (float32 math)."""
    return _reduce("sum", np.add, x, axis, dtype, keepdims)


def max(x: NkiTensor, axis: Any, dtype: Any = None, keepdims: bool = False) -> NkiTensor:
    """Maximum over the trailing free ``axis``."""
    return _reduce("max", np.maximum, x, axis, dtype, keepdims)


def min(x: NkiTensor, axis: Any, dtype: Any = None, keepdims: bool = False) -> NkiTensor:
    """Minimum over the trailing free ``axis``."""
    return _reduce("min", np.minimum, x, axis, dtype, keepdims)


def mean(x: NkiTensor, axis: Any, dtype: Any = None, keepdims: bool = False) -> NkiTensor:
    """Arithmetic mean over the trailing free ``axis``."""
    return _reduce("mean", _mean, x, axis, dtype, keepdims)


def prod(x: NkiTensor, axis: Any, dtype: Any = None, keepdims: bool = False) -> NkiTensor:
    """Product over the trailing free ``axis``."""
    return _reduce("prod", np.multiply, x, axis, dtype, keepdims)


def var(x: NkiTensor, axis: Any, dtype: Any = None, keepdims: bool = False) -> NkiTensor:
    """Population variance over the trailing free ``axis``."""
    return _reduce("var", _variance, x, axis, dtype, keepdims)


def all(x: NkiTensor, axis: Any, dtype: Any = None) -> NkiTensor:
    """1 where every element along the trailing free ``axis`` is nonzero, else 0."""
    return _reduce("all", np.logical_and, x, axis, dtype, False)


def softmax_over(axes: tuple[int, ...]) -> Callable[[Any], Any]:
    """``nl.softmax``'s math (both generations) over ``axes``."""

    def function(values: Any) -> Any:
        shifted = np.exp(values - values.max(axis=axes, keepdims=True))
        return shifted / shifted.sum(axis=axes, keepdims=True)

    return function


def softmax(x: NkiTensor, axis: Any = -1, dtype: Any = None) -> NkiTensor:
    """``exp(x - max) / sum(exp(x - max))`` along the trailing free ``axis``."""
    return _elementwise("softmax", softmax_over(reduce_axes("softmax", x, axis)), {"x": x}, dtype)


def rms_norm(
    x: NkiTensor,
    w: NkiTensor,
    axis: Any,
    n: int,
    epsilon: float = 1e-06,
    dtype: Any = None,
    compute_dtype: Any = None,
) -> NkiTensor:
    """``x / sqrt(sum(x**2, axis) / n + epsilon) * w`` (``w`` shaped like ``x``)."""
    axes = reduce_axes("rms_norm", x, axis)

    def function(values: Any, weights: Any) -> Any:
        mean_square = np.square(values).sum(axis=axes, keepdims=True) / n
        return values / np.sqrt(mean_square + epsilon) * weights

    return _elementwise("rms_norm", function, {"x": x, "w": w}, dtype)


def broadcast_to(x: NkiTensor, shape: Sequence[int], dtype: Any = None) -> NkiTensor:
    """A new tile of ``shape`` (same rank as ``x``; size-1 axes repeat, the partition axis
    included), or ``x`` itself when the shape and dtype already match."""
    shape = tuple(int(s) for s in shape)
    alu.require("broadcast_to", "x", x, alu.ON_CHIP)
    if shape == x.shape and (dtype is None or nki_dtype(dtype) == x.dtype):
        return x
    if len(shape) != x.ndim or any(a not in (1, b) for a, b in zip(x.shape, shape, strict=True)):
        raise errors.ShapeMismatch(f"cannot broadcast {x!r} to {list(shape)}")
    out = new_tile(shape, nki_dtype(dtype) if dtype is not None else x.dtype, "broadcast_to")
    alu.write(out, np.broadcast_to(alu.as_f32(x), shape), "broadcast_to")
    runtime.active_run("broadcast_to").count("vector")
    return out


def expand_dims(x: NkiTensor, axis: int) -> NkiTensor:
    """A view of ``x`` with a size-1 axis inserted at ``axis`` (see ``NkiTensor.expand_dim``)."""
    return x.expand_dim(axis)


def _psum_result(shape: tuple[int, ...], api: str) -> NkiTensor:
    return allocate(shape, float32, psum, "", api)


def transpose(x: NkiTensor, dtype: Any = None) -> NkiTensor:
    """A new PSUM tile ``x.T`` of the 2-D SBUF tile ``x`` (both sizes <= 128), by a Tensor
    Engine transpose (the instruction ``nc_transpose``)."""
    from asickernels.simulate.nki import isa  # isa builds on this module

    alu.require("transpose", "x", x, alu.SBUF)
    if x.ndim != 2 or x.shape[1] > runtime.PMAX:
        raise errors.SizeOfDimensionExceedArchLimit(
            f"'transpose' takes a 2-D tile <= 128x128, got {x!r}"
        )
    out = allocate(
        x.shape[::-1], nki_dtype(dtype) if dtype is not None else x.dtype, psum, "", "transpose"
    )
    isa._nc_transpose(out, x, isa.engine.tensor, alu.PSUM, "transpose")
    return out


def matmul(x: NkiTensor, y: NkiTensor, transpose_x: bool = False) -> NkiTensor:
    """A new float32 PSUM tile ``x @ y`` (``x.T @ y`` with ``transpose_x``): ``x``
    [<=128, <=128] and ``y`` [<=128, <=512] in SBUF."""
    from asickernels.simulate.nki import isa  # isa builds on this module

    stationary = x if transpose_x else transpose_in_sbuf(x)
    out = _psum_result((stationary.shape[1], y.shape[1]), "matmul")
    isa.nc_matmul(out, stationary, y)
    return out


def transpose_in_sbuf(x: NkiTensor) -> NkiTensor:
    """``x.T`` as a new SBUF tile (a Tensor Engine transpose and a PSUM -> SBUF copy)."""
    return copy(transpose(x))


def zeros_like(
    x: NkiTensor, dtype: Any = None, buffer: MemoryRegion | None = None, name: str = ""
) -> NkiTensor:
    """A new zero tensor shaped like ``x`` (its dtype and buffer unless given)."""
    return zeros(x.shape, dtype if dtype is not None else x.dtype, buffer or x.buffer, name)


def empty_like(
    x: NkiTensor | grid.NkiGrid,
    dtype: Any = None,
    buffer: MemoryRegion | None = None,
    name: str = "",
    *,
    transpose_axes: Sequence[int] | None = None,
    address: Any = None,
) -> NkiTensor | grid.NkiGrid:
    """New uninitialised storage with ``x``'s geometry (its dtype and buffer unless given):
    a tensor of ``x``'s shape, or a grid of the same kind, navigation shape, tile shape,
    block grouping and clamped extents whose selected cells are packed densely.
    ``transpose_axes`` ((1, 0), (2, 1, 0) or (3, 1, 2, 0)) permutes the (tiled) dimensions
    for a later ``nisa.dma_transpose`` (nki.language.empty_like, NKI 0.7)."""
    dtype = x.dtype if dtype is None else dtype
    buffer = buffer or x.buffer
    if isinstance(x, grid.NkiGrid):
        extent, prefix, tile_shape, cells, consumed, block_shape = grid.dense_layout(
            x, transpose_axes
        )
        on_chip = not _is_hbm_region(buffer)
        shape = grid.packed_storage_shape(extent, tile_shape, on_chip)
        storage = _grid_storage("empty_like", shape, tile_shape, dtype, buffer, name, address)
        return grid.like(storage, extent, prefix, tile_shape, cells, consumed, block_shape)
    shape = tuple(x.shape)
    if transpose_axes is not None:
        axes = tuple(transpose_axes)
        if grid.TRANSPOSE_AXES.get(len(shape)) != axes:
            raise ValueError(f"'empty_like' transpose_axes {axes} for a rank-{len(shape)} tensor")
        shape = tuple(shape[a] for a in axes)
    return ndarray(shape, dtype, buffer, name, address)


# -- tile grids (NKI 0.7) -----------------------------------------------------------------
NkiGrid = grid.NkiGrid
NkiTileGrid = grid.NkiTileGrid
NkiBlockGrid = grid.NkiBlockGrid


def tiles(
    source: NkiTensor | grid.NkiGrid, *, tile_shape: Sequence[int] | None = None
) -> grid.NkiTileGrid:
    """``source`` as a grid of ``tile_shape`` tiles over its trailing dimensions; a view that
    copies nothing (nki.language.tiles, NKI 0.7). See :mod:`asickernels.simulate.nki.grid`."""
    return grid.tiles(source, tile_shape)


def blocks(
    source: NkiTensor | grid.NkiGrid,
    *,
    tile_shape: Sequence[int] | None = None,
    block_shape: Sequence[int],
) -> grid.NkiBlockGrid:
    """``source`` as a grid of blocks of ``block_shape`` tiles (nki.language.blocks)."""
    return grid.blocks(source, block_shape, tile_shape)


def alloc_tiles(
    *,
    tile_shape: tuple[int, ...],
    element_shape: tuple[int, ...],
    buffer: MemoryRegion,
    dtype: Any,
    address: Any = None,
    name: str = "",
) -> grid.NkiTileGrid:
    """New uninitialised storage for ``element_shape`` elements as a grid of ``tile_shape``
    tiles: one allocation, compact in HBM, tile after tile along the free axis on chip
    (nki.language.alloc_tiles, NKI 0.7)."""
    made = _alloc_grid("alloc_tiles", tile_shape, element_shape, buffer, dtype, address, name)
    assert isinstance(made, grid.NkiTileGrid)
    return made


def alloc_blocks(
    *,
    tile_shape: tuple[int, ...],
    block_shape: tuple[int, ...],
    element_shape: tuple[int, ...],
    buffer: MemoryRegion,
    dtype: Any,
    address: Any = None,
    name: str = "",
) -> grid.NkiBlockGrid:
    """:func:`alloc_tiles` with the tiles grouped into blocks of ``block_shape`` tiles; the
    tile layout is the same (nki.language.alloc_blocks, NKI 0.7)."""
    made = _alloc_grid(
        "alloc_blocks", tile_shape, element_shape, buffer, dtype, address, name, block_shape
    )
    assert isinstance(made, grid.NkiBlockGrid)
    return made


def _alloc_grid(
    api: str,
    tile_shape: Any,
    element_shape: Any,
    buffer: Any,
    dtype: Any,
    address: Any,
    name: str,
    block_shape: Any = None,
) -> grid.NkiGrid:
    if not isinstance(buffer, MemoryRegion):
        raise TypeError(
            f"'{api}' buffer must be an NKI MemoryRegion (nl.sbuf, ...), got {buffer!r}"
        )
    extent = grid._shape_argument(api, "element_shape", element_shape)
    tiles_of = grid._shape_argument(api, "tile_shape", tile_shape, minimum=2)
    on_chip = not _is_hbm_region(buffer)
    grid._check_tiling(api, extent, tiles_of, on_chip)
    shape = grid.packed_storage_shape(extent, tiles_of, on_chip)
    storage = _grid_storage(api, shape, tiles_of, dtype, buffer, name, address)
    return grid.over_storage(storage, extent, tiles_of, block_shape, api)


def _grid_storage(
    api: str,
    shape: tuple[int, ...],
    tile_shape: Sequence[int],
    dtype: Any,
    buffer: Any,
    name: str,
    address: Any,
) -> NkiTensor:
    """The one tensor behind a new grid. In PSUM each tile takes whole banks (a matmul
    writes a tile within one bank before NeuronCore-v4), not the grid as a whole."""
    if buffer is not MemoryRegion.psum:
        return ndarray(shape, dtype, buffer, name, address)
    tile_bytes = math.prod(tile_shape[1:]) * nki_dtype(dtype).itemsize
    with runtime.allocating(api, psum_tile_bytes=tile_bytes):
        return ndarray(shape, dtype, buffer, name, address)


def shared_constant(constant: Any) -> NkiTensor:
    """A shared HBM tensor holding ``constant`` (a numpy array or a ``.npy`` path)."""
    values = np.load(constant) if isinstance(constant, str) else np.asarray(constant)
    out = allocate(values.shape, values.dtype, shared_hbm, "", "shared_constant")
    alu.write(out, values, "shared_constant")
    return out


def shared_identity_matrix(n: int, dtype: Any = uint8, dst: NkiTensor | None = None) -> NkiTensor:
    """An ``n x n`` identity matrix in SBUF (written into ``dst`` when given)."""
    out = dst if dst is not None else allocate((n, n), dtype, sbuf, "", "shared_identity_matrix")
    alu.write(out, np.eye(n), "shared_identity_matrix")
    return out


def random_generator(api: str) -> np.random.Generator:
    """The run's random number generator, which ``rand``, ``dropout`` and the random
    instructions of both generations draw from; seeded 0 unless :func:`random_seed` sets it."""
    run = runtime.active_run(api)
    if run.random is None:
        run.random = np.random.default_rng(0)
    return run.random  # type: ignore[no-any-return]


def random_seed(seed: Any) -> None:
    """Seeds :func:`rand`, :func:`dropout` and the engines' generators (an int, or a tile
    holding one)."""
    value = int(seed.values.reshape(-1)[0] if isinstance(seed, NkiTensor) else seed)
    run = runtime.active_run("random_seed")
    run.random = np.random.default_rng(value)
    prng.seed_all(run, value)


def rand(
    shape: Sequence[int], dtype: Any, buffer: MemoryRegion = sbuf, name: str = ""
) -> NkiTensor:
    """A new tensor of uniform random values in [0, 1)."""
    out = allocate(shape, dtype, buffer, name, "rand")
    rand_into(out)
    return out


def rand_into(dst: NkiTensor) -> None:
    """``dst`` = uniform random values in [0, 1) (GpSimd engine; ``nl.rand`` of both
    generations)."""
    alu.write(dst, random_generator("rand").random(dst.shape, dtype=np.float32), "rand")
    runtime.active_run("rand").count("gpsimd", "rand", (), (dst,))


def dropout(x: NkiTensor, rate: alu.Operand, dtype: Any = None) -> NkiTensor:
    """``x`` with each element zeroed with probability ``rate`` (a scalar or a
    ``[partitions, 1]`` tile): the instruction ``nisa.dropout`` into a new SBUF tile."""
    from asickernels.simulate.nki import isa  # isa builds on this module

    alu.require("dropout", "x", x, alu.ON_CHIP)
    out = new_tile(x.shape, nki_dtype(dtype) if dtype is not None else x.dtype, "dropout")
    isa._dropout(out, x, rate, same_dtype=False)
    return out


def gather_flattened(
    data: NkiTensor, indices: NkiTensor, axis: int = 0, dtype: Any = None
) -> NkiTensor:
    """``out[p, i...] = data[p].flat[indices[p, i...]]``: each partition gathers from its own
    flattened free elements."""
    count = alu.per_partition(data)
    flat = indices.values.reshape(indices.shape[0], -1).astype(np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= count):
        raise errors.TensorAccessOutOfBound(f"'gather_flattened' index outside 0..{count - 1}")

    def function(values: Any, _indices: Any) -> Any:
        rows = values.reshape(values.shape[0], -1)
        return np.take_along_axis(rows, flat, axis=1).reshape(indices.shape)

    out = new_tile(
        indices.shape, nki_dtype(dtype) if dtype is not None else data.dtype, "gather_flattened"
    )
    alu.check_partitions("gather_flattened", {"data": data, "indices": indices})
    alu.write(out, function(alu.as_f32(data), None), "gather_flattened")
    runtime.active_run("gather_flattened").count("gpsimd")
    return out


def load_transpose2d(src: NkiTensor, dtype: Any = None) -> NkiTensor:
    """A new SBUF tile ``src.T`` of the 2-D HBM tensor ``src`` (a transposing DMA)."""
    alu.require("load_transpose2d", "src", src, alu.HBM)
    if src.ndim != 2:
        raise errors.ShapeMismatch(f"'load_transpose2d' takes a 2-D tensor, got {src!r}")
    out = new_tile(
        src.shape[::-1], nki_dtype(dtype) if dtype is not None else src.dtype, "load_transpose2d"
    )
    alu.write(out, alu.dma_values(src, out.dtype).T, "load_transpose2d")
    runtime.active_run("load_transpose2d").count_dma(
        True, False, src.size * src.dtype.itemsize, "load_transpose2d", (src,), (out,)
    )
    return out


# -- loops, indexing, control flow, debugging ---------------------------------------------------
def range(start: Any, stop: Any = None, step: int = 1) -> builtins.range:
    """``range(start, stop, step)``: a loop unrolled when the kernel is specialized, as
    Python's. Not in the NKI reference, which since 0.7 makes every range iterator a Python
    ``range`` (deep-dives/nki-loops.rst of the 0.8 docs); AWS's own kernels loop with it
    (nki-library@d2ad3a5 experimental/mxfp_subkernels/mxfp_load_utils.py:123)."""
    from asickernels.simulate.nki.scalar import value_of  # scalar builds on this module

    if stop is None:
        return builtins.range(value_of(start))
    return builtins.range(value_of(start), value_of(stop), step)


@reference.deprecated("nki.language.affine_range")
def affine_range(start: int, stop: int | None = None, step: int = 1) -> builtins.range:
    """``range(start, stop, step)``: a loop whose iterations do not depend on each other."""
    return range(start, stop, step)


@reference.deprecated("nki.language.sequential_range")
def sequential_range(start: int, stop: int | None = None, step: int = 1) -> builtins.range:
    """``range(start, stop, step)``: a loop with a dependency between iterations."""
    return range(start, stop, step)


@reference.deprecated("nki.language.static_range")
def static_range(start: int, stop: int | None = None, step: int = 1) -> builtins.range:
    """``range(start, stop, step)``: a loop unrolled when the kernel is specialized."""
    return range(start, stop, step)


@reference.deprecated("nki.language.dynamic_range")
def dynamic_range(start: Any, stop: Any = None, step: int = 1) -> builtins.range:
    """``range(start, stop, step)`` with bounds read from registers (ints or
    ``VirtualRegister``) when the loop starts."""
    return range(start, stop, step)


def _refuse_int64(what: str, scalar: Any) -> None:
    """Control flow compares 32-bit scalars only: the comparison that decides a branch or a
    trip has no 64-bit form (fori_loop and if_else, NKI 0.7/0.8)."""
    if scalar.dtype.itemsize == 8:
        raise errors.UnsupportedDtype(f"{what} must be a 32-bit scalar, got {scalar!r}")


def fori_loop(
    lower: Any, upper: Any, body_fun: Callable[[Any], Any], step: int = 1, unroll: bool = False
) -> None:
    """Calls ``body_fun(i)`` for ``i`` in ``range(lower, upper, step)``. Bounds are ints,
    32-bit :class:`~asickernels.simulate.nki.scalar.NkiScalar` (an ``nl.int64`` one cannot
    bound the loop) or registers; ``i`` is a fresh ``NkiScalar`` (``nl.int32``) each
    iteration, or a ``VirtualRegister`` when a bound is one (nki.language.fori_loop, NKI
    0.7), so the body can pass it as ``scalar_offset``. With ``unroll=True`` the compiler
    unrolls the loop, so both bounds must be Python ints (the "NKI Control Flow" deep dive,
    https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/deep-dives/nki-control-flow.html)."""
    from asickernels.simulate.nki.isa import VirtualRegister  # isa builds on this module
    from asickernels.simulate.nki.scalar import NkiScalar, value_of

    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"fori_loop: step must be a positive int, got {step!r}")
    if not isinstance(unroll, bool):
        raise TypeError(f"fori_loop: unroll must be True or False, got {unroll!r}")
    for bound in (lower, upper):
        if unroll and (isinstance(bound, bool) or not isinstance(bound, int)):
            raise TypeError(
                f"fori_loop(unroll=True): the compiler unrolls the loop, so its bounds must be "
                f"known at compile time (Python ints), got {bound!r}"
            )
        if isinstance(bound, NkiScalar):
            _refuse_int64("fori_loop: a loop bound", bound)
    register = any(isinstance(b, VirtualRegister) for b in (lower, upper))
    with _dynamic_loop():
        for i in builtins.range(value_of(lower), value_of(upper), step):
            body_fun(VirtualRegister.holding(i) if register else NkiScalar(i, int32))


def while_loop(init: Any, body_fun: Callable[[Any], Any]) -> None:
    """Repeats ``state = body_fun(state)`` from ``init`` (a register or scalar) while the
    state is nonzero, checking before each iteration (nki.language.while_loop)."""
    from asickernels.simulate.nki.scalar import value_of  # scalar builds on this module

    state = init
    with _dynamic_loop():
        while value_of(state) != 0:
            state = body_fun(state)


def if_else(
    cond: Any, then_fn: Callable[[], Any], else_fn: Callable[[], Any] | None = None
) -> None:
    """Calls ``then_fn()`` when ``cond`` is nonzero, else ``else_fn()`` if given
    (nki.language.if_else, NKI 0.8). ``cond`` is a Python bool or int (resolved when the
    kernel is specialized) or a 32-bit ``NkiScalar``, such as a scalar comparison (a
    compiled conditional on device); an ``nl.int64`` scalar, a tensor or a register is
    refused, as the reference page allows none of them."""
    from asickernels.simulate.nki.scalar import NkiScalar  # scalar builds on this module

    if isinstance(cond, NkiScalar):
        _refuse_int64("if_else: the condition", cond)
        taken = cond.value != 0
    elif isinstance(cond, (bool, int, np.integer)):
        taken = bool(cond)
    else:
        raise TypeError(
            f"if_else: the condition must be a Python bool or int or a 32-bit NkiScalar, got "
            f"{cond!r}"
        )
    for name, branch in (("then_fn", then_fn), ("else_fn", else_fn)):
        if branch is not None and not callable(branch):
            raise TypeError(f"if_else: {name} must be a function of no arguments, got {branch!r}")
    if taken:
        then_fn()
    elif else_fn is not None:
        else_fn()


class _dynamic_loop:
    """Marks the body of one ``fori_loop``/``while_loop`` in the run, for the rule that a
    dependency edge cannot cross into or out of a dynamic loop (NkiInstruction.depends_on)."""

    def __enter__(self) -> None:
        run = runtime.active_run("dynamic loop")
        run.dynamic_loops.append(id(self))

    def __exit__(self, *exc: object) -> None:
        runtime.active_run("dynamic loop").dynamic_loops.pop()


class no_reorder:
    """``with nl.no_reorder():`` keeps program order, which the simulator always does."""

    def __enter__(self) -> no_reorder:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def program_id(axis: int = 0) -> int:
    """Index of this logical core in the ``kernel[lnc]`` launch (0 without a grid)."""
    if axis != 0:
        raise ValueError(f"program_id({axis}): the launch grid has one axis")
    return runtime.active_run("program_id").program_id


def num_programs(axes: Any = 0) -> int:
    """Number of logical cores in the launch (``kernel[2]``: 2)."""
    return runtime.active_run("num_programs").launch.cores


def program_ndim() -> int:
    """Dimensions of the launch grid: 1 under ``kernel[2]``, else 0."""
    return 1 if runtime.active_run("program_ndim").launch.cores > 1 else 0


def ds(start: int, size: int) -> slice:
    """The index range ``[start, start + size)``."""
    return slice(start, start + size)


def device_print(print_prefix: str, tensor: NkiTensor) -> None:
    """Prints ``tensor``'s values now (the simulator runs eagerly)."""
    print(print_prefix, tensor.values)
