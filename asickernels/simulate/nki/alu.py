"""The numerics and operand rules every compute instruction shares.

Vector, Scalar and GpSimd engines compute in float32 and cast the result to the destination
dtype (GpSimd keeps 32-bit integers exact); DMA casts through float32 when the dtypes
differ. Float-to-integer casts round down (floor) and saturate (NaN becomes 0): the SDK
documents no rounding, and AWS's nearest-neighbour resize test (nki-samples
test/unit/test_resize_nearest.py@8370e11, run on the SDK simulator and on devices) expects
``int32(pos / out_w)`` to be ``floor(pos / out_w)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from asickernels.simulate.nki import errors, runtime
from asickernels.simulate.nki.tensor import (
    MemoryRegion,
    NkiTensor,
    dtype_name,
    is_float,
    is_hbm,
    is_packed,
)

Operand = NkiTensor | float | int
HBM = (MemoryRegion.private_hbm, MemoryRegion.shared_hbm)
SBUF = (MemoryRegion.sbuf,)
PSUM = (MemoryRegion.psum,)
ON_CHIP = (MemoryRegion.sbuf, MemoryRegion.psum)


def require(
    api: str,
    name: str,
    value: Any,
    regions: tuple[MemoryRegion, ...] = (*HBM, *ON_CHIP),
    skip_out_of_bounds: bool = False,
) -> NkiTensor:
    """``value``, which must be a non-empty tensor in one of ``regions``; a view with
    out-of-bounds rows (an indirect view's, an access pattern's) only where the instruction
    skips them (a DMA's ``oob_mode=oob_mode.skip``, nki.isa.dma_copy)."""
    if not isinstance(value, NkiTensor):
        raise TypeError(f"operand '{name}' of '{api}' must be a tensor, got {type(value).__name__}")
    if value.size == 0:
        raise errors.TensorAccessOutOfBound(
            f"operand '{name}' of '{api}' is {value!r}, an empty view (an index range of size "
            "0): an instruction accesses at least one element"
        )
    outside = value.out_of_bounds
    if outside is not None and not skip_out_of_bounds:
        raise errors.TensorAccessOutOfBound(
            f"operand '{name}' of '{api}': rows {np.flatnonzero(outside).tolist()} of the "
            f"view {value!r} lie outside the tensor (a DMA's oob_mode=skip skips them)"
        )
    if value.buffer not in regions:
        spaces = "|".join(sorted({"hbm" if is_hbm(r) else r.value for r in regions}))
        raise errors.UnsupportedMemory(
            f"Expected operand '{name}' of '{api}' to be in address space '{spaces}', but got "
            f"a tile in '{value.buffer.value}' instead"
        )
    return value


def require_all(
    api: str, regions: tuple[MemoryRegion, ...], **operands: Any
) -> dict[str, NkiTensor]:
    """The named tensor operands of ``api``, each checked by :func:`require`."""
    return {name: require(api, name, value, regions) for name, value in operands.items()}


def cast(values: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """``values`` in ``dtype``, rounding as the engines do (tfloat32: float32 with the mantissa
    rounded to 10 bits, nearest even)."""
    if is_packed(dtype) or is_packed(values.dtype):
        if values.dtype != dtype:
            raise errors.UnsupportedDtype(
                f"packed MX data ({dtype_name(dtype)}) is only produced by nisa.quantize_mx and "
                "copied bit for bit, not converted"
            )
        return values
    if dtype.metadata is not None and dtype_name(dtype) == "tfloat32":  # only tagged dtypes
        return _round_to_tfloat32(values.astype(np.float32))
    if values.dtype == dtype:
        return values
    if dtype == np.bool_:
        return values != 0
    if dtype.kind in "iu" and (values.dtype.kind == "f" or is_float(values.dtype)):
        info = np.iinfo(dtype)
        rounded = np.floor(np.nan_to_num(values.astype(np.float64), nan=0.0))
        return np.clip(rounded, info.min, info.max).astype(dtype)
    return values.astype(dtype)


def _round_to_tfloat32(values: np.ndarray) -> np.ndarray:
    bits = values.view(np.uint32).copy()
    finite = np.isfinite(values)
    lsb = (bits >> 13) & 1
    bits[finite] = (bits[finite] + 0xFFF + lsb[finite]) & np.uint32(0xFFFFE000)
    return bits.view(np.float32)


def as_f32(value: Operand) -> Any:
    """An operand's values in float32 (scalars as numpy float32, so arrays stay float32)."""
    if isinstance(value, NkiTensor):
        if is_packed(value.dtype):
            raise errors.UnsupportedDtype(
                f"{value!r} holds packed MX data: only nisa.nc_matmul_mx reads it"
            )
        return value.values.astype(np.float32, copy=False)
    return np.float32(value)


def matmul_f32(stationary: np.ndarray, moving: np.ndarray) -> np.ndarray:
    """``stationary.T @ moving`` in float32 (the transpose made contiguous first: BLAS on a
    transposed view is an order of magnitude slower here). Trace-only runs (placeholder
    inputs: every value is zero) skip the arithmetic: the product is zero."""
    if runtime.values_skipped():
        return np.zeros((stationary.shape[-1], moving.shape[-1]), np.float32)
    return np.ascontiguousarray(stationary.astype(np.float32).T) @ moving.astype(np.float32)


def dma_values(src: NkiTensor, dtype: np.dtype[Any]) -> np.ndarray:
    """What a DMA from ``src`` delivers as ``dtype``: a bit copy, or a cast via float32."""
    if src.dtype == dtype and dtype_name(src.dtype) == dtype_name(dtype):
        return src.values
    if is_packed(src.dtype):
        return cast(src.values, dtype)  # raises unless dtype is the same packed type
    return cast(src.values.astype(np.float32), dtype)


def write(dst: NkiTensor, values: np.ndarray, api: str, skip: np.ndarray | None = None) -> None:
    """Stores ``values`` (as many elements as ``dst``, any shape) into ``dst``, except the
    rows (first-axis indices) ``skip`` selects."""
    if dst.is_broadcast:
        raise errors.StoreDstShapeSmallerThanOtherShape(
            f"'{api}' would write into {dst!r}, a broadcast view: several values per element"
        )
    if values.shape != dst.shape:
        values = values.reshape(dst.shape)
    if dst.scatter(cast(values, dst.dtype), skip):
        return
    if skip is None:
        dst.values[...] = cast(values, dst.dtype)
    else:
        dst.values[~skip] = cast(values[~skip], dst.dtype)


def skipped_rows(api: str, src: NkiTensor, dst: NkiTensor) -> np.ndarray | None:
    """The rows of ``dst`` a DMA with ``oob_mode.skip`` leaves unwritten: its own
    out-of-bounds rows and those whose source row is out of bounds (row for row)."""
    if src.out_of_bounds is None and dst.out_of_bounds is None:
        return None
    skip = np.zeros(dst.shape[0], np.bool_)
    if dst.out_of_bounds is not None:
        skip |= dst.out_of_bounds
    if src.out_of_bounds is not None:
        if src.shape[0] != dst.shape[0]:
            raise errors.ShapeMismatch(
                f"'{api}' skips out-of-bounds rows of {src!r} row for row, but {dst!r} has "
                f"{dst.shape[0]} rows"
            )
        skip |= src.out_of_bounds
    return skip


def per_partition(tile: NkiTensor) -> int:
    return math.prod(tile.shape[1:])


def check_on_chip(api: str, operands: Mapping[str, Any]) -> list[NkiTensor]:
    """The tile operands (scalars skipped), which must all be in SBUF or PSUM."""
    return [
        require(api, name, value, ON_CHIP)
        for name, value in operands.items()
        if isinstance(value, NkiTensor)
    ]


def check_partitions(api: str, operands: Mapping[str, Any]) -> None:
    tiles = {name: t for name, t in operands.items() if isinstance(t, NkiTensor)}
    if len({t.shape[0] for t in tiles.values()}) > 1:
        listed = ", ".join(f"{name}{list(t.shape)}" for name, t in tiles.items())
        raise errors.NumPartitionMismatch(
            f"number of partitions (dimension 0 size of a tile) mismatch in parameters "
            f"({listed}) of '{api}'"
        )


def broadcast_shape(
    api: str, shapes: Sequence[tuple[int, ...]], partitions: bool = True, free: bool = True
) -> tuple[int, ...]:
    """The common shape of tile operands of ``shapes``: the partition axes equal, or equal
    or 1 with ``partitions``; the free axes equal, or broadcast as in NumPy with ``free``
    (a lower-rank ``[P]`` counts as ``[P, 1, ...]``, see :func:`expand`)."""
    sizes = {s[0] for s in shapes if s}
    if len(sizes - {1} if partitions else sizes) > 1:
        listed = ", ".join(str(list(s)) for s in shapes)
        raise errors.NumPartitionMismatch(
            f"number of partitions (dimension 0 size of a tile) mismatch in parameters "
            f"({listed}) of '{api}'"
        )
    if not free:
        if len(set(shapes)) > 1:
            listed = ", ".join(str(list(s)) for s in shapes)
            raise errors.ShapeMismatch(f"'{api}' needs tiles of one shape, got {listed}")
        return tuple(shapes[0])
    try:
        free_shape = np.broadcast_shapes(*(s[1:] for s in shapes))
    except ValueError:
        listed = ", ".join(str(list(s)) for s in shapes)
        raise errors.ShapeMismatch(f"'{api}': shapes {listed} do not broadcast") from None
    return (max(sizes, default=1), *free_shape)


def expand(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``array`` (a tile's values) broadcast partition-first to ``shape``."""
    if array.ndim < len(shape):
        array = array.reshape(array.shape[:1] + (1,) * (len(shape) - array.ndim) + array.shape[1:])
    return np.broadcast_to(array, shape)


def check_elements(api: str, operands: Mapping[str, Any]) -> None:
    """Same partitions and same number of elements per partition."""
    check_partitions(api, operands)
    tiles = {name: t for name, t in operands.items() if isinstance(t, NkiTensor)}
    if len({per_partition(t) for t in tiles.values()}) > 1:
        listed = ", ".join(f"{name}{list(t.shape)}" for name, t in tiles.items())
        raise errors.ShapeMismatch(f"'{api}' needs equal elements per partition, got {listed}")


def check_not_both_psum(api: str, *inputs: Any) -> None:
    """At most one input of an instruction may be read from PSUM."""
    if sum(isinstance(t, NkiTensor) and t.buffer is MemoryRegion.psum for t in inputs) > 1:
        raise errors.UnsupportedMemory(f"'{api}' cannot read two inputs from PSUM")


def check_no_psum_on_gpsimd(api: str, tiles: list[NkiTensor]) -> None:
    for tile in tiles:
        if tile.buffer is MemoryRegion.psum:
            raise errors.UnsupportedMemory(
                f"'{api}' on the GpSimd engine cannot access PSUM ({tile!r})"
            )


def batch_norm_stats(values: np.ndarray, included: np.ndarray | None = None) -> np.ndarray:
    """``bn_stats`` of both generations: per row of ``values`` ``[P, F]`` (float32 math),
    ``(count, mean, variance*count)`` of the even and then the odd elements, counting only
    ``included`` ones (a legacy mask); ``[P, 6]``."""
    values = np.asarray(values, np.float32)
    keep = np.ones(values.shape, np.bool_) if included is None else included
    stats = []
    for parity in (0, 1):
        part, kept = values[:, parity::2], keep[:, parity::2]
        count = kept.sum(axis=1).astype(np.float32)
        mean = np.where(kept, part, 0).sum(axis=1, dtype=np.float32) / np.maximum(count, 1)
        spread = np.where(kept, (part - mean[:, None]) ** 2, 0).sum(axis=1, dtype=np.float32)
        stats += [count, mean, spread]
    return np.stack(stats, axis=1).astype(np.float32)


def batch_norm_aggregate(triples: np.ndarray) -> np.ndarray:
    """``bn_aggr`` of both generations: per row of ``(count, mean, variance*count)`` triples
    ``[P, T, 3]`` (float64 accumulation), the overall ``(mean, variance)``; ``[P, 2]``."""
    triples = np.asarray(triples, np.float64)
    counts, means, spreads = triples[..., 0], triples[..., 1], triples[..., 2]
    total = np.maximum(counts.sum(axis=1), 1)
    mean = (counts * means).sum(axis=1) / total
    variance = (spreads + counts * (means - mean[:, None]) ** 2).sum(axis=1) / total
    return np.stack([mean, variance], axis=1).astype(np.float32)
