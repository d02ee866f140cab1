"""``neuronxcc.nki.language`` (``nl``) of Neuron SDK 2.2x: high-level tile operations that
*return* new tiles, index grids (``arange``/``mgrid``), ``mask=`` predicates and the SPMD
program-id queries. Signatures follow general/nki/api/nki/language/__init__.py at
aws-neuron-sdk 0521004c (Neuron 2.26).

Numerics: the engines compute in float32 and cast to the result dtype (integer bitwise
operators act on the integers); results of the default dtype follow the "NKI Type Promotion"
rules of general/nki/api/nki.api.shared.rst, with weakly typed Python scalars counting as
int32/float32. Tile operands broadcast partition-first: the partition axes must be equal or
one of them 1, and the free axes broadcast as in NumPy, so a reduction result ``[P]`` (the
reduced axes removed, as ``nl.sum`` documents) broadcasts along the free axes of ``[P, F]``
as the rmsnorm and layernorm tutorials rely on.

The compute functions are adapters over the current API's one implementation
(``language.elementwise_into``, ``language.reduce_into`` and the ``isa`` instructions, run
through ``legacy.isa._run_core``): this generation's broadcasting, result dtypes, masks
and bounds checks are what they add.
"""

from __future__ import annotations

import builtins
import functools
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from asickernels.simulate.nki import alu, errors, runtime
from asickernels.simulate.nki import isa as core_isa
from asickernels.simulate.nki import language as core_language
from asickernels.simulate.nki.errors import ErrSharedHbmMustInKernelLevel

# The dtypes (general/nki/api/nki.api.shared.rst, "Supported Data Types") and buffers are
# the core simulator's objects.
from asickernels.simulate.nki.language import (
    TileSizes,
    bfloat16,
    bool_,
    float8_e4m3,
    float8_e5m2,
    float16,
    float32,
    hbm,
    int8,
    int16,
    int32,
    private_hbm,
    psum,
    sbuf,
    shared_hbm,
    tfloat32,
    uint8,
    uint16,
    uint32,
)
from asickernels.simulate.nki.legacy import spmd
from asickernels.simulate.nki.legacy.tile import (
    IndexGrid,
    Mask,
    Storage,
    Tensor,
    allocate,
    arange,
    check_in_bounds,
    mask_values,
    mgrid,
    par_dim,
)
from asickernels.simulate.nki.tensor import (
    DTYPES,
    MemoryRegion,
    NkiTensor,
    is_float,
    is_hbm,
    nki_dtype,
)

# The tile size constants under their legacy names (nothing deprecated there).
tile_size = TileSizes()

__all__ = [
    "IndexGrid",
    "Mask",
    "arange",
    "bfloat16",
    "bool_",
    "float8_e4m3",
    "float8_e5m2",
    "float16",
    "float32",
    "hbm",
    "int8",
    "int16",
    "int32",
    "mgrid",
    "par_dim",
    "private_hbm",
    "psum",
    "sbuf",
    "shared_hbm",
    "tfloat32",
    "tile_size",
    "uint8",
    "uint16",
    "uint32",
]

Operand = Tensor | float | int


# -- dtypes ---------------------------------------------------------------------------------
def _operand_dtype(value: Any) -> np.dtype[Any]:
    """A tile's dtype; a Python scalar is weakly typed: bool -> uint8, int -> int32, float ->
    float32 (nki.api.shared.rst, "Weakly Typed Scalar Type Inference")."""
    if isinstance(value, Tensor):
        return value.dtype
    if isinstance(value, np.generic) and value.dtype in DTYPES.values():
        return value.dtype  # an explicitly typed scalar, e.g. np.float16(2)
    if isinstance(value, (bool, np.bool_)):
        return uint8
    return int32 if isinstance(value, (int, np.integer)) else float32


def _promote_pair(a: np.dtype[Any], b: np.dtype[Any]) -> np.dtype[Any]:
    a, b = (uint8 if d == bool_ else d for d in (a, b))
    if a == b:
        return a
    a_float, b_float = is_float(a), is_float(b)
    if a_float != b_float:  # (float, integer): the float type
        return a if a_float else b
    if a_float:  # the wider type; equal widths widen: fp8 pair -> bf16, fp16/bf16 -> fp32
        if a.itemsize == b.itemsize:
            return bfloat16 if a.itemsize == 1 else float32
        return a if a.itemsize > b.itemsize else b
    if a.kind == b.kind:
        return a if a.itemsize > b.itemsize else b
    signed, unsigned = (a, b) if a.kind == "i" else (b, a)
    if signed.itemsize > unsigned.itemsize:
        return signed
    widened = {1: int16, 2: int32}
    return widened.get(builtins.max(signed.itemsize, unsigned.itemsize), float32)


def promote(values: Sequence[Any]) -> np.dtype[Any]:
    """The dtype of an arithmetic result on ``values`` (general/nki/api/nki.api.shared.rst
    @0521004c, "NKI Type Promotion"): the legacy generation's rule, which its adapters pass
    to the one implementation as the result dtype (the current generation's is
    ``core_language._result_dtype``)."""
    dtypes = [_operand_dtype(v) for v in values]
    result = dtypes[0]
    for dtype in dtypes[1:]:
        result = _promote_pair(result, dtype)
    return result


# -- operands ------------------------------------------------------------------------------
def require_tile(api: str, name: str, value: Any, regions: tuple[MemoryRegion, ...]) -> Tensor:
    """``value``, a tensor in one of ``regions`` (with its block dimensions indexed)."""
    if not isinstance(value, Tensor):
        raise TypeError(f"operand '{name}' of '{api}' must be a tile, got {type(value).__name__}")
    # An instruction's result tile is placed by the compiler, which copies it between SBUF
    # and PSUM where the next instruction needs it: attention.py@8370e11 of nki-samples
    # (flash_attn_bwd) feeds a Tensor Engine nc_transpose result (PSUM) to nc_matmul.
    moved = value.storage.compiler_placed and value.on_chip and bool(set(regions) & set(ON_CHIP))
    if value.buffer not in regions and not moved:
        spaces = "|".join(sorted({"hbm" if is_hbm(r) else r.value for r in regions}))
        raise errors.UnsupportedMemory(
            f"Expected operand '{name}' of '{api}' to be in address space '{spaces}', but got "
            f"a tile in '{value.buffer.value}' instead"
        )
    if value.block_dims:
        raise TypeError(f"'{api}': index the block dimensions of {value!r} to get a tile")
    if value.on_chip and value.ndim and value.shape[0] > runtime.PMAX:
        raise errors.NumPartitionExceedArchLimit(
            f"operand '{name}' of '{api}': size of partition dimension {value.shape[0]} exceeds "
            f"architecture limitation of {runtime.PMAX}"
        )
    return value


ON_CHIP = (MemoryRegion.sbuf, MemoryRegion.psum)
HBM = (MemoryRegion.private_hbm, MemoryRegion.shared_hbm)


def broadcast_shape(api: str, shapes: Sequence[tuple[int, ...]], free_only: bool = False) -> Any:
    """The common shape of tile operands: partition axes equal or 1, free axes broadcast as
    in NumPy. ``free_only``: partition axes must be equal (operator overloads,
    nki_known_issues.rst; ``nisa`` instructions, err_num_partition_mismatch)."""
    return alu.broadcast_shape(api, shapes, partitions=not free_only)


expand = alu.expand


def as_f32(value: Operand) -> Any:
    if isinstance(value, Tensor):
        return value.read().astype(np.float32)
    return np.float32(value)


# Bitvec operators act on the integers' bits (no float32 conversion; core_language.read_bits).
BITVEC = frozenset(
    {np.bitwise_and, np.bitwise_or, np.bitwise_xor, np.left_shift, np.right_shift, np.invert}
)


def checked_inputs(
    api: str, operands: dict[str, Any], shape: tuple[int, ...], where: np.ndarray | None
) -> None:
    """Each tile operand read under ``where`` (over ``shape``) stays inside its tensor."""
    for value in operands.values():
        if isinstance(value, Tensor) and value.out_of_bounds is not None:
            reads = where
            if where is not None and value.shape != shape:
                reads = _reduce_to(where, value.shape)
            check_in_bounds(api, value, reads)


def _reduce_to(where: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The elements of an operand of ``shape`` that some executed element reads."""
    expanded_shape = shape[:1] + (1,) * (where.ndim - len(shape)) + shape[1:]
    axes = tuple(
        i for i, (a, b) in enumerate(zip(expanded_shape, where.shape, strict=True)) if a != b
    )
    return np.any(where, axis=axes, keepdims=True).reshape(shape)


def new_tile(
    shape: tuple[int, ...], dtype: np.dtype[Any], api: str, buffer: MemoryRegion = sbuf
) -> Tensor:
    """An instruction's result tile (a partition-only ``[P]`` result takes ``[P, 1]``)."""
    stored = shape if len(shape) >= 2 else (*shape, 1)
    tile = allocate(stored, dtype, buffer, "", api)
    tile.storage.compiler_placed = True
    return tile if stored == shape else tile.reshape(shape)


def compute(
    api: str,
    function: Callable[..., Any],
    operands: dict[str, Any],
    dtype: Any,
    mask: Any,
    engine: str = "vector",
    free_only: bool = False,
    default_dtype: Any = None,
    dst: Tensor | None = None,
) -> Tensor:
    """One element-wise instruction on tiles (and scalars) into a new SBUF tile (or into
    ``dst``, where ``mask`` holds): the core
    instruction (``core_language.elementwise_into``) with this generation's broadcasting,
    ``mask``, result dtype (:func:`promote` unless ``dtype`` or ``default_dtype``) and
    bounds checks of the views read."""
    from asickernels.simulate.nki.legacy import isa  # the adapter to the core

    runtime.active_run(api)
    tiles = [require_tile(api, n, v, ON_CHIP) for n, v in operands.items() if isinstance(v, Tensor)]
    if not tiles:
        raise TypeError(f"'{api}' needs at least one tile operand")
    shape = broadcast_shape(api, [t.shape for t in tiles], free_only)
    checked_inputs(api, operands, shape, mask_values(api, mask, shape))
    if dtype is None:
        dtype = default_dtype if default_dtype is not None else promote(list(operands.values()))
    read = core_language.read_bits if function in BITVEC else alu.as_f32
    core_operands = {n: isa._core_tensor(v) if isinstance(v, Tensor) else v
                     for n, v in operands.items()}  # fmt: skip
    instruction = functools.partial(
        core_language.elementwise_into, api=api, function=function, operands=core_operands,
        read=read, engine=engine, broadcast=(not free_only, True),
    )  # fmt: skip
    return isa._run_core(api, instruction, shape, nki_dtype(dtype), mask, dst, reads=tuple(tiles))


# -- ALU operators: the binary functions double as ``op=`` for nki.isa ---------------------
ALU_OPS: dict[Any, Callable[..., Any]] = {}
_COMPARISONS = {"equal", "not_equal", "greater", "greater_equal", "less", "less_equal"}
_LOGICAL = {"logical_and", "logical_or", "logical_xor"}


def _binary(name: str) -> Callable[..., Tensor]:
    function = core_language.FUNCTIONS[name]  # a numpy ufunc
    default = bool_ if name in _COMPARISONS | _LOGICAL else None

    def op(
        x: Operand, y: Operand, *, dtype: Any = default, mask: Any = None, **kwargs: Any
    ) -> Tensor:
        return compute(name, function, {"x": x, "y": y}, dtype, mask)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = (
        f"``{name}(x, y)`` element-wise on tiles or scalars (shapes broadcast; see the module "
        "docstring); ``dtype`` overrides the promoted result type; ``mask`` predicates it."
    )
    ALU_OPS[op] = function
    ALU_OPS[function] = function
    return op


add = _binary("add")
subtract = _binary("subtract")
multiply = _binary("multiply")
divide = _binary("divide")
maximum = _binary("maximum")
minimum = _binary("minimum")
power = _binary("power")
fmod = _binary("fmod")
mod = _binary("mod")
equal = _binary("equal")
not_equal = _binary("not_equal")
greater = _binary("greater")
greater_equal = _binary("greater_equal")
less = _binary("less")
less_equal = _binary("less_equal")
logical_and = _binary("logical_and")
logical_or = _binary("logical_or")
logical_xor = _binary("logical_xor")
bitwise_and = _binary("bitwise_and")
bitwise_or = _binary("bitwise_or")
bitwise_xor = _binary("bitwise_xor")
left_shift = _binary("left_shift")
right_shift = _binary("right_shift")
ALU_OPS[np.true_divide] = np.divide


def overloaded_operator(name: str, x: Any, y: Any) -> Tensor:
    """``x <op> y`` through Python operators: no partition broadcasting
    (nki_known_issues.rst: "use nki.language APIs instead")."""
    function = globals()[name]
    return compute(name, ALU_OPS[function], {"x": x, "y": y}, None, None, free_only=True,
                   default_dtype=bool_ if name in _COMPARISONS else None)  # fmt: skip


# -- unary functions ------------------------------------------------------------------------
# Activation functions run on the Scalar engine, simple arithmetic on the Vector engine.
ACTIVATIONS: dict[Any, Callable[[Any], Any]] = {}
_VECTOR_UNARY = frozenset({"abs", "negative", "reciprocal", "ceil", "floor", "trunc"})


def _unary(name: str) -> Callable[..., Tensor]:
    engine = "vector" if name in _VECTOR_UNARY else "scalar"
    function = core_language.FUNCTIONS[name]  # the math is the core's
    numpy_alias = getattr(np, name, None)  # accepted as the same op (``op=np.exp``)

    def op(x: Tensor, *, dtype: Any = None, mask: Any = None, **kwargs: Any) -> Tensor:
        return compute(name, function, {"x": x}, dtype, mask, engine)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"``{name}(x)`` element-wise (float32 math, ``{engine}`` engine)."
    ACTIVATIONS[op] = function
    if numpy_alias is not None:
        ACTIVATIONS[numpy_alias] = function
    return op


abs = _unary("abs")
negative = _unary("negative")
exp = _unary("exp")
log = _unary("log")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
reciprocal = _unary("reciprocal")
square = _unary("square")
sign = _unary("sign")
sin = _unary("sin")
cos = _unary("cos")
tan = _unary("tan")
tanh = _unary("tanh")
arctan = _unary("arctan")
ceil = _unary("ceil")
floor = _unary("floor")
trunc = _unary("trunc")
sigmoid = _unary("sigmoid")
relu = _unary("relu")
gelu = _unary("gelu")
gelu_apprx_tanh = _unary("gelu_apprx_tanh")
silu = _unary("silu")
softplus = _unary("softplus")
mish = _unary("mish")
erf = _unary("erf")
erf_dx = _unary("erf_dx")
gelu_dx = _unary("gelu_dx")
silu_dx = _unary("silu_dx")


def logical_not(x: Tensor, *, dtype: Any = bool_, mask: Any = None, **kwargs: Any) -> Tensor:
    """``not x`` element-wise (1 where ``x`` is 0)."""
    return compute("logical_not", core_language.FUNCTIONS["logical_not"], {"x": x}, dtype, mask)


def invert(x: Tensor, *, dtype: Any = None, mask: Any = None, **kwargs: Any) -> Tensor:
    """Bitwise NOT of an integer tile."""
    if is_float(x.dtype):
        raise errors.UnsupportedDtype(f"'invert' takes integer tiles, got {x.dtype}")
    return compute("invert", np.invert, {"x": x}, dtype, mask)


bitwise_not = invert


def where(
    condition: Tensor, x: Operand, y: Operand, *, dtype: Any = None, mask: Any = None, **kw: Any
) -> Tensor:
    """``x`` where ``condition`` is nonzero, else ``y`` (``y`` may be a scalar); the result
    type is the promoted type of the tiles ``x`` and ``y``."""
    if dtype is None:
        dtype = promote([v for v in (x, y) if isinstance(v, Tensor)] or [x])
    operands = {"condition": condition, "x": x, "y": y}
    return compute("where", core_language.select, operands, dtype, mask)


# -- reductions ----------------------------------------------------------------------------
def reduce(
    api: str,
    function: Any,
    x: Tensor,
    axis: Any,
    dtype: Any,
    mask: Any,
    keepdims: bool,
) -> Tensor:
    """One reduction over any free ``axis`` of ``x`` (the core ``reduce_into``, Vector
    engine). Masked-out inputs take no part; a result element whose inputs are all masked
    out is not written."""
    from asickernels.simulate.nki.legacy import isa  # the adapter to the core

    runtime.active_run(api)
    require_tile(api, "x", x, ON_CHIP)
    axes = core_language.reduce_axes(api, x, axis, trailing=False)
    where = mask_values(api, mask, x.shape)
    check_in_bounds(api, x, where)
    shape, written = reduced(x.shape, axes, keepdims, where)
    instruction = functools.partial(
        core_language.reduce_into, api=api, function=function, x=isa._core_tensor(x), axes=axes,
        keepdims=keepdims, included=where,
    )  # fmt: skip
    out_dtype = nki_dtype(dtype) if dtype is not None else x.dtype
    return isa._run_core(api, instruction, shape, out_dtype, written, reads=(x,))


def reduced(
    shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool, where: np.ndarray | None
) -> tuple[tuple[int, ...], Mask | None]:
    """The result shape of a reduction of a ``shape`` tile over ``axes`` and the elements it
    writes (those with an input ``where``, a mask over ``shape``, holds). Reducing every
    free axis leaves ``[P, 1]``: AWS's kernels broadcast the result (nki-samples
    attention.py@8370e11: ``(1.0 / sum_res).broadcast_to((128, 64))`` of a
    ``tensor_reduce(axis=(1,))``)."""
    result = core_language.reduced_shape(shape, axes, keepdims)
    result = result if len(result) >= 2 else (*result, 1)
    if where is None:
        return result, None
    written = np.any(where, axis=axes, keepdims=keepdims)
    return result, Mask(written.reshape(result))


def _reduction(name: str, function: Any, doc: str) -> Callable[..., Tensor]:
    def op(
        x: Tensor,
        axis: Any,
        *,
        dtype: Any = None,
        mask: Any = None,
        keepdims: bool = False,
        **kwargs: Any,
    ) -> Tensor:
        return reduce(name, function, x, axis, dtype, mask, keepdims)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = (
        f"{doc} over the free ``axis`` (int or list); the result has those axes removed "
        "unless ``keepdims`` (but keeps one free axis: ``[P, F]`` over axis 1 gives ``[P, 1]``)."
    )
    return op


sum = _reduction("sum", np.add, "Sum")
prod = _reduction("prod", np.multiply, "Product")
max = _reduction("max", np.maximum, "Maximum")
min = _reduction("min", np.minimum, "Minimum")
mean = _reduction("mean", core_language._mean, "Arithmetic mean (float32)")
ALU_OPS[max] = ALU_OPS[np.max] = ALU_OPS[np.amax] = np.maximum
ALU_OPS[min] = ALU_OPS[np.min] = ALU_OPS[np.amin] = np.minimum
# np.sum as a reduce_op: nki-samples@0898a77 allocated_attention.py (device-benchmarked)
# passes activation_reduce(..., reduce_op=np.sum)
ALU_OPS[sum] = ALU_OPS[np.sum] = np.add


def var(x: Tensor, axis: Any, *, dtype: Any = None, mask: Any = None, **kwargs: Any) -> Tensor:
    """Population variance over the free ``axis`` (as ``numpy.var``), float32 math."""
    return reduce("var", core_language._variance, x, axis, dtype, mask, False)


def softmax(
    x: Tensor,
    axis: Any,
    *,
    dtype: Any = None,
    compute_dtype: Any = None,
    mask: Any = None,
    **kwargs: Any,
) -> Tensor:
    """``exp(x - max) / sum(exp(x - max))`` over the trailing free ``axis`` (``compute_dtype``
    acts as ``dtype``, as the reference says)."""
    require_tile("softmax", "x", x, ON_CHIP)
    function = core_language.softmax_over(core_language.reduce_axes("softmax", x, axis))
    chosen = dtype if dtype is not None else compute_dtype
    return compute("softmax", function, {"x": x}, chosen if chosen is not None else x.dtype,
                   mask, "scalar")  # fmt: skip


def all(x: Tensor, axis: Any, *, dtype: Any = bool_, mask: Any = None, **kwargs: Any) -> Tensor:
    """Whether every element along the trailing free ``axis`` is nonzero."""
    return reduce("all", np.logical_and, x, axis, dtype, mask, False)


# -- creation ------------------------------------------------------------------------------
def ndarray(
    shape: Sequence[int], dtype: Any, *, buffer: Any = None, name: str = "", **kwargs: Any
) -> Tensor:
    """A new tensor (``buffer`` defaults to SBUF); its values read as NaN (integers: 4) until
    written. ``shared_hbm`` tensors are created at the kernel's top level
    (err_shared_hbm_must_in_kernel_level) and shared by every SPMD program."""
    buffer = sbuf if buffer is None else buffer
    if buffer is MemoryRegion.shared_hbm:
        caller = sys._getframe(1).f_code
        top_level = spmd.kernel_code()
        if top_level is not None and caller is not top_level:
            raise ErrSharedHbmMustInKernelLevel(
                f"shared_hbm tensor {name or list(shape)} created in {caller.co_name}, not at "
                "the top level of the kernel"
            )
    return allocate(shape, dtype, buffer, name, "ndarray")


def full(
    shape: Sequence[int],
    fill_value: Any,
    dtype: Any,
    *,
    buffer: Any = None,
    name: str = "",
    **kwargs: Any,
) -> Tensor:
    """A new on-chip tensor holding ``fill_value`` (one memset)."""
    buffer = sbuf if buffer is None else buffer
    tile: Tensor = core_language._filled(allocate, shape, fill_value, dtype, buffer, name)
    return tile


def zeros(
    shape: Sequence[int], dtype: Any, *, buffer: Any = None, name: str = "", **kwargs: Any
) -> Tensor:
    return full(shape, 0, dtype, buffer=buffer, name=name)


def ones(
    shape: Sequence[int], dtype: Any, *, buffer: Any = None, name: str = "", **kwargs: Any
) -> Tensor:
    return full(shape, 1, dtype, buffer=buffer, name=name)


def zeros_like(
    a: Tensor, dtype: Any = None, *, buffer: Any = None, name: str = "", **kwargs: Any
) -> Tensor:
    return zeros(a.shape, dtype or a.dtype, buffer=buffer, name=name)


def empty_like(
    a: Tensor, dtype: Any = None, *, buffer: Any = None, name: str = "", **kwargs: Any
) -> Tensor:
    return ndarray(a.shape, dtype or a.dtype, buffer=buffer, name=name)


def shared_constant(constant: Any, dtype: Any = None, **kwargs: Any) -> Tensor:
    """A constant HBM tensor holding ``constant`` (cast to ``dtype``), e.g. to ``nl.load``:
    the core ``shared_constant``."""
    values = np.asarray(constant)
    cast = values if dtype is None else alu.cast(values, nki_dtype(dtype))
    return Tensor.whole(Storage(core_language.shared_constant(cast)))


def shared_identity_matrix(n: int, dtype: Any = uint8, **kwargs: Any) -> Tensor:
    """A constant ``[n, n]`` identity matrix in HBM."""
    return shared_constant(np.identity(int(n)), dtype)


# -- data movement: the core DMA and copy instructions, after this generation's index grids,
# masks and broadcasting are resolved ------------------------------------------------------
def load(src: Tensor, *, mask: Any = None, dtype: Any = None, **kwargs: Any) -> Tensor:
    """A new SBUF tile with the values of the HBM view ``src``: the core ``nisa.dma_copy``."""
    return _load("load", src, mask, dtype)


def _load(api: str, src: Tensor, mask: Any, dtype: Any) -> Tensor:
    """``nl.load`` or, of a transposed view, ``nl.load_transpose2d`` (traced as ``api``)."""
    from asickernels.simulate.nki.legacy import isa  # the instruction adapter

    require_tile(api, "src", src, HBM)
    out_dtype = nki_dtype(dtype) if dtype is not None else src.dtype
    return isa._run_core(api, core_isa.dma_copy, src.shape, out_dtype, mask, src=src)


def store(dst: Tensor, value: Any, *, mask: Any = None, **kwargs: Any) -> None:
    """Writes ``value`` (an SBUF or PSUM tile, or a scalar) into the HBM view ``dst``: the
    core ``nisa.dma_copy``; a tile broadcasts partition-first to ``dst``'s shape."""
    from asickernels.simulate.nki.legacy import isa  # the instruction adapter

    api = "store"
    runtime.active_run(api)
    require_tile(api, "dst", dst, HBM)
    if isinstance(value, Tensor):
        require_tile(api, "value", value, ON_CHIP)
        if value.shape[0] == dst.shape[0] and value.size == dst.size:
            # A DMA moves the elements in order: AWS's tests store a [128, 64, 4] result
            # into a [128, 4, 16, 4] tensor (nki/test/test_nki_isa_local_gather.py@81ce03a)
            # and a [1, 1] tile into ``out_dsinks_ref[b, h]`` of shape [1]
            # (nki-samples attention.py@8370e11, flash_attn_bwd).
            value = value.reshape(dst.shape)
        source = _broadcast_source(api, value, dst, mask_values(api, mask, dst.shape))
    else:  # a scalar: the values the DMA delivers, already in dst's dtype
        values = alu.cast(np.full(dst.shape, value), dst.dtype)
        source = NkiTensor(values, dst.dtype, sbuf, None)
    isa._run_core(api, core_isa.dma_copy, dst.shape, dst.dtype, mask, dst, reads=(value,),
                  src=source)  # fmt: skip


def _broadcast_source(api: str, value: Tensor, dst: Tensor, where: np.ndarray | None) -> NkiTensor:
    """The on-chip tile ``value`` broadcast partition-first to ``dst``'s shape, as the core
    operand of a copy into ``dst`` (its reads under ``where`` checked in bounds)."""
    shape = broadcast_shape(api, [dst.shape, value.shape])
    if shape != dst.shape:
        raise errors.StoreDstShapeSmallerThanOtherShape(
            f"Illegal assignment destination shape in 'a = b': shape {list(dst.shape)} of "
            f"parameter 'a' is smaller than other parameter shapes b{list(value.shape)}"
        )
    checked_inputs(api, {"value": value}, shape, where)
    return NkiTensor(expand(value.read(), shape), value.dtype, sbuf, None)


def atomic_rmw(dst: Tensor, value: Any, op: Any, *, mask: Any = None, **kwargs: Any) -> None:
    """``dst = op(dst, value)`` on an HBM view, atomically per element: repeated indices
    all apply (``op``: ``np.add`` only, as documented)."""
    api = "atomic_rmw"
    run = runtime.active_run(api)
    require_tile(api, "dst", dst, HBM)
    dst.storage.check_writable(api)
    if op not in (np.add, add):
        raise errors.UnsupportedOperator(f"'{api}' supports only np.add, got {op!r}")
    where = mask_values(api, mask, dst.shape)
    check_in_bounds(api, dst, where)
    if isinstance(value, Tensor):
        require_tile(api, "value", value, ON_CHIP)
        checked_inputs(api, {"value": value}, dst.shape, where)
        values = expand(as_f32(value), broadcast_shape(api, [dst.shape, value.shape]))
    else:
        values = np.full(dst.shape, np.float32(value))
    selected = np.ones(dst.shape, np.bool_) if where is None else np.array(where)
    offsets = dst.offsets[selected]
    totals = dst.storage.flat.astype(np.float64)
    np.add.at(totals, offsets, np.broadcast_to(values, dst.shape)[selected])
    touched = np.unique(offsets)  # the rest of the storage is not rewritten (nor rounded)
    dst.storage.flat[touched] = alu.cast(totals[touched].astype(np.float32), dst.dtype)
    run.count_dma(False, True, dst.size * dst.itemsize, api, (value, dst), (dst,))


def gather_flattened(data: Tensor, indices: Tensor, *, mask: Any = None, dtype: Any = None,
                     **kwargs: Any) -> Tensor:  # fmt: skip
    """Per partition, ``data``'s flattened free elements at the uint32 ``indices`` (the result
    has ``indices``' shape): the current API's ``nisa.nc_n_gather``. Out-of-range indices
    give garbage on device; here they raise."""
    from asickernels.simulate.nki.legacy import isa  # the instruction it runs

    api = "gather_flattened"
    runtime.active_run(api)
    source = require_tile(api, "data", data, ON_CHIP)
    index = require_tile(api, "indices", indices, ON_CHIP)
    check_in_bounds(api, source, None)
    check_in_bounds(api, index, mask_values(api, mask, index.shape))
    out_dtype = nki_dtype(dtype) if dtype is not None else source.dtype
    # GpSimd reads SBUF; the legacy compiler places a PSUM operand there.
    return isa._run_core(
        api, core_isa.nc_n_gather, index.shape, out_dtype, mask, core_dtype=source.dtype,
        reads=(source, index), data=isa._core_tensor(source, sbuf),
        indices=isa._core_tensor(index, sbuf),
    )  # fmt: skip


def copy(src: Any, *, mask: Any = None, dtype: Any = None, **kwargs: Any) -> Tensor:
    """A new SBUF tile with the values of the on-chip tile ``src``: the core
    ``nisa.tensor_copy`` (Vector engine; a bit copy for the same dtype)."""
    from asickernels.simulate.nki.legacy import isa  # the instruction adapter

    tile = require_tile("copy", "src", src, ON_CHIP)
    out_dtype = nki_dtype(dtype) if dtype is not None else tile.dtype
    return isa._run_core("copy", core_isa.tensor_copy, tile.shape, out_dtype, mask, src=tile)


class LoopReduction:
    """What ``nl.loop_reduce`` returns: ``x`` to be combined by ``op`` into the tile it is
    assigned to ("the destination tile is also the rhs input to ``op``"). Assign it into a
    view (``dst[...] = nl.loop_reduce(x, ...)``, as nki-samples attention.py@8370e11 does);
    the simulator cannot see a destination that is a rebound Python name."""

    def __init__(self, x: Tensor, function: Callable[..., Any], dtype: Any, mask: Any) -> None:
        self.x, self.function, self.dtype, self.mask = x, function, dtype, mask

    def __repr__(self) -> str:
        return f"loop_reduce({self.x!r})"


def loop_reduce(
    x: Tensor, op: Any, loop_indices: Any, *, dtype: Any = None, mask: Any = None, **kwargs: Any
) -> LoopReduction:
    """``dst[...] = loop_reduce(x, op, loop_indices)`` computes ``dst = op(dst, x)`` (one
    Vector-engine instruction, float32 math, cast to ``dtype`` or ``dst``'s dtype);
    ``loop_indices`` only guide the compiler's loop optimisations."""
    require_tile("loop_reduce", "x", x, ON_CHIP)
    if op not in ALU_OPS:
        raise errors.UnsupportedOperator(f"'loop_reduce' does not take op={op!r}")
    return LoopReduction(x, ALU_OPS[op], dtype, mask)


def assign(dst: Tensor, value: Any) -> None:
    """``dst[...] = value``: writes a tile (broadcast from source to destination) or a scalar
    into an on-chip view: the core ``nisa.tensor_copy`` or ``nisa.memset`` (Vector engine); a
    :class:`LoopReduction` combines into it."""
    from asickernels.simulate.nki.legacy import isa  # the instruction adapter

    api = "assign"
    runtime.active_run(api)
    require_tile(api, "dst", dst, ON_CHIP)
    if isinstance(value, LoopReduction):
        # traced as writing dst, so that what reads the reduction waits for it
        compute("loop_reduce", value.function, {"dst": dst, "x": value.x},
                value.dtype or dst.dtype, value.mask, dst=dst)  # fmt: skip
    elif isinstance(value, Tensor):
        require_tile(api, "value", value, ON_CHIP)
        source = _broadcast_source(api, value, dst, None)
        isa._run_core(api, core_isa.tensor_copy, dst.shape, dst.dtype, None, dst,
                      reads=(value,), src=source)  # fmt: skip
    else:
        isa._run_core(api, core_isa.memset, dst.shape, dst.dtype, None, dst, value=value)


def accumulate(dst: Tensor, value: Tensor) -> None:
    """``dst += value`` for PSUM tiles: matmul results accumulate in PSUM, in float32,
    without another instruction. Elements nothing has written yet take ``value`` (the first
    matmul of an accumulation group overwrites, as the attention tutorial's ``nl.ndarray``
    PSUM accumulators rely on; the current API's ``nc_matmul(accumulate=None)`` alike)."""
    api = "accumulate"
    run = runtime.active_run(api)
    require_tile(api, "dst", dst, (MemoryRegion.psum,))
    require_tile(api, "value", value, (MemoryRegion.psum,))
    run.follow(api, (value, dst), (dst,))
    shape = broadcast_shape(api, [dst.shape, value.shape])
    if shape != dst.shape:
        raise errors.StoreDstShapeSmallerThanOtherShape(
            f"'{api}' of {value!r} into the smaller {dst!r}"
        )
    checked_inputs(api, {"value": value}, shape, None)
    if runtime.values_skipped():  # trace-only: no values, only the write's checks
        dst.write(np.zeros((), np.float32), None, api)
        return
    added = expand(as_f32(value), shape)
    assert dst.storage.written is not None
    written = dst.storage.written[dst.offsets]
    dst.write(np.where(written, as_f32(dst) + added, added), None, api)


def broadcast_to(src: Tensor, *, shape: Sequence[int], **kwargs: Any) -> Tensor:
    """A read-only view of ``src`` repeated to ``shape`` (NumPy rules, partition axis
    included: a one-partition tile is repeated across partitions)."""
    require_tile("broadcast_to", "src", src, ON_CHIP)
    target = tuple(int(s) for s in shape)
    if src.shape == target:
        return src
    try:
        offsets = np.broadcast_to(src.offsets, target)
    except ValueError:
        raise errors.ShapeMismatch(f"cannot broadcast {src!r} to {list(target)}") from None
    oob = None if src.out_of_bounds is None else np.broadcast_to(src.out_of_bounds, target)
    if target[0] != src.shape[0]:  # the partition broadcast is a TensorE instruction
        runtime.active_run("broadcast_to").count("tensor", "broadcast_to", (src,))
    return Tensor(src.storage, offsets, 0, oob, repeats=True, dynamic=src.dynamic)


# -- Tensor engine -------------------------------------------------------------------------
def matmul(
    x: Tensor, y: Tensor, *, transpose_x: bool = False, mask: Any = None, **kwargs: Any
) -> Tensor:
    """``x @ y`` (or ``x.T @ y`` with ``transpose_x``) on the Tensor engine, a float32 PSUM
    tile: ``x`` partition <= 128 and free <= 128, ``y`` partition <= 128 and free <= 512.
    Without ``transpose_x`` an extra transpose of ``x`` runs first, as the SDK lowers it."""
    from asickernels.simulate.nki.legacy import isa  # the instruction it runs

    stationary = x if transpose_x else transpose(x)
    return isa.tensor_engine_matmul("matmul", stationary, y, mask)


def transpose(x: Tensor, *, dtype: Any = None, mask: Any = None, **kwargs: Any) -> Tensor:
    """Swaps the partition and free dimension of a 2-D tile (each <= 128), a new SBUF tile
    (Tensor engine)."""
    from asickernels.simulate.nki.legacy import isa  # the adapter to the core

    api = "transpose"
    runtime.active_run(api)
    require_tile(api, "x", x, ON_CHIP)
    if x.ndim != 2:
        raise errors.ExceedMaxSupportedDimension(f"'{api}' takes a 2-D tile, got {x!r}")
    for axis, size in enumerate(x.shape):
        if size > runtime.PMAX:
            raise errors.SizeOfDimensionExceedArchLimit(
                f"size of dimension {axis} in 'x{list(x.shape)}' of '{api}' exceed architecture "
                f"limitation of {runtime.PMAX}"
            )
    check_in_bounds(api, x, None)
    instruction = functools.partial(
        core_isa._nc_transpose, engine=core_isa.engine.tensor, tensor_dst=ON_CHIP, api=api
    )
    out_dtype = nki_dtype(dtype) if dtype is not None else x.dtype
    # The Tensor engine reads SBUF; the compiler copies a PSUM tile there.
    return isa._run_core(api, instruction, x.shape[::-1], out_dtype, mask, masked_inputs=False,
                         reads=(x,), data=isa._core_tensor(x, sbuf))  # fmt: skip


# -- loops, SPMD, indexing, debugging ------------------------------------------------------
class TracedRange:
    """What ``affine_range``/``sequential_range`` return: the iterations of ``range(*args)``,
    run in order here. The SDK traces such a loop's body once, which direct allocation
    inside it sees (:func:`spmd.traced_placement`)."""

    def __init__(self, *args: int) -> None:
        self.values = range(*args)

    def __iter__(self) -> Iterator[int]:
        return spmd.traced_loop(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: Any) -> Any:
        return self.values[index]

    def __repr__(self) -> str:
        return f"TracedRange({self.values.start}, {self.values.stop}, {self.values.step})"


def affine_range(*args: int, **kwargs: Any) -> TracedRange:
    """Loop iterations without carried dependencies (run in order here)."""
    return TracedRange(*args)


def sequential_range(*args: int, **kwargs: Any) -> TracedRange:
    """Loop iterations with carried dependencies (run in order)."""
    return TracedRange(*args)


def static_range(*args: int) -> range:
    """A fully unrolled loop (run in order)."""
    return range(*args)


def ds(start: int, size: int) -> slice:
    """The index range ``[start, start + size)``."""
    return slice(start, start + size)


def program_id(axis: int) -> int:
    """This program's index along ``axis`` of the SPMD launch grid."""
    return spmd.program_id(axis)


def num_programs(axes: Any = None) -> int:
    """Programs along ``axes`` of the launch grid (``None``: all of them)."""
    return spmd.num_programs(axes)


def program_ndim() -> int:
    """Number of dimensions of the launch grid."""
    return spmd.program_ndim()


def expand_dims(data: Tensor, axis: Any) -> Tensor:
    """A view of ``data`` with size-1 axes inserted after its last axis (the only positions
    the reference supports)."""
    axes = sorted(int(a) for a in (axis if isinstance(axis, (tuple, list)) else [axis]))
    if axes != list(range(data.ndim, data.ndim + len(axes))):
        raise errors.ShapeMismatch(
            f"'expand_dims' of {data!r} at {axis}: only axes after the last one are supported"
        )
    view = data
    for position in axes:
        view = view.expand_dims(position)
    return view


def load_transpose2d(src: Tensor, *, mask: Any = None, dtype: Any = None, **kwargs: Any) -> Tensor:
    """A new SBUF tile with the 2-D HBM view ``src`` transposed (a DMA)."""
    require_tile("load_transpose2d", "src", src, HBM)
    if src.ndim != 2:
        raise errors.ExceedMaxSupportedDimension(f"'load_transpose2d' takes 2-D, got {src!r}")
    oob = None if src.out_of_bounds is None else src.out_of_bounds.T
    transposed = Tensor(src.storage, src.offsets.T, 0, oob, src.repeats, src.dynamic)
    return _load("load_transpose2d", transposed, mask, dtype)


class fp32:
    """float32 constants (``nl.fp32.min``: the most negative float32)."""

    min = float(np.finfo(np.float32).min)


def finfo(dtype: Any) -> Any:
    """Machine limits of a float dtype (``numpy.finfo``; ml_dtypes for bfloat16 and fp8)."""
    return ml_dtypes.finfo(nki_dtype(dtype))


def nc(cores: int) -> int:
    """A launch-grid dimension of ``cores`` logical NeuronCores (``kernel[nl.nc(2), 2]``).
    It only places programs on cores: here the grid runs serially, program ids unchanged."""
    return int(cores)


def spmd_dim(*sizes: int) -> int:
    """A launch-grid dimension tiled into sub-dimensions (``nl.spmd_dim(nl.nc(2), 2)``): its
    size is their product; the tiling only places programs on cores."""
    return math.prod(int(s) for s in sizes)


# -- random numbers: the run's generator (the core instructions' too), seeded 0 unless
# nl.random_seed sets it -------------------------------------------------------------------
def random_seed(seed: Any, *, mask: Any = None, **kwargs: Any) -> None:
    """Seeds the random number generator (the same seed gives the same sequence): the
    core ``random_seed``."""
    core_language.random_seed(int(seed.read().reshape(-1)[0]) if isinstance(seed, Tensor) else seed)


def rand(shape: Sequence[int], dtype: Any = float32, **kwargs: Any) -> Tensor:
    """A new SBUF tile of uniform random values in [0, 1) (the core ``rand``)."""
    from asickernels.simulate.nki.legacy import isa  # the adapter to the core

    dims = tuple(int(s) for s in shape)
    return isa._run_core("rand", core_language.rand_into, dims, nki_dtype(dtype), None)


def dropout(x: Tensor, rate: Any, *, dtype: Any = None, mask: Any = None, **kwargs: Any) -> Tensor:
    """``x`` with each element zeroed with probability ``rate`` (a scalar or a one-element
    tile): the instruction ``nisa.dropout``."""
    from asickernels.simulate.nki.legacy import isa  # the instruction it runs

    probability = float(as_f32(rate).reshape(-1)[0]) if isinstance(rate, Tensor) else float(rate)
    return isa.dropout(x, probability, mask=mask, dtype=dtype)


def device_print(prefix: str, x: Any, *, mask: Any = None, **kwargs: Any) -> None:
    """Prints ``prefix`` and the values of ``x`` now (the simulator runs eagerly; the SDK
    prints only under ``nki.simulate_kernel``)."""
    runtime.active_run("device_print")
    print(prefix, x.read() if isinstance(x, Tensor) else x)


def static_cast(input_data: np.ndarray, dtype: Any) -> np.ndarray:
    """Host-side conversion of NumPy data to an NKI dtype (e.g. bfloat16)."""
    return np.asarray(input_data).astype(nki_dtype(dtype))
