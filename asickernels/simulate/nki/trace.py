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
    ``engine`` was not set): ``engine`` is then the simulator's default; ``trigger``, of a
    DMA transfer, the engine whose queue the kernel put it on (``nisa.dma_copy``'s
    ``engine``), "" when the compiler chooses."""

    engine: str
    api: str
    reads: tuple[Access, ...]
    writes: tuple[Access, ...]
    params: tuple[str, ...] | None = None
    pinned: bool = True
    trigger: str = ""


def _memory(buffer: MemoryRegion) -> str:
    return buffer.value if buffer in (MemoryRegion.sbuf, MemoryRegion.psum) else "hbm"


def _runs(first_partition: np.ndarray) -> int:
    """Contiguous pieces in a row of element offsets."""
    flat = first_partition.reshape(-1)
    return 1 + int(np.count_nonzero(np.diff(flat) != 1)) if flat.size > 1 else 1


def _strided_runs(row: np.ndarray) -> int:
    """Contiguous pieces of a strided row (a NumPy view), from its strides: the innermost
    axes that continue one another make one piece (what :func:`_runs` counts, without
    building the row's offsets)."""
    axes = [(n, s) for n, s in zip(row.shape, row.strides, strict=True) if n > 1]
    piece, step = 1, row.itemsize
    for size, stride in reversed(axes):
        if stride != step:
            break
        piece *= size
        step *= size
    return math.prod(n for n, _ in axes) // piece


# dtype -> its name (``np.dtype.name`` is slow, and asked for every operand)
_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(getattr(dtype, "name", dtype))
    return name


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
        # a strided view (slices and integers, no mask): its pieces and bounds from strides
        strided = None if tensor.repeats or tensor.out_of_bounds is not None else tensor.core
        runs = 1
        if memory == "hbm" and offsets.ndim > 1:  # only DMAs price an HBM view's pieces
            first = (0,) * (blocks + 1)
            if strided is not None:
                runs = _strided_runs(strided.values[first])
            else:
                row = offsets[first]
                if tensor.out_of_bounds is not None:  # elements a mask excludes move nothing
                    row = row[~tensor.out_of_bounds[first]]
                runs = _runs(row)
        if allocation is not None and allocation.address is not None:
            physical = allocation.run.physical(allocation.in_psum)
            key = id(physical)
            low, high = _placed_bytes(storage.flat, offsets, physical)
        elif not offsets.size:
            low = high = 0
        elif strided is not None:
            low, high = _element_bounds(strided.values, storage.tensor.values)
        else:
            low, high = int(offsets.min()), int(offsets.max())
    elif isinstance(tensor, NkiTensor):
        data, root = tensor._data, tensor.root
        allocation = tensor.allocation
        key = -allocation.serial if allocation is not None else id(root)
        if allocation is not None and allocation.address is not None:
            physical = allocation.run.physical(allocation.in_psum)
            key = id(physical)
            low, high = _placed_view_bytes(data, physical)
        else:
            low, high = _element_bounds(data, root)
        partitions = data.shape[0] if data.ndim else 1
        memory, dtype = _memory(tensor.buffer), tensor.dtype
        runs = _strided_runs(data[0]) if memory == "hbm" and data.ndim > 1 else 1
    else:
        return None
    return Access(
        memory,
        int(partitions),
        key,
        low,
        high,
        tuple(int(s) for s in tensor.shape),
        _dtype_name(dtype),
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


# Tensors placed at addresses (:mod:`asickernels.simulate.nki.placement`) are views of one
# physical memory, keyed by it; a tile takes the same bytes on each of its partitions, so
# an access's range is the bytes it touches within a partition: placements overlap exactly
# where their byte ranges do (partitions apart, they still count as overlapping).
def _placed_view_bytes(view: np.ndarray, physical: np.ndarray) -> tuple[int, int]:
    """The first and last byte within a partition of ``physical`` that ``view`` touches."""
    start = (_pointer(view) - _pointer(physical)) % physical.shape[1]
    reach = [
        (size - 1) * stride for size, stride in zip(view.shape[1:], view.strides[1:], strict=True)
    ]
    low = start + sum(r for r in reach if r < 0)
    return low, start + sum(r for r in reach if r > 0) + view.dtype.itemsize - 1


def _placed_bytes(elements: Any, offsets: np.ndarray, physical: np.ndarray) -> tuple[int, int]:
    """The first and last byte within a partition of ``physical`` that the elements
    ``offsets`` of a placed legacy tensor (``elements``: its ``PlacedElements``) occupy."""
    if not offsets.size:
        return 0, 0
    memory = elements.memory
    item = memory.dtype.itemsize
    start = _pointer(memory) - _pointer(physical)
    within = (start + elements.to_memory[offsets] * item) % physical.shape[1]
    return int(within.min()), int(within.max()) + item - 1


def _pointer(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def instruction(
    engine: str,
    api: str,
    reads: Sequence[Any],
    writes: Sequence[Any],
    params: Sequence[Any] | None = None,
    pinned: bool = True,
    trigger: str = "",
) -> Instruction:
    """An :class:`Instruction` from simulator tensors (non-tiles are skipped); ``params``:
    every non-tile argument (operators by name), or None when not all are known;
    ``pinned``: the caller chose the engine; ``trigger``: a DMA's queue, if chosen."""
    return Instruction(
        engine,
        api,
        tuple(a for a in map(access, reads) if a is not None),
        tuple(a for a in map(access, writes) if a is not None),
        None if params is None else tuple(_param(p) for p in params),
        pinned,
        trigger,
    )


def _param(value: Any) -> str:
    return str(getattr(value, "__name__", value))
