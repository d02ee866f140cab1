"""The simulator's instruction trace: what each instruction read and wrote.

A run records a trace when asked (:func:`asickernels.simulate.nki.runtime.recording`): every
instruction that counts itself (``Run.count`` / ``Run.count_dma``) appends one
:class:`Instruction` with the engine, the API name and an :class:`Access` per tile operand.
The cost model (:mod:`asickernels.simulate.nki.estimate`) schedules it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from asickernels.simulate.nki.tensor import MemoryRegion

__all__ = ["Access", "Instruction", "access", "instruction"]


@dataclasses.dataclass(frozen=True, slots=True)
class Access:
    """One tile operand: which storage (``key``, unique within a run), which elements
    (``low``..``high``, element offsets into the storage, inclusive), its shape and dtype,
    and ``runs_per_partition``: the contiguous pieces of its first partition (row), i.e. the
    DMA buffers one partition needs (trainium_inferentia2_arch.rst, "DMA buffers"); counted
    for HBM views only (an on-chip partition is one piece)."""

    memory: str  # "hbm", "sbuf" or "psum"
    partitions: int  # the partition dimension's size (after any legacy block dimensions)
    key: int
    low: int
    high: int
    shape: tuple[int, ...]
    dtype: str
    itemsize: int
    runs_per_partition: int

    @property
    def free_size(self) -> int:
        """Elements per partition."""
        return math.prod(self.shape) // max(1, self.partitions)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


@dataclasses.dataclass(frozen=True, slots=True)
class Instruction:
    """One instruction: ``engine`` is ``tensor``, ``vector``, ``scalar``, ``gpsimd`` or
    ``dma``; ``api`` the NKI call that issued it; ``params`` its arguments other than tiles
    (operators, scalars) when the call site records them all, else None (then two calls on
    the same tiles are never taken for the same computation); ``pinned`` False when the
    kernel left the engine to the compiler (an ``nl`` call, or an ``nisa`` call whose
    ``engine`` was not set): ``engine`` is then the simulator's default."""

    engine: str
    api: str
    reads: tuple[Access, ...]
    writes: tuple[Access, ...]
    params: tuple[str, ...] | None = None
    pinned: bool = True


def _memory(buffer: MemoryRegion) -> str:
    return buffer.value if buffer in (MemoryRegion.sbuf, MemoryRegion.psum) else "hbm"


def _runs(first_partition: np.ndarray) -> int:
    """Contiguous pieces in a row of element offsets."""
    flat = first_partition.reshape(-1)
    return 1 + int(np.count_nonzero(np.diff(flat) != 1)) if flat.size > 1 else 1


def access(tensor: Any) -> Access | None:
    """The :class:`Access` of a simulator tensor (current or legacy API); None for a
    scalar or anything else that is not a tile."""
    from asickernels.simulate.nki.legacy.tile import Tensor as LegacyTensor
    from asickernels.simulate.nki.tensor import NkiTensor

    if isinstance(tensor, LegacyTensor):
        storage, offsets = tensor.storage, tensor.offsets
        # On-chip storage is freed and recreated during a run: its allocation's serial
        # number names it (negated: never an id); HBM tensors live for the whole run.
        allocation = storage.tensor.allocation
        key = -allocation.serial if allocation is not None else id(storage.tensor.root)
        blocks = min(tensor.block_dims, offsets.ndim - 1)
        partitions = offsets.shape[blocks] if offsets.ndim else 1
        memory, dtype = _memory(tensor.buffer), tensor.dtype
        runs = 1
        if memory == "hbm" and offsets.ndim > 1:  # only DMAs price an HBM view's pieces
            runs = _runs(offsets[(0,) * (blocks + 1)])
        low = int(offsets.min()) if offsets.size else 0
        high = int(offsets.max()) if offsets.size else 0
    elif isinstance(tensor, NkiTensor):
        data, root = tensor._data, tensor.root
        key = -tensor.allocation.serial if tensor.allocation is not None else id(root)
        low, high = _element_bounds(data, root)
        partitions = data.shape[0] if data.ndim else 1
        memory, dtype = _memory(tensor.buffer), tensor.dtype
        runs = _runs(_row_offsets(data[0])) if memory == "hbm" and data.ndim > 1 else 1
    else:
        return None
    return Access(
        memory,
        int(partitions),
        key,
        low,
        high,
        tuple(int(s) for s in tensor.shape),
        str(getattr(dtype, "name", dtype)),
        int(np.dtype(dtype).itemsize),
        runs,
    )


def _element_bounds(view: np.ndarray, root: np.ndarray) -> tuple[int, int]:
    """The first and last element of ``root`` (C-contiguous) that ``view`` touches."""
    item = view.dtype.itemsize
    start = (view.__array_interface__["data"][0] - root.__array_interface__["data"][0]) // item
    if view.size == 0:
        return start, start
    reach = [
        (size - 1) * stride // item for size, stride in zip(view.shape, view.strides, strict=True)
    ]
    return start + sum(r for r in reach if r < 0), start + sum(r for r in reach if r > 0)


def _row_offsets(row: np.ndarray) -> np.ndarray:
    """Element offsets of a strided view, relative to its first element."""
    item = row.dtype.itemsize
    offsets = np.zeros((), np.int64)
    for size, stride in zip(row.shape, row.strides, strict=True):
        offsets = offsets[..., None] + np.arange(size, dtype=np.int64) * (stride // item)
    return offsets


def instruction(
    engine: str,
    api: str,
    reads: Sequence[Any],
    writes: Sequence[Any],
    params: Sequence[Any] | None = None,
    pinned: bool = True,
) -> Instruction:
    """An :class:`Instruction` from simulator tensors (non-tiles are skipped); ``params``:
    every non-tile argument (operators by name), or None when not all are known;
    ``pinned``: the caller chose the engine."""
    return Instruction(
        engine,
        api,
        tuple(a for a in map(access, reads) if a is not None),
        tuple(a for a in map(access, writes) if a is not None),
        None if params is None else tuple(_param(p) for p in params),
        pinned,
    )


def _param(value: Any) -> str:
    return str(getattr(value, "__name__", value))
