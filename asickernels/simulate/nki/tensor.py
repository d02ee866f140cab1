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


# The NKI dtypes the simulator models, as numpy dtypes (nki/api/nki.api.shared.rst, "Supported
# Data Types"): bfloat16 and the fp8 formats from ml_dtypes (``float8_e4m3`` is the IEEE-style
# format with inf, max 240; ``float8_e4m3fn`` the OCP one, max 448); tfloat32 as float32 storage
# tagged so writes round to its 10-bit mantissa; the 4x-packed MX types as opaque records of their
# bytes (4 for the fp8 pairs, 2 for fp4), decoded only by nc_matmul_mx / quantize_mx.
TFLOAT32 = np.dtype(np.float32, metadata={"nki_dtype": "tfloat32"})
PACKED_X4: dict[str, tuple[Any, int]] = {  # name: (element dtype, bytes per packed element)
    "float8_e5m2_x4": (ml_dtypes.float8_e5m2, 4),
    "float8_e4m3fn_x4": (ml_dtypes.float8_e4m3fn, 4),
    "float4_e2m1fn_x4": (ml_dtypes.float4_e2m1fn, 2),
}
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
    "tfloat32": TFLOAT32,
    "float8_e4m3": np.dtype(ml_dtypes.float8_e4m3),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e8m0fnu": np.dtype(ml_dtypes.float8_e8m0fnu),
    **{name: np.dtype([(name, f"<u{nbytes}")]) for name, (_, nbytes) in PACKED_X4.items()},
}
_SUPPORTED = frozenset(DTYPES.values())
_FLOATS = frozenset(
    DTYPES[n]
    for n in ("float16", "bfloat16", "float32", "float8_e4m3", "float8_e5m2", "float8_e4m3fn")
) | {DTYPES["float8_e8m0fnu"]}
# What new storage holds before anything writes it, as the SDK's simulator fills it.
UNINITIALISED_FLOAT = np.nan
UNINITIALISED_INT = 4


def nki_dtype(dtype: Any) -> np.dtype[Any]:
    """``dtype`` as one of :data:`DTYPES`, or :class:`~errors.UnsupportedDtype`."""
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        raise errors.UnsupportedDtype(f"{dtype!r} is not a dtype") from None
    if resolved.names is not None or resolved.metadata is not None:
        # packed / tagged types compare by structure: resolve them by name instead
        match = next((d for d in DTYPES.values() if dtype_name(d) == dtype_name(resolved)), None)
        if match is None:
            raise errors.UnsupportedDtype(f"{resolved} is not an NKI dtype")
        return match
    if resolved not in _SUPPORTED:
        raise errors.UnsupportedDtype(
            f"{resolved} is not an NKI dtype; supported: {', '.join(sorted(DTYPES))}"
        )
    return resolved


def dtype_name(dtype: np.dtype[Any]) -> str:
    """The NKI name of ``dtype`` (``tfloat32`` and the ``_x4`` types included)."""
    if dtype.metadata is not None and "nki_dtype" in dtype.metadata:
        return str(dtype.metadata["nki_dtype"])
    if dtype.names is not None:
        return dtype.names[0]
    return next((n for n, d in DTYPES.items() if d == dtype and d.metadata is None), str(dtype))


def is_float(dtype: np.dtype[Any]) -> bool:
    return dtype in _FLOATS and dtype.names is None


def is_packed(dtype: np.dtype[Any]) -> bool:
    """One of the 4x-packed MX types."""
    return dtype.names is not None


def is_hbm(buffer: MemoryRegion) -> bool:
    return buffer in (MemoryRegion.private_hbm, MemoryRegion.shared_hbm)


class NKIObject:
    """``nl.NKIObject``: the base class of NKI kernel dataclasses and configuration objects
    (2.32 reference, nki/api/nki/language/__init__.py); keyword arguments become
    attributes."""

    __slots__ = ()

    def __init__(self, **kwargs: Any) -> None:
        for name, value in kwargs.items():
            setattr(self, name, value)


class NkiTensor(NKIObject):
    """A tensor in HBM, SBUF or PSUM. Indexing and the view methods return views sharing
    storage; on-chip tensors keep their partition axis (axis 0) first and whole."""

    __slots__ = (
        "_data",
        "_gather",
        "allocation",
        "buffer",
        "dtype",
        "is_argument",
        "is_broadcast",
        "is_indirect_view",
        "name",
        "root",
    )

    def __init__(
        self,
        data: np.ndarray,
        dtype: np.dtype[Any],
        buffer: MemoryRegion,
        alloc: runtime.Allocation | None,
        name: str = "",
        is_argument: bool = False,
        broadcast: bool = False,
        root: np.ndarray | None = None,
        indirect: bool = False,
    ) -> None:
        self._data = data
        # The whole allocation (C-contiguous) this tensor views: what ``.ap`` addresses.
        self.root = data if root is None else root
        self.is_indirect_view = indirect
        # per-partition indirection (vector_select, ap(vector_offset=)): each partition's view
        self._gather: list[np.ndarray] | None = None
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
        """The simulated storage (read it for debugging; kernels use NKI APIs). For a
        per-partition indirect view, a read-only copy of the gathered partitions."""
        if self._gather is None:
            return self._data
        gathered = np.stack(self._gather)
        gathered.flags.writeable = False
        return gathered

    def scatter(self, values: np.ndarray) -> bool:
        """Writes ``values`` through a per-partition indirect view (True), or does nothing
        for an ordinary view (False)."""
        if self._gather is None:
            return False
        for row, value in zip(self._gather, values, strict=True):
            row[...] = value
        return True

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

    @property
    def strides(self) -> tuple[int, ...]:
        """Element strides of this view into its storage (partition stride included)."""
        return tuple(stride // self.dtype.itemsize for stride in self._data.strides)

    @property
    def offset(self) -> int:
        """Element offset of this view's first element in its storage."""
        return self._byte_offset() // self.dtype.itemsize

    def _byte_offset(self) -> int:
        return int(
            self._data.__array_interface__["data"][0] - self.root.__array_interface__["data"][0]
        )

    def _view(
        self,
        data: np.ndarray,
        broadcast: bool = False,
        dtype: np.dtype[Any] | None = None,
        indirect: bool = False,
    ) -> NkiTensor:
        if self._gather is not None:
            raise errors.NkiValidationError(
                f"{self!r} is an indirect (vector_select) view: it cannot be viewed further"
            )
        return NkiTensor(
            data,
            self.dtype if dtype is None else dtype,
            self.buffer,
            self.allocation,
            self.name,
            self.is_argument,
            broadcast or self.is_broadcast,
            self.root,
            indirect or self.is_indirect_view,
        )

    # -- indexing -----------------------------------------------------------------------
    def __getitem__(self, key: Any) -> NkiTensor:
        """Integers, slices (step >= 1), ``Ellipsis`` and :func:`nki.language.ds`; every
        index must lie inside the tensor. On-chip, an integer on axis 0 keeps the axis."""
        keys = expand_ellipsis(self, list(key) if isinstance(key, tuple) else [key])
        keys += [slice(None)] * (self.ndim - len(keys))
        numpy_key: list[int | slice] = []
        for axis, (k, size) in enumerate(zip(keys, self.shape, strict=True)):
            if isinstance(k, slice):
                numpy_key.append(checked_slice(self, axis, k, size))
            elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
                i = checked_index(self, axis, k, size)
                numpy_key.append(slice(i, i + 1) if axis == 0 and self.on_chip else i)
            else:
                raise TypeError(f"unsupported index {k!r} for {self!r}: use ints, slices or nl.ds")
        if not self.on_chip and all(not isinstance(k, slice) for k in numpy_key):
            last = numpy_key[-1]
            assert isinstance(last, int)
            numpy_key[-1] = slice(last, last + 1)  # HBM views stay at least 1-D
        return self._view(self._data[tuple(numpy_key)])

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

    def squeeze_dim(self, dim: int) -> NkiTensor:
        """Removes the size-1 dimension ``dim`` (not the partition axis)."""
        if self.shape[dim] != 1:
            raise errors.ShapeMismatch(f"squeeze_dim({dim}) on {self!r}: its size is not 1")
        self._check_partition_axis_kept(dim % self.ndim == 0, f"squeeze_dim({dim})")
        return self._view(np.squeeze(self._data, dim))

    def reshape_dim(self, dim: int, shape: Sequence[int]) -> NkiTensor:
        """Splits dimension ``dim`` into ``shape`` (one entry may be -1)."""
        dim %= self.ndim
        sizes = [int(s) for s in shape]
        if sizes.count(-1) == 1:
            known = math.prod(s for s in sizes if s != -1)
            sizes[sizes.index(-1)] = self.shape[dim] // known if known else 0
        if math.prod(sizes) != self.shape[dim]:
            raise errors.ShapeMismatch(f"reshape_dim({dim}, {tuple(shape)}) on {self!r}")
        self._check_partition_axis_kept(dim == 0 and len(sizes) != 1, f"reshape_dim(0, {shape})")
        return self.reshape((*self.shape[:dim], *sizes, *self.shape[dim + 1 :]))

    def flatten_dims(self, start_dim: int, end_dim: int) -> NkiTensor:
        """Merges dimensions ``start_dim..end_dim`` (inclusive), which must be contiguous in
        memory."""
        start, end = start_dim % self.ndim, end_dim % self.ndim
        self._check_partition_axis_kept(start == 0, f"flatten_dims({start_dim}, {end_dim})")
        merged = math.prod(self.shape[start : end + 1])
        return self.reshape((*self.shape[:start], merged, *self.shape[end + 1 :]))

    def rearrange(
        self,
        src_pattern: tuple[Any, ...],
        dst_pattern: tuple[Any, ...],
        fixed_sizes: dict[str, int] | None = None,
    ) -> NkiTensor:
        """einops-style split / reorder / merge of dimensions (a view). Names grouped in a
        tuple are split (``src_pattern``) or merged (``dst_pattern``)."""
        if len(src_pattern) != self.ndim:
            raise errors.ShapeMismatch(f"rearrange source {src_pattern} for {self!r}")
        sizes = dict(fixed_sizes or {})
        split_shape: list[int] = []
        names: list[str] = []
        for entry, size in zip(src_pattern, self.shape, strict=True):
            group = list(entry) if isinstance(entry, tuple) else [entry]
            unknown = [n for n in group if n not in sizes]
            if len(unknown) > 1:
                raise errors.ShapeMismatch(f"rearrange: give sizes for {unknown[1:]}")
            if unknown:
                sizes[unknown[0]] = size // math.prod(sizes[n] for n in group if n in sizes)
            if math.prod(sizes[n] for n in group) != size:
                raise errors.ShapeMismatch(f"rearrange: group {entry} does not make size {size}")
            split_shape += [sizes[n] for n in group]
            names += group
        flat_dst = [n for e in dst_pattern for n in (e if isinstance(e, tuple) else (e,))]
        if sorted(flat_dst) != sorted(names):
            raise errors.ShapeMismatch(f"rearrange: {dst_pattern} names differ from {src_pattern}")
        permuted = self.reshape(split_shape).permute([names.index(n) for n in flat_dst])
        merged = [
            math.prod(sizes[n] for n in e) if isinstance(e, tuple) else sizes[e]
            for e in dst_pattern
        ]
        return permuted.reshape(merged)

    def slice(self, dim: int, start: int, end: int, step: int = 1) -> NkiTensor:
        """``[start, end)`` with ``step`` along ``dim``."""
        key: list[Any] = [slice(None)] * self.ndim
        key[dim] = slice(start, end, step)
        return self[tuple(key)]

    def select(self, dim: int, index: int | NkiTensor) -> NkiTensor:
        """Element ``index`` of ``dim``, removing the dimension. A tensor ``index`` (dynamic
        selection) is read now: the simulator knows device values as it runs."""
        indirect = isinstance(index, NkiTensor)
        if isinstance(index, NkiTensor):
            if self.is_indirect_view:
                raise errors.NkiValidationError(f"{self!r} is already an indirect view")
            if self.on_chip and dim % self.ndim == 0:
                raise errors.LeadingDimensionOfTensorMustBePartition(
                    f"dynamic select on the partition axis of {self!r}"
                )
            index = _scalar_value(index)
        dim %= self.ndim
        self._check_partition_axis_kept(dim == 0, f"select({dim}, {index})")
        key: list[Any] = [slice(None)] * self.ndim
        key[dim] = index
        picked = self[tuple(key)]  # an integer off the partition axis removes the dimension
        return picked._view(picked._data, indirect=indirect)

    def vector_select(self, dim: int, vector_offset: NkiTensor) -> NkiTensor:
        """Per-partition indirection of an HBM tensor: partition ``p`` of the result is
        ``self[vector_offset[p]]`` (``dim`` 0, ``vector_offset`` an SBUF ``[P, 1]`` integer
        tile read as the instruction runs). DMAs read and write through the view."""
        if dim != 0:
            raise errors.LeadingDimensionOfTensorMustBePartition(
                f"vector_select({dim}) on {self!r}: only dimension 0"
            )
        offsets = self._vector_offsets(vector_offset, self.shape[0])
        return self._gathered([self._data[o] for o in offsets], self.dtype)

    def _vector_offsets(self, vector_offset: NkiTensor, limit: int) -> np.ndarray:
        """The per-partition offsets of an indirect view (an SBUF [P, 1] integer tile, read
        as the instruction runs), each in ``[0, limit)``."""
        if self.is_indirect_view:
            raise errors.NkiValidationError(f"{self!r} is already an indirect view")
        if self.on_chip:
            raise errors.UnsupportedMemory(f"per-partition indirection reads HBM, not {self!r}")
        if (
            vector_offset.buffer is not MemoryRegion.sbuf
            or vector_offset.size != vector_offset.shape[0]
        ):
            raise errors.ShapeMismatch(
                f"vector_offset must be an SBUF [P, 1] tile, got {vector_offset!r}"
            )
        if vector_offset.dtype.kind not in "iu":
            raise errors.UnsupportedDtype(
                f"vector_offset must hold integers, got {vector_offset!r}"
            )
        offsets = vector_offset.data.reshape(-1).astype(np.int64)
        if offsets.min() < 0 or offsets.max() >= limit:
            raise errors.TensorAccessOutOfBound(
                f"vector_offset values {offsets.min()}..{offsets.max()} outside 0..{limit - 1} "
                f"for {self!r}"
            )
        return offsets

    def _gathered(self, rows: list[np.ndarray], dtype: np.dtype[Any]) -> NkiTensor:
        view = self._view(np.stack(rows), dtype=dtype, indirect=True)
        view._gather = rows
        return view

    def is_contiguous(self) -> bool:
        """Row-major contiguity of the view (for on-chip tensors, of the free axes only)."""
        expected = self.dtype.itemsize
        axes = range(self.ndim - 1, 0 if self.on_chip else -1, -1)
        for axis in axes:
            if self.shape[axis] != 1 and self._data.strides[axis] != expected:
                return False
            expected *= self.shape[axis]
        return True

    def get_pattern(self) -> list[list[int]]:
        """The view as an access pattern ``[[stride, count], ...]`` (see :meth:`ap`)."""
        return [[stride, size] for stride, size in zip(self.strides, self.shape, strict=True)]

    def is_indirect(self) -> bool:
        """Whether this view was made by a dynamic :meth:`select` or ``ap(scalar_offset=)``."""
        return self.is_indirect_view

    def ap(
        self,
        pattern: Sequence[Sequence[int]],
        offset: int | None = None,
        scalar_offset: Any = None,
        vector_offset: NkiTensor | None = None,
        indirect_dim: int = 0,
        dtype: Any = None,
    ) -> NkiTensor:
        """An explicit access pattern ``[[stride, count], ...]`` over this tensor's storage
        (like ``torch.as_strided``), starting at this view's offset plus ``offset`` elements
        (of ``dtype``, default this tensor's). On-chip, the first pair walks partitions, so its
        stride must be a whole number of partitions and the rest must stay in one partition.
        ``scalar_offset`` adds its (runtime) value times the stride of ``indirect_dim``;
        ``vector_offset`` (HBM only) does so per partition: partition ``i`` of the view starts
        ``vector_offset[i]`` strides of ``indirect_dim`` in, walking the remaining pairs."""
        if vector_offset is not None:
            return self._vector_ap(pattern, offset, vector_offset, indirect_dim, dtype)
        new_dtype = self.dtype if dtype is None else nki_dtype(dtype)
        itemsize = new_dtype.itemsize
        pairs = [(int(step), int(count)) for step, count in pattern]
        if not pairs or any(count < 1 for _, count in pairs):
            raise errors.ShapeMismatch(f"access pattern {pattern} needs positive counts")
        start = self._byte_offset() + (offset or 0) * itemsize
        if scalar_offset is not None:
            if self.is_indirect_view:
                raise errors.NkiValidationError(f"{self!r} is already an indirect view")
            start += _scalar_value(scalar_offset) * self._data.strides[indirect_dim]
        total = self.root.nbytes
        low = start + sum(min(0, step * (count - 1)) for step, count in pairs) * itemsize
        high = start + (sum(max(0, step * (count - 1)) for step, count in pairs) + 1) * itemsize
        if low < 0 or high > total or start % itemsize:
            raise errors.TensorAccessOutOfBound(
                f"access pattern {pattern} at element offset {start // itemsize} reaches bytes "
                f"[{low}, {high}) of {self!r}'s {total}-byte storage"
            )
        if self.on_chip:
            self._check_on_chip_pattern(pairs, start, itemsize)
        data = np.ndarray(
            [count for _, count in pairs],
            new_dtype,
            buffer=self.root.reshape(-1).view(np.uint8),
            offset=start,
            strides=[step * itemsize for step, _ in pairs],
        )
        return self._view(data, dtype=new_dtype, indirect=scalar_offset is not None)

    def _vector_ap(
        self,
        pattern: Sequence[Sequence[int]],
        offset: int | None,
        vector_offset: NkiTensor,
        indirect_dim: int,
        dtype: Any,
    ) -> NkiTensor:
        (_, partitions), *free = [(int(step), int(count)) for step, count in pattern]
        if partitions != vector_offset.shape[0]:
            raise errors.ShapeMismatch(
                f"access pattern {pattern} walks {partitions} partitions, vector_offset has "
                f"{vector_offset.shape[0]}"
            )
        new_dtype = self.dtype if dtype is None else nki_dtype(dtype)
        stride = self._data.strides[indirect_dim]
        if stride % new_dtype.itemsize:
            raise errors.ShapeMismatch(
                f"dimension {indirect_dim} of {self!r} is not a whole number of {new_dtype}"
            )
        offsets = self._vector_offsets(vector_offset, self.shape[indirect_dim])
        rows = [
            self.ap(
                [[1, 1], *([step, count] for step, count in free)],
                (offset or 0) + int(row) * stride // new_dtype.itemsize,
                dtype=new_dtype,
            )._data[0]
            for row in offsets
        ]
        return self._gathered(rows, new_dtype)

    def _check_on_chip_pattern(
        self, pairs: list[tuple[int, int]], start: int, itemsize: int
    ) -> None:
        """Partitions are separate memories: an on-chip pattern moves between them only with
        its first pair."""
        row_bytes = self.root.nbytes // self.root.shape[0]
        (partition_step, partitions), free = pairs[0], pairs[1:]
        within = start % row_bytes + (sum(max(0, s * (c - 1)) for s, c in free) + 1) * itemsize
        if partitions > runtime.PMAX:
            raise errors.NumPartitionExceedArchLimit(
                f"access pattern with {partitions} partitions exceeds architecture limitation of "
                f"{runtime.PMAX}"
            )
        if (partitions > 1 and (partition_step * itemsize) % row_bytes) or within > row_bytes:
            raise errors.LeadingDimensionOfTensorMustBePartition(
                f"access pattern {[list(p) for p in pairs]} on {self!r} crosses partitions "
                "outside its first (partition) pair"
            )

    def view(self, dtype: Any) -> NkiTensor:
        """The same bytes as ``dtype``; the last dimension scales by the size ratio and must be
        contiguous."""
        new_dtype = nki_dtype(dtype)
        if self.shape[-1] > 1 and self._data.strides[-1] != self.dtype.itemsize:
            raise errors.ShapeMismatch(
                f"view({dtype_name(new_dtype)}) of {self!r}: last dimension is not contiguous"
            )
        if (self.shape[-1] * self.dtype.itemsize) % new_dtype.itemsize:
            raise errors.ShapeMismatch(
                f"view({dtype_name(new_dtype)}) of {self!r}: last dimension of "
                f"{self.shape[-1] * self.dtype.itemsize} bytes does not divide"
            )
        count = self.shape[-1] * self.dtype.itemsize // new_dtype.itemsize
        data = np.ndarray(
            (*self.shape[:-1], count),
            new_dtype,
            buffer=self.root.reshape(-1).view(np.uint8),
            offset=self._byte_offset(),
            strides=(*self._data.strides[:-1], new_dtype.itemsize),
        )
        return self._view(data, dtype=new_dtype)

    reinterpret_cast = view


def expand_ellipsis(tensor: Any, keys: list[Any]) -> list[Any]:
    """The index ``keys`` of ``tensor`` (either generation's) with their one ``Ellipsis``, if
    any, replaced by whole slices of the dimensions it stands for; more explicit keys than
    dimensions are out of bound."""
    ellipses = [i for i, k in enumerate(keys) if k is Ellipsis]  # no ==: index grids compare
    if len(ellipses) > 1:
        raise TypeError("an index can have only one Ellipsis")
    explicit = len(keys) - len(ellipses)
    if explicit > tensor.ndim:
        raise errors.TensorAccessOutOfBound(
            f"{explicit} indices for {tensor!r} with {tensor.ndim} dimensions"
        )
    if ellipses:
        at = ellipses[0]
        keys[at : at + 1] = [slice(None)] * (tensor.ndim - explicit)
    return keys


def checked_index(tensor: Any, axis: int, k: int | np.integer[Any], size: int) -> int:
    """The integer index ``k`` (negative: from the end) on dimension ``axis`` (of ``size``)
    of ``tensor`` (either generation's), which must lie inside it."""
    i = int(k) + size if int(k) < 0 else int(k)
    if not 0 <= i < size:
        raise errors.TensorAccessOutOfBound(
            f"index {int(k)} on dimension {axis} of {tensor!r} (size {size})"
        )
    return i


def checked_slice(tensor: Any, axis: int, k: slice, size: int) -> slice:
    """``k`` on dimension ``axis`` (of ``size``) of ``tensor`` (either generation's) with its
    bounds resolved: a step >= 1 and a non-empty range inside the dimension."""
    step = 1 if k.step is None else int(k.step)
    start = 0 if k.start is None else int(k.start)
    stop = size if k.stop is None else int(k.stop)
    start += size if start < 0 else 0
    stop += size if stop < 0 else 0
    if step < 1:
        raise errors.TensorAccessOutOfBound(f"slice step {step} on {tensor!r}: steps must be >= 1")
    if not 0 <= start < stop <= size:
        raise errors.TensorAccessOutOfBound(
            f"index range [{start}, {stop - 1}] on dimension {axis} of {tensor!r} exceeds "
            f"its size {size}"
            if stop > start
            else f"empty range [{start}, {stop}) on dimension {axis} of {tensor!r}"
        )
    return slice(start, stop, step)


def _scalar_value(value: Any) -> int:
    """A run-time index: a one-element tensor's value, or a register's (``nl.fori_loop``
    hands its body a ``VirtualRegister``)."""
    if isinstance(value, NkiTensor):
        return int(np.asarray(value.data).reshape(-1)[0])
    return int(value)


def allocate(
    shape: Sequence[int],
    dtype: Any,
    buffer: MemoryRegion,
    name: str,
    api: str,
    fill: float | None = None,
    *,
    block_dims: int = 0,
) -> NkiTensor:
    """New storage in ``buffer``, holding ``fill`` or, for ``None``, the uninitialised
    sentinel (NaN for floats, 4 for integers). ``block_dims``: leading dimensions before
    the partition dimension (the legacy generation's ``par_dim``), which are logical: "the
    physical tiles may not be alive in the memory simultaneously ... at the very minimum,
    only 1 physical tile needs to be alive" (general/nki/nki_block_dimension_migration_guide.rst),
    so one tile is counted."""
    run = runtime.active_run(api)
    dtype = nki_dtype(dtype)
    shape = storage_shape(api, shape, buffer)
    alloc = None
    if not is_hbm(buffer):
        what = f"{name or 'tensor'} {list(shape)} {dtype} in {buffer.value}"
        alloc = on_chip_allocation(run, buffer, shape[block_dims:], dtype, what)
    if buffer is MemoryRegion.shared_hbm:  # one storage for all logical cores of the launch
        run.shared_hbm_created += 1
        data = run.launch.shared_tensor(
            run.shared_hbm_created - 1, lambda: _new_storage(shape, dtype, fill)
        )
        if data.shape != shape or data.dtype != dtype:
            raise errors.ShapeMismatch(
                f"logical core {run.program_id} creates shared_hbm tensor {list(shape)} {dtype} "
                f"where another core created {list(data.shape)} {data.dtype}"
            )
    else:
        data = _new_storage(shape, dtype, fill)
    return NkiTensor(data, dtype, buffer, alloc, name)


def storage_shape(api: str, shape: Sequence[int], buffer: Any) -> tuple[int, ...]:
    """``shape`` of a new tensor (positive sizes) in ``buffer`` (a memory region)."""
    dims = tuple(int(s) for s in shape)
    if not dims or any(s < 1 for s in dims):
        raise errors.ShapeMismatch(f"'{api}' needs a shape of positive sizes, got {dims}")
    if not isinstance(buffer, MemoryRegion):
        raise TypeError(f"'{api}': buffer must be nl.sbuf, nl.psum, nl.hbm or nl.shared_hbm")
    return dims


def on_chip_allocation(
    run: runtime.Run, buffer: MemoryRegion, tile: tuple[int, ...], dtype: np.dtype[Any], what: str
) -> runtime.Allocation:
    """SBUF/PSUM for one ``tile`` (partitions <= 128, at least one free axis: "Tile on
    SBUF/PSUM must have at least 2 dimensions", nki_known_issues.rst), its bytes per
    partition counted against the target's capacity."""
    if len(tile) < 2:
        raise errors.LeadingDimensionOfTensorMustBePartition(
            f"{what}: an on-chip tile needs a partition axis and at least one free axis"
        )
    if tile[0] > runtime.PMAX:
        raise errors.NumPartitionExceedArchLimit(
            f"{what}: size of partition dimension {tile[0]} exceeds architecture "
            f"limitation of {runtime.PMAX}"
        )
    return run.allocate(buffer is MemoryRegion.psum, math.prod(tile[1:]) * dtype.itemsize, what)


def _new_storage(shape: tuple[int, ...], dtype: np.dtype[Any], fill: float | None) -> np.ndarray:
    if is_packed(dtype):  # packed MX data starts as all-ones bytes (NaN in both fp8 formats)
        return np.full((*shape, dtype.itemsize), 0xFF, np.uint8).view(dtype).reshape(shape)
    if fill is None:
        fill = UNINITIALISED_FLOAT if is_float(dtype) else UNINITIALISED_INT
    return np.full(shape, fill, dtype)


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


def wrap_argument(
    array: np.ndarray, position: str, buffer: MemoryRegion = MemoryRegion.private_hbm
) -> NkiTensor:
    """A kernel argument: the caller's array, in HBM (writes go back to it)."""
    try:
        dtype = nki_dtype(array.dtype)
    except errors.UnsupportedDtype as error:
        raise errors.UnsupportedDtype(f"kernel argument {position}: {error}") from None
    if array.ndim == 0 or array.size == 0:
        raise errors.ShapeMismatch(f"kernel argument {position} has shape {array.shape}")
    return NkiTensor(array, dtype, buffer, None, position, is_argument=True)
