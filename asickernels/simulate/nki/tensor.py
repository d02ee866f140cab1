"""``NkiTensor``: a typed view of HBM, SBUF or PSUM storage held in a numpy array, with the
SDK's indexing and view rules checked (bounds, the partition axis of on-chip tensors)."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

from asickernels.simulate.nki import errors, runtime


class MemoryRegion(enum.Enum):
    """Where a tensor lives."""

    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"


# The NKI dtypes the simulator models, as numpy dtypes (bfloat16 from ml_dtypes).
DTYPES: dict[str, np.dtype[Any]] = {
    "bool_": np.dtype(np.bool_),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
}
_SUPPORTED = frozenset(DTYPES.values())
# What new storage holds before anything writes it, as the SDK's simulator fills it.
UNINITIALISED_FLOAT = np.nan
UNINITIALISED_INT = 4


def nki_dtype(dtype: Any) -> np.dtype[Any]:
    """``dtype`` as one of :data:`DTYPES`, or :class:`~errors.UnsupportedDtype`."""
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        raise errors.UnsupportedDtype(f"{dtype!r} is not a dtype") from None
    if resolved not in _SUPPORTED:
        raise errors.UnsupportedDtype(
            f"{resolved} is not an NKI dtype; supported: {', '.join(sorted(DTYPES))}"
        )
    return resolved


def is_float(dtype: np.dtype[Any]) -> bool:
    return dtype.kind == "f" or dtype == DTYPES["bfloat16"]


def is_hbm(buffer: MemoryRegion) -> bool:
    return buffer in (MemoryRegion.private_hbm, MemoryRegion.shared_hbm)


class NkiTensor:
    """A tensor in HBM, SBUF or PSUM. Indexing and the view methods return views sharing
    storage; on-chip tensors keep their partition axis (axis 0) first and whole."""

    __slots__ = ("_data", "allocation", "buffer", "dtype", "is_argument", "is_broadcast", "name")

    def __init__(
        self,
        data: np.ndarray,
        dtype: np.dtype[Any],
        buffer: MemoryRegion,
        alloc: runtime.Allocation | None,
        name: str = "",
        is_argument: bool = False,
        broadcast: bool = False,
    ) -> None:
        self._data = data
        self.dtype = dtype
        self.buffer = buffer
        self.allocation = alloc  # on-chip: its SBUF/PSUM accounting
        self.name = name
        self.is_argument = is_argument
        self.is_broadcast = broadcast  # repeats elements: not writable

    # -- properties ---------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._data.shape)

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> int:
        return int(self._data.size)

    @property
    def on_chip(self) -> bool:
        return not is_hbm(self.buffer)

    @property
    def data(self) -> np.ndarray:
        """The simulated storage (read it for debugging; kernels use NKI APIs)."""
        return self._data

    def __repr__(self) -> str:
        return (
            f"NkiTensor({self.name or '?'}: {list(self.shape)} {self.dtype} in {self.buffer.value})"
        )

    def __bool__(self) -> bool:
        raise errors.AmbiguousTensorTruthValue(
            f"the truth value of {self!r} is only known on device; branch with nl.where or "
            "predicated instructions, not Python control flow"
        )

    def __iter__(self) -> Any:
        raise TypeError("NKI tensors are not iterable; index them with slices")

    def _view(self, data: np.ndarray, broadcast: bool = False) -> NkiTensor:
        return NkiTensor(
            data,
            self.dtype,
            self.buffer,
            self.allocation,
            self.name,
            self.is_argument,
            broadcast or self.is_broadcast,
        )

    # -- indexing -----------------------------------------------------------------------
    def __getitem__(self, key: Any) -> NkiTensor:
        """Integers, slices (step >= 1), ``Ellipsis`` and :func:`nki.language.ds`; every
        index must lie inside the tensor. On-chip, an integer on axis 0 keeps the axis."""
        keys = list(key) if isinstance(key, tuple) else [key]
        if sum(k is Ellipsis for k in keys) > 1:
            raise TypeError("an index can have only one Ellipsis")
        explicit = len(keys) - (Ellipsis in keys)
        if explicit > self.ndim:
            raise errors.TensorAccessOutOfBound(
                f"{explicit} indices for {self!r} with {self.ndim} dimensions"
            )
        if Ellipsis in keys:
            at = keys.index(Ellipsis)
            keys[at : at + 1] = [slice(None)] * (self.ndim - explicit)
        keys += [slice(None)] * (self.ndim - len(keys))
        numpy_key: list[int | slice] = []
        for axis, (k, size) in enumerate(zip(keys, self.shape, strict=True)):
            if isinstance(k, slice):
                numpy_key.append(self._checked_slice(axis, k, size))
            elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
                i = int(k) + size if int(k) < 0 else int(k)
                if not 0 <= i < size:
                    raise errors.TensorAccessOutOfBound(
                        f"index {int(k)} on dimension {axis} of {self!r} (size {size})"
                    )
                numpy_key.append(slice(i, i + 1) if axis == 0 and self.on_chip else i)
            else:
                raise TypeError(f"unsupported index {k!r} for {self!r}: use ints, slices or nl.ds")
        if not self.on_chip and all(not isinstance(k, slice) for k in numpy_key):
            last = numpy_key[-1]
            assert isinstance(last, int)
            numpy_key[-1] = slice(last, last + 1)  # HBM views stay at least 1-D
        return self._view(self._data[tuple(numpy_key)])

    def _checked_slice(self, axis: int, k: slice, size: int) -> slice:
        step = 1 if k.step is None else int(k.step)
        start = 0 if k.start is None else int(k.start)
        stop = size if k.stop is None else int(k.stop)
        start += size if start < 0 else 0
        stop += size if stop < 0 else 0
        if step < 1:
            raise errors.TensorAccessOutOfBound(
                f"slice step {step} on {self!r}: steps must be >= 1"
            )
        if not 0 <= start < stop <= size:
            raise errors.TensorAccessOutOfBound(
                f"index range [{start}, {stop - 1}] on dimension {axis} of {self!r} exceeds "
                f"its size {size}"
                if stop > start
                else f"empty range [{start}, {stop}) on dimension {axis} of {self!r}"
            )
        return slice(start, stop, step)

    # -- views ---------------------------------------------------------------------------
    def _check_partition_axis_kept(self, moves_axis_0: bool, what: str) -> None:
        if self.on_chip and moves_axis_0:
            raise errors.LeadingDimensionOfTensorMustBePartition(
                f"{what} on {self!r} would change its partition axis (axis 0)"
            )

    def reshape(self, shape: Sequence[int]) -> NkiTensor:
        """The same elements in ``shape`` (row-major), without copying: the layout must
        allow it. On-chip, ``shape[0]`` must stay the partition count."""
        shape = tuple(int(s) for s in shape)
        self._check_partition_axis_kept(
            not shape or shape[0] != self.shape[0], f"reshape to {shape}"
        )
        if math.prod(shape) != self.size or any(s < 1 for s in shape):
            raise errors.ShapeMismatch(f"cannot reshape {self!r} to {shape}")
        reshaped = self._data.reshape(shape)
        if not np.may_share_memory(reshaped, self._data):
            raise errors.ShapeMismatch(
                f"reshape of {self!r} to {shape} is not expressible as a view of its layout"
            )
        return self._view(reshaped)

    def permute(self, dims: Sequence[int]) -> NkiTensor:
        """Reorders dimensions (a view). On-chip, ``dims[0]`` must be 0."""
        dims = tuple(int(d) for d in dims)
        if sorted(dims) != list(range(self.ndim)):
            raise errors.ShapeMismatch(f"{dims} is not a permutation of the axes of {self!r}")
        self._check_partition_axis_kept(dims[0] != 0, f"permute{dims}")
        return self._view(self._data.transpose(dims))

    def broadcast(self, dim: int, size: int) -> NkiTensor:
        """Repeats the size-1 dimension ``dim`` ``size`` times (a read-only view)."""
        if self.shape[dim] != 1:
            raise errors.ShapeMismatch(
                f"broadcast of dimension {dim} of {self!r}: its size is not 1"
            )
        self._check_partition_axis_kept(dim == 0, f"broadcast of dimension {dim}")
        shape = list(self.shape)
        shape[dim] = int(size)
        return self._view(np.broadcast_to(self._data, shape), broadcast=True)

    def expand_dim(self, dim: int) -> NkiTensor:
        """Inserts a size-1 dimension at ``dim`` (not in front of the partition axis)."""
        self._check_partition_axis_kept(dim == 0, f"expand_dim({dim})")
        return self._view(np.expand_dims(self._data, dim))


def allocate(
    shape: Sequence[int],
    dtype: Any,
    buffer: MemoryRegion,
    name: str,
    api: str,
    fill: float | None = None,
) -> NkiTensor:
    """New storage in ``buffer``, holding ``fill`` or, for ``None``, the uninitialised
    sentinel (NaN for floats, 4 for integers)."""
    run = runtime.active_run(api)
    dtype = nki_dtype(dtype)
    shape = tuple(int(s) for s in shape)
    if not shape or any(s < 1 for s in shape):
        raise errors.ShapeMismatch(f"'{api}' needs a shape of positive sizes, got {shape}")
    if not isinstance(buffer, MemoryRegion):
        raise TypeError(f"'{api}': buffer must be nl.sbuf, nl.psum, nl.hbm or nl.shared_hbm")
    alloc = None
    if not is_hbm(buffer):
        what = f"{name or 'tensor'} {list(shape)} {dtype} in {buffer.value}"
        if len(shape) < 2:
            raise errors.LeadingDimensionOfTensorMustBePartition(
                f"{what}: an on-chip tile needs a partition axis and at least one free axis"
            )
        if shape[0] > runtime.PMAX:
            raise errors.NumPartitionExceedArchLimit(
                f"{what}: size of partition dimension {shape[0]} exceeds architecture "
                f"limitation of {runtime.PMAX}"
            )
        per_partition = math.prod(shape[1:]) * dtype.itemsize
        alloc = run.allocate(buffer is MemoryRegion.psum, per_partition, what)
    if fill is None:
        fill = UNINITIALISED_FLOAT if is_float(dtype) else UNINITIALISED_INT
    data = np.full(shape, fill, dtype)
    return NkiTensor(data, dtype, buffer, alloc, name)


def new_tile(shape: tuple[int, ...], dtype: np.dtype[Any], api: str) -> NkiTensor:
    """An SBUF tile for an instruction's result (every element is written next)."""
    run = runtime.active_run(api)
    if shape[0] > runtime.PMAX:
        raise errors.NumPartitionExceedArchLimit(
            f"'{api}' result {list(shape)}: size of partition dimension {shape[0]} exceeds "
            f"architecture limitation of {runtime.PMAX}"
        )
    alloc = run.allocate(
        False, math.prod(shape[1:]) * dtype.itemsize, f"'{api}' result {list(shape)}"
    )
    return NkiTensor(np.empty(shape, dtype), dtype, MemoryRegion.sbuf, alloc)


def wrap_argument(array: np.ndarray, position: str) -> NkiTensor:
    """A kernel argument: the caller's array, in HBM (writes go back to it)."""
    try:
        dtype = nki_dtype(array.dtype)
    except errors.UnsupportedDtype as error:
        raise errors.UnsupportedDtype(f"kernel argument {position}: {error}") from None
    if array.ndim == 0 or array.size == 0:
        raise errors.ShapeMismatch(f"kernel argument {position} has shape {array.shape}")
    return NkiTensor(array, dtype, MemoryRegion.private_hbm, None, position, is_argument=True)
