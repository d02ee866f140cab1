"""RoIAlign and its gradient in ``jax.numpy`` (any XLA device; inside torch_xla's graph).

torchvision's kernel loops over a per-RoI sampling grid whose size, with the adaptive
``sampling_ratio <= 0``, depends on the box. Here one loop step takes the same grid point
``(iy, ix)`` of every bin of every RoI at once (RoIs whose grid is smaller skip it), for as
many steps as the largest grid in the call needs: shapes stay static, and small boxes cost
few steps. The gradient runs the same steps, scatter-adding instead of gathering.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from asickernels.backends.xla import BACKEND
from asickernels.kernels import public as ops
from asickernels.kernels.registry import FLOAT32_AND_64

# A bilinear corner of one sample step of every bin: rows [K, PH, 1], columns [K, 1, PW]
# and weights [K, PH, PW].
Corner = tuple[jax.Array, jax.Array, jax.Array]


class SamplingGrid(NamedTuple):
    """Per RoI (``[K]``): batch index, top-left corner, bin size, sampling grid and the
    number of samples per bin (at least 1), as torchvision computes them."""

    batch: jax.Array
    y0: jax.Array
    x0: jax.Array
    bin_h: jax.Array
    bin_w: jax.Array
    grid_h: jax.Array
    grid_w: jax.Array
    samples: jax.Array


def exact_quotient(numerator: jax.Array, divisor: int | jax.Array) -> jax.Array:
    """``numerator / divisor``, correctly rounded: XLA's simplifier turns a division by a
    constant or a broadcast scalar into a multiplication by its reciprocal, which rounds
    differently (21 / 7 gives 3.0000002 in float32), and torchvision's bins are decided by
    correctly rounded quotients. A full-shape divisor behind a barrier is divided by."""
    divisor = jnp.broadcast_to(jnp.asarray(divisor, numerator.dtype), numerator.shape)
    return numerator / lax.optimization_barrier(divisor)


def rounded_product(multiplier: jax.Array, value: jax.Array) -> jax.Array:
    """``multiplier * value`` rounded once, as torchvision rounds it before adding it, for a
    whole or half ``multiplier`` (a bin or sample index) with at most 12 significant bits
    (float64: 26). XLA on CPU fuses a product and the sum it feeds into one fused
    multiply-add, rounded once (a sample moves by an ulp, up to 1.6x roi_align's float32
    tolerance on a 68-pixel map), so the product is the sum of two exact ones (``value``
    split into its high and low halves of the significand): fused or not, it rounds once."""
    wide = value.dtype == jnp.float64
    bits = lax.bitcast_convert_type(value, jnp.int64 if wide else jnp.int32)
    low_bits = (1 << 26) - 1 if wide else (1 << 12) - 1
    high = lax.bitcast_convert_type(bits & ~jnp.asarray(low_bits, bits.dtype), value.dtype)
    return multiplier * high + multiplier * (value - high)


def sampling_grid(
    rois: jax.Array,
    output_size: tuple[int, int],
    spatial_scale: float,
    sampling_ratio: int,
    aligned: bool,
) -> SamplingGrid:
    """The :class:`SamplingGrid` of ``rois [K, 5]`` (float32 or float64)."""
    offset = 0.5 if aligned else 0.0
    x1, y1, x2, y2 = (rois[:, i] * spatial_scale - offset for i in range(1, 5))
    roi_w, roi_h = x2 - x1, y2 - y1
    if not aligned:  # torchvision: malformed RoIs are forced to 1x1
        roi_w, roi_h = jnp.maximum(roi_w, 1.0), jnp.maximum(roi_h, 1.0)
    bin_h, bin_w = exact_quotient(roi_h, output_size[0]), exact_quotient(roi_w, output_size[1])
    if sampling_ratio > 0:
        grid_h = grid_w = jnp.full(rois.shape[:1], sampling_ratio, jnp.int32)
    else:
        grid_h = jnp.ceil(bin_h).astype(jnp.int32)
        grid_w = jnp.ceil(bin_w).astype(jnp.int32)
    finite = jnp.isfinite(x1) & jnp.isfinite(y1) & jnp.isfinite(x2) & jnp.isfinite(y2)
    grid_h, grid_w = jnp.where(finite, grid_h, 0), jnp.where(finite, grid_w, 0)  # pools to 0
    count = jnp.maximum(grid_h * grid_w, 1).astype(rois.dtype)
    return SamplingGrid(rois[:, 0].astype(jnp.int32), y1, x1, bin_h, bin_w, grid_h, grid_w, count)


def _axis_weights(
    start: jax.Array, bin_size: jax.Array, grid: jax.Array, step: jax.Array, bins: int, size: int
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Along one axis, the sample ``step`` of each of ``bins`` bins of each RoI (``[K, bins]``):
    low and high pixel indices and their weights (0 outside the map or past the RoI's grid),
    as torchvision's ``bilinear_interpolate``."""
    # torchvision's order: start + bin * bin_size + (step + 0.5) * bin_size / grid.
    bin_start = start[:, None] + rounded_product(
        jnp.arange(bins, dtype=start.dtype), bin_size[:, None]
    )
    within = rounded_product(step.astype(start.dtype) + 0.5, bin_size[:, None])
    position = bin_start + exact_quotient(within, grid[:, None].astype(start.dtype))
    inside = (position >= -1.0) & (position <= size) & (step < grid)[:, None]
    position = jnp.maximum(position, 0.0)
    low = jnp.floor(position).astype(jnp.int32)
    at_edge = low >= size - 1
    low = jnp.where(at_edge, size - 1, low)
    high = jnp.where(at_edge, size - 1, low + 1)
    position = jnp.where(at_edge, low.astype(position.dtype), position)
    frac = position - low
    zero = jnp.zeros_like(frac)
    return low, high, jnp.where(inside, 1.0 - frac, zero), jnp.where(inside, frac, zero)


def _for_each_sample(
    grid: SamplingGrid,
    output_size: tuple[int, int],
    shape: tuple[int, ...],
    body: Callable[[jax.Array, tuple[Corner, ...]], jax.Array],
    init: jax.Array,
) -> jax.Array:
    """``carry = body(carry, corners)`` from ``init`` for each grid point up to the largest
    grid of the call; ``corners`` are the four :data:`Corner` of the step."""
    height, width = shape[2], shape[3]
    steps_w = jnp.max(grid.grid_w, initial=0)
    steps = jnp.max(grid.grid_h, initial=0) * steps_w

    def step(index: jax.Array, carry: jax.Array) -> jax.Array:
        iy, ix = index // steps_w, index % steps_w
        y_lo, y_hi, wy_lo, wy_hi = _axis_weights(
            grid.y0, grid.bin_h, grid.grid_h, iy, output_size[0], height
        )
        x_lo, x_hi, wx_lo, wx_hi = _axis_weights(
            grid.x0, grid.bin_w, grid.grid_w, ix, output_size[1], width
        )
        rows = (y_lo[:, :, None], y_hi[:, :, None])
        columns = (x_lo[:, None, :], x_hi[:, None, :])
        row_weights = (wy_lo[:, :, None], wy_hi[:, :, None])
        column_weights = (wx_lo[:, None, :], wx_hi[:, None, :])
        corners = tuple(
            (rows[a], columns[b], row_weights[a] * column_weights[b])
            for a in (0, 1)
            for b in (0, 1)
        )
        return body(carry, corners)

    return lax.fori_loop(0, steps, step, init)  # type: ignore[no-any-return]


@BACKEND.implements(ops.roi_align, dtypes=FLOAT32_AND_64)
def roi_align(
    input: jax.Array,
    rois: jax.Array,
    *,
    output_size: tuple[int, int],
    spatial_scale: float,
    sampling_ratio: int,
    aligned: bool,
) -> jax.Array:
    """``input [N, C, H, W]``, ``rois [K, 5]`` (float32 or float64) -> ``[K, C, PH, PW]``."""
    grid = sampling_grid(rois, output_size, spatial_scale, sampling_ratio, aligned)
    channels_last = jnp.moveaxis(input, 1, -1)  # [N, H, W, C]: one gather per sample
    batch = grid.batch[:, None, None]

    def body(total: jax.Array, corners: tuple[Corner, ...]) -> jax.Array:
        value = sum(
            weight[..., None] * channels_last[batch, row, column] for row, column, weight in corners
        )
        return total + value

    zeros = jnp.zeros((rois.shape[0], *output_size, input.shape[1]), input.dtype)
    total = _for_each_sample(grid, output_size, input.shape, body, zeros)
    return jnp.moveaxis(total / grid.samples[:, None, None, None], -1, 1)


@BACKEND.implements(ops.roi_align_vjp, dtypes=FLOAT32_AND_64)
def roi_align_vjp(
    input: jax.Array,
    rois: jax.Array,
    cotangent: jax.Array,
    *,
    output_size: tuple[int, int],
    spatial_scale: float,
    sampling_ratio: int,
    aligned: bool,
) -> jax.Array:
    """``input [N, C, H, W]`` (its shape only), ``rois [K, 5]``, ``cotangent [K, C, PH,
    PW]`` -> the gradient ``[N, C, H, W]``, scatter-added (the order of additions is
    XLA's)."""
    grid = sampling_grid(rois, output_size, spatial_scale, sampling_ratio, aligned)
    scaled = jnp.moveaxis(cotangent, 1, -1) / grid.samples[:, None, None, None]
    batch = grid.batch[:, None, None]

    def body(grad: jax.Array, corners: tuple[Corner, ...]) -> jax.Array:
        for row, column, weight in corners:
            grad = grad.at[batch, row, column].add(weight[..., None] * scaled)
        return grad

    n, c, h, w = input.shape
    zeros = jnp.zeros((n, h, w, c), rois.dtype)
    grad = _for_each_sample(grid, output_size, input.shape, body, zeros)
    return jnp.moveaxis(grad, -1, 1)
