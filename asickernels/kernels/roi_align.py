"""RoIAlign (torchvision's ``roi_align``) and its gradient: the declarations, and the float64
reference, a transcription of torchvision's CPU kernel (``ops/cpu/roi_align_kernel.cpp``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from asickernels import reference
from asickernels.kernels import _checks
from asickernels.kernels.declaration import Op, Plan, Runner, Spec, array, cast, static
from asickernels.kernels.registry import FLOAT32_AND_64

_STATICS = [
    static("output_size", "int[]", positional=True),
    static("spatial_scale", "float", 1.0),
    static("sampling_ratio", "int", -1),
    static("aligned", "bool", False),
]


def check_output_size(size: Any) -> tuple[int, int]:
    """``output_size`` (an int or a pair of ints, each >= 1) as ``(height, width)``."""
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        size = (size, size)
    if not isinstance(size, (tuple, list)) or len(size) != 2:
        raise TypeError(f"output_size must be an int or a pair of ints, got {size!r}")
    height = _checks.static_int(size[0], "output_size[0]", low=1)
    width = _checks.static_int(size[1], "output_size[1]", low=1)
    return height, width


def _check_statics(statics: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    height, width = check_output_size(statics["output_size"])
    scale = _checks.static_float(statics["spatial_scale"], "spatial_scale", low=0.0)
    ratio = _checks.static_int(
        statics["sampling_ratio"], "sampling_ratio", low=-(2**31), high=2**31 - 1
    )  # a C int in torchvision
    aligned = statics["aligned"]
    if not isinstance(aligned, (bool, np.bool_)):
        raise TypeError(f"aligned must be a bool, got {type(aligned).__name__}")
    return (
        ("output_size", (height, width)),
        ("spatial_scale", scale),
        ("sampling_ratio", ratio),
        ("aligned", bool(aligned)),
    )


def check_input_and_rois(specs: Mapping[str, Spec | None]) -> tuple[Spec, Spec]:
    """``input [N, C, H, W]`` and ``rois [K, 5]``, both floating (RoIAlign's and RoIPool's)."""
    features, rois = _checks.required(specs, "input"), _checks.required(specs, "rois")
    _checks.check_float(features, "input")
    _checks.check_float(rois, "rois")
    if len(features.shape) != 4:
        raise ValueError(f"input must have shape [N, C, H, W], got {tuple(features.shape)}")
    if len(rois.shape) != 2 or rois.shape[1] != 5:
        raise ValueError(
            f"rois must have shape [K, 5] (batch index, x1, y1, x2, y2), got {tuple(rois.shape)}"
        )
    return features, rois


def check_batch_indices(input: Any, rois: Any, **_: Any) -> None:
    """On eager calls: every RoI names an image of ``input`` (its index, truncated as
    torchvision truncates it, in ``[0, N)``)."""
    index = np.asarray(rois)[:, 0].astype(np.float64)
    if not np.all((index > -1) & (index < np.shape(input)[0])):
        raise ValueError(
            f"rois[:, 0] must be image indices of input, in [0, {np.shape(input)[0]}), got "
            f"{index[~((index > -1) & (index < np.shape(input)[0]))][:3].tolist()}"
        )


def pooling_plan(
    kernel: str, specs: Mapping[str, Spec | None], statics: tuple[tuple[str, Any], ...]
) -> Plan:
    """The plan of a RoI pooling op (``roi_align``, ``roi_pool``) or, for a ``kernel`` named
    ``*_vjp``, of its gradient (checking ``cotangent [K, C, height, width]``), given its
    checked statics."""
    features, rois = check_input_and_rois(specs)
    height, width = dict(statics)["output_size"]
    pooled = (rois.shape[0], features.shape[1], height, width)
    dtype = _checks.float_compute_dtype(features, rois)
    if not kernel.endswith("_vjp"):
        trivial = _checks.size(pooled) == 0
        return Plan(kernel, dtype, Spec(pooled, features.dtype), statics, trivial=trivial)
    cotangent = _checks.required(specs, "cotangent")
    _checks.check_float(cotangent, "cotangent")
    if tuple(cotangent.shape) != pooled:
        raise ValueError(f"cotangent must have shape {pooled}, got {tuple(cotangent.shape)}")
    return Plan(
        kernel,
        dtype,
        Spec(features.shape, features.dtype),
        statics,
        trivial=_checks.size(features.shape) == 0 or _checks.size(pooled) == 0,
    )


def pooling_compute(runner: Runner, plan: Plan, input: Any, rois: Any) -> Any:
    """The forward computation of a RoI pooling op: its kernel on ``input`` and ``rois`` in
    the compute dtype, cast back to the input's."""
    dtype = plan.dtype or "float32"
    assert plan.kernel is not None and isinstance(plan.outputs, Spec)
    out = runner.kernel(plan.kernel)(cast(input, dtype), cast(rois, dtype), **dict(plan.statics))
    return cast(out, plan.outputs.dtype)


def _compute_roi_align_vjp(
    runner: Runner, plan: Plan, input: Any, rois: Any, cotangent: Any
) -> Any:
    dtype = plan.dtype or "float32"
    statics = dict(plan.statics)
    grad = runner.kernel("roi_align_vjp")(
        cast(rois, dtype), cast(cotangent, dtype), input_shape=tuple(input.shape), **statics
    )
    assert isinstance(plan.outputs, Spec)
    return cast(grad, plan.outputs.dtype)


# The float64 reference ----------------------------------------------------------------------


def _samples(roi: np.ndarray, statics: Mapping[str, Any]) -> tuple[int, Any]:
    """torchvision's sampling of one RoI: ``(batch index, [(bin row, bin column, y, x)])``
    and the divisor (samples per bin, at least 1)."""
    height, width = statics["output_size"]
    scale, ratio = statics["spatial_scale"], statics["sampling_ratio"]
    offset = 0.5 if statics["aligned"] else 0.0
    x1, y1, x2, y2 = (float(v) * scale - offset for v in roi[1:])
    roi_w, roi_h = x2 - x1, y2 - y1
    if not statics["aligned"]:
        roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
    bin_h, bin_w = roi_h / height, roi_w / width
    grid_h = ratio if ratio > 0 else math.ceil(roi_h / height)
    grid_w = ratio if ratio > 0 else math.ceil(roi_w / width)
    points = [
        (
            ph,
            pw,
            y1 + ph * bin_h + (iy + 0.5) * bin_h / grid_h,
            x1 + pw * bin_w + (ix + 0.5) * bin_w / grid_w,
        )
        for ph in range(height)
        for pw in range(width)
        for iy in range(grid_h)
        for ix in range(grid_w)
    ]
    return int(roi[0]), (points, max(grid_h * grid_w, 1))


def _corners(y: float, x: float, height: int, width: int) -> list[tuple[int, int, float]]:
    """The bilinear corners ``(row, column, weight)`` of a sample (none outside the map)."""
    if y < -1.0 or y > height or x < -1.0 or x > width:
        return []
    y, x = max(y, 0.0), max(x, 0.0)
    y_low, x_low = int(y), int(x)
    if y_low >= height - 1:
        y_high = y_low = height - 1
        y = float(y_low)
    else:
        y_high = y_low + 1
    if x_low >= width - 1:
        x_high = x_low = width - 1
        x = float(x_low)
    else:
        x_high = x_low + 1
    ly, lx = y - y_low, x - x_low
    hy, hx = 1.0 - ly, 1.0 - lx
    return [
        (y_low, x_low, hy * hx),
        (y_low, x_high, hy * lx),
        (y_high, x_low, ly * hx),
        (y_high, x_high, ly * lx),
    ]


def reference_roi_align(
    input: Any,
    rois: Any,
    output_size: Any,
    *,
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
) -> np.ndarray:
    """The float64 reference over the public signature."""
    features = np.asarray(input, np.float64)
    boxes = np.asarray(rois, np.float64)
    statics = dict(
        _check_statics(
            dict(
                output_size=output_size,
                spatial_scale=spatial_scale,
                sampling_ratio=sampling_ratio,
                aligned=aligned,
            )
        )
    )
    height, width = statics["output_size"]
    out = np.zeros((boxes.shape[0], features.shape[1], height, width))
    for k, roi in enumerate(boxes):
        batch, (points, count) = _samples(roi, statics)
        for ph, pw, y, x in points:
            for row, column, weight in _corners(y, x, features.shape[2], features.shape[3]):
                out[k, :, ph, pw] += weight * features[batch, :, row, column]
        out[k] /= count
    return out


def reference_roi_align_vjp(
    input: Any,
    rois: Any,
    cotangent: Any,
    output_size: Any,
    *,
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
) -> np.ndarray:
    """The float64 gradient of ``sum(cotangent * roi_align(input, rois, ...))`` in
    ``input`` (``rois`` get none, as in torchvision)."""
    shape = np.shape(input)
    boxes = np.asarray(rois, np.float64)
    grad_out = np.asarray(cotangent, np.float64)
    statics = dict(
        _check_statics(
            dict(
                output_size=output_size,
                spatial_scale=spatial_scale,
                sampling_ratio=sampling_ratio,
                aligned=aligned,
            )
        )
    )
    grad = np.zeros(shape)
    for k, roi in enumerate(boxes):
        batch, (points, count) = _samples(roi, statics)
        for ph, pw, y, x in points:
            for row, column, weight in _corners(y, x, shape[2], shape[3]):
                grad[batch, :, row, column] += weight * grad_out[k, :, ph, pw] / count
    return grad


@reference.BACKEND.implements("roi_align", dtypes=FLOAT32_AND_64)
def _reference_kernel(input: Any, rois: Any, **statics: Any) -> np.ndarray:
    return reference_roi_align(input, rois, **statics)


@reference.BACKEND.implements("roi_align_vjp", dtypes=FLOAT32_AND_64)
def _reference_vjp_kernel(rois: Any, cotangent: Any, *, input_shape: Any, **statics: Any) -> Any:
    return reference_roi_align_vjp(np.zeros(input_shape), rois, cotangent, **statics)


def _roi_align_vjp_of_roi_align(
    arrays: Mapping[str, Any], statics: Mapping[str, Any], backend: str | None, cotangent: Any
) -> tuple[Any]:
    return (roi_align_vjp(arrays["input"], arrays["rois"], cotangent, backend=backend, **statics),)


roi_align = Op(
    "roi_align",
    [array("input", 3), array("rois", 1), *_STATICS],
    check=lambda specs, statics: pooling_plan("roi_align", specs, _check_statics(statics)),
    check_values=check_batch_indices,
    compute=pooling_compute,
    reference=reference_roi_align,
    vjp=_roi_align_vjp_of_roi_align,
    differentiable=("input",),
    partition="none",  # no SPMD rule yet: RoIs name their image by index
    doc="""RoIAlign, as ``torchvision.ops.roi_align`` defines it (Mask R-CNN's pooling).

    Each RoI is cut into ``output_size`` bins; a bin's value is the mean of bilinear
    samples of the input on a regular grid (``sampling_ratio`` per side, or
    ``ceil(roi size / output size)`` when ``sampling_ratio <= 0``); samples farther than one
    pixel outside the map count as 0.

    Args:
      input: ``[N, C, H, W]`` float features (float16/bfloat16 computed in float32).
      rois: ``[K, 5]`` float ``(batch index, x1, y1, x2, y2)`` in input-image coordinates;
        a batch index that names no image of ``input`` is a ValueError (on eager calls;
        under ``jit`` the cpu backend raises, XLA clamps it).
      output_size: int or ``(height, width)``, each >= 1.
      spatial_scale: the feature map's scale of the image coordinates (e.g. 1/16), >= 0.
      sampling_ratio: samples per bin side; <= 0 for the adaptive grid.
      aligned: shift the box coordinates by -0.5 pixel (torchvision's ``aligned=True``).
      backend, config: see :func:`asickernels.giou`.

    Returns:
      ``[K, C, height, width]`` in the input's dtype. Differentiable in ``input``
      (:func:`roi_align_vjp`); ``rois`` get no gradient, as in torchvision.
    """,
)

roi_align_vjp = Op(
    "roi_align_vjp",
    [array("input", 3), array("rois", 1), array("cotangent", 3), *_STATICS],
    check=lambda specs, statics: pooling_plan("roi_align_vjp", specs, _check_statics(statics)),
    check_values=check_batch_indices,
    compute=_compute_roi_align_vjp,
    reference=reference_roi_align_vjp,
    outputs=("d_input",),
    partition="none",  # no SPMD rule yet: RoIs name their image by index
    doc="""The gradient of ``sum(cotangent * roi_align(input, rois, ...))`` in ``input``.

    ``input [N, C, H, W]`` (its shape and dtype only), ``rois [K, 5]``, ``cotangent
    [K, C, height, width]`` -> ``d_input [N, C, H, W]`` in the input's dtype.
    """,
)
