"""RoIPool (torchvision's ``roi_pool``, Fast R-CNN's max pooling) and its gradient: the
declarations, and the float64 reference, a transcription of torchvision's CPU kernel
(``ops/cpu/roi_pool_kernel.cpp``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from asickernels import reference
from asickernels.kernels import _checks
from asickernels.kernels.declaration import (
    Op,
    Plan,
    Runner,
    Spec,
    array,
    cast,
    static,
)
from asickernels.kernels.registry import FLOAT32_AND_64
from asickernels.kernels.roi_align import (
    check_batch_indices,
    check_output_size,
    pooling_compute,
    pooling_plan,
)

_STATICS = [static("output_size", "int[]", positional=True), static("spatial_scale", "float", 1.0)]
# A bin's running maximum starts here (torchvision's -FLT_MAX, in every dtype), an empty
# bin's value is 0; a bin whose values are all below it or NaN keeps it, with no argmax.
LOWEST = -float(np.finfo(np.float32).max)


def _check_statics(statics: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    size = check_output_size(statics["output_size"])
    scale = _checks.static_float(statics["spatial_scale"], "spatial_scale", low=0.0)
    return (("output_size", size), ("spatial_scale", scale))


def _compute_roi_pool_vjp(runner: Runner, plan: Plan, input: Any, rois: Any, cotangent: Any) -> Any:
    dtype = plan.dtype or "float32"
    grad = runner.kernel("roi_pool_vjp")(
        cast(input, dtype), cast(rois, dtype), cast(cotangent, dtype), **dict(plan.statics)
    )
    assert isinstance(plan.outputs, Spec)
    return cast(grad, plan.outputs.dtype)


# The float64 reference ----------------------------------------------------------------------


def _round(value: float) -> int:
    """C's ``round``: half away from zero."""
    whole = math.trunc(value)
    return whole + (int(math.copysign(1, value)) if abs(value - whole) >= 0.5 else 0)


def _bins(roi: np.ndarray, statics: Mapping[str, Any], height: int, width: int) -> Any:
    """torchvision's bins of one RoI: ``(ph, pw, rows, columns)`` with ``rows`` and
    ``columns`` the clipped pixel ranges (possibly empty)."""
    pooled_height, pooled_width = statics["output_size"]
    scale = statics["spatial_scale"]
    start_w, start_h, end_w, end_h = (_round(float(v) * scale) for v in roi[1:])
    bin_h = max(end_h - start_h + 1, 1) / pooled_height  # malformed RoIs are forced to 1x1
    bin_w = max(end_w - start_w + 1, 1) / pooled_width
    for ph in range(pooled_height):
        h0 = min(max(math.floor(ph * bin_h) + start_h, 0), height)
        h1 = min(max(math.ceil((ph + 1) * bin_h) + start_h, 0), height)
        for pw in range(pooled_width):
            w0 = min(max(math.floor(pw * bin_w) + start_w, 0), width)
            w1 = min(max(math.ceil((pw + 1) * bin_w) + start_w, 0), width)
            yield ph, pw, range(h0, h1), range(w0, w1)


def _pool(features: np.ndarray, boxes: np.ndarray, statics: Mapping[str, Any]) -> Any:
    """``(out [K, C, PH, PW], argmax [K, C, PH, PW])``: each bin's maximum (the first in
    row-major order; NaN never wins) and its flat pixel index ``h * W + w``, -1 for none."""
    _, channels, height, width = features.shape
    out = np.zeros((boxes.shape[0], channels, *statics["output_size"]))
    argmax = np.full(out.shape, -1, np.int64)
    for k, roi in enumerate(boxes):
        plane = features[int(roi[0])].reshape(channels, height * width)
        for ph, pw, rows, columns in _bins(roi, statics, height, width):
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


def _statics_of(output_size: Any, spatial_scale: float) -> dict[str, Any]:
    return dict(_check_statics({"output_size": output_size, "spatial_scale": spatial_scale}))


def reference_roi_pool(
    input: Any, rois: Any, output_size: Any, *, spatial_scale: float = 1.0
) -> np.ndarray:
    """The float64 reference over the public signature."""
    features = np.asarray(input, np.float64)
    boxes = np.asarray(rois, np.float64)
    out, _ = _pool(features, boxes, _statics_of(output_size, spatial_scale))
    return out  # type: ignore[no-any-return]


def reference_roi_pool_vjp(
    input: Any, rois: Any, cotangent: Any, output_size: Any, *, spatial_scale: float = 1.0
) -> np.ndarray:
    """The float64 gradient of ``sum(cotangent * roi_pool(input, rois, ...))`` in ``input``:
    each bin's cotangent goes to its argmax pixel (``rois`` get none, as in torchvision)."""
    features = np.asarray(input, np.float64)
    boxes = np.asarray(rois, np.float64)
    grad_out = np.asarray(cotangent, np.float64)
    _, argmax = _pool(features, boxes, _statics_of(output_size, spatial_scale))
    n, channels, height, width = features.shape
    grad = np.zeros((n, channels, height * width))
    for k, roi in enumerate(boxes):
        for c in range(channels):
            for index, value in zip(argmax[k, c].ravel(), grad_out[k, c].ravel(), strict=True):
                if index >= 0:
                    grad[int(roi[0]), c, index] += value
    return grad.reshape(features.shape)


@reference.BACKEND.implements("roi_pool", dtypes=FLOAT32_AND_64)
def _reference_kernel(input: Any, rois: Any, **statics: Any) -> np.ndarray:
    return reference_roi_pool(input, rois, **statics)


@reference.BACKEND.implements("roi_pool_vjp", dtypes=FLOAT32_AND_64)
def _reference_vjp_kernel(input: Any, rois: Any, cotangent: Any, **statics: Any) -> np.ndarray:
    return reference_roi_pool_vjp(input, rois, cotangent, **statics)


def _roi_pool_vjp_of_roi_pool(
    arrays: Mapping[str, Any], statics: Mapping[str, Any], backend: str | None, cotangent: Any
) -> tuple[Any]:
    return (roi_pool_vjp(arrays["input"], arrays["rois"], cotangent, backend=backend, **statics),)


roi_pool = Op(
    "roi_pool",
    [array("input", 3), array("rois", 1), *_STATICS],
    check=lambda specs, statics: pooling_plan("roi_pool", specs, _check_statics(statics)),
    check_values=check_batch_indices,
    compute=pooling_compute,
    reference=reference_roi_pool,
    vjp=_roi_pool_vjp_of_roi_pool,
    differentiable=("input",),
    partition="none",  # no SPMD rule yet: RoIs name their image by index
    doc="""RoIPool, as ``torchvision.ops.roi_pool`` defines it (Fast R-CNN's pooling).

    Each RoI's corners are scaled by ``spatial_scale`` and rounded to pixels (half away from
    zero); the RoI (at least 1x1 pixel) is cut into ``output_size`` bins of
    ``floor(start)..ceil(end)`` pixels, clipped to the map; a bin's value is its largest
    input value (NaN never wins; a bin with no pixel is 0).

    Args:
      input: ``[N, C, H, W]`` float features (float16/bfloat16 computed in float32).
      rois: ``[K, 5]`` float ``(batch index, x1, y1, x2, y2)`` in input-image coordinates;
        a batch index that names no image of ``input`` is a ValueError (on eager calls;
        under ``jit`` XLA clamps it).
      output_size: int or ``(height, width)``, each >= 1.
      spatial_scale: the feature map's scale of the image coordinates (e.g. 1/16), >= 0.
      backend, config: see :func:`asickernels.giou`.

    Returns:
      ``[K, C, height, width]`` in the input's dtype. Differentiable in ``input``
      (:func:`roi_pool_vjp`: each bin's gradient goes to the pixel that was its maximum);
      ``rois`` get no gradient, as in torchvision.
    """,
)

roi_pool_vjp = Op(
    "roi_pool_vjp",
    [array("input", 3), array("rois", 1), array("cotangent", 3), *_STATICS],
    check=lambda specs, statics: pooling_plan("roi_pool_vjp", specs, _check_statics(statics)),
    check_values=check_batch_indices,
    compute=_compute_roi_pool_vjp,
    reference=reference_roi_pool_vjp,
    outputs=("d_input",),
    partition="none",  # no SPMD rule yet: RoIs name their image by index
    doc="""The gradient of ``sum(cotangent * roi_pool(input, rois, ...))`` in ``input``.

    ``input [N, C, H, W]`` (its values choose each bin's maximum), ``rois [K, 5]``,
    ``cotangent [K, C, height, width]`` -> ``d_input [N, C, H, W]`` in the input's dtype:
    each bin's cotangent added at its maximum's pixel (nothing for an empty bin).
    """,
)
