"""Tile grids (NKI 0.7): ``nl.tiles``/``nl.blocks`` views of a tensor in tile or block
coordinates, and the grids ``nl.alloc_tiles``/``nl.alloc_blocks``/``nl.empty_like`` allocate
(nki.language.tiles, .blocks, .alloc_tiles, .alloc_blocks, .NkiGrid, .NkiTileGrid,
.NkiBlockGrid reference pages, https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/api/
generated/).

A grid is a selection of *cells* (tiles or blocks) along every dimension of a source. The
trailing dimensions are tiled by ``tile_shape``; leading dimensions of an HBM source stay
untiled and are walked one element (a "slab") at a time. The last cell along a dimension is
clamped to the source's extent. Integer indexing consumes a grid coordinate, slices keep it;
neither copies data. ``grid.data`` is the selection as one tensor view, when one access
pattern can express it (``is_data_representable``).

Storage is addressed through one offset table per source dimension (element index ->
element offset into the backing tensor), which every layout here separates into: a tensor's
own strides for views, and for on-chip grids allocated here the "dense rank-two capacity
layout" of the alloc_tiles page: tile ``k`` (row-major over tile coordinates) holds
partitions ``0..tile_shape[0]`` and free elements ``k*F..(k+1)*F`` (``F``: the elements of
one tile per partition).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from asickernels.simulate.nki import errors, runtime
from asickernels.simulate.nki.tensor import NKIObject, NkiTensor

Cells = tuple[tuple[int, int], ...]
# nki.language.empty_like: the tiled-dimension orders ``transpose_axes`` takes, per rank.
TRANSPOSE_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


class NkiGrid(NKIObject):
    """A tensor region in tile (:class:`NkiTileGrid`) or block (:class:`NkiBlockGrid`)
    coordinates. ``shape`` counts cells; ``element_shape`` the selected elements per
    source dimension (consumed untiled dimensions left out); ``data`` the selection as a
    tensor view."""

    __slots__ = (
        "_block",
        "_cells",
        "_consumed",
        "_extent",
        "_offsets",
        "_prefix",
        "_storage",
        "_tile",
    )

    def __init__(
        self,
        storage: NkiTensor,
        offsets: Sequence[np.ndarray],
        prefix: int,
        tile_shape: tuple[int, ...],
        cells: Sequence[Cells],
        consumed: Sequence[bool],
        block_shape: tuple[int, ...] = (),
    ) -> None:
        self._block = block_shape  # tiles per cell along each tiled dimension (blocks only)
        self._storage = storage
        self._offsets = tuple(offsets)
        self._extent = tuple(len(o) for o in offsets)
        self._prefix = prefix
        self._tile = tile_shape
        self._cells = tuple(cells)
        self._consumed = tuple(consumed)

    # -- the documented attributes -----------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        """Cells along each coordinate not consumed by integer indexing."""
        return tuple(
            len(c) for c, used in zip(self._cells, self._consumed, strict=True) if not used
        )

    @property
    def tile_shape(self) -> tuple[int, ...]:
        """The nominal source-element shape of one tile."""
        return self._tile

    @property
    def element_shape(self) -> tuple[int, ...]:
        """Selected elements along each source dimension (boundary tiles clamped)."""
        return tuple(sum(b - a for a, b in self._cells[d]) for d in self._data_dims())

    @property
    def index_step_elements(self) -> tuple[int, ...]:
        """Source elements one step of each grid coordinate moves."""
        units = (1,) * self._prefix + self._unit()
        return tuple(u for u, used in zip(units, self._consumed, strict=True) if not used)

    @property
    def is_remainder(self) -> bool:
        """Whether the selection holds a cell clamped at the source's boundary."""
        units = self._unit()
        return any(
            b - a < unit
            for cells, unit in zip(self._cells[self._prefix :], units, strict=True)
            for a, b in cells
        )

    @property
    def is_data_representable(self) -> bool:
        """Whether one access pattern expresses the whole selection (see :attr:`data`)."""
        return self._pattern() is not None

    @property
    def data(self) -> NkiTensor:
        """The selection as one tensor view of the backing storage, with
        :attr:`element_shape`; a selection that skips cells or crosses tiles of an on-chip
        tile layout has no such view (raises ``ShapeMismatch``)."""
        pattern = self._pattern()
        if pattern is None:
            raise errors.ShapeMismatch(
                f"{self!r}: no single access pattern covers this selection "
                "(is_data_representable is False); select fewer cells, or use nl.tiles on it "
                "and take .data per tile"
            )
        pairs, offset = pattern
        return self._storage.ap(pairs, offset=offset)

    @property
    def dtype(self) -> Any:
        return self._storage.dtype

    @property
    def buffer(self) -> Any:
        return self._storage.buffer

    # -- navigation ---------------------------------------------------------------------
    def __getitem__(self, key: Any) -> NkiGrid:
        keys = list(key) if isinstance(key, tuple) else [key]
        free = [d for d, used in enumerate(self._consumed) if not used]
        if any(k is Ellipsis for k in keys):
            at = keys.index(Ellipsis)
            keys[at : at + 1] = [slice(None)] * (len(free) - len(keys) + 1)
        if len(keys) > len(free):
            raise errors.TensorAccessOutOfBound(
                f"{len(keys)} indices for {self!r} with {len(free)} grid coordinates"
            )
        cells, consumed = list(self._cells), list(self._consumed)
        for d, k in zip(free, keys, strict=False):
            if isinstance(k, slice):
                picked = cells[d][k]
                if (k.step is not None and k.step < 1) or not picked:
                    raise errors.TensorAccessOutOfBound(
                        f"grid slice {k} on coordinate {d} of {self!r}: steps must be >= 1 and "
                        "the range non-empty"
                    )
                cells[d] = picked
            elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
                size = len(cells[d])
                if not -size <= int(k) < size:
                    raise errors.TensorAccessOutOfBound(
                        f"grid index {int(k)} on coordinate {d} of {self!r} (size {size})"
                    )
                cells[d], consumed[d] = (cells[d][int(k)],), True
            else:
                raise TypeError(f"grid indices are ints or slices, got {k!r}")
        return self._with(cells, consumed)

    def __iter__(self) -> Any:
        raise TypeError(f"{type(self).__name__} is not iterable; index it by cell")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(shape={list(self.shape)}, tile_shape={list(self._tile)}, "
            f"element_shape={list(self.element_shape)} over {self._storage!r})"
        )

    # -- internals ----------------------------------------------------------------------
    def _unit(self) -> tuple[int, ...]:
        """Source elements of one cell along each tiled dimension."""
        return self._tile

    def _with(self, cells: Sequence[Cells], consumed: Sequence[bool]) -> NkiGrid:
        return type(self)(
            self._storage, self._offsets, self._prefix, self._tile, cells, consumed, self._block
        )

    def _data_dims(self) -> list[int]:
        return [d for d in range(len(self._cells)) if d >= self._prefix or not self._consumed[d]]

    def _positions(self, d: int) -> np.ndarray:
        return np.concatenate([np.arange(a, b) for a, b in self._cells[d]])

    def _pattern(self) -> tuple[list[list[int]], int] | None:
        """The access pattern ``[[step, count], ...]`` and element offset of the selection,
        or None if the offsets along some dimension are not evenly spaced."""
        offset = 0
        pairs = []
        for d in range(len(self._cells)):
            reached = self._offsets[d][self._positions(d)]
            offset += int(reached[0])
            if d < self._prefix and self._consumed[d]:
                continue
            steps = np.unique(np.diff(reached))
            if len(steps) > 1:
                return None
            step = int(steps[0]) if len(steps) else self._storage.strides[0] if d == 0 else 1
            pairs.append([step, len(reached)])
        return pairs, offset

    def _tile_cells(self, tile_shape: tuple[int, ...]) -> list[Cells]:
        """The selected region along every dimension cut into cells of ``tile_shape``
        (aligned to the source's origin)."""
        cells = list(self._cells[: self._prefix])
        for d, tile in zip(range(self._prefix, len(self._cells)), tile_shape, strict=True):
            pieces = []
            for a, b in self._cells[d]:
                start = a
                while start < b:
                    end = min(b, (start // tile + 1) * tile)
                    pieces.append((start, end))
                    start = end
            cells.append(tuple(pieces))
        return cells


class NkiTileGrid(NkiGrid):
    """A tensor region navigated in tile coordinates (nki.language.NkiTileGrid)."""

    __slots__ = ()


class NkiBlockGrid(NkiGrid):
    """A tensor region navigated in block coordinates: a block groups ``block_shape`` tiles
    per tiled dimension (nki.language.NkiBlockGrid)."""

    __slots__ = ()

    @property
    def block_shape(self) -> tuple[int, ...]:
        """Tiles per block along each tiled dimension."""
        return self._block

    def _unit(self) -> tuple[int, ...]:
        return tuple(b * t for b, t in zip(self._block, self._tile, strict=True))


def _shape_argument(api: str, what: str, shape: Any, minimum: int = 1) -> tuple[int, ...]:
    """A shape argument: a tuple of exact, positive Python ints (the reference pages'
    ``TypeError``/``ValueError`` contract)."""
    if not isinstance(shape, tuple) or any(
        type(s) is not int
        for s in shape  # exact ints: no bools, no numpy
    ):
        raise TypeError(f"'{api}' {what} must be a tuple of Python ints, got {shape!r}")
    if len(shape) < minimum or any(s < 1 for s in shape):
        raise ValueError(f"'{api}' {what} needs at least {minimum} positive entries, got {shape!r}")
    return shape


def _tile_cells(extent: int, tile: int) -> Cells:
    return tuple((k, min(k + tile, extent)) for k in range(0, extent, tile))


def _check_tiling(
    api: str, extent: tuple[int, ...], tile_shape: tuple[int, ...], on_chip: bool
) -> int:
    """The untiled prefix length for ``tile_shape`` over ``extent``."""
    if len(tile_shape) > len(extent):
        raise ValueError(f"'{api}' tile_shape {tile_shape} has more dimensions than {extent}")
    prefix = len(extent) - len(tile_shape)
    if on_chip and prefix:
        raise ValueError(
            f"'{api}': an on-chip grid tiles every dimension (only HBM keeps untiled leading "
            f"dimensions), got tile_shape {tile_shape} for {extent}"
        )
    if on_chip and tile_shape[0] > runtime.PMAX:
        raise errors.NumPartitionExceedArchLimit(
            f"'{api}' tile_shape {tile_shape}: a tile spans at most {runtime.PMAX} partitions"
        )
    return prefix


def _grid(
    kind: type[NkiGrid],
    storage: NkiTensor,
    offsets: Sequence[np.ndarray],
    prefix: int,
    tile_shape: tuple[int, ...],
    block_shape: tuple[int, ...] | None,
) -> NkiGrid:
    extent = [len(o) for o in offsets]
    cells = [tuple((i, i + 1) for i in range(n)) for n in extent[:prefix]]
    units = (
        tile_shape
        if block_shape is None
        else tuple(b * t for b, t in zip(block_shape, tile_shape, strict=True))
    )
    cells += [_tile_cells(n, u) for n, u in zip(extent[prefix:], units, strict=True)]
    consumed = [False] * len(extent)
    if block_shape is None:
        return kind(storage, offsets, prefix, tile_shape, cells, consumed)
    return NkiBlockGrid(storage, offsets, prefix, tile_shape, cells, consumed, block_shape)


def view_offsets(tensor: NkiTensor) -> list[np.ndarray]:
    """The offset tables of ``tensor``'s own layout: index times stride, per dimension."""
    return [
        np.arange(n, dtype=np.int64) * s for n, s in zip(tensor.shape, tensor.strides, strict=True)
    ]


def packed_offsets(
    extent: tuple[int, ...], tile_shape: tuple[int, ...], prefix: int, on_chip: bool
) -> list[np.ndarray]:
    """Offset tables of a grid's own storage: HBM holds the compact extent (row-major); an
    on-chip grid the tile layout of the module docstring, in a ``(tile_shape[0], tiles * F)``
    tensor."""
    if not on_chip:
        strides = [math.prod(extent[d + 1 :]) for d in range(len(extent))]
        return [np.arange(n, dtype=np.int64) * s for n, s in zip(extent, strides, strict=True)]
    counts = [-(-n // t) for n, t in zip(extent, tile_shape, strict=True)]
    free = math.prod(tile_shape[1:])
    row = math.prod(counts) * free
    offsets = []
    for d, (n, t) in enumerate(zip(extent, tile_shape, strict=True)):
        index = np.arange(n, dtype=np.int64)
        tile_stride = math.prod(counts[d + 1 :]) * free
        inner_stride = row if d == 0 else math.prod(tile_shape[d + 1 :])
        offsets.append((index // t) * tile_stride + (index % t) * inner_stride)
    return offsets


def packed_storage_shape(
    extent: tuple[int, ...], tile_shape: tuple[int, ...], on_chip: bool
) -> tuple[int, ...]:
    """The shape of the tensor :func:`packed_offsets` addresses."""
    if not on_chip:
        return extent
    tiles = math.prod(-(-n // t) for n, t in zip(extent, tile_shape, strict=True))
    return (tile_shape[0], tiles * math.prod(tile_shape[1:]))


def over_storage(
    storage: NkiTensor,
    extent: tuple[int, ...],
    tile_shape: Any,
    block_shape: Any = None,
    api: str = "alloc_tiles",
) -> NkiGrid:
    """A whole grid over ``storage`` allocated with :func:`packed_storage_shape`."""
    tile_shape = _shape_argument(api, "tile_shape", tile_shape, minimum=2)
    prefix = _check_tiling(api, extent, tile_shape, storage.on_chip)
    blocks = None if block_shape is None else _block_argument(api, block_shape, tile_shape)
    offsets = packed_offsets(extent, tile_shape, prefix, storage.on_chip)
    return _grid(NkiTileGrid, storage, offsets, prefix, tile_shape, blocks)


def _block_argument(api: str, block_shape: Any, tile_shape: tuple[int, ...]) -> tuple[int, ...]:
    blocks = _shape_argument(api, "block_shape", block_shape)
    if len(blocks) != len(tile_shape):
        raise ValueError(f"'{api}' block_shape {blocks} needs the rank of tile_shape {tile_shape}")
    return blocks


def tiles(source: NkiTensor | NkiGrid, tile_shape: Any = None) -> NkiTileGrid:
    """``source`` in tile coordinates: a tensor cut into ``tile_shape`` tiles, a tile grid
    (same ``tile_shape``) as it is, or a block grid's selected blocks as their tiles."""
    if isinstance(source, NkiGrid):
        if tile_shape is not None and tuple(tile_shape) != source.tile_shape:
            raise ValueError(
                f"'tiles' of {source!r} keeps its tile_shape {source.tile_shape}, got {tile_shape}"
            )
        consumed = list(source._consumed)
        if isinstance(source, NkiBlockGrid):  # a block's interior tile coordinates
            consumed[source._prefix :] = [False] * (len(consumed) - source._prefix)
        cells = source._tile_cells(source.tile_shape)
        return NkiTileGrid(
            source._storage, source._offsets, source._prefix, source.tile_shape, cells, consumed
        )
    if not isinstance(source, NkiTensor):
        raise TypeError(f"'tiles' takes an NkiTensor or a grid, got {type(source).__name__}")
    if tile_shape is None:
        raise TypeError("'tiles' of a tensor needs tile_shape")
    tile_shape = _shape_argument("tiles", "tile_shape", tuple(tile_shape), minimum=2)
    prefix = _check_tiling("tiles", source.shape, tile_shape, source.on_chip)
    grid = _grid(NkiTileGrid, source, view_offsets(source), prefix, tile_shape, None)
    assert isinstance(grid, NkiTileGrid)
    return grid


def blocks(source: NkiTensor | NkiGrid, block_shape: Any, tile_shape: Any = None) -> NkiBlockGrid:
    """``source`` grouped into blocks of ``block_shape`` tiles per tiled dimension."""
    tiled = tiles(source, tile_shape)
    block_shape = _block_argument("blocks", tuple(block_shape), tiled.tile_shape)
    cells = list(tiled._cells[: tiled._prefix])
    for d, group in zip(range(tiled._prefix, len(tiled._cells)), block_shape, strict=True):
        run = tiled._cells[d]
        cells.append(tuple((run[i][0], run[min(i + group, len(run)) - 1][1])
                           for i in range(0, len(run), group)))  # fmt: skip
    return NkiBlockGrid(
        tiled._storage,
        tiled._offsets,
        tiled._prefix,
        tiled.tile_shape,
        cells,
        tiled._consumed,
        block_shape,
    )


def dense_layout(
    grid: NkiGrid, transpose_axes: Any = None
) -> tuple[tuple[int, ...], int, tuple[int, ...], list[Cells], list[bool], tuple[int, ...]]:
    """What ``empty_like(grid)`` allocates: the selection's cells packed densely (gaps
    dropped, extents kept), optionally with the tiled dimensions permuted by
    ``transpose_axes``: (extent, prefix, tile_shape, cells, consumed, block_shape)."""
    dims = grid._data_dims()
    prefix = sum(1 for d in dims if d < grid._prefix)
    cells, consumed = [], []
    for d in dims:
        start, packed = 0, []
        for a, b in grid._cells[d]:
            packed.append((start, start + b - a))
            start += b - a
        cells.append(tuple(packed))
        consumed.append(grid._consumed[d])
    tile_shape = grid.tile_shape
    block_shape = grid.block_shape if isinstance(grid, NkiBlockGrid) else ()
    if transpose_axes is not None:
        axes = tuple(transpose_axes)
        if TRANSPOSE_AXES.get(len(tile_shape)) != axes:
            raise ValueError(
                f"'empty_like' transpose_axes {axes}: rank {len(tile_shape)} takes "
                f"{TRANSPOSE_AXES.get(len(tile_shape))}"
            )
        tiled = list(range(prefix, len(cells)))
        order = [tiled[a] for a in axes]
        cells = cells[:prefix] + [cells[d] for d in order]
        consumed = consumed[:prefix] + [consumed[d] for d in order]
        tile_shape = tuple(tile_shape[a] for a in axes)
        block_shape = tuple(block_shape[a] for a in axes) if block_shape else ()
        if tile_shape[0] > runtime.PMAX:
            raise errors.NumPartitionExceedArchLimit(
                f"'empty_like' transpose_axes {axes} puts {tile_shape[0]} elements on the "
                f"partition axis of a tile; at most {runtime.PMAX}"
            )
    extent = tuple(c[-1][1] for c in cells)
    return extent, prefix, tile_shape, cells, consumed, block_shape


def like(
    storage: NkiTensor,
    extent: tuple[int, ...],
    prefix: int,
    tile_shape: tuple[int, ...],
    cells: list[Cells],
    consumed: list[bool],
    block_shape: tuple[int, ...],
) -> NkiGrid:
    """The grid :func:`dense_layout` describes, over newly allocated ``storage``."""
    offsets = packed_offsets(extent, tile_shape, prefix, storage.on_chip)
    if block_shape:
        return NkiBlockGrid(storage, offsets, prefix, tile_shape, cells, consumed, block_shape)
    return NkiTileGrid(storage, offsets, prefix, tile_shape, cells, consumed)
