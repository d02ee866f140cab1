"""RoIAlign (torchvision's ``roi_align``) and its gradient: the declarations, what every RoI
pooling op shares (:func:`pooling_ops`, which RoIPool's declarations use too), and the float64
reference, a transcription of torchvision's CPU kernel (``ops/cpu/roi_align_kernel.cpp``).

A backend implements the kernels ``roi_align`` and ``roi_align_vjp``, called with arrays of
one float dtype (the compute dtype: float32, or float64 where the backend supports it) and
the checked statics (:class:`RoiAlignStatics`) as keywords:

* ``roi_align(input [N, C, H, W], rois [K, 5], **statics) -> [K, C, PH, PW]``;
* ``roi_align_vjp(rois [K, 5], cotangent [K, C, PH, PW], *, input_shape, **statics)
  -> [N, C, H, W]`` (RoIAlign's gradient does not depend on the input's values).

The op makes ``roi_align`` differentiable in ``input`` through ``roi_align_vjp``
(:func:`pooling_ops`), so a JAX kernel need not be differentiable itself.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypedDict, Unpack

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from asickernels.kernels import _checks
from asickernels.kernels.declaration import (
    Array,
    Op,
    Param,
    Plan,
    Runner,
    Spec,
    array,
    cast,
    static,
)
from asickernels.kernels.registry import FLOAT32_AND_64, REFERENCE


class RoiStatics(TypedDict):
    """The checked statics every RoI pooling kernel takes (RoIPool's, all of them)."""

    output_size: tuple[int, int]  # (PH, PW), each >= 1
    spatial_scale: float  # >= 0


class RoiAlignStatics(RoiStatics):
    """The checked statics of the ``roi_align`` and ``roi_align_vjp`` kernels."""

    sampling_ratio: int  # a C int; <= 0: the adaptive grid
    aligned: bool


# How a RoI pooling op calls its ``<name>_vjp`` kernel: ``call(kernel, input, rois,
# cotangent) -> d_input``, with the statics bound to ``kernel`` and the arrays in the
# compute dtype.
VjpCall = Callable[[Callable[..., Array], Array, Array, Array], Array]


def check_output_size(size: object) -> tuple[int, int]:
    """``output_size`` (an int or a pair of ints, each >= 1) as ``(height, width)``.

    Raises:
      TypeError: it is neither an int nor a pair of ints.
      ValueError: a side is < 1.
    """
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        size = (size, size)
    if not isinstance(size, (tuple, list)) or len(size) != 2:
        raise TypeError(f"output_size must be an int or a pair of ints, got {size!r}")
    height = _checks.static_int(size[0], "output_size[0]", low=1)
    width = _checks.static_int(size[1], "output_size[1]", low=1)
    return height, width


def check_roi_statics(statics: Mapping[str, object]) -> RoiStatics:
    """``output_size`` (see :func:`check_output_size`) and ``spatial_scale`` (a number >= 0).

    Raises:
      TypeError, ValueError: naming the bad argument.
    """
    return RoiStatics(
        output_size=check_output_size(statics["output_size"]),
        spatial_scale=_checks.static_float(statics["spatial_scale"], "spatial_scale", low=0.0),
    )


def _check_statics(statics: Mapping[str, object]) -> RoiAlignStatics:
    aligned = statics["aligned"]
    if not isinstance(aligned, (bool, np.bool_)):
        raise TypeError(f"aligned must be a bool, got {type(aligned).__name__}")
    return RoiAlignStatics(
        **check_roi_statics(statics),
        sampling_ratio=_checks.static_int(
            statics["sampling_ratio"], "sampling_ratio", low=-(2**31), high=2**31 - 1
        ),
        aligned=bool(aligned),
    )


def check_batch_indices(input: Array, rois: Array, **_: object) -> None:
    """On eager calls: every RoI names an image of ``input`` (its index, truncated as
    torchvision truncates it, in ``[0, N)``).

    Raises:
      ValueError: naming ``rois[:, 0]`` and the first bad indices.
    """
    index = np.asarray(rois)[:, 0].astype(np.float64)
    images = np.shape(input)[0]
    bad = ~((index > -1) & (index < images))
    if np.any(bad):
        raise ValueError(
            f"rois[:, 0] must be image indices of input, in [0, {images}), got "
            f"{index[bad][:3].tolist()}"
        )


def pooling_ops(
    name: str,
    statics: Sequence[Param],
    check_statics: Callable[[Mapping[str, object]], RoiStatics],
    reference: Callable[..., np.ndarray],
    reference_vjp: Callable[..., np.ndarray],
    call_vjp: VjpCall,
    doc: str,
    vjp_doc: str,
) -> tuple[Op, Op]:
    """A RoI pooling op and its gradient op ``<name>_vjp``, run by the kernels of those names.

    The op: ``input [N, C, H, W]``, ``rois [K, 5]`` (both floating) and ``statics`` ->
    ``[K, C, PH, PW]`` in the input's dtype, differentiable in ``input``. The gradient op:
    the same and ``cotangent [K, C, PH, PW]`` -> ``d_input [N, C, H, W]`` in the input's
    dtype. Both compute in float32 (float64 for float64 inputs), check the batch indices
    on eager calls (:func:`check_batch_indices`) and have no SPMD rule (a RoI names its
    image by index). Under JAX the forward kernel's gradient in ``input`` is the
    ``<name>_vjp`` kernel (through ``call_vjp``); ``rois`` get none, as in torchvision.

    Validation raises TypeError/ValueError naming the argument: a missing or non-float
    array, a shape other than the above, or what ``check_statics`` refuses.
    """
    vjp_name = f"{name}_vjp"

    def checked(
        specs: Mapping[str, Spec | None], given: Mapping[str, object]
    ) -> tuple[Spec, Spec, tuple[int, ...], tuple[tuple[str, object], ...]]:
        features, rois = _checks.required(specs, "input"), _checks.required(specs, "rois")
        _checks.check_float(features, "input")
        _checks.check_float(rois, "rois")
        if len(features.shape) != 4:
            raise ValueError(f"input must have shape [N, C, H, W], got {tuple(features.shape)}")
        if len(rois.shape) != 2 or rois.shape[1] != 5:
            raise ValueError(
                "rois must have shape [K, 5] (batch index, x1, y1, x2, y2), got "
                f"{tuple(rois.shape)}"
            )
        valid = check_statics(given)
        pooled = (rois.shape[0], features.shape[1], *valid["output_size"])
        return features, rois, pooled, tuple(valid.items())

    def check(specs: Mapping[str, Spec | None], given: Mapping[str, object]) -> Plan:
        features, rois, pooled, items = checked(specs, given)
        return Plan(
            name,
            _checks.float_compute_dtype(features, rois),
            Spec(pooled, features.dtype),
            items,
            trivial=_checks.size(pooled) == 0,
        )

    def check_vjp(specs: Mapping[str, Spec | None], given: Mapping[str, object]) -> Plan:
        features, rois, pooled, items = checked(specs, given)
        cotangent = _checks.required(specs, "cotangent")
        _checks.check_float(cotangent, "cotangent")
        if tuple(cotangent.shape) != pooled:
            raise ValueError(f"cotangent must have shape {pooled}, got {tuple(cotangent.shape)}")
        return Plan(
            vjp_name,
            _checks.float_compute_dtype(features, rois),
            Spec(features.shape, features.dtype),
            items,
            trivial=_checks.size(features.shape) == 0 or _checks.size(pooled) == 0,
        )

    def compute_vjp(
        runner: Runner, plan: Plan, input: Array, rois: Array, cotangent: Array
    ) -> Array:
        dtype = plan.dtype or "float32"
        kernel = functools.partial(runner.kernel(vjp_name), **dict(plan.statics))
        grad = call_vjp(kernel, cast(input, dtype), cast(rois, dtype), cast(cotangent, dtype))
        return cast(grad, input.dtype)

    def compute(runner: Runner, plan: Plan, input: Array, rois: Array) -> Array:
        dtype = plan.dtype or "float32"
        forward = functools.partial(runner.kernel(name), **dict(plan.statics))
        features, boxes = cast(input, dtype), cast(rois, dtype)
        if runner.host:
            return cast(forward(features, boxes), input.dtype)
        backward = functools.partial(compute_vjp, runner, plan)
        return cast(_differentiable_in_input(forward, backward, features, boxes), input.dtype)

    vjp_op = Op(
        vjp_name,
        [array("input", 3), array("rois", 1), array("cotangent", 3), *statics],
        check=check_vjp,
        check_values=check_batch_indices,
        compute=compute_vjp,
        reference=reference_vjp,
        outputs=("d_input",),
        partition="none",
        doc=vjp_doc,
    )

    def vjp(
        arrays: Mapping[str, Array],
        given: Mapping[str, object],
        backend: str | None,
        cotangent: Array,
    ) -> tuple[Array]:
        return (vjp_op(arrays["input"], arrays["rois"], cotangent, backend=backend, **given),)

    op = Op(
        name,
        [array("input", 3), array("rois", 1), *statics],
        check=check,
        check_values=check_batch_indices,
        compute=compute,
        reference=reference,
        vjp=vjp,
        differentiable=("input",),
        partition="none",
        doc=doc,
    )
    return op, vjp_op


def _differentiable_in_input(
    forward: Callable[[jax.Array, jax.Array], Array],
    backward: Callable[[jax.Array, jax.Array, jax.Array], Array],
    input: jax.Array,
    rois: jax.Array,
) -> Array:
    """``forward(input, rois)``, whose gradient in ``input`` is ``backward(input, rois,
    cotangent)``; ``rois`` get zeros."""

    @jax.custom_vjp
    def pooled(input: jax.Array, rois: jax.Array) -> Array:
        return forward(input, rois)

    def forward_pass(input: jax.Array, rois: jax.Array) -> tuple[Array, tuple[jax.Array, ...]]:
        return forward(input, rois), (input, rois)

    def backward_pass(
        residuals: tuple[jax.Array, ...], cotangent: jax.Array
    ) -> tuple[Array, jax.Array]:
        input, rois = residuals
        return backward(input, rois, cotangent), jnp.zeros_like(rois)

    pooled.defvjp(forward_pass, backward_pass)
    return pooled(input, rois)  # type: ignore[no-any-return]


# The float64 reference ----------------------------------------------------------------------

# A bin's samples: (bin row, bin column, y, x).
Point = tuple[int, int, float, float]


def _samples(
    roi: np.ndarray, statics: RoiAlignStatics, dtype: type[np.floating]
) -> tuple[int, list[Point], int]:
    """torchvision's sampling of one RoI: its image, its samples and their number per bin
    (at least 1). The sample positions are computed in ``dtype``, the compute dtype, as
    torchvision computes them in the input's (at image coordinates near 1000, float32
    positions move a sample by about 1e-5 pixel)."""
    height, width = statics["output_size"]
    scale, ratio = dtype(statics["spatial_scale"]), statics["sampling_ratio"]
    offset = dtype(0.5 if statics["aligned"] else 0.0)
    x1, y1, x2, y2 = (dtype(v) * scale - offset for v in roi[1:])
    roi_w, roi_h = x2 - x1, y2 - y1
    if not statics["aligned"]:
        roi_w, roi_h = max(roi_w, dtype(1.0)), max(roi_h, dtype(1.0))
    bin_h, bin_w = roi_h / dtype(height), roi_w / dtype(width)
    grid_h = ratio if ratio > 0 else math.ceil(roi_h / dtype(height))
    grid_w = ratio if ratio > 0 else math.ceil(roi_w / dtype(width))
    points = [
        (
            ph,
            pw,
            float(y1 + dtype(ph) * bin_h + dtype(iy + 0.5) * bin_h / dtype(grid_h)),
            float(x1 + dtype(pw) * bin_w + dtype(ix + 0.5) * bin_w / dtype(grid_w)),
        )
        for ph in range(height)
        for pw in range(width)
        for iy in range(grid_h)
        for ix in range(grid_w)
    ]
    return int(roi[0]), points, max(grid_h * grid_w, 1)


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


def _taps(
    boxes: np.ndarray,
    statics: RoiAlignStatics,
    height: int,
    width: int,
    dtype: type[np.floating],
) -> Iterator[tuple[int, int, int, int, int, int, float]]:
    """Every pixel every RoI's bins take: ``(k, image, bin row, bin column, row, column,
    weight)``, the weight divided by the bin's number of samples (a bin is their mean);
    the samples placed in ``dtype``."""
    for k, roi in enumerate(boxes):
        image, points, count = _samples(roi, statics, dtype)
        for ph, pw, y, x in points:
            for row, column, weight in _corners(y, x, height, width):
                yield k, image, ph, pw, row, column, weight / count


def compute_dtype(input: npt.ArrayLike, rois: npt.ArrayLike) -> type[np.floating]:
    """The dtype a RoI pooling op computes in (its references place samples and bins in
    it, as torchvision does): float64 if an input is, else float32."""
    wide = _checks.float_compute_dtype(np.asarray(input), np.asarray(rois)) == "float64"
    return np.float64 if wide else np.float32


def _statics_of(
    output_size: int | Sequence[int], spatial_scale: float, sampling_ratio: int, aligned: bool
) -> RoiAlignStatics:
    return _check_statics(
        dict(
            output_size=output_size,
            spatial_scale=spatial_scale,
            sampling_ratio=sampling_ratio,
            aligned=aligned,
        )
    )


def reference_roi_align(
    input: npt.ArrayLike,
    rois: npt.ArrayLike,
    output_size: int | Sequence[int],
    *,
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
) -> np.ndarray:
    """The float64 :func:`roi_align` of ``input [N, C, H, W]``, ``rois [K, 5]`` ->
    ``[K, C, PH, PW]`` (the statics are checked as the op checks them)."""
    dtype = compute_dtype(input, rois)
    features = np.asarray(input, np.float64)
    boxes = np.asarray(rois, np.float64)
    statics = _statics_of(output_size, spatial_scale, sampling_ratio, aligned)
    out = np.zeros((boxes.shape[0], features.shape[1], *statics["output_size"]))
    height, width = features.shape[2:]
    for k, image, ph, pw, row, column, weight in _taps(boxes, statics, height, width, dtype):
        out[k, :, ph, pw] += weight * features[image, :, row, column]
    return out


def reference_roi_align_vjp(
    input: npt.ArrayLike,
    rois: npt.ArrayLike,
    cotangent: npt.ArrayLike,
    output_size: int | Sequence[int],
    *,
    spatial_scale: float = 1.0,
    sampling_ratio: int = -1,
    aligned: bool = False,
) -> np.ndarray:
    """The float64 gradient of ``sum(cotangent * roi_align(input, rois, ...))`` in
    ``input``: ``[N, C, H, W]`` (only ``input``'s shape and dtype are read)."""
    shape = np.shape(input)
    dtype = compute_dtype(input, rois)
    boxes = np.asarray(rois, np.float64)
    grad_out = np.asarray(cotangent, np.float64)
    statics = _statics_of(output_size, spatial_scale, sampling_ratio, aligned)
    grad = np.zeros(shape)
    height, width = shape[2:]
    for k, image, ph, pw, row, column, weight in _taps(boxes, statics, height, width, dtype):
        grad[image, :, row, column] += weight * grad_out[k, :, ph, pw]
    return grad


REFERENCE.implements("roi_align", dtypes=FLOAT32_AND_64)(reference_roi_align)


@REFERENCE.implements("roi_align_vjp", dtypes=FLOAT32_AND_64)
def _reference_vjp_kernel(
    rois: np.ndarray,
    cotangent: np.ndarray,
    *,
    input_shape: tuple[int, ...],
    **statics: Unpack[RoiAlignStatics],
) -> np.ndarray:
    return reference_roi_align_vjp(np.zeros(input_shape, rois.dtype), rois, cotangent, **statics)


roi_align, roi_align_vjp = pooling_ops(
    "roi_align",
    [
        static("output_size", "int[]", positional=True),
        static("spatial_scale", "float", 1.0),
        static("sampling_ratio", "int", -1),
        static("aligned", "bool", False),
    ],
    _check_statics,
    reference_roi_align,
    reference_roi_align_vjp,
    lambda kernel, input, rois, cotangent: kernel(rois, cotangent, input_shape=input.shape),
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
      sampling_ratio: samples per bin side; <= 0 for the adaptive grid; a C int.
      aligned: shift the box coordinates by -0.5 pixel (torchvision's ``aligned=True``).
      backend, config: see :func:`asickernels.giou`.

    Returns:
      ``[K, C, height, width]`` in the input's dtype. Differentiable in ``input``
      (:func:`roi_align_vjp`); ``rois`` get no gradient, as in torchvision.

    Raises:
      TypeError, ValueError: naming the argument (shapes, dtypes, statics, batch indices).
    """,
    vjp_doc="""The gradient of ``sum(cotangent * roi_align(input, rois, ...))`` in ``input``.

    ``input [N, C, H, W]`` (its shape and dtype only), ``rois [K, 5]``, ``cotangent
    [K, C, height, width]`` -> ``d_input [N, C, H, W]`` in the input's dtype; the other
    arguments and errors as :func:`roi_align`'s.
    """,
)
