"""RoIPool (torchvision's ``roi_pool``, Fast R-CNN's max pooling) and its gradient: the
declarations, and the float64 reference, a transcription of torchvision's CPU kernel
(``ops/cpu/roi_pool_kernel.cpp``).

A backend implements the kernels ``roi_pool`` and ``roi_pool_vjp``, called with arrays of one
float dtype (the compute dtype) and the checked statics as keywords (``output_size`` a pair
of ints, ``spatial_scale`` a float):

* ``roi_pool(input [N, C, H, W], rois [K, 5], *, output_size, spatial_scale) -> [K, C, PH,
  PW]``;
* ``roi_pool_vjp(input, rois, cotangent [K, C, PH, PW], *, output_size, spatial_scale) ->
  [N, C, H, W]`` (each bin's cotangent added at its maximum's pixel, which the kernel finds
  again).

The op makes ``roi_pool`` differentiable in ``input`` through ``roi_pool_vjp``'s kernel
(:func:`~asickernels.kernels.roi_align.compute_pooling`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from asickernels.kernels import _checks
from asickernels.kernels.declaration import EXACT, Tolerance
from asickernels.kernels.registry import FLOAT32_AND_64, REFERENCE
from asickernels.kernels.roi_align import (
    POOLING_ARGS_DOC,
    POOLING_STATICS,
    RoiPooling,
    RoiPoolingVjp,
    check_output_size,
    check_pooling_statics,
    compute_dtype,
)

# A bin's running maximum starts here (torchvision's -FLT_MAX, in every dtype), an empty
# bin's value is 0; a bin whose values are all below it or NaN keeps it, with no argmax.
LOWEST = -float(np.finfo(np.float32).max)


# The float64 reference ----------------------------------------------------------------------


def _round(value: float) -> int:
    """C's ``round``: half away from zero."""
    whole = math.trunc(value)
    return whole + (int(math.copysign(1, value)) if abs(value - whole) >= 0.5 else 0)


def _bins(
    roi: np.ndarray,
    output_size: tuple[int, int],
    spatial_scale: float,
    height: int,
    width: int,
    dtype: type[np.floating],
) -> Iterator[tuple[int, int, range, range]]:
    """torchvision's bins of one RoI: ``(ph, pw, rows, columns)`` with ``rows`` and
    ``columns`` the clipped pixel ranges (possibly empty). The corners and bin edges are
    computed in ``dtype``, the compute dtype, as torchvision computes them in the input's:
    a float32 bin of 29/7 pixels ends at 29, a float64 one just past it (at 30)."""
    pooled_height, pooled_width = output_size
    scale = dtype(spatial_scale)
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0, overflow: not finite
        scaled = [float(dtype(v) * scale) for v in roi[1:]]
    if not np.isfinite(scaled).all():  # a RoI with a NaN or infinite corner pools to 0
        for ph in range(pooled_height):
            for pw in range(pooled_width):
                yield ph, pw, range(0), range(0)
        return
    start_w, start_h, end_w, end_h = (_round(v) for v in scaled)
    bin_h = dtype(max(end_h - start_h + 1, 1)) / dtype(pooled_height)  # malformed: 1x1
    bin_w = dtype(max(end_w - start_w + 1, 1)) / dtype(pooled_width)
    for ph in range(pooled_height):
        h0 = min(max(math.floor(dtype(ph) * bin_h) + start_h, 0), height)
        h1 = min(max(math.ceil(dtype(ph + 1) * bin_h) + start_h, 0), height)
        for pw in range(pooled_width):
            w0 = min(max(math.floor(dtype(pw) * bin_w) + start_w, 0), width)
            w1 = min(max(math.ceil(dtype(pw + 1) * bin_w) + start_w, 0), width)
            yield ph, pw, range(h0, h1), range(w0, w1)


def _pool(
    input: npt.ArrayLike,
    rois: npt.ArrayLike,
    output_size: int | Sequence[int],
    spatial_scale: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``(out [K, C, PH, PW], argmax [K, C, PH, PW])`` in float64: each bin's maximum (the
    first in row-major order; NaN never wins) and its flat pixel index ``h * W + w``, -1 for
    none; the bins computed in the op's compute dtype (float64 if an input is, else
    float32); the statics checked as the op checks them."""
    size = check_output_size(output_size)
    scale = _checks.static_float(spatial_scale, "spatial_scale", low=0.0)
    dtype = compute_dtype(input, rois)
    features = np.asarray(input, np.float64)
    boxes = np.asarray(rois, np.float64)
    _, channels, height, width = features.shape
    out = np.zeros((boxes.shape[0], channels, *size))
    argmax = np.full(out.shape, -1, np.int64)
    for k, roi in enumerate(boxes):
        plane = features[int(roi[0])].reshape(channels, height * width)
        for ph, pw, rows, columns in _bins(roi, size, scale, height, width, dtype):
            pixels = np.array([h * width + w for h in rows for w in columns], np.int64)
            if pixels.size == 0:
                continue  # an empty bin is 0, with no argmax
            values = plane[:, pixels]
            above = values > LOWEST  # NaN is never above
            first = np.argmax(np.where(above, values, -np.inf), axis=1)
            found = above[np.arange(channels), first]
            out[k, :, ph, pw] = np.where(found, values[np.arange(channels), first], LOWEST)
            argmax[k, :, ph, pw] = np.where(found, pixels[first], -1)
    return out, argmax


def reference_roi_pool(
    input: npt.ArrayLike,
    rois: npt.ArrayLike,
    output_size: int | Sequence[int],
    *,
    spatial_scale: float = 1.0,
) -> np.ndarray:
    """The float64 :func:`roi_pool` of ``input [N, C, H, W]``, ``rois [K, 5]`` ->
    ``[K, C, PH, PW]`` (the statics are checked as the op checks them)."""
    out, _ = _pool(input, rois, output_size, spatial_scale)
    return out


def reference_roi_pool_vjp(
    input: npt.ArrayLike,
    rois: npt.ArrayLike,
    cotangent: npt.ArrayLike,
    output_size: int | Sequence[int],
    *,
    spatial_scale: float = 1.0,
) -> np.ndarray:
    """The float64 gradient of ``sum(cotangent * roi_pool(input, rois, ...))`` in
    ``input``: ``[N, C, H, W]``, each bin's cotangent added at its maximum's pixel."""
    boxes = np.asarray(rois, np.float64)
    grad_out = np.asarray(cotangent, np.float64)
    _, argmax = _pool(input, rois, output_size, spatial_scale)
    n, channels, height, width = np.shape(input)
    grad = np.zeros((n, channels, height * width))
    for k, roi in enumerate(boxes):
        for c in range(channels):
            for index, value in zip(argmax[k, c].ravel(), grad_out[k, c].ravel(), strict=True):
                if index >= 0:
                    grad[int(roi[0]), c, index] += value
    return grad.reshape(np.shape(input))


roi_pool_vjp = RoiPoolingVjp(
    "roi_pool_vjp",
    POOLING_STATICS,
    check_statics=check_pooling_statics,
    reference=reference_roi_pool_vjp,
    # Cotangents added at the argmax pixels.
    tolerance=(Tolerance(1e-6, 1e-6), Tolerance(1e-12, 1e-12)),
    doc="""The gradient of ``sum(cotangent * roi_pool(input, rois, ...))`` in ``input``.

    ``input [N, C, H, W]`` (its values choose each bin's maximum), ``rois [K, 5]``,
    ``cotangent [K, C, height, width]`` -> ``d_input [N, C, H, W]`` in the input's dtype:
    each bin's cotangent added at its maximum's pixel (nothing for an empty bin); the other
    arguments and errors as :func:`roi_pool`'s.
    """,
)

roi_pool = RoiPooling(
    "roi_pool",
    POOLING_STATICS,
    check_statics=check_pooling_statics,
    reference=reference_roi_pool,
    gradient=roi_pool_vjp,
    tolerance=(EXACT, EXACT),  # RoIPool picks input values
    doc=f"""RoIPool, as ``torchvision.ops.roi_pool`` defines it (Fast R-CNN's pooling).

    Each RoI's corners are scaled by ``spatial_scale`` and rounded to pixels (half away from
    zero); the RoI (at least 1x1 pixel) is cut into ``output_size`` bins of
    ``floor(start)..ceil(end)`` pixels, clipped to the map; a bin's value is its largest
    input value (NaN never wins; a bin with no pixel is 0).

    Args:
      {POOLING_ARGS_DOC}
      backend, config: see :func:`asickernels.giou`.

    Returns:
      ``[K, C, height, width]`` in the input's dtype. Differentiable in ``input``
      (:func:`roi_pool_vjp`: each bin's gradient goes to the pixel that was its maximum);
      ``rois`` get no gradient, as in torchvision.

    Raises:
      TypeError, ValueError: naming the argument (shapes, dtypes, statics, batch indices).
    """,
)

REFERENCE.implements(roi_pool, dtypes=FLOAT32_AND_64)(reference_roi_pool)
REFERENCE.implements(roi_pool_vjp, dtypes=FLOAT32_AND_64)(reference_roi_pool_vjp)
