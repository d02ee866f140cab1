"""RoIPool and its gradient in ``jax.numpy`` (any XLA device; inside torch_xla's graph).

A bin's pixel range depends on its RoI. Here one loop step takes the same offset
``(dy, dx)`` from the top-left pixel of every bin of every RoI at once (bins smaller than
the offset skip it), for as many steps as the largest bin of the call has pixels: shapes
stay static. Offsets are visited row by row, and a value replaces the running maximum only
when strictly greater, so each bin's argmax is torchvision's (the first maximum in
row-major order; NaN never wins). The gradient scatter-adds each bin's cotangent at its
argmax.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from asickernels.backends.xla import BACKEND
from asickernels.backends.xla.roi_align import exact_quotient
from asickernels.kernels import public as ops
from asickernels.kernels.registry import FLOAT32_AND_64
from asickernels.kernels.roi_pool import LOWEST


def _round(value: jax.Array) -> jax.Array:
    """C's ``round`` (half away from zero), exactly."""
    whole = jnp.trunc(value)
    return whole + jnp.where(jnp.abs(value - whole) >= 0.5, jnp.sign(value), 0.0)


def _edges(start: jax.Array, end: jax.Array, bins: int, size: int) -> tuple[jax.Array, jax.Array]:
    """Along one axis, each bin's clipped pixel range ``[first, last)`` (``[K, bins]``)."""
    length = jnp.maximum(end - start + 1, 1).astype(start.dtype)  # malformed: 1 pixel
    bin_size = exact_quotient(length, bins)
    steps = jnp.arange(bins, dtype=start.dtype)
    first = jnp.floor(steps * bin_size[:, None]) + start[:, None]
    last = jnp.ceil((steps + 1) * bin_size[:, None]) + start[:, None]
    clip = functools.partial(jnp.clip, min=0, max=size)
    return clip(first).astype(jnp.int32), clip(last).astype(jnp.int32)


def _pool(
    input: jax.Array, rois: jax.Array, output_size: tuple[int, int], spatial_scale: float
) -> tuple[jax.Array, jax.Array]:
    """``(out, argmax)``, both ``[K, C, PH, PW]``; argmax is the flat pixel ``h * W + w``,
    -1 where nothing was taken."""
    _, _, height, width = input.shape
    scaled = [rois[:, i] * jnp.asarray(spatial_scale, rois.dtype) for i in range(1, 5)]
    corners = [_round(corner) for corner in scaled]
    h0, h1 = _edges(corners[1], corners[3], output_size[0], height)
    w0, w1 = _edges(corners[0], corners[2], output_size[1], width)
    finite = functools.reduce(jnp.logical_and, [jnp.isfinite(c) for c in scaled])[:, None]
    rows = jnp.where(finite, h1 - h0, 0)  # [K, PH]; a RoI with a NaN or inf corner pools to 0
    columns = jnp.where(finite, w1 - w0, 0)  # [K, PW]
    empty = (rows[:, :, None] <= 0) | (columns[:, None, :] <= 0)  # [K, PH, PW]
    steps_w = jnp.max(columns, initial=0)
    steps = jnp.max(rows, initial=0) * steps_w
    channels_last = jnp.moveaxis(input, 1, -1)  # [N, H, W, C]: one gather per step
    batch = rois[:, 0].astype(jnp.int32)[:, None, None]

    def step(index: jax.Array, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        best, where = carry
        dy, dx = index // steps_w, index % steps_w
        h, w = h0 + dy, w0 + dx
        inside = (dy < rows)[:, :, None] & (dx < columns)[:, None, :]
        h_at = jnp.minimum(h, height - 1)[:, :, None]
        w_at = jnp.minimum(w, width - 1)[:, None, :]
        value = channels_last[batch, h_at, w_at]  # [K, PH, PW, C]
        take = inside[..., None] & (value > best)
        pixel = (h_at * width + w_at)[..., None]
        return jnp.where(take, value, best), jnp.where(take, pixel, where)

    shape = (rois.shape[0], *output_size, input.shape[1])
    start = jnp.where(empty, 0.0, LOWEST).astype(input.dtype)[..., None]
    init = (jnp.broadcast_to(start, shape), jnp.full(shape, -1, jnp.int32))
    best, where = lax.fori_loop(0, steps, step, init)
    return jnp.moveaxis(best, -1, 1), jnp.moveaxis(where, -1, 1)


@BACKEND.implements(ops.roi_pool, dtypes=FLOAT32_AND_64)
def roi_pool(
    input: jax.Array,
    rois: jax.Array,
    *,
    output_size: tuple[int, int],
    spatial_scale: float,
) -> jax.Array:
    """``input [N, C, H, W]``, ``rois [K, 5]`` (float32 or float64) -> ``[K, C, PH, PW]``."""
    return _pool(input, rois, output_size, spatial_scale)[0]


@BACKEND.implements(ops.roi_pool_vjp, dtypes=FLOAT32_AND_64)
def roi_pool_vjp(
    input: jax.Array,
    rois: jax.Array,
    cotangent: jax.Array,
    *,
    output_size: tuple[int, int],
    spatial_scale: float,
) -> jax.Array:
    """``input [N, C, H, W]``, ``rois [K, 5]``, ``cotangent [K, C, PH, PW]`` -> the gradient
    in ``input``: each bin's cotangent scatter-added at its argmax (none for -1)."""
    _, argmax = _pool(input, rois, output_size, spatial_scale)
    n, c, h, w = input.shape
    batch = rois[:, 0].astype(jnp.int32)[:, None, None, None]
    channel = jnp.arange(c)[None, :, None, None]
    values = jnp.where(argmax >= 0, cotangent, jnp.zeros_like(cotangent))
    grad = jnp.zeros((n, c, h * w), cotangent.dtype)
    grad = grad.at[batch, channel, jnp.maximum(argmax, 0)].add(values)
    return grad.reshape(input.shape)
