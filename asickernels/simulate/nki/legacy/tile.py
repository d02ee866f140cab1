"""The data model of the legacy ``neuronxcc.nki`` API (Neuron SDK 2.2x): index grids from
``nl.arange``/``nl.mgrid``, masks, and :class:`Tensor`, a view of HBM, SBUF or PSUM storage.

A view is its storage plus, for every element, the element's flat offset into the storage:
slices, integers, index grids (NumPy advanced indexing) and ``broadcast_to`` all reduce to
indexing that offset array. Accesses an index grid takes outside the tensor are recorded
rather than refused at once, because a ``mask=`` may exclude them ("out-of-bound access can
be avoided by providing a proper mask", general/nki/api/nki.errors.rst,
err_tensor_access_out_of_bound); the instruction that uses the view checks that.
Offsets rather than the core's strided views, because index grids may repeat elements
(``broadcast_to``), read run-time indices from a tile (indirect DMA) and reach outside the
tensor under a mask: none of these is a NumPy strided view.

The storage is the core's: a whole core tensor from the core allocator (SBUF/PSUM capacity,
counters), and the index rules both generations share (ellipsis, integer and slice bounds)
are the core's functions.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Callable, Sequence
from functools import partialmethod
from operator import itemgetter
from typing import Any

import numpy as np

from asickernels.simulate.nki import alu, errors, placement, runtime
from asickernels.simulate.nki.compiler import DirectAllocation
from asickernels.simulate.nki.errors import (
    Err1dArangeNotSupported,
    ErrCannotAssignToIndex,
    ErrControlFlowConditionDependingOnArange,
    ErrUnsupportedMixingBasicAdvancedTensorIndexing,
)
from asickernels.simulate.nki.legacy import spmd
from asickernels.simulate.nki.tensor import (
    UNINITIALISED_FLOAT,
    UNINITIALISED_INT,
    MemoryRegion,
    NkiTensor,
    checked_index,
    checked_slice,
    expand_ellipsis,
    is_float,
    is_hbm,
    nki_dtype,
    storage_shape,
    wrap_argument,
)
from asickernels.simulate.nki.tensor import allocate as core_allocate


class par_dim(int):  # the SDK's (lowercase) name
    """Marks the partition dimension in a shape: ``(blocks, nl.par_dim(128), free)``; the
    dimensions before it are block dimensions."""


# -- index grids and masks ---------------------------------------------------------------
class IndexGrid:
    """An affine index expression over ``nl.arange``/``nl.mgrid`` values (an int array that
    broadcasts against the other indices of the same access). ``dynamic``: it includes
    values read from a tile at run time (``offsets_tile[0, i] + i_f``)."""

    __slots__ = ("dynamic", "lifted", "values")

    def __init__(self, values: np.ndarray, lifted: bool = True, dynamic: bool = False) -> None:
        self.values = values
        self.lifted = lifted
        self.dynamic = dynamic

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    def __getitem__(self, key: Any) -> IndexGrid:
        """``[:, None]`` / ``[None, :]``: lifts the grid to its axis of a tile."""
        return IndexGrid(self.values[key], dynamic=self.dynamic)

    def __setitem__(self, key: Any, value: Any) -> None:
        raise ErrCannotAssignToIndex(
            "'index' tensor does not support item assignment; build values with nisa.iota"
        )

    def __bool__(self) -> bool:
        raise ErrControlFlowConditionDependingOnArange(
            "control flow depending on nl.arange/nl.mgrid is not supported; use mask="
        )

    def _combine(self, other: Any, function: Callable[[Any, Any], Any]) -> IndexGrid:
        if isinstance(other, Tensor):
            other = _dynamic_indices(other)
        if not isinstance(other, (IndexGrid, int, np.integer)) or isinstance(other, bool):
            raise TypeError(
                f"index expressions must be affine in nl.arange/nl.mgrid values, loop "
                f"variables and nl.program_id, got {type(other).__name__}"
            )
        grid = other if isinstance(other, IndexGrid) else None
        lifted = self.lifted and (grid is None or grid.lifted)
        dynamic = self.dynamic or (grid is not None and grid.dynamic)
        values = function(self.values, other if grid is None else grid.values)
        return IndexGrid(np.asarray(values), lifted, dynamic)

    __add__ = __radd__ = partialmethod(_combine, function=np.add)
    __sub__ = partialmethod(_combine, function=np.subtract)
    __rsub__ = partialmethod(_combine, function=lambda a, b: b - a)
    __mul__ = __rmul__ = partialmethod(_combine, function=np.multiply)
    __floordiv__ = partialmethod(_combine, function=np.floor_divide)
    __mod__ = partialmethod(_combine, function=np.mod)

    def __neg__(self) -> IndexGrid:
        return IndexGrid(-self.values, self.lifted)

    def _compare(self, other: Any, function: Callable[[Any, Any], Any]) -> Mask:
        other_values = other.values if isinstance(other, IndexGrid) else other
        difference = np.asarray(self.values - np.asarray(other_values))
        return Mask(np.asarray(function(self.values, other_values)), (difference, function))

    __lt__ = partialmethod(_compare, function=np.less)
    __le__ = partialmethod(_compare, function=np.less_equal)
    __gt__ = partialmethod(_compare, function=np.greater)
    __ge__ = partialmethod(_compare, function=np.greater_equal)
    __eq__ = partialmethod(_compare, function=np.equal)
    __ne__ = partialmethod(_compare, function=np.not_equal)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"IndexGrid(shape={self.shape})"


class Mask:
    """A compile-time predicate over index values (general/nki/api/nki.api.shared.rst,
    "NKI API Masking"): comparisons of affine index expressions, combined with ``&``.
    ``comparison``: for one comparison ``a <op> b``, ``(a - b, op)`` (what
    ``nisa.affine_select`` evaluates); None once masks are combined."""

    __slots__ = ("comparison", "values")

    def __init__(
        self, values: np.ndarray, comparison: tuple[np.ndarray, Any] | None = None
    ) -> None:
        self.values = values.astype(np.bool_)
        self.comparison = comparison

    def _combine(self, other: Any, function: Callable[[Any, Any], Any]) -> Mask:
        other_values = other.values if isinstance(other, Mask) else np.bool_(other)
        return Mask(np.asarray(function(self.values, other_values)))

    def __and__(self, other: Any) -> Mask:
        return self._combine(other, np.logical_and)

    __rand__ = __and__

    def __or__(self, other: Any) -> Mask:
        return self._combine(other, np.logical_or)

    __ror__ = __or__

    def __invert__(self) -> Mask:
        return Mask(~self.values)

    def __bool__(self) -> bool:
        # nki_known_issues.rst: "Use & to combine masks. We do not support using and".
        raise ErrControlFlowConditionDependingOnArange(
            "a comparison of nl.arange/nl.mgrid values is a mask: pass it as mask= and "
            "combine masks with '&', not 'and'/'or'/'if'"
        )


class _MGrid:
    """``nl.mgrid[0:128, 0:512]``: one open index grid per axis (``i_p, i_f = ...`` or
    ``.p``/``.x``)."""

    def __getitem__(self, key: Any) -> MGridResult:
        keys = key if isinstance(key, tuple) else (key,)
        grids: Any = np.ogrid[keys]
        listed = list(grids) if isinstance(grids, (list, tuple)) else [grids]
        return MGridResult([IndexGrid(np.asarray(g, np.int64)) for g in listed])


class MGridResult(tuple):  # type: ignore[type-arg]
    """The grids ``nl.mgrid`` returns: iterable, with ``.p`` (axis 0), ``.x``, ``.y`` and
    ``.z`` (axes 1-3)."""

    def __new__(cls, grids: list[IndexGrid]) -> MGridResult:
        return super().__new__(cls, grids)

    p = property(itemgetter(0))
    x = property(itemgetter(1))
    y = property(itemgetter(2))
    z = property(itemgetter(3))


mgrid = _MGrid()


def arange(*args: int) -> IndexGrid:
    """``arange(stop)`` or ``arange(start, stop)``: index values, to be lifted to an axis."""
    if not 1 <= len(args) <= 2:
        raise TypeError("nl.arange takes (stop) or (start, stop)")
    return IndexGrid(np.arange(*(int(a) for a in args), dtype=np.int64), lifted=False)


def mask_values(api: str, mask: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    """``mask`` as a boolean array over ``shape`` (the instruction's iteration space), or
    None when every element executes."""
    if mask is None:
        return None
    if isinstance(mask, (bool, np.bool_)):
        return None if mask else np.zeros(shape, np.bool_)
    if not isinstance(mask, Mask):
        raise TypeError(f"'{api}': mask must be a comparison of index expressions, got {mask!r}")
    try:
        return np.broadcast_to(mask.values, shape)
    except ValueError:
        raise errors.ShapeMismatch(
            f"'{api}': mask of shape {mask.values.shape} does not fit the instruction's "
            f"shape {list(shape)}"
        ) from None


# -- storage and views --------------------------------------------------------------------
class PlacedElements:
    """The elements of a tensor the kernel placed (:func:`_placed`), in its logical order
    (blocks, then each tile row-major), as they lie in the core's physical memory:
    ``elements[i]`` is ``memory[to_memory[i]]``. Views index logical elements, so that each
    logical tile keeps its own state (a PSUM tile's accumulation), while tiles placed at one
    address share their values."""

    __slots__ = ("memory", "to_memory")

    def __init__(self, memory: np.ndarray, to_memory: np.ndarray) -> None:
        self.memory = memory  # the physical SBUF or PSUM as one array of the tensor's dtype
        self.to_memory = to_memory

    @property
    def size(self) -> int:
        return int(self.to_memory.size)

    def __getitem__(self, index: Any) -> np.ndarray:
        return self.memory[self.to_memory[index]]  # type: ignore[no-any-return]

    def __setitem__(self, index: Any, values: Any) -> None:
        self.memory[self.to_memory[index]] = values


class Storage:
    """The memory behind a legacy tensor and all its views: a whole core :class:`NkiTensor`
    from the core allocator (one storage object and one SBUF/PSUM accounting for both
    generations), plus the state only the legacy API keeps."""

    __slots__ = ("block_dims", "compiler_placed", "flat", "read_only", "tensor", "written")

    def __init__(
        self,
        tensor: NkiTensor,
        block_dims: int = 0,
        read_only: bool = False,
        flat: PlacedElements | None = None,
    ) -> None:
        self.tensor = tensor
        # the elements views index (``flat[offsets]``): the tensor's own array (a view: storage
        # is created C-contiguous), or where a placed tensor's elements are in memory
        self.flat: Any = tensor.values.reshape(-1) if flat is None else flat
        self.block_dims = block_dims  # on-chip: leading dims before the partition dim
        self.read_only = read_only  # an immutable kernel parameter
        self.compiler_placed = False  # an instruction's result: the compiler places it
        # PSUM: which elements hold a value (a first matmul accumulation overwrites the rest)
        psum = tensor.buffer is MemoryRegion.psum
        self.written = np.zeros(self.flat.size, np.bool_) if psum else None

    def core_view(self, data: np.ndarray) -> NkiTensor:
        """``data``, a NumPy view of this storage, as a core tensor view."""
        core = self.tensor
        return NkiTensor(data, core.dtype, core.buffer, core.allocation, core.name,
                         core.is_argument, root=core.values)  # fmt: skip

    def check_writable(self, api: str) -> None:
        """A write to a parameter not annotated ``nt.mutable_tensor``: the docs forbid it
        (nki.errors.rst, err_cannot_update_immutable_parameter), but kernels of the older
        style take their output as an argument and store into it, and published ones ran so
        on devices (aws-neuron/neuronx-distributed
        examples/training/mamba2/mamba2/conv1d_grouped.py@8b29d69, ``conv1d_grouped_kernel``
        stores into its ``output`` argument). It warns once per parameter and runs."""
        if self.read_only:
            warnings.warn(
                f"'{api}' writes kernel parameter {self.tensor.name}, which the docs make "
                "immutable (ErrCannotUpdateImmutableParameter: annotate it nt.mutable_tensor "
                "and return it, or write a new nl.shared_hbm tensor); published kernels that "
                "store into an output argument ran on devices, so the write goes through",
                errors.DeviceRanItWarning,
                stacklevel=4,
            )
            self.read_only = False


def allocate(
    shape: Sequence[int], dtype: Any, buffer: Any, name: str, api: str, fill: Any = None
) -> Tensor:
    """New storage of ``shape`` from the core allocator (``par_dim`` marks the partition
    dim; the dimensions before it are block dimensions), or placed by the kernel
    (``buffer`` a :class:`~asickernels.simulate.nki.compiler.DirectAllocation`)."""
    marked = [i for i, s in enumerate(shape) if isinstance(s, par_dim)]
    block_dims = marked[0] if marked else 0
    if isinstance(buffer, DirectAllocation):
        return _placed(shape, dtype, buffer, name, api, fill, block_dims)
    storage = Storage(
        core_allocate(shape, dtype, buffer, name, api, fill, block_dims=block_dims), block_dims
    )
    if storage.written is not None and fill is not None:
        storage.written[:] = True
    return Tensor.whole(storage)


def _placed(
    shape: Sequence[int],
    dtype: Any,
    direct: DirectAllocation,
    name: str,
    api: str,
    fill: Any,
    block_dims: int,
) -> Tensor:
    """A tensor whose logical tiles (one per block index) the kernel placed with ``direct``:
    each tile is a view of the core's physical SBUF or PSUM (:mod:`.placement`), tiles
    placed at one address are one physical tile, and the tensor's storage is that memory
    read as ``dtype``."""
    run = runtime.active_run(api)
    dtype = nki_dtype(dtype)
    dims = storage_shape(api, shape, direct.region)
    blocks, tile = dims[:block_dims], dims[block_dims:]
    what = f"{name or 'tensor'} {list(dims)} {dtype} ({direct!r})"
    if len(tile) < 2:
        raise errors.LeadingDimensionOfTensorMustBePartition(
            f"{what}: an on-chip tile needs a partition axis and at least one free axis"
        )
    in_psum = direct.region is MemoryRegion.psum
    nbytes = math.prod(tile[1:]) * dtype.itemsize
    reserved = 0 if in_psum else placement.LEGACY_SBUF_RESERVED

    def place() -> dict[tuple[int, ...], tuple[int, int]]:
        return {
            block: placement.check(
                run, in_psum, tile[0], nbytes, direct.address(block, tile[0], nbytes),
                f"{what} block {block}", reserved,
            )
            for block in np.ndindex(*blocks)
        }  # fmt: skip

    addresses = spmd.traced_placement(place)
    physical = run.physical(in_psum)
    row = physical.shape[1]
    first = min(p * row + b for p, b in addresses.values())
    if any((p * row + b - first) % dtype.itemsize for p, b in addresses.values()):
        raise NotImplementedError(
            f"{what}: its tiles start at byte offsets that differ by other than whole "
            f"{dtype} elements, which the simulator cannot view as one {dtype} storage"
        )
    base = first % dtype.itemsize
    memory = np.ndarray(((physical.size - base) // dtype.itemsize,), dtype, physical, base)
    rows = row // dtype.itemsize
    within = np.arange(tile[0])[:, None] * rows + np.arange(math.prod(tile[1:]))
    to_memory = np.empty((*blocks, *tile), np.int64)
    for block, (p, b) in addresses.items():
        to_memory[block] = ((p * row + b - base) // dtype.itemsize + within).reshape(tile)
    highest = max(addresses.values(), key=lambda address: address[1])
    allocation = run.place(in_psum, highest, nbytes)
    core = NkiTensor(memory, dtype, direct.region, allocation, name)
    storage = Storage(core, block_dims, flat=PlacedElements(memory, to_memory.reshape(-1)))
    tensor = Tensor(storage, _offsets(storage.flat.size).reshape(dims), block_dims)
    if not blocks:  # one tile: its strided view of the memory reads and writes it
        data = placement.view(run, in_psum, dtype, tile, addresses[()])
        tensor.core = NkiTensor(data, dtype, direct.region, allocation, name, root=memory)
    if fill is not None:
        tensor.write(np.full(tensor.shape, fill), None, api)
    return tensor


def argument(array: np.ndarray, position: str, writable: bool) -> Tensor:
    """A kernel argument in HBM viewing the caller's (C-contiguous) array."""
    return Tensor.whole(Storage(wrap_argument(array, position), read_only=not writable))


def _grid_range(grid: IndexGrid, axis: int, ndim: int, size: int) -> slice | None:
    """The slice selecting what ``grid`` selects on ``axis`` of an ``ndim``-axis access, when
    the grid runs along that axis only, one by one, inside ``0..size``; else None."""
    values = grid.values
    if values.ndim != ndim or any(n != 1 for i, n in enumerate(values.shape) if i != axis):
        return None
    line = values.reshape(-1)
    start = int(line[0])
    stop = start + line.size
    if start < 0 or stop > size or not np.array_equal(line, np.arange(start, stop)):
        return None
    return slice(start, stop)


_ARANGE = np.arange(0, dtype=np.int64)


def _offsets(size: int) -> np.ndarray:
    """``0..size-1`` as a read-only view of one shared array, grown to the largest tensor
    so far: a new tensor's offsets without filling an array per allocation."""
    global _ARANGE
    if _ARANGE.size < size:
        _ARANGE = np.arange(size, dtype=np.int64)
        _ARANGE.flags.writeable = False
    return _ARANGE[:size]


class Tensor:
    """A tensor or tile of the legacy API (``nt.tensor``): a view of a :class:`Storage`.

    On-chip, axis 0 is the partition axis (after any block dimensions) and a view keeps at
    least one free axis: indexing or reducing away the last one leaves ``[P, 1]``."""

    __slots__ = (
        "block_dims",
        "core",
        "dynamic",
        "offsets",
        "out_of_bounds",
        "repeats",
        "storage",
        "unclipped",
    )

    def __init__(
        self,
        storage: Storage,
        offsets: np.ndarray,
        block_dims: int,
        out_of_bounds: np.ndarray | None = None,
        repeats: bool = False,
        dynamic: bool = False,
    ) -> None:
        self.storage = storage
        self.offsets = offsets
        self.block_dims = block_dims
        self.out_of_bounds = out_of_bounds  # elements outside the tensor (need a mask)
        self.repeats = repeats  # may name one element twice: not writable as a whole
        self.dynamic = dynamic  # indexed by run-time values from a tile (indirect DMA)
        # Run-time indexed views: each element's storage offset before clipping (the offset an
        # out-of-bounds access reports).
        self.unclipped: np.ndarray | None = None
        # The same elements as a core (strided) view of the storage, where slices and
        # integers made this view: what values are read and written through.
        self.core: NkiTensor | None = None

    def _derived(
        self,
        offsets: np.ndarray,
        oob: np.ndarray | None,
        repeats: bool,
        core: np.ndarray | None = None,
    ) -> Tensor:
        """A view of the same storage; ``core``: its elements as a NumPy view of the storage
        (of ``offsets``' shape), where this view is strided."""
        view = Tensor(self.storage, offsets, 0, oob, repeats, self.dynamic)
        if core is not None and core.shape == offsets.shape:
            view.core = self.storage.core_view(core)
        return view

    @classmethod
    def whole(cls, storage: Storage) -> Tensor:
        offsets = _offsets(storage.flat.size).reshape(storage.tensor.shape)
        tensor = cls(storage, offsets, storage.block_dims)
        tensor.core = storage.tensor
        return tensor

    # -- properties ----------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.offsets.shape)

    @property
    def ndim(self) -> int:
        return self.offsets.ndim

    @property
    def size(self) -> int:
        return int(self.offsets.size)

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.storage.tensor.dtype

    @property
    def itemsize(self) -> int:
        return int(self.dtype.itemsize)

    @property
    def buffer(self) -> MemoryRegion:
        return self.storage.tensor.buffer

    @property
    def on_chip(self) -> bool:
        return not is_hbm(self.buffer)

    def __repr__(self) -> str:
        return (
            f"Tensor({self.storage.tensor.name or '?'}: {list(self.shape)} {self.dtype} in "
            f"{self.buffer.value})"
        )

    def __bool__(self) -> bool:
        """An HBM tensor is a handle the kernel receives or creates: present, so true (AWS's
        test writes ``nl.load(imm1[...]) if imm1 else None`` for an optional HBM parameter,
        nki/test/test_nki_isa_tensor_scalar_cumulative.py@81ce03a). A tile's values are
        only known on device."""
        if not self.on_chip:
            return True
        raise errors.AmbiguousTensorTruthValue(
            f"the truth value of {self!r} is only known on device; use mask= or nl.where"
        )

    def __iter__(self) -> Any:
        raise TypeError("NKI tensors are not iterable; index them")

    # -- values --------------------------------------------------------------------------
    def read(self) -> np.ndarray:
        """The view's values (elements outside the tensor read as the uninitialised
        sentinel; an instruction may only read them under a mask that excludes them)."""
        if runtime.values_skipped():  # trace-only: every value reads as zero
            return np.zeros(self.shape, self.dtype)
        if self.core is not None:
            return self.core.values.copy()
        values = self.storage.flat[self.offsets]
        if self.out_of_bounds is not None and self.out_of_bounds.any():
            fill = UNINITIALISED_FLOAT if is_float(self.dtype) else UNINITIALISED_INT
            values[self.out_of_bounds] = fill
        return values

    def write(self, values: np.ndarray, where: np.ndarray | None, api: str) -> None:
        """Stores ``values`` (this view's shape) where ``where`` holds (everywhere if None)."""
        self.storage.check_writable(api)
        if self.out_of_bounds is not None:
            check_in_bounds(api, self, where)
        if where is None and not self.repeats and runtime.values_skipped():
            return  # trace-only: no values, nor which PSUM elements hold one
        if self.core is not None and not self.repeats:  # a strided view: no offsets needed
            if not runtime.values_skipped():
                cast = np.broadcast_to(alu.cast(np.asarray(values), self.dtype), self.shape)
                target = self.core.values
                if where is None:
                    target[...] = cast
                else:
                    target[where] = cast[where]
            if self.storage.written is not None:
                self.storage.written[self.offsets if where is None else self.offsets[where]] = True
            return
        selected = np.ones(self.shape, np.bool_) if where is None else np.array(where)
        offsets = self.offsets[selected]
        if self.repeats and _has_duplicates(offsets, self.storage.flat.size):
            raise errors.StoreDstShapeSmallerThanOtherShape(
                f"'{api}' would write several values into one element of {self!r}"
            )
        if not runtime.values_skipped():
            cast = alu.cast(np.asarray(values), self.dtype)
            self.storage.flat[offsets] = np.broadcast_to(cast, self.shape)[selected]
        if self.storage.written is not None:
            self.storage.written[offsets] = True

    # -- indexing ------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> Tensor:
        keys = list(key) if isinstance(key, tuple) else [key]
        if not self.block_dims:
            return self._index(keys)
        # Fewer indices than block dimensions select blocks and keep the rest as block
        # dimensions: attention.py@8370e11 (nki-samples, flash_attn_bwd) passes
        # ``dy_o_sum[i_q_head]`` of a tensor with two block dimensions to a sub-kernel.
        count = min(len(keys), self.block_dims)
        view = self._select_blocks(keys[:count])
        return view._index(keys[count:]) if not view.block_dims else view

    def _select_blocks(self, keys: list[Any]) -> Tensor:
        if not all(isinstance(k, (int, np.integer)) for k in keys):
            raise TypeError(
                f"index the {self.block_dims} block dimension(s) of {self!r} with integers first"
            )
        index = tuple(int(k) for k in keys)
        for axis, (i, size) in enumerate(zip(index, self.shape, strict=False)):
            if not 0 <= i < size:
                raise errors.TensorAccessOutOfBound(
                    f"block index {i} on dimension {axis} of {self!r} (size {size})"
                )
        oob = None if self.out_of_bounds is None else self.out_of_bounds[index]
        core = None if self.core is None else self.core.values[index]
        view = self._derived(self.offsets[index], oob, self.repeats, core)
        view.block_dims = self.block_dims - len(index)
        return view

    def _index(self, keys: list[Any]) -> Tensor:
        keys = expand_ellipsis(self, keys)
        keys = [_dynamic_indices(k) if isinstance(k, Tensor) else k for k in keys]
        first = keys[0] if keys else None
        # A [P, 1] index tile on the first axis holds one index per partition, whatever the
        # rank: AWS's test indexes a 3-D tensor ``src[idx, iy, iz]`` with it
        # (nki/test/test_nki_isa_dma_transpose.py@81ce03a).
        if (
            isinstance(first, IndexGrid)
            and first.dynamic
            and len(keys) > 2
            and first.values.shape[1:] == (1,)
        ):
            per_partition = first.values.reshape((-1,) + (1,) * (len(keys) - 1))
            keys[0] = IndexGrid(per_partition, dynamic=True)
        dynamic = any(isinstance(k, IndexGrid) and k.dynamic for k in keys)
        for axis, k in enumerate(keys):
            if isinstance(k, IndexGrid) and not k.lifted:
                raise Err1dArangeNotSupported(
                    f"a 1-D nl.arange indexes dimension {axis} of {self!r}; lift it with "
                    "[:, None] (partition) or [None, :] (free)"
                )
        grids = any(isinstance(k, IndexGrid) for k in keys)
        if grids and (len(keys) < self.ndim or any(isinstance(k, slice) for k in keys)):
            raise ErrUnsupportedMixingBasicAdvancedTensorIndexing(
                f"index {self!r} either with slices/integers or with index grids "
                "(nl.arange/nl.mgrid) on every dimension, not a mix"
            )
        if grids and not dynamic and all(isinstance(k, IndexGrid) for k in keys):
            ranges = [_grid_range(k, axis, self.ndim, size)
                      for axis, (k, size) in enumerate(zip(keys, self.shape, strict=True))]  # fmt: skip
            if all(r is not None for r in ranges):  # the same elements as slices: a view
                keys, grids = ranges, False
        keys += [slice(None)] * (self.ndim - len(keys))
        if not grids and any(_overhangs(k, size) for k, size in zip(keys, self.shape, strict=True)):
            keys = self._slices_as_grids(keys)
            grids = True
        numpy_key: list[Any] = []
        bounds: list[np.ndarray] = []
        shifts: list[Any] = []  # per grid axis: (unclipped - clipped) * the axis's stride
        for axis, (k, size) in enumerate(zip(keys, self.shape, strict=True)):
            if isinstance(k, IndexGrid):
                bounds.append((k.values < 0) | (k.values >= size))
                numpy_key.append(np.clip(k.values, 0, size - 1))
                shifts.append((k.values - numpy_key[-1]) * self._stride(axis))
            elif isinstance(k, slice):
                numpy_key.append(checked_slice(self, axis, k, size))
            elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
                i = checked_index(self, axis, k, size)
                keep_partition = axis == 0 and self.on_chip and not grids
                numpy_key.append(slice(i, i + 1) if keep_partition else i)
            else:
                raise TypeError(
                    f"unsupported index {k!r} for {self!r}: use ints, slices, nl.ds or "
                    "nl.arange/nl.mgrid grids"
                )
        if not self.on_chip and all(isinstance(k, int) for k in numpy_key):
            numpy_key[-1] = slice(numpy_key[-1], numpy_key[-1] + 1)  # HBM views stay >= 1-D
        offsets = self.offsets[tuple(numpy_key)]
        oob = None if self.out_of_bounds is None else self.out_of_bounds[tuple(numpy_key)]
        for outside in bounds:
            outside = np.broadcast_to(outside, offsets.shape)
            oob = outside.copy() if oob is None else oob | outside
        if self.on_chip and offsets.ndim == 1 and self.ndim > 1:
            # An integer on the last free axis leaves [P, 1], not [P]: AWS's device-tested
            # kernels rely on it (attention.py@8370e11 of nki-samples: ``l_buffer[:, i]`` as
            # an activation bias, ``m_buffer[:, 0]`` assigned a [P, 1] tile).
            offsets = offsets[:, None]
            oob = None if oob is None else oob[:, None]
        core = None
        if self.core is not None and not grids:  # slices and integers: a strided view
            core = self.core.values[tuple(numpy_key)]
            core = core[:, None] if core.ndim < offsets.ndim else core
        view = self._derived(offsets, oob, self.repeats or grids, core)
        view.dynamic = self.dynamic or dynamic
        if view.dynamic and oob is not None:
            view.unclipped = offsets + sum(np.broadcast_to(d, offsets.shape) for d in shifts)
        return view

    def _slices_as_grids(self, keys: list[Any]) -> list[Any]:
        """Basic indices as open index grids, so that a slice reaching past the tensor is
        recorded as out of bounds (for a mask to exclude) instead of refused: the adaptive
        average pooling kernel of nki-samples (vision.py@8370e11) slices 128 partitions
        from a 288-row tensor under ``mask=(i_p < N * C)``."""
        kept = [not isinstance(k, (int, np.integer)) or (axis == 0 and self.on_chip)
                for axis, k in enumerate(keys)]  # fmt: skip
        rank, position, grid_keys = sum(kept), 0, []
        for axis, (k, keep) in enumerate(zip(keys, kept, strict=True)):
            if not keep:
                grid_keys.append(k)
                continue
            if isinstance(k, slice):
                step = 1 if k.step is None else int(k.step)
                start = 0 if k.start is None else int(k.start)
                stop = self.shape[axis] if k.stop is None else int(k.stop)
                if step < 1 or start < 0 or stop <= start:
                    checked_slice(self, axis, k, self.shape[axis])  # raises
                values = np.arange(start, stop, step)
            else:
                values = np.array([int(k)])
            shape = [1] * rank
            shape[position] = values.size
            grid_keys.append(IndexGrid(values.reshape(shape)))
            position += 1
        return grid_keys

    def _stride(self, axis: int) -> int:
        """Storage elements between neighbours along ``axis`` (views are affine)."""
        if self.shape[axis] < 2:
            return 0
        step = [0] * self.ndim
        step[axis] = 1
        return int(self.offsets[tuple(step)] - self.offsets[(0,) * self.ndim])

    def __setitem__(self, key: Any, value: Any) -> None:
        """``tile[idx] = value``: a copy of ``value`` (a tile, broadcast from source to
        destination as general/nki/api/nki.errors.rst err_store_dst_shape_smaller_than_other_shape
        allows, or a scalar) into the view (one Vector-engine instruction)."""
        from asickernels.simulate.nki.legacy import language

        language.assign(self[key], value)

    # -- view methods --------------------------------------------------------------------
    def broadcast_to(self, shape: Sequence[int]) -> Tensor:
        """A view repeating this tile to ``shape`` (NumPy broadcasting; on the partition axis
        a tile with one partition is repeated across partitions)."""
        from asickernels.simulate.nki.legacy import language

        return language.broadcast_to(self, shape=shape)

    def reshape(self, shape: Sequence[int]) -> Tensor:
        """The same elements in ``shape`` (row-major); on-chip the partition size stays."""
        dims = tuple(int(s) for s in shape)
        if math.prod(dims) != self.size:
            raise errors.ShapeMismatch(f"cannot reshape {self!r} to {dims}")
        if self.on_chip and dims[0] != self.shape[0]:
            raise errors.LeadingDimensionOfTensorMustBePartition(
                f"reshape of {self!r} to {dims} would change its partition axis"
            )
        oob = None if self.out_of_bounds is None else self.out_of_bounds.reshape(dims)
        core = None if self.core is None else self.core.values.reshape(dims)
        if core is not None and not np.may_share_memory(core, self.storage.tensor.values):
            core = None  # the layout needs a copy: not a view
        return self._derived(self.offsets.reshape(dims), oob, self.repeats, core)

    def expand_dims(self, axis: int) -> Tensor:
        """Inserts a size-1 dimension at ``axis`` (not in front of an on-chip partition axis)."""
        if self.on_chip and axis == 0:
            raise errors.LeadingDimensionOfTensorMustBePartition(
                f"expand_dims(0) on {self!r} would move its partition axis"
            )
        oob = None if self.out_of_bounds is None else np.expand_dims(self.out_of_bounds, axis)
        core = None if self.core is None else np.expand_dims(self.core.values, axis)
        return self._derived(np.expand_dims(self.offsets, axis), oob, self.repeats, core)

    def view(self, dtype: Any) -> Tensor:
        """The same bytes reinterpreted as ``dtype`` of the same size (no copy)."""
        new = nki_dtype(dtype)
        if new.itemsize != self.itemsize:
            raise errors.UnsupportedDtype(
                f"view of {self!r} as {new}: only dtypes of the same size ({self.itemsize} bytes)"
            )
        old = self.storage
        core = old.tensor  # the same memory (and allocation: counted once) as ``new``
        viewed = NkiTensor(core.values.view(new), new, core.buffer, core.allocation, core.name)
        placed = old.flat if isinstance(old.flat, PlacedElements) else None
        flat = None if placed is None else PlacedElements(viewed.values, placed.to_memory)
        storage = Storage(viewed, old.block_dims, old.read_only, flat)
        storage.written = old.written
        storage.compiler_placed = old.compiler_placed
        return Tensor(storage, self.offsets, self.block_dims, self.out_of_bounds, self.repeats,
                      self.dynamic)  # fmt: skip

    def assert_shape(self, shape: Sequence[int]) -> Tensor:
        if self.shape != tuple(shape):
            raise errors.ShapeMismatch(f"{self!r} does not have shape {tuple(shape)}")
        return self

    def astype(self, dtype: Any) -> Tensor:
        """A copy in ``dtype`` (always a copy, as the SDK documents)."""
        from asickernels.simulate.nki.legacy import language

        return language.copy(self, dtype=dtype)

    # -- operators (nki_known_issues.rst: no partition broadcasting on overloads) ---------
    def _operator(self, name: str, other: Any, reflected: bool = False) -> Any:
        from asickernels.simulate.nki.legacy import language

        if isinstance(other, IndexGrid):  # a run-time offset in an index expression
            if name not in _GRID_OPERATORS:
                raise TypeError(f"index expressions are affine: '{name}' of a tile and a grid")
            grid = _dynamic_indices(self)
            return getattr(grid, f"__{'r' if reflected else ''}{_GRID_OPERATORS[name]}__")(other)
        x, y = (other, self) if reflected else (self, other)
        return language.overloaded_operator(name, x, y)

    __add__ = partialmethod(_operator, "add")
    __radd__ = partialmethod(_operator, "add", reflected=True)
    __sub__ = partialmethod(_operator, "subtract")
    __rsub__ = partialmethod(_operator, "subtract", reflected=True)
    __mul__ = partialmethod(_operator, "multiply")
    __rmul__ = partialmethod(_operator, "multiply", reflected=True)
    __truediv__ = partialmethod(_operator, "divide")
    __rtruediv__ = partialmethod(_operator, "divide", reflected=True)
    __pow__ = partialmethod(_operator, "power")
    __and__ = partialmethod(_operator, "bitwise_and")
    __or__ = partialmethod(_operator, "bitwise_or")
    __xor__ = partialmethod(_operator, "bitwise_xor")
    __lshift__ = partialmethod(_operator, "left_shift")
    __rshift__ = partialmethod(_operator, "right_shift")
    __lt__ = partialmethod(_operator, "less")
    __le__ = partialmethod(_operator, "less_equal")
    __gt__ = partialmethod(_operator, "greater")
    __ge__ = partialmethod(_operator, "greater_equal")
    __eq__ = partialmethod(_operator, "equal")
    __ne__ = partialmethod(_operator, "not_equal")

    __hash__ = object.__hash__

    def __neg__(self) -> Tensor:
        return self._operator("multiply", -1)

    def __invert__(self) -> Tensor:
        from asickernels.simulate.nki.legacy import language

        return language.invert(self)

    def _in_place(self, name: str, other: Any) -> Tensor:
        """``t += x``: the result is written back into ``t``. ``psum_tile += <matmul result
        in PSUM>`` is the Tensor engine accumulating into PSUM (nl.affine_range, Example 2)."""
        from asickernels.simulate.nki.legacy import language

        psum = MemoryRegion.psum
        if name == "add" and self.buffer is psum and getattr(other, "buffer", None) is psum:
            language.accumulate(self, other)
        else:
            self[...] = self._operator(name, other)
        return self

    __iadd__ = partialmethod(_in_place, "add")
    __isub__ = partialmethod(_in_place, "subtract")
    __imul__ = partialmethod(_in_place, "multiply")
    __itruediv__ = partialmethod(_in_place, "divide")


def _has_duplicates(offsets: np.ndarray, storage_size: int) -> bool:
    """Whether ``offsets`` (into a storage of ``storage_size`` elements) name one element
    twice: a marker array over the storage (linear time, unlike sorting), or the offsets
    sorted where the storage is much larger than they are. Whether offsets repeat depends
    only on their pattern relative to the first, which a loop reuses: checked once each."""
    if not offsets.size:
        return False
    pattern = np.ascontiguousarray(offsets - offsets.flat[0])
    key = (pattern.shape, hashlib.blake2b(pattern.data, digest_size=16).digest())
    found = _REPEATING.get(key)
    if found is None:
        if storage_size > 16 * offsets.size:
            ordered = np.sort(pattern, axis=None)
            found = bool(np.any(ordered[1:] == ordered[:-1]))
        else:
            marks = np.zeros(storage_size, np.bool_)
            marks[offsets] = True
            found = int(np.count_nonzero(marks)) != offsets.size
        _REPEATING[key] = found
    return found


# (shape, digest of offsets relative to the first) -> whether they name an element twice
_REPEATING: dict[tuple[tuple[int, ...], bytes], bool] = {}


_GRID_OPERATORS = {"add": "add", "subtract": "sub", "multiply": "mul"}


def _dynamic_indices(tile: Tensor) -> IndexGrid:
    """An on-chip integer tile used as an index: its values, read when the access runs
    (indirect DMA; "indices have to be in SBUF", test_nki_nl_load_store_indirect.py)."""
    if not tile.on_chip or tile.dtype.kind not in "iu":
        raise TypeError(f"an index tile must be an integer tile in SBUF, got {tile!r}")
    if tile.out_of_bounds is not None:
        check_in_bounds("index", tile, None)
    return IndexGrid(tile.read().astype(np.int64), dynamic=True)


def _overhangs(key: Any, size: int) -> bool:
    """A slice starting inside the dimension and ending past it."""
    if not isinstance(key, slice) or key.stop is None or int(key.stop) <= size:
        return False
    return 0 <= (0 if key.start is None else int(key.start)) < size


def check_in_bounds(api: str, tensor: Tensor, where: np.ndarray | None) -> None:
    """Elements of ``tensor`` outside its storage must be excluded by the mask ``where``."""
    if tensor.out_of_bounds is None:
        return
    outside = tensor.out_of_bounds
    if where is not None:
        outside = outside & np.broadcast_to(where, outside.shape)
    if not outside.any():
        return
    first = tuple(int(i) for i in np.argwhere(outside)[0])
    if tensor.dynamic:
        # Run-time indices: "out-of-bound access results in run-time exceptions"
        # (nki.errors.rst). The SDK's simulator raises numpy's IndexError for the flat
        # storage, which AWS's tests assert verbatim (nki/test/test_nki_isa_dma_copy.py
        # @81ce03a: "index 66048 is out of bounds for axis 0 with size 65536").
        offset = tensor.offsets[first] if tensor.unclipped is None else tensor.unclipped[first]
        raise IndexError(
            f"index {int(offset)} is out of bounds for axis 0 with size {tensor.storage.flat.size}"
        )
    raise errors.TensorAccessOutOfBound(
        f"'{api}' accesses {tensor!r} outside its bounds (first at tile position {first}); "
        "fix the indices or exclude those elements with mask="
    )
