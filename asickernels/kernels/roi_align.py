"""RoIAlign (torchvision's ``roi_align``) and its gradient: the declarations, what every RoI
pooling op shares (its checks, :func:`pooling_plan`, and computations,
:func:`compute_pooling`, which RoIPool's declarations use too), and the float64 reference,
a transcription of torchvision's CPU kernel (``ops/cpu/roi_align_kernel.cpp``).

A backend implements the kernels of ``roi_align`` and ``roi_align_vjp``, called with arrays
of one float dtype (the compute dtype: float32, or float64 where the backend supports it)
and the checked statics as keywords (``output_size`` a pair of ints, ``spatial_scale`` a
float, ``sampling_ratio`` a C int, ``aligned`` a bool):

* ``roi_align(input [N, C, H, W], rois [K, 5], *, output_size, spatial_scale,
  sampling_ratio, aligned) -> [K, C, PH, PW]``;
* ``roi_align_vjp(input, rois, cotangent [K, C, PH, PW], *, ...the same statics)
  -> [N, C, H, W]`` (RoIAlign's gradient reads only the input's shape, not its values).

The op makes ``roi_align`` differentiable in ``input`` through ``roi_align_vjp``'s kernel
(:func:`compute_pooling`), so a JAX kernel need not be differentiable itself.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import NamedTuple

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
    Spec,
    Tolerance,
    array,
    cast,
    static,
)
from asickernels.kernels.registry import FLOAT32_AND_64, REFERENCE, Runner


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


def check_pooling_statics(output_size: object, spatial_scale: object) -> dict[str, Hashable]:
    """The statics every RoI pooling op takes (RoIPool's all), checked: ``output_size`` (see
    :func:`check_output_size`) and ``spatial_scale`` (a number >= 0).

    Raises:
      TypeError, ValueError: naming the bad argument.
    """
    return {
        "output_size": check_output_size(output_size),
        "spatial_scale": _checks.static_float(spatial_scale, "spatial_scale", low=0.0),
    }


def _roi_align_statics(
    output_size: object, spatial_scale: object, sampling_ratio: object, aligned: object
) -> dict[str, Hashable]:
    """RoIAlign's statics, checked: those of :func:`check_pooling_statics`,
    ``sampling_ratio`` (a C int) and ``aligned`` (a bool).

    Raises:
      TypeError, ValueError: naming the bad argument.
    """
    if not isinstance(aligned, (bool, np.bool_)):
        raise TypeError(f"aligned must be a bool, got {type(aligned).__name__}")
    return {
        **check_pooling_statics(output_size, spatial_scale),
        "sampling_ratio": _checks.static_int(
            sampling_ratio, "sampling_ratio", low=-(2**31), high=2**31 - 1
        ),
        "aligned": bool(aligned),
    }


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


def pooling_plan(
    input: Spec | None,
    rois: Spec | None,
    cotangent: Spec | None,
    *,
    gradient: bool,
    statics: dict[str, Hashable],
) -> Plan:
    """The plan of a RoI pooling op (``input [N, C, H, W]``, ``rois [K, 5]``, both
    floating -> ``[K, C, PH, PW]`` in the input's dtype) or, with ``gradient``, of its
    gradient op (the same and ``cotangent [K, C, PH, PW]`` -> ``d_input [N, C, H, W]``),
    given its checked ``statics`` (``output_size`` among them). Both compute in float32
    (float64 for float64 inputs).

    Raises:
      TypeError, ValueError: a missing or non-float array, or a shape other than the above,
        naming the argument.
    """
    features, boxes = _checks.required(input, "input"), _checks.required(rois, "rois")
    _checks.check_float(features, "input")
    _checks.check_float(boxes, "rois")
    if len(features.shape) != 4:
        raise ValueError(f"input must have shape [N, C, H, W], got {tuple(features.shape)}")
    if len(boxes.shape) != 2 or boxes.shape[1] != 5:
        raise ValueError(
            f"rois must have shape [K, 5] (batch index, x1, y1, x2, y2), got {tuple(boxes.shape)}"
        )
    dtype = _checks.float_compute_dtype(features, boxes)
    output_size = statics["output_size"]
    assert isinstance(output_size, tuple)
    pooled = (boxes.shape[0], features.shape[1], *output_size)
    if not gradient:
        return Plan(dtype, Spec(pooled, features.dtype), statics, trivial=_checks.size(pooled) == 0)
    cotangent = _checks.required(cotangent, "cotangent")
    _checks.check_float(cotangent, "cotangent")
    if tuple(cotangent.shape) != pooled:
        raise ValueError(f"cotangent must have shape {pooled}, got {tuple(cotangent.shape)}")
    empty = _checks.size(features.shape) == 0 or _checks.size(pooled) == 0
    return Plan(dtype, Spec(features.shape, features.dtype), statics, trivial=empty)


def _pooling_check(
    check_statics: Callable[..., dict[str, Hashable]],
    gradient: bool,
    input: Spec | None,
    rois: Spec | None,
    cotangent: Spec | None = None,
    **statics: object,
) -> Plan:
    """An op's ``check``: :func:`pooling_plan` with the statics ``check_statics`` checked."""
    return pooling_plan(input, rois, cotangent, gradient=gradient, statics=check_statics(**statics))


def _pool_gradient(
    kernel: Callable[..., Array], dtype: str, input: Array, rois: Array, cotangent: Array
) -> Array:
    """A RoI pooling gradient ``kernel(input, rois, cotangent)`` (its statics bound) on
    arrays of the compute ``dtype``, in the input's dtype."""
    grad = kernel(cast(input, dtype), cast(rois, dtype), cast(cotangent, dtype))
    return cast(grad, input.dtype)


def compute_pooling_vjp(
    runner: Runner, plan: Plan, input: Array, rois: Array, cotangent: Array, **statics: Hashable
) -> Array:
    """A RoI pooling gradient op's computation: its kernel, given the op's statics."""
    assert runner.op.kernel is not None
    kernel = functools.partial(runner.kernel(runner.op.kernel), **statics)
    return _pool_gradient(kernel, plan.dtype or "float32", input, rois, cotangent)


def compute_pooling(
    gradient: Op, runner: Runner, plan: Plan, input: Array, rois: Array, **statics: Hashable
) -> Array:
    """A RoI pooling op's computation: its kernel, given the op's statics, differentiable
    under JAX in ``input`` through the kernel of ``gradient`` (its gradient op); ``rois``
    get no gradient, as in torchvision."""
    dtype = plan.dtype or "float32"
    assert runner.op.kernel is not None
    forward = functools.partial(runner.kernel(runner.op.kernel), **statics)
    features, boxes = cast(input, dtype), cast(rois, dtype)
    if runner.host:
        return cast(forward(features, boxes), input.dtype)
    backward = functools.partial(
        _pool_gradient, functools.partial(runner.kernel(gradient), **statics), dtype
    )
    return cast(_differentiable_in_input(forward, backward, features, boxes), input.dtype)


def pooling_vjp(
    gradient: Op,
    arrays: Mapping[str, Array | None],
    statics: Mapping[str, object],
    backend: str | None,
    cotangent: Array,
) -> tuple[Array]:
    """The gradient of a RoI pooling op in ``input``: its gradient op ``gradient``."""
    return (gradient(arrays["input"], arrays["rois"], cotangent, backend=backend, **statics),)


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


class RoiPoolingVjp(Op):
    """The gradient op of a RoI pooling op: ``input [N, C, H, W]``, ``rois [K, 5]``,
    ``cotangent [K, C, PH, PW]`` and ``statics`` -> ``d_input [N, C, H, W]``, run by its own
    kernel (:func:`compute_pooling_vjp`); the batch indices checked on eager calls, no SPMD
    rule (a RoI names its image by index)."""

    def __init__(
        self,
        name: str,
        statics: Sequence[Param],
        *,
        check_statics: Callable[..., dict[str, Hashable]],
        reference: Callable[..., np.ndarray],
        tolerance: tuple[Tolerance, Tolerance],
        doc: str,
    ) -> None:
        super().__init__(
            name,
            [array("input", 3), array("rois", 1), array("cotangent", 3), *statics],
            check=functools.partial(_pooling_check, check_statics, True),
            check_values=check_batch_indices,
            compute=compute_pooling_vjp,
            reference=reference,
            outputs=("d_input",),
            partition="none",
            preference=("cpu", "xla"),
            tolerance=tolerance,
            doc=doc,
        )


class RoiPooling(Op):
    """A RoI pooling op: ``input [N, C, H, W]``, ``rois [K, 5]`` and ``statics`` -> ``[K, C,
    PH, PW]`` in the input's dtype, run by its own kernel and differentiable in ``input``
    through its gradient op ``gradient`` (:func:`compute_pooling`); the batch indices checked
    on eager calls, no SPMD rule (a RoI names its image by index)."""

    def __init__(
        self,
        name: str,
        statics: Sequence[Param],
        *,
        check_statics: Callable[..., dict[str, Hashable]],
        reference: Callable[..., np.ndarray],
        gradient: RoiPoolingVjp,
        tolerance: tuple[Tolerance, Tolerance],
        doc: str,
    ) -> None:
        super().__init__(
            name,
            [array("input", 3), array("rois", 1), *statics],
            check=functools.partial(_pooling_check, check_statics, False),
            check_values=check_batch_indices,
            compute=functools.partial(compute_pooling, gradient),
            reference=reference,
            vjp=functools.partial(pooling_vjp, gradient),
            differentiable=("input",),
            partition="none",
            preference=("cpu", "xla"),
            tolerance=tolerance,
            doc=doc,
        )


# The float64 reference ----------------------------------------------------------------------

# A bin's samples: (bin row, bin column, y, x).
Point = tuple[int, int, float, float]


class Sampling(NamedTuple):
    """How the reference samples each RoI: RoIAlign's statics, checked as the op checks
    them."""

    output_size: tuple[int, int]
    spatial_scale: float
    sampling_ratio: int
    aligned: bool


def _samples(
    roi: np.ndarray, sampling: Sampling, dtype: type[np.floating]
) -> tuple[int, list[Point], int]:
    """torchvision's sampling of one RoI: its image, its samples and their number per bin
    (at least 1). The sample positions are computed in ``dtype``, the compute dtype, as
    torchvision computes them in the input's (at image coordinates near 1000, float32
    positions move a sample by about 1e-5 pixel)."""
    height, width = sampling.output_size
    scale, ratio = dtype(sampling.spatial_scale), sampling.sampling_ratio
    offset = dtype(0.5 if sampling.aligned else 0.0)
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0, overflow: not finite
        x1, y1, x2, y2 = (dtype(v) * scale - offset for v in roi[1:])
    if not np.isfinite([x1, y1, x2, y2]).all():
        return int(roi[0]), [], 1  # a RoI with a NaN or infinite corner pools to 0
    roi_w, roi_h = x2 - x1, y2 - y1
    if not sampling.aligned:
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
    input: npt.ArrayLike, rois: npt.ArrayLike, sampling: Sampling
) -> Iterator[tuple[int, int, int, int, int, int, float]]:
    """Every pixel of ``input [N, C, H, W]`` every RoI's bins take: ``(k, image, bin row,
    bin column, row, column, weight)``, the weight divided by the bin's number of samples (a
    bin is their mean); the samples placed in the op's compute dtype
    (:func:`compute_dtype`)."""
    dtype = compute_dtype(input, rois)
    height, width = np.shape(input)[2:]
    for k, roi in enumerate(np.asarray(rois, np.float64)):
        image, points, count = _samples(roi, sampling, dtype)
        for ph, pw, y, x in points:
            for row, column, weight in _corners(y, x, height, width):
                yield k, image, ph, pw, row, column, weight / count


def compute_dtype(input: npt.ArrayLike, rois: npt.ArrayLike) -> type[np.floating]:
    """The dtype a RoI pooling op computes in (its references place samples and bins in
    it, as torchvision does): float64 if an input is, else float32."""
    wide = _checks.float_compute_dtype(np.asarray(input), np.asarray(rois)) == "float64"
    return np.float64 if wide else np.float32


def _sampling(
    output_size: int | Sequence[int], spatial_scale: float, sampling_ratio: int, aligned: bool
) -> Sampling:
    return Sampling(**_roi_align_statics(output_size, spatial_scale, sampling_ratio, aligned))  # type: ignore[arg-type]


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
    features = np.asarray(input, np.float64)
    sampling = _sampling(output_size, spatial_scale, sampling_ratio, aligned)
    out = np.zeros((np.shape(rois)[0], features.shape[1], *sampling.output_size))
    with np.errstate(invalid="ignore"):  # non-finite features propagate as torchvision's do
        for k, image, ph, pw, row, column, weight in _taps(input, rois, sampling):
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
    grad_out = np.asarray(cotangent, np.float64)
    sampling = _sampling(output_size, spatial_scale, sampling_ratio, aligned)
    grad = np.zeros(np.shape(input))
    with np.errstate(invalid="ignore"):  # non-finite cotangents propagate as torchvision's do
        for k, image, ph, pw, row, column, weight in _taps(input, rois, sampling):
            grad[image, :, row, column] += weight * grad_out[k, :, ph, pw]
    return grad


# The statics every RoI pooling op declares first (RoIPool's all), as
# :func:`check_pooling_statics` checks them.
POOLING_STATICS = (
    static("output_size", "int[]", positional=True, bad=(None, (2, 0), (2, 2, 2), "2")),
    static("spatial_scale", "float", 1.0, bad=(None, "0.5", -1.0, math.nan)),
)

# What every RoI pooling op's docstring says of the arguments they all check alike
# (:func:`pooling_plan`, :func:`check_batch_indices`, :func:`check_pooling_statics`): the
# first entries of its ``Args:`` section, indented as an op's ``doc`` indents them.
POOLING_ARGS_DOC = """input: ``[N, C, H, W]`` float features (float16/bfloat16 computed in float32).
      rois: ``[K, 5]`` float ``(batch index, x1, y1, x2, y2)`` in input-image coordinates;
        a batch index that names no image of ``input`` is a ValueError (on eager calls;
        under ``jit`` the cpu backend raises, XLA clamps it). A RoI with a NaN or infinite
        scaled corner pools to 0 and passes no gradient (torchvision's is undefined).
      output_size: int or ``(height, width)``, each >= 1.
      spatial_scale: the feature map's scale of the image coordinates (e.g. 1/16), >= 0."""

_ROI_ALIGN_STATICS = [
    *POOLING_STATICS,
    static("sampling_ratio", "int", -1, bad=(None, 2.0, True)),
    static("aligned", "bool", False, bad=(None, 1, "yes")),
]

roi_align_vjp = RoiPoolingVjp(
    "roi_align_vjp",
    _ROI_ALIGN_STATICS,
    check_statics=_roi_align_statics,
    reference=reference_roi_align_vjp,
    # Sums of bilinear samples of O(1) features: up to thousands of them in a gradient
    # pixel under a huge RoI's adaptive grid.
    tolerance=(Tolerance(1e-5, 5e-5), Tolerance(1e-12, 1e-12)),
    doc="""The gradient of ``sum(cotangent * roi_align(input, rois, ...))`` in ``input``.

    ``input [N, C, H, W]`` (its shape and dtype only), ``rois [K, 5]``, ``cotangent
    [K, C, height, width]`` -> ``d_input [N, C, H, W]`` in the input's dtype; the other
    arguments and errors as :func:`roi_align`'s.
    """,
)

roi_align = RoiPooling(
    "roi_align",
    _ROI_ALIGN_STATICS,
    check_statics=_roi_align_statics,
    reference=reference_roi_align,
    gradient=roi_align_vjp,
    tolerance=(Tolerance(1e-5, 2e-5), Tolerance(1e-12, 1e-12)),
    doc=f"""RoIAlign, as ``torchvision.ops.roi_align`` defines it (Mask R-CNN's pooling).

    Each RoI is cut into ``output_size`` bins; a bin's value is the mean of bilinear
    samples of the input on a regular grid (``sampling_ratio`` per side, or
    ``ceil(roi size / output size)`` when ``sampling_ratio <= 0``); samples farther than one
    pixel outside the map count as 0.

    Args:
      {POOLING_ARGS_DOC}
      sampling_ratio: samples per bin side; <= 0 for the adaptive grid; a C int.
      aligned: shift the box coordinates by -0.5 pixel (torchvision's ``aligned=True``).
      backend, config: see :func:`asickernels.giou`.

    Returns:
      ``[K, C, height, width]`` in the input's dtype. Differentiable in ``input``
      (:func:`roi_align_vjp`); ``rois`` get no gradient, as in torchvision.

    Raises:
      TypeError, ValueError: naming the argument (shapes, dtypes, statics, batch indices).
    """,
)

REFERENCE.implements(roi_align, dtypes=FLOAT32_AND_64)(reference_roi_align)
REFERENCE.implements(roi_align_vjp, dtypes=FLOAT32_AND_64)(reference_roi_align_vjp)
