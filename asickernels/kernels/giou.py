"""GIOU of paired boxes, its gradient, and the masked GIOU loss: the declarations, their
float64 references, and what every paired box metric (GIOU, DIoU, CIoU) is declared with:
the checks and computations of a metric (:func:`check_paired_metric`,
:func:`compute_paired_metric`), of its gradient (:func:`check_paired_vjp`,
:func:`compute_paired_vjp`) and of its masked loss (:func:`check_masked_loss`,
:func:`compute_masked_loss`), each op running its own kernel.

Boxes are ``(x1, y1, x2, y2)``; nothing requires ``x1 <= x2`` (such boxes give negative
areas and the formulas below apply as written).

GIOU (torchvision's ``generalized_box_iou_loss`` with ``eps = 1e-7``)::

    inter = max(0, min(x2, X2) - max(x1, X1)) * max(0, min(y2, Y2) - max(y1, Y1))
    union = area1 + area2 - inter
    hull  = (max(x2, X2) - min(x1, X1)) * (max(y2, Y2) - min(y1, Y1))
    giou  = inter / (union + eps) - (hull - union) / (hull + eps)

GIOU gradient: the exact derivative of that formula, with these conventions where it has a
kink: ``max(a, b)`` and ``min(a, b)`` pass the gradient to ``a`` (the ``boxes1`` side) on a
tie, and ``max(0, w)`` passes it only where ``w > 0``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from asickernels.kernels import _checks
from asickernels.kernels.declaration import (
    Array,
    Op,
    Plan,
    Spec,
    Tolerance,
    array,
    cast,
    static,
)
from asickernels.kernels.registry import FLOAT32_AND_64, REFERENCE, Runner

GIOU_EPS = 1e-7
REDUCTIONS = ("none", "sum", "mean")
# Padding boxes are replaced by this box on both sides before GIOU runs, so that whatever
# the padding holds (zeros, NaN) the loss and its gradient there are exactly 0.
_SAFE_BOX = (0.0, 0.0, 1.0, 1.0)


def _check_pair(
    boxes1: Spec | None, boxes2: Spec | None, first: str, second: str
) -> tuple[Spec, Spec]:
    """Two float ``[..., 4]`` box arrays of one shape (paired boxes), named ``first`` and
    ``second``."""
    a, b = _checks.required(boxes1, first), _checks.required(boxes2, second)
    _checks.check_boxes(a, first)
    _checks.check_boxes(b, second)
    if a.shape != b.shape:
        raise ValueError(
            f"{first} and {second} must have the same shape (paired boxes), got "
            f"{a.shape} and {b.shape}"
        )
    return a, b


def _paired(
    runner: Runner, dtype: str | None, boxes1: Array, boxes2: Array, *per_pair: Array
) -> Any:
    """Runs the running op's paired-box kernel on ``[P, 4]`` views of ``[..., 4]`` boxes;
    ``per_pair`` arrays (``[...]``, such as a cotangent) are flattened to ``[P]``."""
    flat = [boxes1.reshape(-1, 4), boxes2.reshape(-1, 4), *(a.reshape(-1) for a in per_pair)]
    if dtype == "float64":
        flat = [cast(a, np.float64) for a in flat]
    assert runner.op.kernel is not None
    return runner.kernel(runner.op.kernel)(*flat)


# The float64 references ---------------------------------------------------------------


def reference_planes(boxes: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    b = np.asarray(boxes).astype(np.float64)
    return b[..., 0], b[..., 1], b[..., 2], b[..., 3]


@np.errstate(invalid="ignore", divide="ignore", over="ignore")
def reference_giou(boxes1: npt.ArrayLike, boxes2: npt.ArrayLike) -> np.ndarray:
    """GIOU of paired boxes ``[..., 4]`` -> ``[...]`` float64."""
    x1, y1, x2, y2 = reference_planes(boxes1)
    u1, v1, u2, v2 = reference_planes(boxes2)
    inter = np.maximum(0.0, np.minimum(x2, u2) - np.maximum(x1, u1)) * np.maximum(
        0.0, np.minimum(y2, v2) - np.maximum(y1, v1)
    )
    union = (x2 - x1) * (y2 - y1) + (u2 - u1) * (v2 - v1) - inter
    hull = (np.maximum(x2, u2) - np.minimum(x1, u1)) * (np.maximum(y2, v2) - np.minimum(y1, v1))
    return inter / (union + GIOU_EPS) - (hull - union) / (hull + GIOU_EPS)


@np.errstate(invalid="ignore", divide="ignore", over="ignore")
def reference_giou_vjp(
    boxes1: npt.ArrayLike, boxes2: npt.ArrayLike, cotangent: npt.ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    """Gradient of ``sum(cotangent * giou(boxes1, boxes2))`` w.r.t. both box arrays (float64)."""
    x1, y1, x2, y2 = reference_planes(boxes1)
    u1, v1, u2, v2 = reference_planes(boxes2)
    g = np.asarray(cotangent, np.float64)

    # Forward, keeping which side each max/min took (ties: the boxes1 side).
    left_from_1 = x1 >= u1
    right_from_1 = x2 <= u2
    top_from_1 = y1 >= v1
    bottom_from_1 = y2 <= v2
    iw = np.where(right_from_1, x2, u2) - np.where(left_from_1, x1, u1)
    ih = np.where(bottom_from_1, y2, v2) - np.where(top_from_1, y1, v1)
    iw_pos, ih_pos = iw > 0, ih > 0
    iw_c, ih_c = np.where(iw_pos, iw, 0.0), np.where(ih_pos, ih, 0.0)
    inter = iw_c * ih_c
    w1, h1, w2, h2 = x2 - x1, y2 - y1, u2 - u1, v2 - v1
    union = w1 * h1 + w2 * h2 - inter
    hull_left_1 = x1 <= u1
    hull_right_1 = x2 >= u2
    hull_top_1 = y1 <= v1
    hull_bottom_1 = y2 >= v2
    cw = np.where(hull_right_1, x2, u2) - np.where(hull_left_1, x1, u1)
    ch = np.where(hull_bottom_1, y2, v2) - np.where(hull_top_1, y1, v1)
    hull = cw * ch

    # Backward.
    d_union = g * (1.0 / (hull + GIOU_EPS) - inter / (union + GIOU_EPS) ** 2)
    d_inter = g / (union + GIOU_EPS) - d_union
    d_hull = -g * (union + GIOU_EPS) / (hull + GIOU_EPS) ** 2
    d_iw = np.where(iw_pos, d_inter * ih_c, 0.0)
    d_ih = np.where(ih_pos, d_inter * iw_c, 0.0)
    d_cw, d_ch = d_hull * ch, d_hull * cw

    d1 = np.zeros(np.shape(x1) + (4,))
    d2 = np.zeros(np.shape(x1) + (4,))
    # Areas: area1 = w1 * h1, area2 = w2 * h2, both enter union with +1.
    d1[..., 0] -= d_union * h1
    d1[..., 2] += d_union * h1
    d1[..., 1] -= d_union * w1
    d1[..., 3] += d_union * w1
    d2[..., 0] -= d_union * h2
    d2[..., 2] += d_union * h2
    d2[..., 1] -= d_union * w2
    d2[..., 3] += d_union * w2
    # Intersection and hull edges, each routed to the side the max/min took.
    for grad, from_1, coord in (
        (-d_iw, left_from_1, 0),
        (d_iw, right_from_1, 2),
        (-d_ih, top_from_1, 1),
        (d_ih, bottom_from_1, 3),
        (-d_cw, hull_left_1, 0),
        (d_cw, hull_right_1, 2),
        (-d_ch, hull_top_1, 1),
        (d_ch, hull_bottom_1, 3),
    ):
        d1[..., coord] += np.where(from_1, grad, 0.0)
        d2[..., coord] += np.where(from_1, 0.0, grad)
    return d1, d2


def masked_loss_reference(
    metric: Callable[[npt.ArrayLike, npt.ArrayLike], np.ndarray],
    preds: npt.ArrayLike,
    targets: npt.ArrayLike,
    *,
    mask: npt.ArrayLike | None = None,
    reduction: str = "mean",
) -> np.ndarray:
    """The float64 reference of a masked loss over a paired metric's reference ``metric``:
    ``1 - metric`` where ``mask`` is True and exactly 0 at padding (which may hold NaN),
    reduced: ``"none"``, ``"sum"``, or ``"mean"`` over the valid boxes (0 when there are
    none)."""
    with np.errstate(all="ignore"):  # padding may hold NaN; it is masked out
        values = 1.0 - metric(preds, targets)
    valid = np.ones(values.shape, bool) if mask is None else np.asarray(mask, bool)
    values = np.where(valid, values, 0.0)
    if reduction == "none":
        return values
    total = values.sum()
    if reduction == "sum":
        return np.asarray(total)
    count = valid.sum()
    return np.asarray(total / count if count else 0.0)


# Paired metrics: validation and computation -------------------------------------------------


def metric_plan(shape: tuple[int, ...], boxes1: Spec, boxes2: Spec, *, paired: bool) -> Plan:
    """The plan of a box metric of ``shape`` (paired or pairwise), computed in float64 for
    float64 boxes and in float32 otherwise; nothing to run when it is empty. A paired
    metric reads each box once: it is copy-bound (see :class:`Plan`)."""
    dtype = _checks.float_compute_dtype(boxes1, boxes2)
    return Plan(
        dtype,
        Spec(shape, np.dtype(dtype)),
        trivial=_checks.size(shape) == 0,
        copy_bound=paired,
    )


def check_paired_metric(boxes1: Spec | None, boxes2: Spec | None) -> Plan:
    """Validation of a paired-box metric ``(boxes1, boxes2 [..., 4]) -> [...]``."""
    a, b = _check_pair(boxes1, boxes2, "boxes1", "boxes2")
    return metric_plan(a.shape[:-1], a, b, paired=True)


def compute_paired_metric(runner: Runner, plan: Plan, boxes1: Array, boxes2: Array) -> Array:
    """A paired-box metric on its kernel (``[P, 4]`` x2 -> ``[P]``)."""
    assert isinstance(plan.outputs, Spec)
    out = _paired(runner, plan.dtype, boxes1, boxes2)
    return cast(out, plan.outputs.dtype).reshape(boxes1.shape[:-1])


def check_paired_vjp(boxes1: Spec | None, boxes2: Spec | None, cotangent: Spec | None) -> Plan:
    """Validation of a paired-box metric's VJP ``(boxes1, boxes2 [..., 4], cotangent
    [...]) -> (d_boxes1, d_boxes2)``."""
    a, b = _check_pair(boxes1, boxes2, "boxes1", "boxes2")
    cotangent = _checks.required(cotangent, "cotangent")
    _checks.check_float(cotangent, "cotangent")
    if cotangent.shape != a.shape[:-1]:
        raise ValueError(f"cotangent must have shape {a.shape[:-1]}, got {cotangent.shape}")
    dtype = _checks.float_compute_dtype(a, b)
    out = Spec(a.shape, np.dtype(dtype))
    return Plan(dtype, (out, out), trivial=_checks.size(a.shape[:-1]) == 0, copy_bound=True)


def compute_paired_vjp(
    runner: Runner, plan: Plan, boxes1: Array, boxes2: Array, cotangent: Array
) -> tuple[Array, Array]:
    """A paired-box metric's VJP on its kernel (``[P, 4]`` x2, ``[P]`` -> ``[P, 4]`` x2)."""
    dtype = plan.dtype or "float32"
    d1, d2 = _paired(runner, dtype, boxes1, boxes2, cast(cotangent, dtype))
    return cast(d1, dtype).reshape(boxes1.shape), cast(d2, dtype).reshape(boxes1.shape)


def check_masked_loss(
    preds: Spec | None, targets: Spec | None, mask: Spec | None, *, reduction: object
) -> Plan:
    """Validation of a masked loss over a paired metric (see :func:`compute_masked_loss`):
    a ``[...]`` bool or numeric mask (or None) and a known reduction."""
    a, b = _check_pair(preds, targets, "preds", "targets")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
    batch = a.shape[:-1]
    if mask is not None:
        if mask.shape != batch:
            raise ValueError(f"mask must have shape {batch}, got {mask.shape}")
        if not (np.issubdtype(mask.dtype, np.number) or mask.dtype == np.bool_):
            raise TypeError(f"mask must be bool or numeric, got dtype {mask.dtype}")
    dtype = _checks.float_compute_dtype(a, b)
    shape = batch if reduction == "none" else ()
    return Plan(
        dtype,
        Spec(shape, np.dtype(dtype)),
        {"reduction": str(reduction)},
        trivial=_checks.size(batch) == 0,
    )


def compute_masked_loss(
    runner: Runner,
    plan: Plan,
    preds: Array,
    targets: Array,
    mask: Array | None,
    *,
    reduction: str,
) -> Array:
    """``1 - metric(preds, targets)`` over valid boxes (the metric: the running op's
    kernel), reduced as ``reduction`` says; padding boxes are replaced by a safe box first,
    so they contribute exactly 0 (no NaN)."""
    xp = runner.xp
    dtype = plan.dtype or "float32"
    if mask is None:
        valid = xp.ones(preds.shape[:-1], bool)
    else:
        valid = mask != 0
        safe = xp.asarray(_SAFE_BOX, preds.dtype)
        preds = xp.where(valid[..., None], preds, safe)
        targets = xp.where(valid[..., None], targets, safe)
    value = cast(_paired(runner, dtype, preds, targets), dtype)
    loss = xp.where(valid, 1.0 - value.reshape(valid.shape), 0.0).astype(dtype)
    if reduction == "sum":
        loss = loss.sum()
    elif reduction == "mean":
        loss = loss.sum() / xp.maximum(valid.sum(), 1).astype(dtype)
    return loss.astype(dtype)


def masked_loss_vjp(
    metric_vjp: Op,
    arrays: Mapping[str, Array | None],
    statics: Mapping[str, object],
    backend: str | None,
    cotangent: Array,
) -> tuple[Array, Array]:
    """The gradient of a masked loss ``sum(-metric * weight)`` (``weight`` 0 at padding,
    ``1 / count`` for "mean"): the metric's VJP op with ``-weight * cotangent``. Padding is
    zeroed first so that NaN there cannot leak through ``0 * NaN``."""
    import jax
    import jax.numpy as jnp

    preds, targets, mask = arrays["preds"], arrays["targets"], arrays["mask"]
    # numpy for host inputs keeps float64 float64 whatever JAX's x64 setting.
    on_device = any(isinstance(a, jax.Array) for a in (preds, targets, mask, cotangent))
    xp: Any = jnp if on_device else np
    preds, targets = xp.asarray(preds), xp.asarray(targets)
    dtype = xp.result_type(preds, targets, np.float32)
    cotangent = xp.asarray(cotangent).astype(dtype)
    if mask is None:  # every box counts: no masking passes over the boxes
        count = math.prod(preds.shape[:-1])
        scale = 1.0 / max(count, 1) if statics["reduction"] == "mean" else 1.0
        local = xp.broadcast_to(-scale * cotangent, preds.shape[:-1])
        return metric_vjp(preds, targets, local, backend=backend)  # type: ignore[no-any-return]
    valid = xp.asarray(mask) != 0
    weight = valid.astype(dtype)
    if statics["reduction"] == "mean":
        weight = weight / xp.maximum(valid.sum(), 1).astype(dtype)
    local = -(weight * cotangent)
    inside = valid[..., None]
    return metric_vjp(  # type: ignore[no-any-return]
        xp.where(inside, preds, 0), xp.where(inside, targets, 0), local, backend=backend
    )


def metric_vjp(
    vjp: Op,
    arrays: Mapping[str, Array | None],
    statics: Mapping[str, object],
    backend: str | None,
    cotangent: Array,
) -> tuple[Array, Array]:
    """The gradient of a paired metric: its VJP op ``vjp`` on the same boxes."""
    return vjp(arrays["boxes1"], arrays["boxes2"], cotangent, backend=backend)  # type: ignore[no-any-return]


class PairedMetricVjp(Op):
    """The gradient op of a paired-box metric, ``(boxes1, boxes2 [..., 4], cotangent [...])
    -> (d_boxes1, d_boxes2)``, run by its own kernel (``[P, 4]`` x2, ``[P]`` -> ``[P, 4]``
    x2): the gradient of ``sum(cotangent * metric(boxes1, boxes2))``."""

    def __init__(
        self,
        name: str,
        *,
        reference: Callable[..., tuple[np.ndarray, np.ndarray]],
        preference: tuple[str, ...],
        doc: str,
        tolerance: tuple[Tolerance, Tolerance] | None = None,
    ) -> None:
        super().__init__(
            name,
            [array("boxes1", 1), array("boxes2", 1), array("cotangent", 0)],
            check=check_paired_vjp,
            compute=compute_paired_vjp,
            reference=reference,
            outputs=("d_boxes1", "d_boxes2"),
            preference=preference,
            tolerance=tolerance,
            doc=doc,
        )


class PairedMetric(Op):
    """A metric of paired boxes, ``(boxes1, boxes2 [..., 4]) -> [...]``, run by its own kernel
    (``[P, 4]`` x2 -> ``[P]``) and differentiated by its gradient op ``gradient``."""

    def __init__(
        self,
        name: str,
        *,
        reference: Callable[..., np.ndarray],
        gradient: PairedMetricVjp,
        preference: tuple[str, ...],
        tolerance: tuple[Tolerance, Tolerance],
        doc: str,
    ) -> None:
        super().__init__(
            name,
            [array("boxes1", 1), array("boxes2", 1)],
            check=check_paired_metric,
            compute=compute_paired_metric,
            reference=reference,
            vjp=functools.partial(metric_vjp, gradient),
            differentiable=("boxes1", "boxes2"),
            preference=preference,
            tolerance=tolerance,
            doc=doc,
        )


class MaskedLoss(Op):
    """``1 - metric(preds, targets)`` over the valid boxes, ``(preds, targets [..., 4], *,
    mask [...] | None, reduction)``, run by the kernel of the paired metric ``metric`` and
    differentiated by its gradient op ``gradient`` (:func:`compute_masked_loss`,
    :func:`masked_loss_vjp`)."""

    def __init__(
        self,
        name: str,
        *,
        metric: PairedMetric,
        gradient: PairedMetricVjp,
        doc: str,
        tolerance: tuple[Tolerance, Tolerance] | None = None,
    ) -> None:
        super().__init__(
            name,
            [
                array("preds", 1),
                array("targets", 1),
                array("mask", 0, optional=True),
                static("reduction", "str", "mean", bad=(None, "average", 3)),
            ],
            check=check_masked_loss,
            compute=compute_masked_loss,
            reference=functools.partial(masked_loss_reference, metric.reference),
            vjp=functools.partial(masked_loss_vjp, gradient),
            differentiable=("preds", "targets"),
            partition="loss",
            kernel=metric,
            tolerance=tolerance,
            doc=doc,
        )


# GIOU ---------------------------------------------------------------------------------------

giou_vjp = PairedMetricVjp(
    "giou_vjp",
    reference=reference_giou_vjp,
    preference=("cpu", "pallas_tpu", "nki", "xla"),
    # float32 GIOU carries about 1e-6 relative error per operation; the gradient divides by
    # unions and hulls, hence rtol.
    tolerance=(Tolerance(2e-4, 2e-5), Tolerance(1e-9, 1e-12)),
    doc="""Gradient of ``sum(cotangent * giou(boxes1, boxes2))`` with respect to both inputs.

    ``boxes1, boxes2 [..., 4]``, ``cotangent [...]`` -> ``(d_boxes1, d_boxes2)`` ``[..., 4]``,
    float32 (float64 for float64 boxes). JAX backends differentiate their GIOU kernel
    (a ``custom_vjp`` kernel on Pallas); host backends run their own backward kernel.
    """,
)

giou = PairedMetric(
    "giou",
    reference=reference_giou,
    gradient=giou_vjp,
    preference=("cpu", "pallas_tpu", "gpsimd", "nki", "xla"),
    tolerance=(Tolerance(0.0, 2e-5), Tolerance(0.0, 1e-12)),
    doc="""Generalized IoU of paired boxes.

    Args:
      boxes1, boxes2: ``[..., 4]`` boxes ``(x1, y1, x2, y2)``, same shape; float32, bfloat16
        or float16 (computed in float32), or float64 (computed in float64).
      backend: a name from :func:`asickernels.available_backends`, or None for the first
        backend of the selection policy that runs natively where the inputs live.
      config: backend-specific tuning (e.g. block sizes); None uses the backend's defaults.

    Returns:
      ``[...]`` GIOU in ``[-1, 1]``, float32 (float64 for float64 inputs), equal to
      ``1 - torchvision.ops.generalized_box_iou_loss``. Differentiable with ``jax.grad`` on
      the JAX backends.
    """,
)

giou_loss = MaskedLoss(
    "giou_loss",
    metric=giou,
    gradient=giou_vjp,
    tolerance=(Tolerance(1e-5, 2e-5), Tolerance(1e-10, 1e-12)),
    doc="""``1 - giou(preds, targets)`` over the valid (non-padding) boxes.

    Args:
      preds, targets: ``[..., 4]`` boxes, same shape (see :func:`giou`).
      mask: ``[...]`` bool (or 0/1), True where the box is real; None means all are. Padding
        boxes may hold anything (even NaN): their loss and gradient are exactly 0.
      reduction: ``"none"`` -> ``[...]`` per-box loss (0 at padding); ``"sum"``; ``"mean"``
        over valid boxes, 0 (not NaN) when there are none.
      backend, config: see :func:`giou`.

    Returns:
      float32 loss (float64 for float64 boxes): ``[...]`` for ``"none"``, else a scalar.
    """,
)

REFERENCE.implements(giou, dtypes=FLOAT32_AND_64)(reference_giou)
REFERENCE.implements(giou_vjp, dtypes=FLOAT32_AND_64)(reference_giou_vjp)
