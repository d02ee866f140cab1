"""RoIAlign (torchvision's ``roi_align``) and its gradient as Pallas TPU kernels.

Bilinear sampling is separable: a sample's weight on pixel ``(h, w)`` is a row weight
times a column weight, and torchvision's "outside the map" test and border clamps apply per
axis. So one RoI's ``[PH, PW]`` bins of one channel are two small matmuls,
``out = A_y @ F @ A_x^T``, where ``A_y [PH, H]`` holds, per bin row, the mean over the
bin's ``grid_h`` sample rows of their bilinear row weights (and ``A_x [PW, W]`` likewise
for columns); the mean over ``grid_h x grid_w`` samples is the product of the two means.
The kernel builds ``A_y`` and ``A_x`` in VMEM from each RoI's corner, bin size and sampling
grid (held in SMEM by scalar prefetch), one dense ``[bins, pixels]`` tile per sample row or
column: the adaptive grid (``sampling_ratio <= 0``: ``ceil(roi size / output size)``) is a
loop whose trip count each RoI reads from SMEM, so it needs no static bound.

Forward: the grid is ``(C / block, K)``; a step reads one image's ``[block, H, W]`` feature
block (the image the RoI names, by scalar prefetch; ``block`` channels, as many as fit
:data:`MAP_BUDGET`, at most 128) and writes ``[block, PH * PW]``: the bins flattened
row-major onto lanes (by exact 0/1 products), since ``[PH, PW]`` blocks would pad to
8 x 128 tiles in HBM (for 7 x 7 bins, 21 times the output). All channels go at once:
``A_y`` (its rows padded to PH8, a multiple of 8) against each channel in one batched
product, then ``[block * PH8, W] @ A_x^T`` and the flattening as plain 2-D products. RoIs
of one image in a row (torchvision's order) keep the feature block in VMEM: Pallas skips
the copy when the block index repeats. Gradient: the grid is ``(N, C / block, K)``; each
step adds ``A_y^T @ G @ A_x`` of the RoIs of image ``n`` into its ``[block, H, W]``
gradient block (the same products in reverse; the K axis accumulates, "arbitrary"), so
images without RoIs get zeros.

A map of which 8 channels outgrow :data:`MAP_BUDGET` is cut into bands of rows (one more
grid axis: the forward accumulates a RoI's bins over the bands, the gradient writes one
band per step), so any map size fits VMEM (a 2048 x 2048 map compiles for v5p).

Runs as Mosaic on a TPU (v5e, v6e, v5p are compile-tested) and in Pallas or TPU interpret
mode elsewhere. Computes in float32 (MXU products at HIGHEST precision). Batch indices are
clamped to ``[0, N - 1]``, as XLA's gather does. Not measured on a TPU: the selection
policy runs XLA's ``roi_align`` there; this kernel runs when asked for by name.

Non-finite values: a product with a zero weight would spread a NaN or an infinity to every
bin (``0 * inf`` is NaN). A block holding one (checked per RoI) goes channel by channel,
computed with them zeroed, then given torchvision's non-finite results from 0/1 products
of where each axis's samples take a pixel with a positive and with a zero weight: NaN
where a NaN is taken, an infinity is taken with weight 0, or both infinities are; +-inf
where one infinity is. The gradient does the same for a non-finite cotangent.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
from jax import lax

from asickernels.backends.pallas_tpu import BACKEND, lowering
from asickernels.backends.xla.roi_align import rounded_product, sampling_grid
from asickernels.kernels import public as ops
from asickernels.pallas_home import pl, pltpu

LANES, SUBLANES = 128, 8
# Per-RoI parameters in SMEM, float32: the box corner, bin size and grid of each axis.
Y0, X0, BIN_H, BIN_W, GRID_H, GRID_W = range(6)
FIELDS = 6
# Bytes of VMEM the double-buffered feature (or gradient) blocks may take: maps larger
# than that are cut into bands of rows.
MAP_BUDGET = 8 << 20
# The statics as the kernel builders take them (hashable): output_size, spatial_scale,
# sampling_ratio, aligned.
Sampling = tuple[tuple[int, int], float, int, bool]


@dataclasses.dataclass(frozen=True)
class RoiAlignConfig:
    """At most ``block_channels`` channels per grid step (a multiple of 8: the flattened
    output's sublanes; as many as fit :data:`MAP_BUDGET`, all of them when there are
    fewer) and map rows per step (a multiple of 8; None: the whole map when 8 channels of
    it fit, else the most rows that do)."""

    block_channels: int = 128
    band_rows: int | None = None

    def __post_init__(self) -> None:
        if self.block_channels <= 0 or self.block_channels % SUBLANES:
            raise ValueError(
                f"block_channels must be a positive multiple of 8, got {self.block_channels}"
            )
        if self.band_rows is not None and (self.band_rows <= 0 or self.band_rows % SUBLANES):
            raise ValueError(f"band_rows must be a positive multiple of 8, got {self.band_rows}")


def _round_up(value: int, multiple: int) -> int:
    return pl.cdiv(value, multiple) * multiple


def _plane_bytes(height: int, width: int) -> int:
    """VMEM bytes of one float32 ``[height, width]`` plane (tiles of 8 x 128)."""
    return _round_up(height, SUBLANES) * _round_up(width, LANES) * 4


def _blocks(channels: int, height: int, width: int, config: RoiAlignConfig) -> tuple[int, int]:
    """(channels, rows) of a feature block: the whole map when 8 channels of it fit
    :data:`MAP_BUDGET` double-buffered, else bands of a multiple of 8 rows; then as many
    channels as fit (a multiple of 8), at most ``block_channels``."""
    band = height if config.band_rows is None else min(height, config.band_rows)
    if config.band_rows is None and 2 * SUBLANES * _plane_bytes(height, width) > MAP_BUDGET:
        band = MAP_BUDGET // (2 * SUBLANES * _plane_bytes(SUBLANES, width)) * SUBLANES
        band = min(height, max(SUBLANES, band))
    fits = MAP_BUDGET // (2 * _plane_bytes(band, width)) // SUBLANES * SUBLANES
    block = min(config.block_channels, max(SUBLANES, fits))
    return min(block, channels), band


class _Samples(NamedTuple):
    """RoI ``k``'s samples along ``axis`` (0: rows, 1: columns) of a map ``size`` pixels long,
    for the ``pixels = (first, count)`` pixels, on ``[bins, count]`` tiles
    (``pixels_first``: ``[count, bins]``)."""

    params_ref: Any  # the [K * FIELDS] float32 SMEM parameters (a Pallas ref)
    k: jax.Array
    axis: int
    bins: int
    size: int
    pixels: tuple[jax.Array | int, int]
    pixels_first: bool


class _Step(NamedTuple):
    """One sample step on a tile: each entry's pixel, the sample's low and high pixels, the
    high one's weight and whether the sample is on the map (all float32 or bool tiles)."""

    pixel: jax.Array
    low: jax.Array
    high: jax.Array
    frac: jax.Array
    inside: jax.Array


Total = TypeVar("Total")
# A pair of 0/1 float32 tiles (:func:`_touched`).
Touched = tuple[jax.Array, jax.Array]


def _over_samples(
    where: _Samples,
    add: Callable[[Total, _Step], Total],
    init: Callable[[tuple[int, int]], Total],
) -> tuple[Total, jax.Array]:
    """Folds ``add(total, step)`` over ``where``'s sample steps (:class:`_Step`),
    from ``init(tile shape)``, as torchvision's ``bilinear_interpolate`` per axis (samples
    beyond one pixel outside the map are not ``inside``; positions clamp at 0 and at the
    last pixel). Returns the total and the grid size as a tile."""
    base = FIELDS * where.k
    start = where.params_ref[base + (Y0, X0)[where.axis]]
    bin_size = where.params_ref[base + (BIN_H, BIN_W)[where.axis]]
    grid = where.params_ref[base + (GRID_H, GRID_W)[where.axis]]
    first_pixel, count = where.pixels
    shape = (count, where.bins) if where.pixels_first else (where.bins, count)
    bin_axis = 1 if where.pixels_first else 0
    bin_index = lax.broadcasted_iota(jnp.int32, shape, bin_axis).astype(jnp.float32)
    pixel = (lax.broadcasted_iota(jnp.int32, shape, 1 - bin_axis) + first_pixel).astype(jnp.float32)
    grid_v = jnp.full(shape, grid, jnp.float32)
    first = start + rounded_product(bin_index, jnp.full(shape, bin_size))
    size = where.size
    last = float(size - 1)

    def add_sample(step: jax.Array, total: Total) -> Total:
        step_v = jnp.full(shape, step, jnp.int32).astype(jnp.float32)
        # torchvision's order: start + bin * bin_size + (step + 0.5) * bin_size / grid.
        position = first + rounded_product(step_v + 0.5, jnp.full(shape, bin_size)) / grid_v
        inside = (position >= -1.0) & (position <= float(size))
        position = jnp.maximum(position, 0.0)
        low = jnp.floor(position)
        at_edge = low >= last
        low = jnp.where(at_edge, last, low)
        high = jnp.where(at_edge, last, low + 1.0)
        frac = jnp.where(at_edge, 0.0, position - low)
        return add(total, _Step(pixel, low, high, frac, inside))

    total = lax.fori_loop(0, grid.astype(jnp.int32), add_sample, init(shape))
    return total, grid_v


def _interpolation(where: _Samples) -> jax.Array:
    """The mean bilinear weights over ``where``'s samples."""

    def add(total: jax.Array, step: _Step) -> jax.Array:
        pixel, low, high, frac, inside = step
        weight = jnp.where(pixel == low, 1.0 - frac, 0.0) + jnp.where(pixel == high, frac, 0.0)
        return total + jnp.where(inside, weight, 0.0)

    total, grid = _over_samples(where, add, lambda shape: jnp.zeros(shape, jnp.float32))
    return total / jnp.maximum(grid, 1.0)


def _padded_interpolation(where: _Samples) -> jax.Array:
    """:func:`_interpolation` with the bins padded to a multiple of 8 by zeros (so that
    ``[channels, bins, ...]`` tiles merge their leading axes for free)."""
    weights = _interpolation(where._replace(bins=_round_up(where.bins, SUBLANES)))
    bin_axis = 1 if where.pixels_first else 0
    real = lax.broadcasted_iota(jnp.int32, weights.shape, bin_axis) < where.bins
    return jnp.where(real, weights, 0.0)


def _touched(where: _Samples) -> Touched:
    """0/1 float32 tiles: the pixels some sample takes as a corner with a positive weight,
    and with weight 0. Across both axes, a sample's corner weighs ``w_y * w_x``: positive
    on ``P_y x P_x``, 0 on ``Z_y x T_x`` and ``T_y x Z_x`` (``T = P | Z``)."""

    def add(total: Touched, step: _Step) -> Touched:
        pixel, low, high, frac, inside = step
        positive, zero = total
        at_low, at_high = inside & (pixel == low), inside & (pixel == high)
        now_positive = (at_low & (frac < 1.0)) | (at_high & (frac > 0.0))
        now_zero = (at_low & (frac == 1.0)) | (at_high & (frac == 0.0))
        return (
            jnp.maximum(positive, jnp.where(now_positive, 1.0, 0.0)),
            jnp.maximum(zero, jnp.where(now_zero, 1.0, 0.0)),
        )

    def init(shape: tuple[int, int]) -> Touched:
        return jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32)

    touched, _ = _over_samples(where, add, init)
    return touched


def _exceptions(
    values: jax.Array,
    data: jax.Array,
    rows: Touched,
    columns: Touched,
    product: Callable[[jax.Array, jax.Array, jax.Array], jax.Array],
) -> jax.Array:
    """``values`` (computed from ``data`` with its non-finite entries zeroed) made what
    torchvision's sum of ``weight * data`` gives: NaN where a NaN is taken, where an
    infinity is taken with weight 0 (0 * inf) and where both infinities are taken; else
    +-inf where an infinity is taken. ``rows``/``columns``: :func:`_touched` of each axis;
    ``product(row_tile, mask, column_tile)``: the bilinear product as the kernel lays it
    out."""
    (rows_positive, rows_zero), (columns_positive, columns_zero) = rows, columns
    rows_any = jnp.maximum(rows_positive, rows_zero)
    columns_any = jnp.maximum(columns_positive, columns_zero)

    def hit(row_tile: jax.Array, mask: jax.Array, column_tile: jax.Array) -> jax.Array:
        return product(row_tile, mask.astype(jnp.float32), column_tile) > 0.5

    infinite = jnp.abs(data) == jnp.inf
    plus = hit(rows_positive, data == jnp.inf, columns_positive)
    minus = hit(rows_positive, data == -jnp.inf, columns_positive)
    nan = (
        hit(rows_any, data != data, columns_any)
        | hit(rows_zero, infinite, columns_any)
        | hit(rows_any, infinite, columns_zero)
        | (plus & minus)
    )
    values = jnp.where(plus, jnp.inf, jnp.where(minus, -jnp.inf, values))
    return jnp.where(nan, jnp.nan, values)


def _has_nonfinite(data: jax.Array) -> jax.Array:
    return jnp.max(jnp.where(data - data == 0.0, 0.0, 1.0)) > 0.0


def _dot(a: jax.Array, b: jax.Array, contract: tuple[int, int]) -> jax.Array:
    return lax.dot_general(
        a,
        b,
        ((contract[:1], contract[1:]), ((), ())),
        precision=lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )


def _flat_layout(bins_h: int, bins_w: int, rows: int | None = None) -> tuple[jax.Array, jax.Array]:
    """For bins flattened row-major onto lanes (``j = ph * PW + pw``): ``rows [PH, PH*PW]``
    (1 where ``j`` is in bin row ``ph``; ``rows`` rows, the ones past PH zero) and
    ``columns [PW, PH*PW]`` (1 where ``j`` is in bin column ``pw``), float32."""
    flat = bins_h * bins_w
    j = lax.broadcasted_iota(jnp.int32, (1, flat), 1).astype(jnp.float32)
    row_of_j = jnp.floor((j + 0.5) / bins_w)  # exact: small integers
    column_of_j = j - row_of_j * bins_w
    ph = lax.broadcasted_iota(jnp.int32, (rows or bins_h, flat), 0).astype(jnp.float32)
    pw = lax.broadcasted_iota(jnp.int32, (bins_w, flat), 0).astype(jnp.float32)
    return (ph == row_of_j).astype(jnp.float32), (pw == column_of_j).astype(jnp.float32)


def _forward_kernel(
    bins: tuple[int, int],
    height: int,
    batch_ref: Any,
    params_ref: Any,
    features_ref: Any,
    out_ref: Any,
) -> None:
    # features_ref [block, band, W]: rows t * band.. of the RoI's image; out_ref
    # [block, PH * PW] float32, accumulated over the bands t.
    del batch_ref  # read by the index maps
    k, t = pl.program_id(1), pl.program_id(2)
    _, band, width = features_ref.shape
    bins_h, bins_w = bins
    first_row = t * band
    row_samples = _Samples(params_ref, k, 0, bins_h, height, (first_row, band), False)
    column_samples = _Samples(params_ref, k, 1, bins_w, width, (0, width), False)
    rows, columns = _interpolation(row_samples), _interpolation(column_samples)
    padded = _padded_interpolation(row_samples)  # [PH8, band]
    in_row, in_column = _flat_layout(bins_h, bins_w)
    padded_in_row, _ = _flat_layout(bins_h, bins_w, _round_up(bins_h, SUBLANES))
    # The last band may run past the map: its rows there hold whatever the DMA left.
    on_map = lax.broadcasted_iota(jnp.int32, (band, width), 0) + first_row < height

    @pl.when(t == 0)
    def _start() -> None:
        out_ref[...] = jnp.zeros_like(out_ref)

    def bilinear(row_tile: jax.Array, data: jax.Array, column_tile: jax.Array) -> jax.Array:
        return _dot(_dot(row_tile, data, (1, 0)), column_tile, (1, 1))  # [PH, PW]

    def flatten(values: jax.Array) -> jax.Array:  # [PH, PW] (finite) -> [1, PH * PW]
        # Row-major onto lanes: spread each row over all columns' slots, keep its own.
        return jnp.sum(_dot(values, in_column, (1, 0)) * in_row, axis=0, keepdims=True)

    def with_nonfinite(features: jax.Array, rows: jax.Array) -> jax.Array:
        clean = jnp.where(features - features == 0.0, features, 0.0)
        values = bilinear(rows, clean, columns)
        touched = _touched(row_samples), _touched(column_samples)
        values = _exceptions(values, features, *touched, bilinear)
        # Flattened by 0/1 products, the non-finite bins go as masks (0 * inf is NaN).
        flat = flatten(jnp.where(values - values == 0.0, values, 0.0))
        for special in (jnp.inf, -jnp.inf, jnp.nan):
            at = values != values if special != special else values == special
            flat = jnp.where(flatten(jnp.where(at, 1.0, 0.0)) > 0.5, special, flat)
        return flat

    def channel(c: jax.Array, rows: jax.Array) -> jax.Array:
        features = features_ref[c].astype(jnp.float32)
        if height % band:
            features = jnp.where(on_map, features, 0.0)
        out_ref[pl.ds(c, 1), :] += with_nonfinite(features, rows)
        return rows

    block = features_ref[...].astype(jnp.float32)
    if height % band:
        block = jnp.where(on_map[None], block, 0.0)
    finite = jnp.logical_not(_has_nonfinite(block))

    @pl.when(finite)
    def _all_channels() -> None:
        # [C, PH8, band] x [C, band, W] -> [C, PH8, W]; PH8 (PH padded to 8) lets the
        # channels and bin rows merge into one axis for the next products.
        channels = block.shape[0]
        sampled = lax.dot_general(
            jnp.broadcast_to(padded[None], (channels, *padded.shape)),
            block,
            (((2,), (1,)), ((0,), (0,))),
            precision=lax.Precision.HIGHEST,
            preferred_element_type=jnp.float32,
        )
        values = _dot(sampled.reshape(-1, width), columns, (1, 1))  # [C * PH8, PW]
        spread = _dot(values, in_column, (1, 0)).reshape(channels, padded.shape[0], -1)
        out_ref[...] += jnp.sum(spread * padded_in_row[None], axis=1)

    @pl.when(jnp.logical_not(finite))
    def _each_channel() -> None:
        lax.fori_loop(0, out_ref.shape[0], channel, rows)


def _backward_kernel(
    bins: tuple[int, int],
    height: int,
    batch_ref: Any,
    params_ref: Any,
    cotangent_ref: Any,
    grad_ref: Any,
) -> None:
    # cotangent_ref [block, PH * PW] of RoI k; grad_ref [block, band, W]: rows t * band..
    # of image n (Pallas drops the rows past the map).
    n, t, k = pl.program_id(0), pl.program_id(2), pl.program_id(3)

    @pl.when(k == 0)
    def _start() -> None:
        grad_ref[...] = jnp.zeros_like(grad_ref)

    @pl.when(batch_ref[k] == n)
    def _add_this_roi() -> None:
        _, band, width = grad_ref.shape
        bins_h, bins_w = bins
        row_samples = _Samples(params_ref, k, 0, bins_h, height, (t * band, band), True)
        column_samples = _Samples(params_ref, k, 1, bins_w, width, (0, width), False)
        columns = _interpolation(column_samples)
        rows_t, padded_t = _interpolation(row_samples), _padded_interpolation(row_samples)
        in_row, in_column = _flat_layout(bins_h, bins_w)

        def bins_of(flat: jax.Array) -> jax.Array:  # [1, PH * PW] -> [PH, PW]
            return _dot(in_row * flat, in_column, (1, 1))

        def bilinear(row_tile: jax.Array, data: jax.Array, column_tile: jax.Array) -> jax.Array:
            return _dot(_dot(row_tile, data, (1, 0)), column_tile, (1, 0))  # [band, W]

        def with_nonfinite(flat: jax.Array, rows_t: jax.Array) -> jax.Array:
            clean = jnp.where(flat - flat == 0.0, flat, 0.0)
            values = bilinear(rows_t, bins_of(clean), columns)
            touched = _touched(row_samples), _touched(column_samples)

            def at(mask: jax.Array) -> jax.Array:  # exact: a 0/1 product
                return bins_of(jnp.where(mask, 1.0, 0.0)) > 0.5

            # The non-finite bins of the cotangent, as [PH, PW] (finite ones read 0).
            data = jnp.where(at(flat == jnp.inf), jnp.inf, 0.0)
            data = jnp.where(at(flat == -jnp.inf), -jnp.inf, data)
            data = jnp.where(at(flat != flat), jnp.nan, data)
            return _exceptions(values, data, *touched, bilinear)

        cotangent = cotangent_ref[...].astype(jnp.float32)  # [C, PH * PW]
        finite = jnp.logical_not(_has_nonfinite(cotangent))

        @pl.when(finite)
        def _all_channels() -> None:
            # Bins unflattened to [C * PH8, PW] (PH padded to 8: the channels and bin rows
            # share one axis), times A_x: [C, PH8, W]; then A_y^T per channel.
            padded_in_row, _ = _flat_layout(bins_h, bins_w, padded_t.shape[1])
            channels = cotangent.shape[0]
            spread = cotangent[:, None, :] * padded_in_row[None]  # [C, PH8, PH * PW]
            values = _dot(spread.reshape(-1, spread.shape[2]), in_column, (1, 1))
            sampled = _dot(values, columns, (1, 0)).reshape(channels, -1, width)
            grad_ref[...] += lax.dot_general(
                jnp.broadcast_to(padded_t[None], (channels, *padded_t.shape)),
                sampled,
                (((2,), (1,)), ((0,), (0,))),
                precision=lax.Precision.HIGHEST,
                preferred_element_type=jnp.float32,
            )

        @pl.when(jnp.logical_not(finite))
        def _each_channel() -> None:
            def channel(c: jax.Array, carry: None) -> None:
                flat = cotangent_ref[pl.ds(c, 1), :].astype(jnp.float32)  # [1, PH * PW]
                grad_ref[c] += lax.cond(
                    _has_nonfinite(flat),
                    with_nonfinite,
                    lambda f, r: bilinear(r, bins_of(f), columns),
                    flat,
                    rows_t,
                )

            lax.fori_loop(0, grad_ref.shape[0], channel, None)


def _scalars(rois: jax.Array, images: int, sampling: Sampling) -> tuple[jax.Array, jax.Array]:
    """Per RoI: the clamped batch index ``[K]`` int32 and the flat ``[K * FIELDS]``
    float32 parameters (both for SMEM)."""
    grid = sampling_grid(rois, *sampling)
    params = jnp.stack(
        [grid.y0, grid.x0, grid.bin_h, grid.bin_w, grid.grid_h, grid.grid_w], axis=1
    ).astype(jnp.float32)
    return jnp.clip(grid.batch, 0, images - 1), params.reshape(-1)


def _vmem_bytes(block: int, band: int, width: int, bins_h: int, bins_w: int) -> int:
    """The double-buffered feature (or gradient) and output (or cotangent) blocks, one
    RoI's interpolation weights (both orientations, and broadcast over the channels), the
    bin layout matrices and the whole block's temporaries."""
    flat, padded = bins_h * bins_w, _round_up(bins_h, SUBLANES)
    blocks = 2 * (block * _plane_bytes(band, width) + _plane_bytes(block, flat))
    weights = _plane_bytes(padded, band) + _plane_bytes(band, padded)
    weights += 2 * _plane_bytes(bins_w, width) + block * _plane_bytes(padded, band)
    layout = _plane_bytes(padded, flat) + _plane_bytes(bins_w, flat)
    temporaries = block * (2 * _plane_bytes(band, width) + 2 * _plane_bytes(padded, width))
    temporaries += block * 2 * _plane_bytes(padded, max(flat, bins_w))
    return blocks + 2 * weights + 2 * layout + temporaries


def _build_forward(
    sampling: Sampling, config: RoiAlignConfig, target: lowering.Target
) -> Callable[[jax.Array, jax.Array], jax.Array]:
    def forward(input: jax.Array, rois: jax.Array) -> jax.Array:
        images, channels, height, width = input.shape
        bins_h, bins_w = sampling[0]
        count = rois.shape[0]
        block, band = _blocks(channels, height, width, config)
        batch, params = _scalars(rois, images, sampling)
        call = pl.pallas_call(
            functools.partial(_forward_kernel, (bins_h, bins_w), height),
            # Bins flattened onto lanes: [PH, PW] blocks would pad to 8 x 128 tiles.
            out_shape=jax.ShapeDtypeStruct((count, channels, bins_h * bins_w), jnp.float32),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=2,
                grid=(pl.cdiv(channels, block), count, pl.cdiv(height, band)),
                in_specs=[
                    pl.BlockSpec((None, block, band, width), lambda c, k, t, b, p: (b[k], c, t, 0))
                ],
                out_specs=pl.BlockSpec(
                    (None, block, bins_h * bins_w), lambda c, k, t, b, p: (k, c, 0)
                ),
            ),
            compiler_params=lowering.compiler_params(
                ("parallel", "parallel", "arbitrary"),
                _vmem_bytes(block, band, width, bins_h, bins_w),
                target.generation,
            ),
            interpret=target.interpret,
            name="roi_align_forward",
        )
        return call(batch, params, input).reshape(count, channels, bins_h, bins_w)

    return forward


def _build_backward(
    sampling: Sampling,
    input_shape: tuple[int, ...],
    config: RoiAlignConfig,
    target: lowering.Target,
) -> Callable[[jax.Array, jax.Array], jax.Array]:
    def backward(rois: jax.Array, cotangent: jax.Array) -> jax.Array:
        images, channels, height, width = input_shape
        count, _, bins_h, bins_w = cotangent.shape
        block, band = _blocks(channels, height, width, config)
        batch, params = _scalars(rois, images, sampling)
        call = pl.pallas_call(
            functools.partial(_backward_kernel, (bins_h, bins_w), height),
            out_shape=jax.ShapeDtypeStruct(input_shape, jnp.float32),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=2,
                grid=(images, pl.cdiv(channels, block), pl.cdiv(height, band), count),
                in_specs=[
                    pl.BlockSpec((None, block, bins_h * bins_w), lambda n, c, t, k, b, p: (k, c, 0))
                ],
                out_specs=pl.BlockSpec(
                    (None, block, band, width), lambda n, c, t, k, b, p: (n, c, t, 0)
                ),
            ),
            compiler_params=lowering.compiler_params(
                ("parallel", "parallel", "parallel", "arbitrary"),
                _vmem_bytes(block, band, width, bins_h, bins_w),
                target.generation,
            ),
            interpret=target.interpret,
            name="roi_align_backward",
        )
        flat = cotangent.reshape(count, channels, bins_h * bins_w)
        return call(batch, params, flat)  # type: ignore[no-any-return]

    return backward


@BACKEND.implements(ops.roi_align, config=RoiAlignConfig)
def roi_align(
    input: jax.Array,
    rois: jax.Array,
    *,
    config: RoiAlignConfig | None = None,
    mode: lowering.InterpretMode = None,
    output_size: tuple[int, int],
    spatial_scale: float,
    sampling_ratio: int,
    aligned: bool,
) -> jax.Array:
    """``input [N, C, H, W]``, ``rois [K, 5]`` float32 -> ``[K, C, PH, PW]`` float32."""
    sampling = (output_size, spatial_scale, sampling_ratio, aligned)
    build = lowering.Build(_build_forward, (sampling, config or RoiAlignConfig()))
    return lowering.run(build, mode, input, rois)  # type: ignore[no-any-return]


@BACKEND.implements(ops.roi_align_vjp, config=RoiAlignConfig)
def roi_align_vjp(
    input: jax.Array,
    rois: jax.Array,
    cotangent: jax.Array,
    *,
    config: RoiAlignConfig | None = None,
    mode: lowering.InterpretMode = None,
    output_size: tuple[int, int],
    spatial_scale: float,
    sampling_ratio: int,
    aligned: bool,
) -> jax.Array:
    """``input [N, C, H, W]`` (its shape only), ``rois [K, 5]``, ``cotangent [K, C, PH,
    PW]`` float32 -> the gradient ``[N, C, H, W]``, float32."""
    if rois.shape[0] == 0:  # no grid steps to zero the gradient
        return jnp.zeros(input.shape, jnp.float32)
    sampling = (output_size, spatial_scale, sampling_ratio, aligned)
    config = config or RoiAlignConfig()
    build = lowering.Build(_build_backward, (sampling, tuple(input.shape), config))
    return lowering.run(build, mode, rois, cotangent.astype(jnp.float32))  # type: ignore[no-any-return]
