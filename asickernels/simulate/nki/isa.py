"""``nki.isa`` (``nisa``): the instructions our kernels use, with the SDK's names and
signatures (the destination first). Each call is one instruction on one engine, counted
per run; DMAs are counted with the bytes they move."""

from __future__ import annotations

import enum
import math
from typing import Any

import numpy as np

from asickernels.simulate.nki import alu, errors, language, runtime
from asickernels.simulate.nki.errors import NkiValidationError
from asickernels.simulate.nki.tensor import MemoryRegion, NkiTensor

__all__ = [
    "NkiValidationError",
    "dge_mode",
    "dma_copy",
    "engine",
    "get_nc_version",
    "iota",
    "matmul_perf_mode",
    "memset",
    "nc_matmul",
    "nc_version",
    "oob_mode",
    "tensor_copy",
    "tensor_copy_predicated",
    "tensor_partition_reduce",
    "tensor_reduce",
    "tensor_scalar",
    "tensor_tensor",
]


# The enums keep the SDK's (lowercase) names and values.
class engine(enum.Enum):
    """The NeuronCore engines an instruction can be placed on."""

    tensor = 1
    vector = 5
    scalar = 2
    gpsimd = 3
    dma = 4
    sync = 6
    unknown = 0


class oob_mode(enum.Enum):
    """Out-of-bounds handling of indirect DMAs (the simulator raises on any)."""

    error = 0
    skip = 1


class dge_mode(enum.Enum):
    """DMA descriptor generation (no effect in the simulator)."""

    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class matmul_perf_mode(enum.Enum):
    """Tensor Engine performance modes (only ``none`` is simulated)."""

    none = "none"
    double_row = "double_row"


class nc_version(enum.Enum):
    """NeuronCore generations: gen2 = trn1/inf2, gen3 = trn2, gen4 = trn3."""

    gen2 = 2
    gen3 = 3
    gen4 = 4


def get_nc_version() -> nc_version:
    """The simulated target (``NEURON_PLATFORM_TARGET_OVERRIDE``)."""
    return nc_version(runtime.current_target().version)


_INTEGER_32 = (np.dtype(np.int32), np.dtype(np.uint32))
_MATMUL_INPUT_DTYPES = (language.bfloat16, language.float16, language.float32)
_REDUCE_OPS = (language.add, language.maximum, language.minimum, language.multiply)
_PARTITION_REDUCE_OPS = (language.add, language.maximum)


def _engine(api: str, requested: engine, default: str, allowed: tuple[str, ...]) -> str:
    if requested is engine.unknown:
        return default
    if requested.name not in allowed:
        raise errors.UnsupportedEngine(f"'{api}' runs on {'/'.join(allowed)}, not {requested.name}")
    return requested.name


def _alu(api: str, op: Any, allowed: tuple[Any, ...] | None = None) -> Any:
    if op not in language.ALU_OPS or (allowed is not None and op not in allowed):
        names = ", ".join(f"nl.{o.__name__}" for o in (allowed or language.ALU_OPS))
        raise errors.UnsupportedOperator(f"'{api}' does not take op={op!r}; it takes {names}")
    return language.ALU_OPS[op]


def _exact_integers(tile: NkiTensor) -> Any:
    """GpSimd reads 32-bit integers exactly, everything else as float32."""
    return tile.data.astype(np.int64) if tile.dtype in _INTEGER_32 else alu.as_f32(tile)


# -- data movement ------------------------------------------------------------------------
def dma_copy(
    dst: NkiTensor,
    src: NkiTensor,
    priority: Any = None,
    oob_mode: oob_mode = oob_mode.error,
    dge_mode: dge_mode = dge_mode.unknown,
    engine: engine = engine.unknown,
    name: Any = None,
) -> None:
    """``dst = src`` by DMA between HBM and SBUF (any views with equally many elements;
    different dtypes are cast through float32)."""
    api = "dma_copy"
    run = runtime.active_run(api)
    alu.require(api, "dst", dst, (*alu.HBM, *alu.SBUF))
    alu.require(api, "src", src, (*alu.HBM, *alu.SBUF))
    if dst.size != src.size:
        raise errors.ShapeMismatch(f"'{api}' from {src!r} to {dst!r}: element counts differ")
    alu.write(dst, alu.dma_values(src, dst.dtype), api)
    run.count_dma(not src.on_chip, not dst.on_chip, src.size * src.dtype.itemsize)


def tensor_copy(
    dst: NkiTensor, src: NkiTensor, engine: engine = engine.unknown, name: Any = None
) -> None:
    """``dst = src`` on chip (bit copy for equal dtypes, else through float32)."""
    api = "tensor_copy"
    run = runtime.active_run(api)
    tiles = [alu.require(api, "dst", dst, alu.ON_CHIP), alu.require(api, "src", src, alu.ON_CHIP)]
    alu.check_elements(api, {"dst": dst, "src": src})
    chosen = _engine(api, engine, "vector", ("vector", "scalar", "gpsimd"))
    if chosen == "gpsimd":
        alu.check_no_psum_on_gpsimd(api, tiles)
    if chosen == "scalar" and runtime.current_target().version == 2:
        raise errors.UnsupportedEngine(
            f"'{api}' cannot run on the Scalar engine of NeuronCore-v2; use nisa.activation"
        )
    alu.write(dst, src.data if src.dtype == dst.dtype else alu.as_f32(src), api)
    run.count(chosen)


def memset(dst: NkiTensor, value: float, engine: engine = engine.unknown, name: Any = None) -> None:
    """Fills the on-chip ``dst`` with the constant ``value``."""
    api = "memset"
    run = runtime.active_run(api)
    tiles = [alu.require(api, "dst", dst, alu.ON_CHIP)]
    chosen = _engine(api, engine, "vector", ("vector", "gpsimd"))
    if chosen == "gpsimd":
        alu.check_no_psum_on_gpsimd(api, tiles)
    alu.write(dst, np.full(dst.shape, value), api)
    run.count(chosen)


def tensor_copy_predicated(
    dst: NkiTensor,
    src: float | NkiTensor,
    predicate: NkiTensor,
    reverse_pred: bool = False,
    name: Any = None,
) -> None:
    """Copies ``src`` into ``dst`` where ``predicate`` (uint8/16/32) is nonzero (zero, with
    ``reverse_pred``); elsewhere ``dst`` keeps its values. Vector engine."""
    api = "tensor_copy_predicated"
    run = runtime.active_run(api)
    alu.require(api, "dst", dst, alu.ON_CHIP)
    alu.require(api, "predicate", predicate, alu.ON_CHIP)
    operands = {"dst": dst, "src": src, "predicate": predicate}
    alu.check_on_chip(api, operands)  # src may be a scalar
    alu.check_not_both_psum(api, src, predicate)
    alu.check_elements(api, operands)
    if predicate.dtype not in (language.uint8, language.uint16, language.uint32):
        raise errors.UnsupportedDtype(
            f"'{api}' predicate must be uint8/16/32, got {predicate.dtype}"
        )
    if isinstance(src, NkiTensor) and src.dtype != dst.dtype:
        raise errors.UnsupportedDtype(
            f"'{api}' needs src and dst of one dtype, got {src.dtype}, {dst.dtype}"
        )
    chosen = predicate.data.reshape(dst.shape) != 0
    if reverse_pred:
        chosen = ~chosen
    values = src.data.reshape(dst.shape) if isinstance(src, NkiTensor) else alu.as_f32(src)
    alu.write(dst, np.where(chosen, alu.cast(np.asarray(values), dst.dtype), dst.data), api)
    run.count("vector")


# -- Tensor engine --------------------------------------------------------------------------
def nc_matmul(
    dst: NkiTensor,
    stationary: NkiTensor,
    moving: NkiTensor,
    is_stationary_onezero: bool = False,
    is_moving_onezero: bool = False,
    is_transpose: bool = False,
    accumulate: bool | None = None,
    tile_position: tuple[int, ...] = (),
    tile_size: tuple[int, ...] = (),
    perf_mode: matmul_perf_mode = matmul_perf_mode.none,
    name: Any = None,
) -> None:
    """``dst = stationary.T @ moving`` on the Tensor engine: ``stationary [K, M]`` and
    ``moving [K, N]`` in SBUF (K <= 128 partitions, M <= 128, N <= 512), ``dst [M, N]``
    float32 in PSUM. ``accumulate``: False overwrites, True adds, None adds where an earlier
    matmul wrote (accumulation is float32, as in PSUM)."""
    api = "nc_matmul"
    run = runtime.active_run(api)
    if tile_position or tile_size or perf_mode is not matmul_perf_mode.none:
        raise NotImplementedError("Tensor Engine tiling and performance modes are not simulated")
    operands = {
        "dst": alu.require(api, "dst", dst, alu.PSUM),
        "stationary": alu.require(api, "stationary", stationary, alu.SBUF),
        "moving": alu.require(api, "moving", moving, alu.SBUF),
    }
    for operand, tile in operands.items():
        if tile.ndim != 2:
            raise errors.ExceedMaxSupportedDimension(
                f"parameter '{operand}' {tile!r} of '{api}' exceeds max supported number of "
                "dimensions of 2"
            )
    alu.check_partitions(api, {"stationary": stationary, "moving": moving})
    (_, m), (_, n) = stationary.shape, moving.shape
    for operand, size, limit in (
        ("stationary", m, language.tile_size.gemm_stationary_fmax),
        ("moving", n, language.tile_size.gemm_moving_fmax),
    ):
        if size > limit:
            raise errors.SizeOfDimensionExceedArchLimit(
                f"free size {size} of '{operand}' of '{api}' exceeds architecture limitation of {limit}"
            )
    if dst.shape != (m, n):
        raise errors.ShapeMismatch(
            f"'{api}' of {stationary!r}.T @ {moving!r} needs dst [{m}, {n}], got {dst!r}"
        )
    for operand, tile in (("stationary", stationary), ("moving", moving)):
        if tile.dtype not in _MATMUL_INPUT_DTYPES:
            raise errors.UnsupportedDtype(
                f"'{operand}' of '{api}' is {tile.dtype}; the Tensor Engine takes bfloat16, "
                "float16, float32 (and fp8), not integers: cast int8 to bfloat16 (exact)"
            )
    if (stationary.dtype == language.float32) != (moving.dtype == language.float32):
        raise errors.UnsupportedDtype(
            f"'{api}' mixes {stationary.dtype} and {moving.dtype}: if one input is float32 the "
            "other must be too"
        )
    if dst.dtype != language.float32 and not (
        dst.dtype == language.bfloat16 and runtime.current_target().version >= 4
    ):
        raise errors.UnsupportedDtype(f"'{api}' writes a float32 PSUM tile, got dst {dst.dtype}")
    product = alu.as_f32(stationary).T @ alu.as_f32(moving)
    written = _matmul_written(dst)
    if accumulate is None:
        product = np.where(written, alu.as_f32(dst) + product, product)
    elif accumulate:
        product = alu.as_f32(dst) + product
    written[...] = True
    alu.write(dst, product, api)
    run.count("tensor")


def _matmul_written(dst: NkiTensor) -> np.ndarray:
    """A writable boolean view, shaped like ``dst``, of which PSUM elements of its storage a
    matmul has written."""
    root = dst.data if dst.data.base is None else dst.data.base
    allocation = dst.allocation
    assert allocation is not None and isinstance(root, np.ndarray)
    if allocation.matmul_written is None:
        allocation.matmul_written = np.zeros(root.size, np.bool_)
    itemsize = dst.dtype.itemsize
    offset = (dst.data.ctypes.data - root.ctypes.data) // itemsize
    return np.lib.stride_tricks.as_strided(
        allocation.matmul_written[offset:],
        shape=dst.shape,
        strides=tuple(stride // itemsize for stride in dst.data.strides),
    )


# -- Vector / Scalar / GpSimd engines -------------------------------------------------------
def tensor_tensor(
    dst: NkiTensor,
    data1: NkiTensor,
    data2: NkiTensor,
    op: Any,
    engine: engine = engine.unknown,
    name: Any = None,
) -> None:
    """``dst = op(data1, data2)`` element-wise; equal partitions and elements per partition;
    not both inputs in PSUM. All-int32 operands default to GpSimd (exact integer math),
    everything else to Vector (float32 math)."""
    api = "tensor_tensor"
    run = runtime.active_run(api)
    operands = {
        "dst": alu.require(api, "dst", dst, alu.ON_CHIP),
        "data1": alu.require(api, "data1", data1, alu.ON_CHIP),
        "data2": alu.require(api, "data2", data2, alu.ON_CHIP),
    }
    tiles = list(operands.values())
    alu.check_not_both_psum(api, data1, data2)
    alu.check_elements(api, operands)
    function = _alu(api, op)
    integers = all(t.dtype in _INTEGER_32 for t in tiles)
    in_psum = any(t.buffer is MemoryRegion.psum for t in tiles)
    chosen = _engine(
        api, engine, "gpsimd" if integers and not in_psum else "vector", ("vector", "gpsimd")
    )
    if chosen == "gpsimd":
        alu.check_no_psum_on_gpsimd(api, tiles)
    read = _exact_integers if chosen == "gpsimd" and integers else alu.as_f32
    alu.write(dst, np.asarray(function(read(data1), read(data2).reshape(data1.shape))), api)
    run.count(chosen)


def tensor_scalar(
    dst: NkiTensor,
    data: NkiTensor,
    op0: Any,
    operand0: float | NkiTensor,
    reverse0: bool = False,
    op1: Any = None,
    operand1: float | NkiTensor | None = None,
    reverse1: bool = False,
    engine: engine = engine.unknown,
    name: Any = None,
) -> None:
    """``dst = (data op0 operand0) op1 operand1`` in float32; each operand a scalar or a
    float32 ``[partitions, 1]`` tile broadcast along the free axes; ``reverse`` swaps the
    sides of its operator."""
    api = "tensor_scalar"
    run = runtime.active_run(api)
    if (op1 is None) != (operand1 is None):
        raise TypeError(f"'{api}': give op1 and operand1 together")
    operands = {
        "dst": alu.require(api, "dst", dst, alu.ON_CHIP),
        "data": alu.require(api, "data", data, alu.ON_CHIP),
    }
    tiles = alu.check_on_chip(api, {**operands, "operand0": operand0, "operand1": operand1})
    alu.check_elements(api, operands)
    chosen = _engine(api, engine, "vector", ("vector", "scalar", "gpsimd"))
    if chosen == "gpsimd":
        alu.check_no_psum_on_gpsimd(api, tiles)
    values = alu.as_f32(data)
    steps: list[tuple[Any, Any, bool, str]] = [(op0, operand0, reverse0, "operand0")]
    if op1 is not None:
        steps.append((op1, operand1, reverse1, "operand1"))
    for op, operand, reverse, operand_name in steps:
        function = _alu(api, op)
        if isinstance(operand, NkiTensor):
            if operand.shape[0] != data.shape[0] or alu.per_partition(operand) != 1:
                alu.check_partitions(api, {"data": data, operand_name: operand})
                raise errors.ShapeMismatch(
                    f"'{api}' {operand_name} must be [partitions, 1], got {operand!r}"
                )
            if operand.dtype != language.float32:
                raise errors.UnsupportedDtype(
                    f"'{api}' {operand_name} must be float32, got {operand.dtype}"
                )
            scalar = alu.as_f32(operand).reshape((data.shape[0],) + (1,) * (data.ndim - 1))
        else:
            scalar = alu.as_f32(operand)
        result = function(scalar, values) if reverse else function(values, scalar)
        values = np.asarray(result, np.float32)
    alu.write(dst, values, api)
    run.count(chosen)


def tensor_reduce(
    dst: NkiTensor,
    op: Any,
    data: NkiTensor,
    axis: Any,
    negate: bool = False,
    keepdims: bool = False,
    name: Any = None,
) -> None:
    """``dst = op``-reduction of ``data`` over its trailing free ``axis`` (Vector engine)."""
    api = "tensor_reduce"
    run = runtime.active_run(api)
    operands = {
        "dst": alu.require(api, "dst", dst, alu.ON_CHIP),
        "data": alu.require(api, "data", data, alu.ON_CHIP),
    }
    alu.check_partitions(api, operands)
    axes = language.reduce_axes(api, data, axis)
    function = _alu(api, op, _REDUCE_OPS)
    values = function.reduce(alu.as_f32(data), axis=axes, keepdims=keepdims)
    if alu.per_partition(dst) != values.size // data.shape[0]:
        raise errors.ShapeMismatch(f"'{api}' of {data!r} over {axes} does not fit {dst!r}")
    alu.write(dst, -values if negate else values, api)
    run.count("vector")


def tensor_partition_reduce(dst: NkiTensor, op: Any, data: NkiTensor, name: Any = None) -> None:
    """``dst [1, ...] = op``-reduction of ``data`` across its partitions (GpSimd engine)."""
    api = "tensor_partition_reduce"
    run = runtime.active_run(api)
    tiles = [alu.require(api, "dst", dst, alu.ON_CHIP), alu.require(api, "data", data, alu.ON_CHIP)]
    alu.check_no_psum_on_gpsimd(api, tiles)
    function = _alu(api, op, _PARTITION_REDUCE_OPS)
    if dst.shape[0] != 1 or alu.per_partition(dst) != alu.per_partition(data):
        raise errors.ShapeMismatch(
            f"'{api}' of {data!r} needs dst [1, {data.shape[1:]}], got {dst!r}"
        )
    alu.write(dst, np.asarray(function.reduce(_exact_integers(data), axis=0, keepdims=True)), api)
    run.count("gpsimd")


def iota(
    dst: NkiTensor,
    pattern: list[list[int]],
    offset: int = 0,
    channel_multiplier: int = 0,
    name: Any = None,
) -> None:
    """``dst[p, i...] = offset + p * channel_multiplier + sum(i_k * step_k)`` in int32 math,
    for ``pattern = [[step, count], ...]`` covering ``dst``'s free elements (GpSimd)."""
    api = "iota"
    run = runtime.active_run(api)
    alu.require(api, "dst", dst, alu.SBUF)
    counts = [int(count) for _, count in pattern]
    if math.prod(counts) != alu.per_partition(dst):
        raise errors.ShapeMismatch(f"'{api}' pattern {pattern} does not cover {dst!r}")
    values = np.full([dst.shape[0], *counts], int(offset), np.int64)
    values += (np.arange(dst.shape[0]) * int(channel_multiplier)).reshape([-1] + [1] * len(counts))
    for axis, (step, count) in enumerate(pattern):
        shape = [1] * (len(counts) + 1)
        shape[axis + 1] = int(count)
        values += (np.arange(int(count)) * int(step)).reshape(shape)
    alu.write(dst, values.astype(np.int32), api)
    run.count("gpsimd")
