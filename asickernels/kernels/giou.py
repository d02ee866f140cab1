"""GIOU of paired boxes, its gradient, and the masked GIOU loss: the declarations, their
float64 references, and the three op factories every paired box metric (GIOU, DIoU, CIoU) is
declared with: :func:`paired_metric_op`, :func:`paired_vjp_op`, :func:`masked_loss_op`.

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

from asickernels.kernels import _checks, registry
from asickernels.kernels.declaration import (
    Array,
    Check,
    Op,
    Plan,
    Runner,
    Spec,
    array,
    cast,
    static,
)
from asickernels.kernels.registry import FLOAT32_AND_64, REFERENCE

GIOU_EPS = 1e-7
REDUCTIONS = ("none", "sum", "mean")
# Padding boxes are replaced by this box on both sides before GIOU runs, so that whatever
# the padding holds (zeros, NaN) the loss and its gradient there are exactly 0.
_SAFE_BOX = (0.0, 0.0, 1.0, 1.0)


def _check_pair(specs: Mapping[str, Spec | None], first: str, second: str) -> tuple[Spec, Spec]:
    """Two float ``[..., 4]`` box arrays of one shape (paired boxes)."""
    a, b = _checks.required(specs, first), _checks.required(specs, second)
    _checks.check_boxes(a, first)
    _checks.check_boxes(b, second)
    if a.shape != b.shape:
        raise ValueError(
            f"{first} and {second} must have the same shape (paired boxes), got "
            f"{a.shape} and {b.shape}"
        )
    return a, b


def _paired(
    runner: Runner, kernel: str, dtype: str, boxes1: Array, boxes2: Array, *per_pair: Array
) -> Any:
    """Runs a paired-box kernel on ``[P, 4]`` views of ``[..., 4]`` boxes; ``per_pair``
    arrays (``[...]``, such as a cotangent) are flattened to ``[P]``."""
    flat = [boxes1.reshape(-1, 4), boxes2.reshape(-1, 4), *(a.reshape(-1) for a in per_pair)]
    if dtype == "float64":
        flat = [cast(a, np.float64) for a in flat]
    return runner.kernel(kernel)(*flat)


# The float64 references ---------------------------------------------------------------


def reference_planes(boxes: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    b = np.asarray(boxes).astype(np.float64)
    return b[..., 0], b[..., 1], b[..., 2], b[..., 3]


@REFERENCE.implements("giou", dtypes=FLOAT32_AND_64)
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


@REFERENCE.implements("giou_vjp", dtypes=FLOAT32_AND_64)
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
) -> Callable[..., np.ndarray]:
    """The float64 reference of :func:`masked_loss_op` over a paired metric's reference:
    ``loss(preds, targets, *, mask=None, reduction="mean")`` is ``1 - metric`` where
    ``mask`` is True and exactly 0 at padding (which may hold NaN), reduced: ``"none"``,
    ``"sum"``, or ``"mean"`` over the valid boxes (0 when there are none)."""

    def loss(
        preds: npt.ArrayLike,
        targets: npt.ArrayLike,
        *,
        mask: npt.ArrayLike | None = None,
        reduction: str = "mean",
    ) -> np.ndarray:
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

    return loss


reference_giou_loss = masked_loss_reference(reference_giou)


# Paired metrics: validation and computation -------------------------------------------------------


def metric_plan(
    kernel: str, shape: tuple[int, ...], boxes1: Spec, boxes2: Spec, *, paired: bool
) -> Plan:
    """The plan of a box metric of ``shape`` (paired or pairwise), computed in float64 for
    float64 boxes and in float32 otherwise; nothing to run when it is empty. A paired
    metric reads each box once: it is copy-bound (see :class:`Plan`)."""
    dtype = _checks.float_compute_dtype(boxes1, boxes2)
    return Plan(
        kernel,
        dtype,
        Spec(shape, np.dtype(dtype)),
        (),
        trivial=_checks.size(shape) == 0,
        copy_bound=paired,
    )


def _paired_metric_check(kernel: str) -> Check:
    """Validation of a paired-box metric ``(boxes1, boxes2 [..., 4]) -> [...]``."""

    def check(specs: Mapping[str, Spec | None], statics: Mapping[str, object]) -> Plan:
        a, b = _check_pair(specs, "boxes1", "boxes2")
        return metric_plan(kernel, a.shape[:-1], a, b, paired=True)

    return check


def _compute_paired_metric(runner: Runner, plan: Plan, boxes1: Array, boxes2: Array) -> Array:
    assert isinstance(plan.outputs, Spec) and plan.kernel is not None
    out = _paired(runner, plan.kernel, plan.dtype or "float32", boxes1, boxes2)
    return cast(out, plan.outputs.dtype).reshape(boxes1.shape[:-1])


def _paired_vjp_check(kernel: str) -> Check:
    """Validation of a paired-box metric's VJP ``(boxes1, boxes2 [..., 4], cotangent
    [...]) -> (d_boxes1, d_boxes2)``."""

    def check(specs: Mapping[str, Spec | None], statics: Mapping[str, object]) -> Plan:
        a, b = _check_pair(specs, "boxes1", "boxes2")
        cotangent = _checks.required(specs, "cotangent")
        _checks.check_float(cotangent, "cotangent")
        if cotangent.shape != a.shape[:-1]:
            raise ValueError(f"cotangent must have shape {a.shape[:-1]}, got {cotangent.shape}")
        dtype = _checks.float_compute_dtype(a, b)
        out = Spec(a.shape, np.dtype(dtype))
        return Plan(
            kernel,
            dtype,
            (out, out),
            (),
            trivial=_checks.size(a.shape[:-1]) == 0,
            copy_bound=True,
        )

    return check


def _compute_paired_vjp(
    runner: Runner, plan: Plan, boxes1: Array, boxes2: Array, cotangent: Array
) -> tuple[Array, Array]:
    assert plan.kernel is not None
    dtype = plan.dtype or "float32"
    d1, d2 = _paired(runner, plan.kernel, dtype, boxes1, boxes2, cast(cotangent, dtype))
    return cast(d1, dtype).reshape(boxes1.shape), cast(d2, dtype).reshape(boxes1.shape)


def _check_mask_and_reduction(
    specs: Mapping[str, Spec | None], statics: Mapping[str, object], batch: tuple[int, ...]
) -> str:
    """A ``[...]`` bool or numeric mask (or None) and a known reduction."""
    reduction = statics["reduction"]
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
    mask = specs["mask"]
    if mask is not None:
        if mask.shape != batch:
            raise ValueError(f"mask must have shape {batch}, got {mask.shape}")
        if not (np.issubdtype(mask.dtype, np.number) or mask.dtype == np.bool_):
            raise TypeError(f"mask must be bool or numeric, got dtype {mask.dtype}")
    return str(reduction)


def _masked_loss_check(kernel: str) -> Check:
    """Validation of a masked loss over a paired metric (see :func:`_masked_loss`)."""

    def check(specs: Mapping[str, Spec | None], statics: Mapping[str, object]) -> Plan:
        a, b = _check_pair(specs, "preds", "targets")
        reduction = _check_mask_and_reduction(specs, statics, a.shape[:-1])
        dtype = _checks.float_compute_dtype(a, b)
        shape = a.shape[:-1] if reduction == "none" else ()
        return Plan(
            kernel,
            dtype,
            Spec(shape, np.dtype(dtype)),
            (("reduction", reduction),),
            trivial=_checks.size(a.shape[:-1]) == 0,
        )

    return check


def _masked_loss(
    runner: Runner, plan: Plan, preds: Array, targets: Array, mask: Array | None
) -> Array:
    """``1 - metric(preds, targets)`` over valid boxes (the metric: ``plan.kernel``), reduced
    as ``plan`` says; padding boxes are replaced by a safe box first, so they contribute
    exactly 0 (no NaN)."""
    assert plan.kernel is not None
    xp = runner.xp
    dtype = plan.dtype or "float32"
    if mask is None:
        valid = xp.ones(preds.shape[:-1], bool)
    else:
        valid = mask != 0
        safe = xp.asarray(_SAFE_BOX, preds.dtype)
        preds = xp.where(valid[..., None], preds, safe)
        targets = xp.where(valid[..., None], targets, safe)
    value = cast(_paired(runner, plan.kernel, dtype, preds, targets), dtype)
    loss = xp.where(valid, 1.0 - value.reshape(valid.shape), 0.0).astype(dtype)
    reduction = plan.static("reduction")
    if reduction == "sum":
        loss = loss.sum()
    elif reduction == "mean":
        loss = loss.sum() / xp.maximum(valid.sum(), 1).astype(dtype)
    return loss.astype(dtype)


def _masked_loss_vjp(
    metric_vjp: Op,
    arrays: Mapping[str, Array | None],
    statics: Mapping[str, object],
    backend: str | None,
    cotangent: Array,
) -> tuple[Array, Array]:
    """The gradient of a masked loss ``sum(-metric * weight)`` (``weight`` 0 at padding,
    ``1 / count`` for "mean"): the metric's VJP with ``-weight * cotangent``. Padding is
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
        return metric_vjp(preds, targets, local, backend=backend)
    valid = xp.asarray(mask) != 0
    weight = valid.astype(dtype)
    if statics["reduction"] == "mean":
        weight = weight / xp.maximum(valid.sum(), 1).astype(dtype)
    local = -(weight * cotangent)
    inside = valid[..., None]
    return metric_vjp(
        xp.where(inside, preds, 0), xp.where(inside, targets, 0), local, backend=backend
    )


# The op factories ---------------------------------------------------------------------------


def _metric_vjp(
    vjp: Op,
    arrays: Mapping[str, Array | None],
    statics: Mapping[str, object],
    backend: str | None,
    cotangent: Array,
) -> tuple[Array, Array]:
    return vjp(arrays["boxes1"], arrays["boxes2"], cotangent, backend=backend)  # type: ignore[no-any-return]


def paired_metric_op(metric: str, *, reference: Callable[..., np.ndarray], vjp: Op, doc: str) -> Op:
    """The op ``metric(boxes1, boxes2 [..., 4]) -> [...]``, run by the paired-box kernel
    named ``metric`` (``[P, 4]`` x2 -> ``[P]``) and differentiated by ``vjp``."""
    return Op(
        metric,
        [array("boxes1", 1), array("boxes2", 1)],
        check=_paired_metric_check(metric),
        compute=_compute_paired_metric,
        reference=reference,
        vjp=functools.partial(_metric_vjp, vjp),
        differentiable=("boxes1", "boxes2"),
        doc=doc,
    )


def paired_vjp_op(
    metric: str, *, reference: Callable[..., tuple[np.ndarray, np.ndarray]], doc: str
) -> Op:
    """The op ``<metric>_vjp(boxes1, boxes2 [..., 4], cotangent [...]) -> (d_boxes1,
    d_boxes2)``, run by the kernel of that name (``[P, 4]`` x2, ``[P]`` -> ``[P, 4]`` x2)."""
    return Op(
        f"{metric}_vjp",
        [array("boxes1", 1), array("boxes2", 1), array("cotangent", 0)],
        check=_paired_vjp_check(f"{metric}_vjp"),
        compute=_compute_paired_vjp,
        reference=reference,
        outputs=("d_boxes1", "d_boxes2"),
        doc=doc,
    )


def masked_loss_op(metric: str, *, reference: Callable[..., np.ndarray], vjp: Op, doc: str) -> Op:
    """The op ``<metric>_loss(preds, targets [..., 4], *, mask [...] | None, reduction)``:
    ``1 - metric`` over the valid boxes, run by the paired-box kernel ``metric`` and
    differentiated by ``vjp`` (the metric's VJP op)."""
    return Op(
        f"{metric}_loss",
        [
            array("preds", 1),
            array("targets", 1),
            array("mask", 0, optional=True),
            static("reduction", "str", "mean"),
        ],
        check=_masked_loss_check(metric),
        compute=_masked_loss,
        reference=reference,
        vjp=functools.partial(_masked_loss_vjp, vjp),
        differentiable=("preds", "targets"),
        partition="loss",
        doc=doc,
    )


# GIOU ---------------------------------------------------------------------------------------

giou_vjp = paired_vjp_op(
    "giou",
    reference=reference_giou_vjp,
    doc="""Gradient of ``sum(cotangent * giou(boxes1, boxes2))`` with respect to both inputs.

    ``boxes1, boxes2 [..., 4]``, ``cotangent [...]`` -> ``(d_boxes1, d_boxes2)`` ``[..., 4]``,
    float32 (float64 for float64 boxes). JAX backends differentiate their GIOU kernel
    (a ``custom_vjp`` kernel on Pallas); host backends run their own backward kernel.
    """,
)

giou = paired_metric_op(
    "giou",
    reference=reference_giou,
    vjp=giou_vjp,
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

giou_loss = masked_loss_op(
    "giou",
    reference=reference_giou_loss,
    vjp=giou_vjp,
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


def differentiable_backends() -> list[str]:
    """Backends :func:`giou_vjp` can run on (the backends with a ``giou_vjp`` kernel)."""
    return registry.backends_for("giou_vjp")
