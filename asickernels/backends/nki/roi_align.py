"""RoIAlign (torchvision's ``roi_align``) and its gradient as NKI kernels.

Bilinear sampling is separable (a sample's weight on pixel ``(h, w)`` is a row weight times
a column weight; torchvision's "outside the map" test and border clamps apply per axis), so
one RoI's ``[PH, PW]`` bins of channel ``c`` of image ``n`` are
``A_y @ F[n, c] @ A_x^T``: ``A_y [PH, H]`` holds per bin row the mean of its sample rows'
bilinear weights, ``A_x [PW, W]`` likewise for columns. Per RoI the kernel builds both,
transposed (pixels on partitions, tiles of 128), on the Vector engine from the RoI itself:
its coordinates are DMA'd onto every partition, pixel and bin indices come from ``iota``,
and the sample rows (columns) are weighed :data:`STEP_CHUNK` at a time along a third axis
of ``[pixels, bins, steps]`` tiles, then summed. The RoI's image
is not an address: ``A_y`` is masked per image (``batch index == n``) and the Tensor
engine accumulates ``F[n, c]^T A_y^T`` over all images and row tiles in PSUM, then
contracts the columns with ``A_x^T``. The gradient of image ``n``, channel ``c`` is
``sum_k [batch_k == n] A_y^T @ G[k, c] @ A_x``: per image, tile of pixels and group of
:data:`CHANNEL_GROUP` channels, PSUM accumulates it over the RoIs (the weights built with
bins on partitions this time).

The adaptive grid (``sampling_ratio <= 0``: ``ceil(roi size / output size)`` samples per
bin side) is data dependent: the host reads the largest over the call from the concrete
RoIs (the kernel's own float32 formula, plus one step of margin for a device whose division
rounds differently) and the kernel runs that many steps, masking each RoI's steps past its
own grid. All math is float32. A RoI whose batch index names no image gives zeros, and so
does one with a NaN or infinite scaled corner (the host makes it name no image).

Non-finite values: a product with a zero weight would spread a NaN or an infinity to every
bin (``0 * inf`` is NaN). When the host sees one in the features (the cotangent), the
kernel is built with an exceptional path: the values are zeroed for the products, and
0/1 products of the masks of NaNs and infinities with where each axis's samples take a
pixel with a positive and with a zero weight give torchvision's results: NaN where a NaN
is taken, an infinity is taken with weight 0, or both infinities are; +-inf where one is.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from asickernels.backends.nki import BACKEND
from asickernels.backends.nki.sdk import float_input, nisa, nki, nl, run
from asickernels.kernels import public as ops

PMAX = 128
MAX_BINS_H = 128  # the stationary free size of the second product
MAX_BINS_W = 512  # the moving free size (one PSUM bank of float32)
STEP_CHUNK = 32  # sample steps per weight tile: [pixels, bins, 32] float32 temporaries
CHANNEL_GROUP = 4  # gradient tiles accumulated in PSUM at once (a bank each, and one spare)


def _column_scalar(
    data: Any, op0: Any, operand0: Any, op1: Any = None, operand1: Any = None
) -> Any:
    """``(data op0 operand0) op1 operand1``, each operand a scalar or a ``[P, 1]`` tile
    broadcast along the free axes."""
    out = nl.ndarray(data.shape, dtype=nl.float32)
    nisa.tensor_scalar(dst=out, data=data, op0=op0, operand0=operand0, op1=op1, operand1=operand1)
    return out


def _iota(shape: tuple[int, int, int], axis: int, offset: int = 0) -> Any:
    """A float32 tile of ``shape`` holding at every element its index along ``axis``
    (0: the partition), plus ``offset``."""
    index = nl.ndarray(shape, dtype=nl.int32)
    pattern = [[int(axis == 1), shape[1]], [int(axis == 2), shape[2]]]
    nisa.iota(dst=index, pattern=pattern, offset=offset, channel_multiplier=int(axis == 0))
    return nl.copy(index, dtype=nl.float32)


def _axis_samples(
    corners: Any,
    axis: int,
    pixels: tuple[int, int],
    bins: int,
    size: int,
    sampling: tuple[float, int, bool],
    steps: int,
    pixels_on_partitions: bool,
) -> tuple[tuple[int, int], list[tuple[Any, ...]], Any]:
    """One RoI's samples along ``axis`` (0: rows, 1: columns) of a map ``size`` pixels
    long, for the ``pixels = (first, count)`` pixels, on ``[count, bins, steps]`` tiles
    (not ``pixels_on_partitions``: ``[bins, count, steps]``), :data:`STEP_CHUNK` steps a
    tile: ``(plane, [(pixel, low, high, frac, inside) per tile], samples per bin)``, as
    torchvision's ``bilinear_interpolate`` per axis (samples beyond one pixel outside the
    map are not ``inside``; positions clamp at 0 and at the last pixel). ``corners`` is
    the RoI on every partition (``[partitions, 5]``); ``sampling`` is ``(spatial_scale,
    sampling_ratio, aligned)``."""
    scale, ratio, aligned = sampling
    first_pixel, count = pixels
    pixel_axis, bin_axis = (0, 1) if pixels_on_partitions else (1, 0)
    plane = (count, bins) if pixels_on_partitions else (bins, count)
    column = (2, 1)[axis]  # y1 or x1; the far corner is two columns on
    start, end = (
        _column_scalar(corners[:, i : i + 1], nl.multiply, scale, nl.subtract, 0.5 * aligned)
        for i in (column, column + 2)
    )
    length = nl.subtract(end, start)
    if not aligned:  # torchvision: malformed RoIs are forced to 1 pixel
        length = nl.maximum(length, 1.0)
    bin_size = nl.divide(length, float(bins))
    grid: Any = float(ratio) if ratio > 0 else nl.ceil(bin_size)
    last = float(size - 1)
    chunks = []
    for first_step in range(0, steps, STEP_CHUNK):
        shape = (*plane, min(STEP_CHUNK, steps - first_step))
        pixel = _iota(shape, pixel_axis, first_pixel)
        step = _iota(shape, 2, first_step)
        # start + bin * bin_size + (step + 0.5) * bin_size / grid, as the other backends
        bin_start = _column_scalar(_iota(shape, bin_axis), nl.multiply, bin_size, nl.add, start)
        shift = _column_scalar(step, nl.add, 0.5, nl.multiply, bin_size)
        position = nl.add(bin_start, _column_scalar(shift, nl.divide, grid))
        inside = nl.logical_and(
            nl.greater_equal(position, -1.0), nl.less_equal(position, float(size))
        )
        if ratio <= 0:  # steps past this RoI's own grid add nothing
            inside = nl.logical_and(inside, _column_scalar(step, nl.less, grid))
        position = nl.maximum(position, 0.0)
        low = nl.floor(position)
        at_edge = nl.greater_equal(low, last)
        low = nl.where(at_edge, last, low)
        high = nl.where(at_edge, last, nl.add(low, 1.0))
        frac = nl.where(at_edge, 0.0, nl.subtract(position, low))
        chunks.append((pixel, low, high, frac, inside))
    samples: Any = float(ratio) if ratio > 0 else nl.maximum(grid, 1.0)
    return plane, chunks, samples


def _axis_weights(*where: Any) -> Any:
    """The mean bilinear weights of :func:`_axis_samples` ``(*where)``: ``[count, bins]``
    float32 (or ``[bins, count]``)."""
    plane, chunks, samples = _axis_samples(*where)
    total = nl.zeros(plane, dtype=nl.float32)
    for pixel, low, high, frac, inside in chunks:
        weight = nl.add(
            nl.where(nl.equal(pixel, low), nl.subtract(1.0, frac), 0.0),
            nl.where(nl.equal(pixel, high), frac, 0.0),
        )
        total = nl.add(total, nl.sum(nl.where(inside, weight, 0.0), axis=2))
    return _column_scalar(total, nl.divide, samples)


def _axis_touched(*where: Any) -> tuple[Any, Any]:
    """0/1 float32 tiles of :func:`_axis_samples` ``(*where)``: the pixels some sample
    takes as a corner with a positive weight, and with weight 0."""
    plane, chunks, _ = _axis_samples(*where)
    positive = nl.zeros(plane, dtype=nl.float32)
    zero = nl.zeros(plane, dtype=nl.float32)
    for pixel, low, high, frac, inside in chunks:
        at_low = nl.logical_and(inside, nl.equal(pixel, low))
        at_high = nl.logical_and(inside, nl.equal(pixel, high))
        now_positive = nl.logical_or(
            nl.logical_and(at_low, nl.less(frac, 1.0)),
            nl.logical_and(at_high, nl.greater(frac, 0.0)),
        )
        now_zero = nl.logical_or(
            nl.logical_and(at_low, nl.equal(frac, 1.0)),
            nl.logical_and(at_high, nl.equal(frac, 0.0)),
        )
        positive = nl.maximum(positive, nl.max(now_positive, axis=2))
        zero = nl.maximum(zero, nl.max(now_zero, axis=2))
    return positive, zero


def _tiles(size: int) -> list[tuple[int, int]]:
    return [(start, min(start + PMAX, size)) for start in range(0, size, PMAX)]


def _finite(tile: Any) -> Any:
    """1 where ``tile`` is finite, else 0 (``x - x`` is NaN for NaN and +-inf)."""
    return nl.equal(nl.subtract(tile, tile), 0.0)


# The masks of non-finite values the exceptional paths count, by name.
_MASKS = {
    "nan": lambda tile: nl.not_equal(tile, tile),
    "infinite": lambda tile: nl.equal(nl.abs(tile), np.inf),
    "plus": lambda tile: nl.equal(tile, np.inf),
    "minus": lambda tile: nl.equal(tile, -np.inf),
}


def _on_image(tile: Any, corners: Any, n: int) -> Any:
    """``tile`` where the RoI (``corners``, one per partition) is on image ``n``, else 0."""
    return _column_scalar(tile, nl.multiply, nl.equal(nl.trunc(corners[:, 0:1]), float(n)))


def _either(pair: tuple[Any, Any]) -> Any:
    return nl.maximum(pair[0], pair[1])


def _bilinear(
    load: Any, rows_t: list[list[Any]], columns_t: list[Any], tiles: tuple[list[Any], list[Any]]
) -> Any:
    """``sum_n A_y[n] @ load(n, rows, columns) @ A_x^T`` as an SBUF ``[PH, PW]`` tile:
    ``rows_t[i][n]`` is ``A_y[n]^T`` on row tile ``i``, ``columns_t[j]`` is ``A_x^T`` on
    column tile ``j``."""
    row_tiles, column_tiles = tiles
    bins_h, bins_w = rows_t[0][0].shape[1], columns_t[0].shape[1]
    result = nl.ndarray((bins_h, bins_w), dtype=nl.float32, buffer=nl.psum)
    for j, columns in enumerate(column_tiles):
        # (A_y F)^T for these columns: [w, PH], summed over images and row tiles.
        sampled_t = nl.ndarray((columns[1] - columns[0], bins_h), dtype=nl.float32, buffer=nl.psum)
        first = True
        for n in range(len(rows_t[0])):
            for i, rows in enumerate(row_tiles):
                nisa.nc_matmul(
                    dst=sampled_t, stationary=load(n, rows, columns), moving=rows_t[i][n],
                    accumulate=not first,
                )  # fmt: skip
                first = False
        nisa.nc_matmul(
            dst=result, stationary=nl.copy(sampled_t), moving=columns_t[j], accumulate=j > 0
        )
    return nl.copy(result)


def _load_features(
    input: Any, c: int, finite: bool, n: int, rows: Any, columns: Any, mask: Any = None
) -> Any:
    """Channel ``c`` of image ``n`` on the pixels ``rows x columns`` (``(start, stop)``) in
    SBUF: as it is (``finite``), with its non-finite values zeroed, or as ``mask`` of it."""
    tile = nl.load(input[n, c, rows[0] : rows[1], columns[0] : columns[1]])
    if finite:
        return tile
    return nl.where(_finite(tile), tile, 0.0) if mask is None else mask(tile)


@nki.jit
def roi_align_kernel(
    input: Any,
    rois: Any,
    bins_h: int,
    bins_w: int,
    spatial_scale: float,
    sampling_ratio: int,
    aligned: bool,
    steps_h: int,
    steps_w: int,
    finite: bool,
) -> Any:
    """``input [N, C, H, W]``, ``rois [K, 5]`` float32 (HBM) -> ``[K, C, bins_h,
    bins_w]`` float32; ``steps_h``/``steps_w``: sample steps per bin side to run (at least
    every RoI's grid); ``finite``: whether ``input`` is (else the exceptional path runs)."""
    images, channels, height, width = input.shape
    sampling = (spatial_scale, sampling_ratio, aligned)
    out = nl.ndarray(
        (rois.shape[0], channels, bins_h, bins_w), dtype=nl.float32, buffer=nl.shared_hbm
    )
    tiles = _tiles(height), _tiles(width)
    for k in range(rois.shape[0]):
        # A_y^T per row tile and image (zero unless the RoI is on that image), A_x^T per
        # column tile; for the exceptional path, the pixels taken with a positive or a zero
        # weight in the same layout.
        rows_t, columns_t = [], []
        row_touched: list[list[tuple[Any, Any]]] = []
        column_touched = []
        for h0, h1 in tiles[0]:
            corners = nl.load(rois[k : k + 1].broadcast(0, h1 - h0))
            where = (corners, 0, (h0, h1 - h0), bins_h, height, sampling, steps_h, True)
            weights = _axis_weights(*where)
            rows_t.append([_on_image(weights, corners, n) for n in range(images)])
            if not finite:
                touched = _axis_touched(*where)
                row_touched.append(
                    [tuple(_on_image(t, corners, n) for t in touched) for n in range(images)]
                )
        for w0, w1 in tiles[1]:
            corners = nl.load(rois[k : k + 1].broadcast(0, w1 - w0))
            where = (corners, 1, (w0, w1 - w0), bins_w, width, sampling, steps_w, True)
            columns_t.append(_axis_weights(*where))
            if not finite:
                column_touched.append(_axis_touched(*where))
        for c in range(channels):
            load = functools.partial(_load_features, input, c, finite)
            values = _bilinear(load, rows_t, columns_t, tiles)
            if not finite:
                values = _exceptions(values, load, row_touched, column_touched, tiles)
            nl.store(out[k, c], values)
    return out


def _exceptions(
    values: Any, load: Any, rows: list[list[Any]], columns: list[Any], tiles: Any
) -> Any:
    """``values`` (computed with the non-finite inputs zeroed) made what torchvision's sum
    of ``weight * value`` gives: NaN where a NaN is taken, an infinity is taken with weight
    0 (``0 * inf``) or both infinities are; +-inf where one infinity is. ``rows[i][n]`` and
    ``columns[j]`` are the ``(positive, zero)`` pixels of each tile."""

    def hits(mask: str, row_pick: Any, column_pick: Any) -> Any:
        count = _bilinear(
            lambda n, r, c: load(n, r, c, _MASKS[mask]),
            [[row_pick(pair) for pair in per_image] for per_image in rows],
            [column_pick(pair) for pair in columns],
            tiles,
        )
        return nl.greater(count, 0.5)

    def positive(pair: tuple[Any, Any]) -> Any:
        return pair[0]

    def zero(pair: tuple[Any, Any]) -> Any:
        return pair[1]

    plus = hits("plus", positive, positive)
    minus = hits("minus", positive, positive)
    nan = nl.logical_or(
        nl.logical_or(hits("nan", _either, _either), nl.logical_and(plus, minus)),
        nl.logical_or(hits("infinite", zero, _either), hits("infinite", _either, zero)),
    )
    values = nl.where(plus, np.inf, values)
    values = nl.where(minus, -np.inf, values)
    return nl.where(nan, np.nan, values)


def _gradient_tiles(
    rois: Any,
    cotangent: Any,
    grad: Any,
    n: int,
    pixels: tuple[tuple[int, int], tuple[int, int]],
    group: range,
    sampling: tuple[float, int, bool],
    steps: tuple[int, int],
    finite: bool,
) -> None:
    """The gradient of image ``n``, rows ``pixels[0]``, columns ``pixels[1]`` (``(start,
    stop)``) and the channels of ``group``: ``sum_k [batch_k == n] A_y^T @ G[k, c] @ A_x``,
    a PSUM bank per channel; unless the cotangent is ``finite``, three more count where
    its NaNs and infinities land (as :func:`_exceptions` says)."""
    count, _, bins_h, bins_w = cotangent.shape
    _, _, height, width = grad.shape
    (h0, h1), (w0, w1) = pixels
    kinds = ("value",) if finite else ("value", "nan", "plus", "minus")
    sums = [
        {kind: nl.zeros((h1 - h0, w1 - w0), dtype=nl.float32, buffer=nl.psum) for kind in kinds}
        for _ in group
    ]
    spread = nl.ndarray((bins_h, w1 - w0), dtype=nl.float32, buffer=nl.psum)

    def add(total: Any, data_t: Any, rows: Any, columns: Any) -> None:
        # data [PH, PW] @ columns [PW, w]: [PH, w], then rows^T [h, PH] @ that: [h, w].
        nisa.nc_matmul(dst=spread, stationary=data_t, moving=columns, accumulate=False)
        nisa.nc_matmul(dst=total, stationary=rows, moving=nl.copy(spread), accumulate=True)

    for k in range(count):
        # A_y [PH, h] (zero unless the RoI is on image n), A_x [PW, w], and where their
        # samples take pixels with positive and zero weights.
        corners = nl.load(rois[k : k + 1].broadcast(0, bins_h))
        where = (corners, 0, (h0, h1 - h0), bins_h, height, sampling, steps[0], False)
        rows = _on_image(_axis_weights(*where), corners, n)
        if not finite:
            rows_touched = tuple(_on_image(t, corners, n) for t in _axis_touched(*where))
        corners = nl.load(rois[k : k + 1].broadcast(0, bins_w))
        where = (corners, 1, (w0, w1 - w0), bins_w, width, sampling, steps[1], False)
        columns = _axis_weights(*where)
        if not finite:
            columns_touched = _axis_touched(*where)
        for total, c in zip(sums, group, strict=True):
            g_t = nl.load(cotangent[k, c].permute((1, 0)))
            if finite:
                add(total["value"], g_t, rows, columns)
                continue
            add(total["value"], nl.where(_finite(g_t), g_t, 0.0), rows, columns)
            (rows_positive, rows_zero), (columns_positive, columns_zero) = (
                rows_touched, columns_touched
            )  # fmt: skip
            rows_any, columns_any = _either(rows_touched), _either(columns_touched)
            add(total["nan"], _MASKS["nan"](g_t), rows_any, columns_any)
            add(total["nan"], _MASKS["infinite"](g_t), rows_zero, columns_any)
            add(total["nan"], _MASKS["infinite"](g_t), rows_any, columns_zero)
            add(total["plus"], _MASKS["plus"](g_t), rows_positive, columns_positive)
            add(total["minus"], _MASKS["minus"](g_t), rows_positive, columns_positive)
    for total, c in zip(sums, group, strict=True):
        values = nl.copy(total["value"])
        if not finite:
            plus, minus = nl.greater(total["plus"], 0.5), nl.greater(total["minus"], 0.5)
            nan = nl.logical_or(nl.greater(total["nan"], 0.5), nl.logical_and(plus, minus))
            values = nl.where(plus, np.inf, values)
            values = nl.where(minus, -np.inf, values)
            values = nl.where(nan, np.nan, values)
        nl.store(grad[n, c, h0:h1, w0:w1], values)


@nki.jit
def roi_align_vjp_kernel(
    rois: Any,
    cotangent: Any,
    images: int,
    height: int,
    width: int,
    spatial_scale: float,
    sampling_ratio: int,
    aligned: bool,
    steps_h: int,
    steps_w: int,
    finite: bool,
) -> Any:
    """``rois [K, 5]`` (K >= 1), ``cotangent [K, C, PH, PW]`` float32 (HBM) -> the
    gradient ``[images, C, height, width]`` float32, accumulated in PSUM over the RoIs per
    image, tile of pixels and group of channels; ``finite``: whether ``cotangent`` is."""
    channels = cotangent.shape[1]
    sampling = (spatial_scale, sampling_ratio, aligned)
    grad = nl.ndarray((images, channels, height, width), dtype=nl.float32, buffer=nl.shared_hbm)
    column_tiles = [(w0, min(w0 + MAX_BINS_W, width)) for w0 in range(0, width, MAX_BINS_W)]
    per_group = CHANNEL_GROUP if finite else 1  # four PSUM banks a channel
    for n in range(images):
        for rows in _tiles(height):
            for columns in column_tiles:
                for c0 in range(0, channels, per_group):
                    group = range(c0, min(c0 + per_group, channels))
                    _gradient_tiles(
                        rois, cotangent, grad, n, (rows, columns), group, sampling,
                        (steps_h, steps_w), finite,
                    )  # fmt: skip
    return grad


def _max_steps(rois: np.ndarray, axis: int, bins: int, sampling: tuple[float, int, bool]) -> int:
    """The largest sampling grid along ``axis`` over the RoIs, by the kernel's float32
    formula, plus one step of margin (the kernel masks what a RoI does not use)."""
    scale, ratio, aligned = np.float32(sampling[0]), sampling[1], sampling[2]
    if ratio > 0:
        return ratio
    if rois.shape[0] == 0:
        return 0
    offset = np.float32(0.5 if aligned else 0.0)
    column = (2, 1)[axis]
    start = rois[:, column] * scale - offset
    length = rois[:, column + 2] * scale - offset - start
    if not aligned:
        length = np.maximum(length, np.float32(1.0))
    grid = np.ceil(length / np.float32(bins))
    return max(int(np.max(grid)), 0) + 1


def _steps(
    rois: np.ndarray, output_size: tuple[int, int], sampling: tuple[float, int, bool]
) -> tuple[int, int]:
    """The sample steps per bin side (:func:`_max_steps`) for float32 ``rois [K, 5]``
    without non-finite corners, sampled as ``(spatial_scale, sampling_ratio, aligned)``."""
    bins_h, bins_w = output_size
    return _max_steps(rois, 0, bins_h, sampling), _max_steps(rois, 1, bins_w, sampling)


def _refuse_bins(kernel: str, output_size: tuple[int, int], limit: tuple[int, int]) -> None:
    if output_size[0] > limit[0] or output_size[1] > limit[1]:
        raise ValueError(
            f"the nki {kernel} takes output_size up to {limit}, got {tuple(output_size)}"
        )


def _float32(array: np.ndarray) -> np.ndarray:
    return float_input(np.asarray(array)).astype(np.float32, copy=False)


def _finite_rois(rois: np.ndarray, spatial_scale: float) -> np.ndarray:
    """float32 ``rois`` with each RoI whose scaled corners are not all finite made to name no
    image, so that it pools to 0 and passes no gradient (as on every backend)."""
    with np.errstate(invalid="ignore", over="ignore"):
        finite = np.all(np.isfinite(rois[:, 1:] * np.float32(spatial_scale)), axis=1)
    if np.all(finite):
        return rois
    nowhere = np.array([-1, 0, 0, 0, 0], np.float32)
    return np.where(finite[:, None], rois, nowhere)


@BACKEND.implements(ops.roi_align)
def roi_align(
    input: np.ndarray,
    rois: np.ndarray,
    *,
    output_size: tuple[int, int],
    spatial_scale: float,
    sampling_ratio: int,
    aligned: bool,
) -> np.ndarray:
    """``input [N, C, H, W]``, ``rois [K, 5]`` -> ``[K, C, PH, PW]`` float32.

    Raises:
      ValueError: ``PH > 128`` or ``PW > 512`` (what one tile holds).
    """
    _refuse_bins("roi_align", output_size, (MAX_BINS_H, MAX_BINS_W))
    features = _float32(input)
    boxes = _finite_rois(_float32(rois), spatial_scale)
    sampling = (spatial_scale, sampling_ratio, aligned)
    steps = _steps(boxes, output_size, sampling)
    finite = bool(np.isfinite(features).all())
    result: np.ndarray = run(
        roi_align_kernel, features, boxes, *output_size, *sampling, *steps, finite
    )
    return result


@BACKEND.implements(ops.roi_align_vjp)
def roi_align_vjp(
    input: np.ndarray,
    rois: np.ndarray,
    cotangent: np.ndarray,
    *,
    output_size: tuple[int, int],
    spatial_scale: float,
    sampling_ratio: int,
    aligned: bool,
) -> np.ndarray:
    """``input [N, C, H, W]`` (its shape only), ``rois [K, 5]``, ``cotangent [K, C, PH,
    PW]`` -> the gradient ``[N, C, H, W]``, float32.

    Raises:
      ValueError: ``PH > 128`` or ``PW > 128`` (what one tile holds).
    """
    _refuse_bins("roi_align_vjp", output_size, (PMAX, PMAX))
    boxes = _finite_rois(_float32(rois), spatial_scale)
    grad_out = _float32(cotangent)
    if boxes.shape[0] == 0:
        return np.zeros(input.shape, np.float32)
    images, _, height, width = input.shape
    sampling = (spatial_scale, sampling_ratio, aligned)
    steps = _steps(boxes, output_size, sampling)
    finite = bool(np.isfinite(grad_out).all())
    result: np.ndarray = run(
        roi_align_vjp_kernel, boxes, grad_out, images, height, width, *sampling, *steps, finite
    )
    return result
