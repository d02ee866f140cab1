"""``NkiTensor``: a typed view of HBM, SBUF or PSUM storage held in a numpy array, with the
SDK's indexing and view rules checked (bounds, the partition axis of on-chip tensors)."""

from __future__ import annotations

import enum
import inspect
import math
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

from asickernels.simulate.nki import errors, placement, runtime


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
    # 64-bit values only for NkiScalar loads and stores (nki.isa.scalar_load, NKI 0.7+).
    "int64": np.dtype(np.int64),
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
    name = _NAMES.get(dtype)  # asked for every operand: str(dtype) is slow
    if name is None:
        name = _NAMES[dtype] = next(
            (n for n, d in DTYPES.items() if d == dtype and d.metadata is None), str(dtype)
        )
    return name


# plain dtype (no metadata, no fields) -> its NKI name
_NAMES: dict[np.dtype[Any], str] = {}


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
    attributes.

    A subclass that defines no ``__init__`` gets the one the NKI compiler creates, with or
    without ``@dataclass`` (nki/get-started/nki-language-guide.rst, "Class Support"): one
    parameter per field, in order, defaulting to the field's class value (None when it has
    none), then ``__post_init__`` (other keywords become attributes, as ``NKIObject``'s own
    ``__init__`` makes them). Fields are the annotated class attributes and, as AWS's
    kernels use them, the unannotated ones (nki-library@d2ad3a5 attention_cte.py builds its
    ``@dataclass SectionParams`` of plain ``section_idx = None`` attributes by keyword), frozen
    dataclasses too (its rotational_topk_utils.py ``@dataclass(frozen=True)
    TopkHardwareParams``)."""

    __slots__ = ()

    def __init__(self, **kwargs: Any) -> None:
        for name, value in kwargs.items():
            setattr(self, name, value)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        inherited = cls.__init__
        if "__init__" not in cls.__dict__ and (
            inherited is NKIObject.__init__ or getattr(inherited, "nki_generated", False)
        ):
            cls.__init__ = _field_initializer(cls)  # type: ignore[method-assign]


def _field_initializer(cls: type) -> Any:
    """The NKI compiler's default ``__init__`` for ``cls`` (see :class:`NKIObject`)."""
    defaults: dict[str, Any] = {}
    for klass in reversed(cls.__mro__[: cls.__mro__.index(NKIObject)]):
        for name in inspect.get_annotations(klass):
            defaults.setdefault(name, klass.__dict__.get(name))
        for name, value in klass.__dict__.items():
            if not name.startswith("_") and not callable(value) and not hasattr(value, "__get__"):
                defaults.setdefault(name, value)
    fields = list(defaults)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(fields):
            raise TypeError(f"{cls.__name__}() takes {len(fields)} fields, got {len(args)}")
        values = {**defaults, **dict(zip(fields, args, strict=False))}
        for name, value in kwargs.items():  # other keywords become attributes, as NKIObject's
            if name in fields[: len(args)]:
                raise TypeError(f"{cls.__name__}() got {name!r} twice")
            values[name] = value
        for name, value in values.items():  # as dataclass's own __init__ sets a frozen one's
            object.__setattr__(self, name, value)
        post_init = getattr(self, "__post_init__", None)
        if post_init is not None:
            post_init()

    __init__.nki_generated = True  # type: ignore[attr-defined]
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    return __init__


class NkiTensor(NKIObject):
    """A tensor in HBM, SBUF or PSUM. Indexing and the view methods return views sharing
    storage; on-chip tensors keep their partition axis (axis 0) first and whole."""

    __slots__ = (
        "_data",
        "_gather",
        "_oob",
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
        # per-partition indirection (vector_select, ap(vector_offset=), indirect()): each
        # partition's row view and the index into it (Ellipsis: the whole row)
        self._gather: list[tuple[np.ndarray, Any]] | None = None
        self._oob: np.ndarray | None = None  # rows of such a view whose offset is out of bounds
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
    def data(self) -> NkiTensor:
        """The tensor itself: the operand form that tensors share with tile grids
        (``nki.language.NkiGrid.data``), so a kernel can write ``tile.data`` for either
        (the example of the nki.language.NkiTileGrid reference page, NKI 0.7+)."""
        return self

    @property
    def values(self) -> np.ndarray:
        """The simulated storage (read it for debugging; kernels use NKI APIs). For a
        per-partition indirect view, a read-only copy of the gathered partitions."""
        if self._gather is None:
            return self._data
        gathered = np.stack([row[key] for row, key in self._gather])
        gathered.flags.writeable = False
        return gathered

    @property
    def out_of_bounds(self) -> np.ndarray | None:
        """For an indirect view (``ap(vector_offset=)``, ``vector_select``), which of its rows
        have an offset outside the tensor; None otherwise. Only a DMA with
        ``oob_mode=nisa.oob_mode.skip`` touches such a view: it skips those rows."""
        return self._oob

    def scatter(self, values: np.ndarray, skip: np.ndarray | None = None) -> bool:
        """Writes ``values`` through a per-partition indirect view, leaving the rows
        ``skip`` selects (True), or does nothing for an ordinary view (False)."""
        if self._gather is None:
            return False
        for r, ((row, key), value) in enumerate(zip(self._gather, values, strict=True)):
            if skip is None or not skip[r]:
                row[key] = value
        return True

    def __repr__(self) -> str:
        return (
            f"NkiTensor({self.name or '?'}: {list(self.shape)} {self.dtype} in {self.buffer.value})"
        )

    def __bool__(self) -> bool:
        """True: a tensor in a Python condition is a presence test. The compiler resolves every
        ``if`` while specializing the kernel, before any tensor holds a value (nki/get-started/
        nki-language-guide.rst@81ce03a, "Compilation Model" and "Control Flow"), and the
        reference's ``NkiTensor`` defines no truth value of its own (nki/api/nki/language/
        __init__.py@81ce03a); nki-library@d2ad3a5's device-run kernels test optional tensors
        so (core/mlp/mlp_tkg/mlp_tkg_constants.py:173, ``if ... expert_index:`` on HBM and
        SBUF indices, which may hold 0). A branch on values takes nl.where or predicated
        instructions, on a device as here."""
        return True

    def __iter__(self) -> Any:
        raise TypeError("NKI tensors are not iterable; index them with slices")

    @property
    def strides(self) -> tuple[int, ...]:
        """Element strides of this view into its storage (partition stride included)."""
        return tuple(stride // self.dtype.itemsize for stride in self._byte_strides())

    @property
    def offset(self) -> int:
        """Element offset of this view's first element in its storage."""
        return self._byte_offset() // self.dtype.itemsize

    # A tensor's storage is its allocation laid out row-major, one partition after another
    # (what ``offset``, ``strides`` and ``ap`` address). An ordinary allocation is such an
    # array; a tensor placed at an address is a view of the core's physical memory, whose
    # partitions lie further apart: positions are translated between the two layouts.
    def _memory(self) -> tuple[np.ndarray, int, int]:
        """``(memory, start, row)``: the bytes behind this tensor's allocation as one
        contiguous uint8 array, where the allocation starts in it, and the bytes from one
        partition to the next there."""
        allocation = self.allocation
        if allocation is None or allocation.address is None:
            return self.root.reshape(-1).view(np.uint8), 0, self._row_bytes()
        memory = allocation.run.physical(allocation.in_psum)
        row = memory.shape[1]
        return memory.reshape(-1), allocation.address[0] * row + allocation.address[1], row

    def _row_bytes(self) -> int:
        """Bytes per partition of the allocation's row-major layout."""
        return self.root.nbytes // self.root.shape[0] if self.root.ndim else self.root.nbytes

    def _byte_offset(self) -> int:
        """Where this view starts in its allocation's row-major layout, in bytes."""
        delta = _address(self._data) - _address(self.root)
        _, _, row = self._memory()
        partitions, within = divmod(delta, row)
        return partitions * self._row_bytes() + within

    def _byte_strides(self) -> tuple[int, ...]:
        """This view's strides in its allocation's row-major layout, in bytes."""
        strides = self._data.strides
        _, _, row = self._memory()
        if not strides or row == self._row_bytes():
            return tuple(strides)
        return (strides[0] // row * self._row_bytes(), *strides[1:])

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
        index must lie inside the tensor. On-chip, an integer on axis 0 keeps the axis, and
        views stay at least 2-D: integers on every free axis keep the last one at size 1
        (``t[:, 3]`` of a ``[128, 8]`` tile is ``[128, 1]``; nki-language-guide.rst@81ce03a,
        "Indexing"; nki-library@d2ad3a5 attention_cte.py:2734-2745 indexes that view with
        ``[:num_p, :1]``). HBM views stay at least 1-D. An empty range (``nl.ds(start, 0)``) makes an empty view, which no instruction takes:
        AWS's cross-entropy kernel gives an LNC=2 core no rows for a one-row input and
        never touches its empty slices (nki-library@d2ad3a5,
        test/integration/nkilib/experimental/loss/test_cross_entropy_forward.py, B=T=1)."""
        keys = expand_ellipsis(self, list(key) if isinstance(key, tuple) else [key])
        keys += [slice(None)] * (self.ndim - len(keys))
        numpy_key: list[int | slice] = []
        for axis, (k, size) in enumerate(zip(keys, self.shape, strict=True)):
            if isinstance(k, slice):
                numpy_key.append(checked_slice(self, axis, k, size, allow_empty=True))
            elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
                i = checked_index(self, axis, k, size)
                numpy_key.append(slice(i, i + 1) if axis == 0 and self.on_chip else i)
            else:
                raise TypeError(f"unsupported index {k!r} for {self!r}: use ints, slices or nl.ds")
        free = numpy_key[1:] if self.on_chip else numpy_key
        if free and all(not isinstance(k, slice) for k in free):
            last = numpy_key[-1]
            assert isinstance(last, int)
            numpy_key[-1] = slice(last, last + 1)
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
        """Element ``index`` of ``dim``, removing the dimension. A run-time ``index`` (a
        one-element tensor or an ``NkiScalar``: dynamic selection) is read now, as the
        simulator knows device values as it runs; one outside the dimension makes a view
        that raises where an instruction uses it (a DMA with ``oob_mode.skip`` skips it),
        as a device finds it only then."""
        indirect = not isinstance(index, (int, np.integer))
        if indirect:
            if self.is_indirect_view:
                raise errors.NkiValidationError(f"{self!r} is already an indirect view")
            if self.on_chip and dim % self.ndim == 0:
                raise errors.LeadingDimensionOfTensorMustBePartition(
                    f"dynamic select on the partition axis of {self!r}"
                )
            index = _scalar_value(index)
            if not 0 <= index < self.shape[dim % self.ndim]:
                shape = [n for d, n in enumerate(self.shape) if d != dim % self.ndim]
                placeholder = np.zeros(shape, self.dtype)
                return self._gathered(
                    [(row, Ellipsis) for row in placeholder],
                    self.dtype,
                    np.ones(len(placeholder), np.bool_),
                )
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
        if vector_offset.size != vector_offset.shape[0]:
            raise errors.ShapeMismatch(
                f"vector_select takes an SBUF [P, 1] vector_offset, got {vector_offset!r}"
            )
        offsets, outside = self._vector_offsets(
            vector_offset, self.shape[0], vector_offset.shape[0]
        )
        placeholder = np.zeros(self.shape[1:], self.dtype)
        rows = [
            (placeholder if bad else self._data[o], Ellipsis)
            for o, bad in zip(offsets, outside, strict=True)
        ]
        return self._gathered(rows, self.dtype, outside)

    def _vector_offsets(
        self, vector_offset: NkiTensor, limit: int, count: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """The first ``count`` offsets of an indirect view and which of them lie outside
        ``[0, limit)``: the SBUF integer tile ``vector_offset`` read as the instruction
        runs, column after
        column (``indices.T.flatten()``: a ``[128, N]`` tile of the 2-D index form gathers
        ``128 * N`` rows, nki.isa.dma_transpose "Indirect transpose", NKI 0.6)."""
        if self.is_indirect_view:
            raise errors.NkiValidationError(f"{self!r} is already an indirect view")
        if self.on_chip:
            raise errors.UnsupportedMemory(f"per-partition indirection reads HBM, not {self!r}")
        if vector_offset.buffer is not MemoryRegion.sbuf or vector_offset.ndim != 2:
            raise errors.ShapeMismatch(
                f"vector_offset must be a 2-D SBUF tile, got {vector_offset!r}"
            )
        if vector_offset.dtype.kind not in "iu":
            raise errors.UnsupportedDtype(
                f"vector_offset must hold integers, got {vector_offset!r}"
            )
        if vector_offset.size < count:
            raise errors.ShapeMismatch(
                f"{count} indirect rows need as many offsets, {vector_offset!r} has "
                f"{vector_offset.size}"
            )
        offsets = vector_offset.values.T.reshape(-1)[:count].astype(np.int64)
        return offsets, (offsets < 0) | (offsets >= limit)

    def _gathered(
        self,
        rows: list[tuple[np.ndarray, Any]],
        dtype: np.dtype[Any],
        out_of_bounds: np.ndarray | None = None,
    ) -> NkiTensor:
        view = self._view(np.stack([row[key] for row, key in rows]), dtype=dtype, indirect=True)
        view._gather = rows
        if out_of_bounds is not None and out_of_bounds.any():
            view._oob = out_of_bounds
        return view

    def indirect(self, index: NkiTensor, num_elem: int | None = None) -> NkiTensor:
        """A Tensor Indirection view (NeuronCore-v4): ``[P, num_elem]``, element ``[p, i]``
        being this tensor's partition ``p`` at free offset ``o_i`` (of the flattened free
        axes), with ``o_i = index[i % 16, i // 16]`` (``index``: an SBUF ``[P, K]`` integer
        tile, read as the instruction runs; ``num_elem`` defaults to ``index.size``).
        Instructions read it (gather) or write it (scatter). The snake groups 16
        partitions, the group of the Vector, Scalar and GpSimd engines; the Tensor
        engine's group of 32 is not simulated (nki.language.NkiTensor.indirect, NKI 0.6)."""
        if runtime.current_target().version < 4:
            raise errors.UnsupportedOperator(
                f"indirect() on {self!r}: Tensor Indirection needs NeuronCore-v4 (trn3)"
            )
        if self.is_indirect_view:
            raise errors.NkiValidationError(f"{self!r} is already an indirect view")
        if not isinstance(index, NkiTensor) or index.buffer is not MemoryRegion.sbuf:
            raise errors.UnsupportedMemory(
                f"indirect(): index must be an SBUF tensor, got {index!r}"
            )
        if index.ndim != 2 or index.shape[0] != self.shape[0] or index.dtype.kind not in "iu":
            raise errors.ShapeMismatch(
                f"indirect(): index must be an integer [{self.shape[0]}, K] tile, got {index!r}"
            )
        count = index.size if num_elem is None else int(num_elem)
        group = min(16, index.shape[0])
        if not 0 < count <= index.size:
            raise errors.ShapeMismatch(f"indirect(): num_elem {count} outside 1..{index.size}")
        positions = np.arange(count)
        offsets = index.values[positions % group, positions // group].astype(np.int64)
        row_shape = self.shape[1:]
        if offsets.min() < 0 or offsets.max() >= math.prod(row_shape):
            raise errors.TensorAccessOutOfBound(
                f"indirect() offsets {offsets.min()}..{offsets.max()} outside the "
                f"{math.prod(row_shape)} free elements of {self!r}"
            )
        key = np.unravel_index(offsets, row_shape)
        return self._gathered([(row, key) for row in self._data], self.dtype)

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
        stride must be a whole number of partitions (or this view's free size: one partition)
        and the rest must stay in one partition.
        ``scalar_offset`` adds its (runtime) value times the stride of ``indirect_dim``;
        ``vector_offset`` (HBM only) does so per partition: partition ``i`` of the view starts
        ``vector_offset[i]`` strides of ``indirect_dim`` in, walking the remaining pairs.

        A pattern reaching outside the tensor (or, on-chip, outside a partition) is no error
        until an instruction accesses it: the view's rows (first pair) that do are
        :attr:`out_of_bounds`, which a DMA with ``oob_mode=oob_mode.skip`` skips and any
        other access refuses. nki.isa.dma_copy's reference checks a dynamic start address
        "during execution" (oob_mode.error raising, oob_mode.skip skipping), and
        nki-library@d2ad3a5's kernels build such patterns and leave them unused or skipped:
        core/output_projection/output_projection_tkg.py:932-948 makes the pattern of an
        ``h_2_idx`` past the end before ``if h_2_idx < cfg.h_2_size:`` guards its matmul,
        core/moe/moe_cte/bwmm_shard_on_block.py:1441-1454 DMAs a ``scalar_offset`` expert
        index past the last with ``oob_mode.skip``."""
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
            if self.on_chip and getattr(scalar_offset, "dtype", None) == np.dtype(np.int64):
                # nki.isa.scalar_load: "on an SBUF or PSUM operand the offset must be nl.int32"
                raise errors.UnsupportedDtype(
                    f"an nl.int64 scalar_offset on {self!r}: on-chip offsets are nl.int32"
                )
            start += _scalar_value(scalar_offset) * self._byte_strides()[indirect_dim]
        if start % itemsize:
            raise errors.TensorAccessOutOfBound(
                f"access pattern {pattern} starts at byte {start} of {self!r}, inside an "
                f"element of {new_dtype}"
            )
        if self.on_chip:
            pairs = self._on_chip_pattern(pairs, itemsize)
        (step, count), free = pairs[0], pairs[1:]
        starts = start + np.arange(count, dtype=np.int64) * step * itemsize
        outside = self._rows_outside(starts, free, itemsize)
        if outside.any():
            rows = self._row_views(starts, free, new_dtype, outside)
            return self._gathered([(row, Ellipsis) for row in rows], new_dtype, outside)
        strides = [step * itemsize for step, _ in pairs]
        memory, base, row = self._memory()
        if self.on_chip:
            strides[0] = strides[0] // self._row_bytes() * row  # whole partitions
        partitions, within = divmod(start, self._row_bytes())
        data = np.ndarray(
            [count for _, count in pairs],
            new_dtype,
            buffer=memory,
            offset=base + partitions * row + within,
            strides=strides,
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
        new_dtype = self.dtype if dtype is None else nki_dtype(dtype)
        stride = self._data.strides[indirect_dim]
        if stride % new_dtype.itemsize:
            raise errors.ShapeMismatch(
                f"dimension {indirect_dim} of {self!r} is not a whole number of {new_dtype}"
            )
        offsets, outside = self._vector_offsets(vector_offset, self.shape[indirect_dim], partitions)
        # partition i is ``ap([[1, 1], *free], offset + offsets[i] * stride)``
        start = self._byte_offset() + (offset or 0) * new_dtype.itemsize
        if start % new_dtype.itemsize and not outside.all():
            raise errors.TensorAccessOutOfBound(
                f"access pattern {pattern} starts at byte {start} of {self!r}, inside an "
                f"element of {new_dtype}"
            )
        starts = start + offsets * stride
        bad = outside | self._rows_outside(starts, free, new_dtype.itemsize)
        rows = self._row_views(starts, free, new_dtype, bad)
        return self._gathered([(row, Ellipsis) for row in rows], new_dtype, outside)

    def _on_chip_pattern(
        self, pairs: list[tuple[int, int]], itemsize: int
    ) -> list[tuple[int, int]]:
        """``pairs`` checked as an on-chip pattern, with a partition step given as this
        view's free size made the storage's. Partitions are separate memories: an on-chip
        pattern moves between them only with its first pair (a row that runs past its
        partition's end is out of bounds: :meth:`_rows_outside`), whose step is the storage's
        free size (deep-dives/nki-aps.rst@81ce03a, "Restriction on SBUF/PSUM Tensors"). The
        step may also be the free size of the view ``.ap`` is called on: nki-library's
        TensorView re-patterns views that way, e.g. the gate and up halves of one
        [T, 2 * I] buffer as [[I, T], [1, I]] (nki-library@d2ad3a5
        core/mlp/mlp_tkg/mlp_tkg_gate_up_projection.py:240-244 on the views of 606-615)."""
        (partition_step, partitions) = pairs[0]
        view_row = math.prod(self.shape[1:]) * self.dtype.itemsize
        if partitions > 1 and partition_step * itemsize == view_row != self._row_bytes():
            pairs = [(self._row_bytes() // itemsize, partitions), *pairs[1:]]
            partition_step = pairs[0][0]
        # a tensor over 128 partitions (runtime.allocating) is viewed whole; compute
        # instructions check their operands
        if partitions > max(runtime.PMAX, self.root.shape[0]):
            raise errors.NumPartitionExceedArchLimit(
                f"access pattern with {partitions} partitions exceeds architecture limitation of "
                f"{runtime.PMAX}"
            )
        if partitions > 1 and (partition_step * itemsize) % self._row_bytes():
            raise errors.LeadingDimensionOfTensorMustBePartition(
                f"access pattern {[list(p) for p in pairs]} on {self!r} crosses partitions "
                "outside its first (partition) pair"
            )
        return pairs

    def _rows_outside(
        self, starts: np.ndarray, free: list[tuple[int, int]], itemsize: int
    ) -> np.ndarray:
        """Which rows of a pattern, row ``r`` walking the pairs ``free`` from byte
        ``starts[r]``, reach bytes outside the storage, or, on-chip, outside their
        partition."""
        low = sum(min(0, s * (c - 1)) for s, c in free) * itemsize
        high = (sum(max(0, s * (c - 1)) for s, c in free) + 1) * itemsize
        outside = (starts + low < 0) | (starts + high > self.root.nbytes)
        if self.on_chip:
            within = starts % self._row_bytes()
            outside |= (within + low < 0) | (within + high > self._row_bytes())
        return outside

    def _row_views(
        self,
        starts: np.ndarray,
        free: list[tuple[int, int]],
        dtype: np.dtype[Any],
        skip: np.ndarray,
    ) -> list[np.ndarray]:
        """Row ``r`` of a pattern: the pairs ``free`` walked from byte ``starts[r]`` of the
        allocation's row-major layout, as a view of the storage, or a zero placeholder where
        ``skip[r]`` (the callers skip the rows :meth:`_rows_outside` finds). All rows at once:
        an indirect DMA has one per partition."""
        shape = [count for _, count in free]
        strides = [step * dtype.itemsize for step, _ in free]
        placeholder = np.zeros(shape, dtype)
        memory, base, row = self._memory()
        partitions, within = np.divmod(starts, self._row_bytes())
        positions = (base + partitions * row + within).tolist()
        return [
            placeholder
            if bad
            else np.ndarray(shape, dtype, buffer=memory, offset=position, strides=strides)
            for position, bad in zip(positions, skip.tolist(), strict=True)
        ]

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
        memory, _, _ = self._memory()
        data = np.ndarray(
            (*self.shape[:-1], count),
            new_dtype,
            buffer=memory,
            offset=_address(self._data) - _address(memory),
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


def checked_slice(tensor: Any, axis: int, k: slice, size: int, allow_empty: bool = False) -> slice:
    """``k`` on dimension ``axis`` (of ``size``) of ``tensor`` (either generation's) with its
    bounds resolved: a step >= 1 and a range inside the dimension, non-empty unless
    ``allow_empty``."""
    step = 1 if k.step is None else int(k.step)
    start = 0 if k.start is None else int(k.start)
    stop = size if k.stop is None else int(k.stop)
    start += size if start < 0 else 0
    stop += size if stop < 0 else 0
    if step < 1:
        raise errors.TensorAccessOutOfBound(f"slice step {step} on {tensor!r}: steps must be >= 1")
    if allow_empty and 0 <= start == stop <= size:
        return slice(start, stop, step)
    if not 0 <= start < stop <= size:
        raise errors.TensorAccessOutOfBound(
            f"index range [{start}, {stop - 1}] on dimension {axis} of {tensor!r} exceeds "
            f"its size {size}"
            if stop > start
            else f"empty range [{start}, {stop}) on dimension {axis} of {tensor!r}"
        )
    return slice(start, stop, step)


def _scalar_value(value: Any) -> int:
    """A run-time index: a one-element tensor's value, or an ``NkiScalar``'s or register's
    (``nl.fori_loop`` hands its body one)."""
    if isinstance(value, NkiTensor):
        return int(np.asarray(value.values).reshape(-1)[0])
    return int(getattr(value, "value", value))


def allocate(
    shape: Sequence[int],
    dtype: Any,
    buffer: MemoryRegion,
    name: str,
    api: str,
    fill: float | None = None,
    *,
    block_dims: int = 0,
    address: Any = None,
) -> NkiTensor:
    """New storage in ``buffer``, holding ``fill`` or, for ``None``, the uninitialised
    sentinel (NaN for floats, 4 for integers). ``block_dims``: leading dimensions before
    the partition dimension (the legacy generation's ``par_dim``), which are logical: "the
    physical tiles may not be alive in the memory simultaneously ... at the very minimum,
    only 1 physical tile needs to be alive" (general/nki/nki_block_dimension_migration_guide.rst),
    so one tile is counted. ``address`` ``(partition_offset, free_offset)`` places an
    on-chip tensor in the core's physical memory instead (:mod:`.placement`): it holds
    whatever was written there."""
    run = runtime.active_run(api)
    dtype = nki_dtype(dtype)
    shape = storage_shape(api, shape, buffer)
    if address is not None:
        if is_hbm(buffer):
            raise NotImplementedError(
                f"'{api}': address= on an HBM tensor ({name or list(shape)}) is not simulated; "
                "only SBUF and PSUM placements are"
            )
        what = f"{name or 'tensor'} {list(shape)} {dtype} in {buffer.value}"
        psum = buffer is MemoryRegion.psum
        data, placed = placement.place(run, psum, dtype, shape, address, what)
        return NkiTensor(data, dtype, buffer, placed, name)
    alloc = None
    if not is_hbm(buffer):
        what = f"{name or 'tensor'} {list(shape)} {dtype} in {buffer.value}"
        alloc = on_chip_allocation(run, buffer, shape[block_dims:], dtype, what)
    if buffer is MemoryRegion.shared_hbm:  # one storage for all logical cores of the launch
        run.shared_hbm_created += 1
        data = run.launch.shared_tensor(
            run.shared_hbm_created - 1, lambda: _new_storage(shape, dtype, fill, run.trace_only)
        )
        if data.shape != shape or data.dtype != dtype:
            raise errors.ShapeMismatch(
                f"logical core {run.program_id} creates shared_hbm tensor {list(shape)} {dtype} "
                f"where another core created {list(data.shape)} {data.dtype}"
            )
    else:
        data = _new_storage(shape, dtype, fill, run.trace_only)
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
    partition_tiles = -(-tile[0] // runtime.PMAX)
    if partition_tiles > 1:
        if not run.partition_tiles:
            raise errors.NumPartitionExceedArchLimit(
                f"{what}: size of partition dimension {tile[0]} exceeds architecture "
                f"limitation of {runtime.PMAX}"
            )
        run.wide_on_chip = True  # runtime.allocating(partition_tiles=True)
    nbytes = partition_tiles * math.prod(tile[1:]) * dtype.itemsize
    return run.allocate(buffer is MemoryRegion.psum, nbytes, what)


def _new_storage(
    shape: tuple[int, ...], dtype: np.dtype[Any], fill: float | None, trace_only: bool
) -> np.ndarray:
    if trace_only:  # values are not computed: every value reads as zero (and zeroed pages
        return np.zeros(shape, dtype)  # are only touched when written)
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


def _address(array: np.ndarray) -> int:
    """Where ``array``'s first element is in memory."""
    return int(array.__array_interface__["data"][0])
