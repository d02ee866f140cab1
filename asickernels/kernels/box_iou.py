"""Pairwise IoU/GIOU, paired DIoU/CIoU with their gradients, and the DIoU/CIoU losses: the
declarations and their float64 references (torchvision's formulas with ``eps = 1e-7``; GIOU's
in :mod:`asickernels.kernels.giou`).

Kernel calling conventions (beside those in :mod:`asickernels.kernels.registry`):

* ``box_iou``, ``generalized_box_iou``: ``(boxes1 [B, N, 4], boxes2 [B, M, 4]) -> [B, N, M]``;
  B, N, M >= 1.
* ``diou``, ``ciou``: as ``giou``, ``[P, 4]`` x2 -> ``[P]``; ``diou_vjp``, ``ciou_vjp``: as
  ``giou_vjp``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from asickernels.kernels import _checks
from asickernels.kernels.declaration import Array, Op, Plan, Spec, Tolerance, array, cast
from asickernels.kernels.giou import (
    GIOU_EPS,
    MaskedLoss,
    PairedMetric,
    PairedMetricVjp,
    giou_vjp,
    metric_plan,
    reference_planes,
)
from asickernels.kernels.registry import FLOAT32_AND_64, REFERENCE, Runner

# The float64 references: pairwise IoU/GIOU and paired DIoU/CIoU -------------------------------------------------------
#
# torchvision's formulas (``box_iou``, ``generalized_box_iou``, ``distance_box_iou_loss``,
# ``complete_box_iou_loss``) with ``eps = GIOU_EPS`` in every denominator, so that degenerate
# boxes give finite values where torchvision divides 0 by 0::
#
#     iou  = inter / (union + eps)                    (inter, union as for GIOU)
#     giou = iou - (hull - union) / (hull + eps)
#     diou = iou - rho2 / (hull_w ** 2 + hull_h ** 2 + eps)
#            rho2 = squared distance between the box centres
#     ciou = diou - alpha * v,  v = 4 / pi ** 2 * (atan(w2 / (h2 + eps)) - atan(w1 / (h1 + eps))) ** 2,
#            alpha = v / (1 - iou + v + eps)
#
# ``alpha`` is a constant for gradients (torchvision computes it under ``no_grad``, as the
# CIoU paper does), so ``ciou_vjp`` is not the derivative of ``ciou`` where ``alpha`` varies.
# Gradient ties follow GIOU's rules: ``max``/``min`` ties go to ``boxes1``; ``max(0, w)``
# passes the gradient only where ``w > 0``. The pairwise ops apply the same formulas to
# every pair ``(boxes1[..., i, :], boxes2[..., j, :])``.

METRICS = ("iou", "giou", "diou", "ciou")


class _Dual:
    """A float64 value and (optionally) its derivatives with respect to the 8 coordinates of
    a box pair, ``tangent [..., 8]``: forward-mode differentiation, so the reference
    gradients are derived from the very formula text of the values."""

    __slots__ = ("tangent", "value")

    def __init__(self, value: npt.ArrayLike, tangent: np.ndarray | None = None) -> None:
        self.value = np.asarray(value, np.float64)
        self.tangent = tangent

    def _scaled(self, scale: npt.ArrayLike) -> np.ndarray | None:
        return None if self.tangent is None else self.tangent * np.asarray(scale)[..., None]

    def __add__(self, other: Operand) -> _Dual:
        other = _lift(other)
        return _Dual(self.value + other.value, _sum(self.tangent, other.tangent))

    __radd__ = __add__

    def __neg__(self) -> _Dual:
        return _Dual(-self.value, self._scaled(-1.0))

    def __sub__(self, other: Operand) -> _Dual:
        return self + -_lift(other)

    def __rsub__(self, other: Operand) -> _Dual:
        return _lift(other) - self

    def __mul__(self, other: Operand) -> _Dual:
        other = _lift(other)
        return _Dual(
            self.value * other.value, _sum(self._scaled(other.value), other._scaled(self.value))
        )

    __rmul__ = __mul__

    def __truediv__(self, other: Operand) -> _Dual:
        other = _lift(other)
        with np.errstate(divide="ignore", invalid="ignore"):
            value = self.value / other.value
            numerator = _sum(self.tangent, (-other)._scaled(value))
            tangent = None if numerator is None else numerator / other.value[..., None]
        return _Dual(value, tangent)


# What a dual number combines with: another, or a float64 constant (an array or a number).
Operand = _Dual | npt.ArrayLike


def _lift(x: Operand) -> _Dual:
    return x if isinstance(x, _Dual) else _Dual(x)


def _sum(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    if a is None or b is None:
        return a if b is None else b
    return a + b


def _select(condition: np.ndarray, a: _Dual, b: _Dual) -> _Dual:
    tangent = None
    if a.tangent is not None or b.tangent is not None:
        zeros = np.zeros(np.shape(condition) + (8,))
        ta = zeros if a.tangent is None else a.tangent
        tb = zeros if b.tangent is None else b.tangent
        tangent = np.where(condition[..., None], ta, tb)
    return _Dual(np.where(condition, a.value, b.value), tangent)


def _max(a: _Dual, b: _Dual) -> _Dual:
    return _select(a.value >= b.value, a, b)


def _min(a: _Dual, b: _Dual) -> _Dual:
    return _select(a.value <= b.value, a, b)


def _positive(a: _Dual) -> _Dual:
    return _select(a.value > 0, a, _Dual(np.zeros_like(a.value)))


def _atan(a: _Dual) -> _Dual:
    return _Dual(np.arctan(a.value), a._scaled(1.0 / (1.0 + a.value**2)))


# NaN or infinite boxes give NaN results, as in every backend; numpy need not warn of them.
@np.errstate(invalid="ignore", divide="ignore", over="ignore")
def _box_metric(
    metric: str, boxes1: npt.ArrayLike, boxes2: npt.ArrayLike, with_tangents: bool
) -> _Dual:
    """``metric`` of paired (broadcast) boxes ``[..., 4]`` as a :class:`_Dual` ``[...]``."""
    planes = np.broadcast_arrays(*reference_planes(boxes1), *reference_planes(boxes2))
    eye = np.eye(8)
    x1, y1, x2, y2, u1, v1, u2, v2 = (
        _Dual(p, np.broadcast_to(eye[k], p.shape + (8,)) if with_tangents else None)
        for k, p in enumerate(planes)
    )
    inter = _positive(_min(x2, u2) - _max(x1, u1)) * _positive(_min(y2, v2) - _max(y1, v1))
    union = (x2 - x1) * (y2 - y1) + (u2 - u1) * (v2 - v1) - inter
    iou = inter / (union + GIOU_EPS)
    if metric == "iou":
        return iou
    hull_w = _max(x2, u2) - _min(x1, u1)
    hull_h = _max(y2, v2) - _min(y1, v1)
    if metric == "giou":
        hull = hull_w * hull_h
        return iou - (hull - union) / (hull + GIOU_EPS)
    dx = (x1 + x2 - u1 - u2) * 0.5
    dy = (y1 + y2 - v1 - v2) * 0.5
    diou = iou - (dx * dx + dy * dy) / (hull_w * hull_w + hull_h * hull_h + GIOU_EPS)
    if metric == "diou":
        return diou
    angle = _atan((u2 - u1) / (v2 - v1 + GIOU_EPS)) - _atan((x2 - x1) / (y2 - y1 + GIOU_EPS))
    v = angle * angle * (4.0 / np.pi**2)
    alpha = v.value / (1.0 - iou.value + v.value + GIOU_EPS)  # a constant: no tangent
    return diou - v * alpha


def reference_pairwise(metric: str, boxes1: npt.ArrayLike, boxes2: npt.ArrayLike) -> np.ndarray:
    """``metric`` (one of :data:`METRICS`) of every pair: ``[..., N, 4]`` x ``[..., M, 4]``
    -> ``[..., N, M]`` float64."""
    b1 = np.asarray(boxes1, np.float64)[..., :, None, :]
    b2 = np.asarray(boxes2, np.float64)[..., None, :, :]
    return _box_metric(metric, b1, b2, False).value


def reference_box_iou(boxes1: npt.ArrayLike, boxes2: npt.ArrayLike) -> np.ndarray:
    """Pairwise IoU ``[..., N, 4]`` x ``[..., M, 4]`` -> ``[..., N, M]`` float64."""
    return reference_pairwise("iou", boxes1, boxes2)


def reference_generalized_box_iou(boxes1: npt.ArrayLike, boxes2: npt.ArrayLike) -> np.ndarray:
    """Pairwise GIOU ``[..., N, 4]`` x ``[..., M, 4]`` -> ``[..., N, M]`` float64."""
    return reference_pairwise("giou", boxes1, boxes2)


def reference_diou(boxes1: npt.ArrayLike, boxes2: npt.ArrayLike) -> np.ndarray:
    """DIoU of paired boxes ``[..., 4]`` -> ``[...]`` float64."""
    return _box_metric("diou", boxes1, boxes2, False).value


def reference_ciou(boxes1: npt.ArrayLike, boxes2: npt.ArrayLike) -> np.ndarray:
    """CIoU of paired boxes ``[..., 4]`` -> ``[...]`` float64."""
    return _box_metric("ciou", boxes1, boxes2, False).value


def reference_metric_vjp(
    metric: str, boxes1: npt.ArrayLike, boxes2: npt.ArrayLike, cotangent: npt.ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    """Gradient of ``sum(cotangent * metric(boxes1, boxes2))`` for paired boxes ``[..., 4]``
    (``alpha`` constant for CIoU): ``(d_boxes1, d_boxes2)`` float64 ``[..., 4]``."""
    result = _box_metric(metric, boxes1, boxes2, True)
    assert result.tangent is not None
    grad = np.asarray(cotangent, np.float64)[..., None] * result.tangent
    return grad[..., :4], grad[..., 4:]


def reference_diou_vjp(
    boxes1: npt.ArrayLike, boxes2: npt.ArrayLike, cotangent: npt.ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    return reference_metric_vjp("diou", boxes1, boxes2, cotangent)


def reference_ciou_vjp(
    boxes1: npt.ArrayLike, boxes2: npt.ArrayLike, cotangent: npt.ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    return reference_metric_vjp("ciou", boxes1, boxes2, cotangent)


# Pairwise ------------------------------------------------------------------------------------


def check_pairwise(boxes1: Spec | None, boxes2: Spec | None) -> Plan:
    """Validation of a pairwise metric ``(boxes1 [..., N, 4], boxes2 [..., M, 4]) ->
    [..., N, M]``."""
    a, b = _checks.required(boxes1, "boxes1"), _checks.required(boxes2, "boxes2")
    _checks.check_boxes(a, "boxes1", min_ndim=2)
    _checks.check_boxes(b, "boxes2", min_ndim=2)
    if a.shape[:-2] != b.shape[:-2]:
        raise ValueError(
            f"boxes1 [..., N, 4] and boxes2 [..., M, 4] must have the same leading dims, "
            f"got {a.shape} and {b.shape}"
        )
    return metric_plan(a.shape[:-1] + b.shape[-2:-1], a, b, paired=False)


def compute_pairwise(runner: Runner, plan: Plan, boxes1: Array, boxes2: Array) -> Array:
    """Runs the op's pairwise kernel on ``[B, N, 4]``, ``[B, M, 4]`` views (one image when
    unbatched)."""
    out = plan.outputs
    assert isinstance(out, Spec)
    flat1 = cast(boxes1.reshape(-1, *boxes1.shape[-2:]), out.dtype)
    flat2 = cast(boxes2.reshape(-1, *boxes2.shape[-2:]), out.dtype)
    assert runner.op.kernel is not None
    return cast(runner.kernel(runner.op.kernel)(flat1, flat2), out.dtype).reshape(out.shape)


def _pairwise_giou_vjp(
    arrays: Mapping[str, Array | None],
    statics: Mapping[str, object],
    backend: str | None,
    cotangent: Array,
) -> tuple[Array, Array]:
    """The paired :func:`giou_vjp` on every pair, summed over the other side's boxes."""
    import jax
    import jax.numpy as jnp

    on_device = any(isinstance(a, jax.Array) for a in (*arrays.values(), cotangent))
    xp: Any = jnp if on_device else np
    shape = tuple(cotangent.shape) + (4,)
    b1 = xp.broadcast_to(xp.asarray(arrays["boxes1"])[..., :, None, :], shape)
    b2 = xp.broadcast_to(xp.asarray(arrays["boxes2"])[..., None, :, :], shape)
    d1, d2 = giou_vjp(b1, b2, cotangent, backend=backend)
    return d1.sum(-2), d2.sum(-3)


class PairwiseMetric(Op):
    """``name(boxes1 [..., N, 4], boxes2 [..., M, 4]) -> [..., N, M]`` (torchvision's
    ``name``), run by its own pairwise kernel (``[B, N, 4]`` x ``[B, M, 4]`` -> ``[B, N,
    M]``); differentiable in both boxes through ``vjp`` when one is given. ``what`` and
    ``gradient`` complete its docstring."""

    def __init__(
        self,
        name: str,
        *,
        reference: Callable[..., np.ndarray],
        what: str,
        gradient: str,
        vjp: Callable[..., tuple[Array, Array]] | None = None,
    ) -> None:
        super().__init__(
            name,
            [array("boxes1", 2), array("boxes2", 2)],
            check=check_pairwise,
            compute=compute_pairwise,
            reference=reference,
            vjp=vjp,
            differentiable=("boxes1", "boxes2") if vjp is not None else (),
            # On CPU hosts the native kernels; on TPUs XLA's fused elementwise program,
            # which ``asickernels estimate`` puts as fast as the Pallas kernel or faster:
            # the Pallas kernel runs when named.
            preference=("cpu", "nki", "xla", "pallas_tpu"),
            # As GIOU, with room for the float32 rounding of areas of boxes at 1e4 (the
            # "large_coords" edge case).
            tolerance=(Tolerance(0.0, 5e-5), Tolerance(0.0, 1e-12)),
            doc=f"""{what} of every pair of boxes, as torchvision's ``{name}`` (with
    ``eps = 1e-7`` in the denominators: degenerate boxes give finite values).

    Args:
      boxes1: ``[..., N, 4]`` boxes ``(x1, y1, x2, y2)``; float32, bfloat16 or float16
        (computed in float32), or float64 (computed in float64).
      boxes2: ``[..., M, 4]``, the same leading dims.
      backend, config: see :func:`asickernels.giou`.

    Returns:
      ``[..., N, M]`` float32 (float64 for float64 boxes).{gradient}
    """,
        )


box_iou = PairwiseMetric(
    "box_iou",
    reference=reference_box_iou,
    what="IoU",
    gradient=" Differentiable with ``jax.grad`` on the JAX backends.",
)
generalized_box_iou = PairwiseMetric(
    "generalized_box_iou",
    reference=reference_generalized_box_iou,
    vjp=_pairwise_giou_vjp,
    what="Generalized IoU",
    gradient=" Differentiable (``jax.grad`` on the JAX backends; PyTorch autograd runs the "
    "paired ``giou_vjp`` on every pair). ``-generalized_box_iou(pred, target)`` is DETR's "
    "matching cost.",
)


# Paired DIoU / CIoU ------------------------------------------------------------------------


def _vjp_doc(metric: str) -> str:
    return f"""Gradient of ``sum(cotangent * {metric}(boxes1, boxes2))`` with respect to both
    inputs{" (``alpha`` held constant, as torchvision and the CIoU paper do)" if metric == "ciou" else ""}.

    ``boxes1, boxes2 [..., 4]``, ``cotangent [...]`` -> ``(d_boxes1, d_boxes2)`` ``[..., 4]``,
    float32 (float64 for float64 boxes). JAX backends differentiate their ``{metric}`` kernel.
    """


def _metric_doc(metric: str, what: str) -> str:
    return f"""{what} of paired boxes.

    Args:
      boxes1, boxes2: ``[..., 4]`` boxes ``(x1, y1, x2, y2)``, same shape; float32, bfloat16
        or float16 (computed in float32), or float64 (computed in float64).
      backend, config: see :func:`asickernels.giou`.

    Returns:
      ``[...]`` float32 (float64 for float64 inputs), equal to ``1 -
      torchvision.ops.{"distance" if metric == "diou" else "complete"}_box_iou_loss`` (up to
      ``eps``). Differentiable with ``jax.grad`` on the JAX backends.
    """


def _loss_doc(metric: str) -> str:
    return f"""``1 - {metric}(preds, targets)`` over the valid (non-padding) boxes, with
    :func:`asickernels.giou_loss`'s ``mask`` and ``reduction`` (padding may hold anything,
    even NaN: its loss and gradient are exactly 0; ``"mean"`` is 0 when no box is valid).

    Returns:
      float32 loss (float64 for float64 boxes): ``[...]`` for ``"none"``, else a scalar.
    """


# As GIOU, with room for the float32 rounding of centre distances of boxes at 1e4.
_METRIC_TOLERANCE = (Tolerance(0.0, 5e-5), Tolerance(0.0, 1e-12))

diou_vjp = PairedMetricVjp(
    "diou_vjp",
    reference=reference_diou_vjp,
    preference=("cpu", "pallas_tpu", "xla"),
    doc=_vjp_doc("diou"),
)
ciou_vjp = PairedMetricVjp(
    "ciou_vjp",
    reference=reference_ciou_vjp,
    preference=("cpu", "pallas_tpu", "xla"),
    doc=_vjp_doc("ciou"),
)
diou = PairedMetric(
    "diou",
    reference=reference_diou,
    gradient=diou_vjp,
    preference=("cpu", "pallas_tpu", "nki", "xla"),
    tolerance=_METRIC_TOLERANCE,
    doc=_metric_doc("diou", "Distance IoU (DIoU)"),
)
ciou = PairedMetric(
    "ciou",
    reference=reference_ciou,
    gradient=ciou_vjp,
    preference=("cpu", "pallas_tpu", "nki", "xla"),
    tolerance=_METRIC_TOLERANCE,
    doc=_metric_doc("ciou", "Complete IoU (CIoU)"),
)
diou_loss = MaskedLoss("diou_loss", metric=diou, gradient=diou_vjp, doc=_loss_doc("diou"))
ciou_loss = MaskedLoss("ciou_loss", metric=ciou, gradient=ciou_vjp, doc=_loss_doc("ciou"))

for _op, _reference in (
    (box_iou, reference_box_iou),
    (generalized_box_iou, reference_generalized_box_iou),
    (diou, reference_diou),
    (ciou, reference_ciou),
    (diou_vjp, reference_diou_vjp),
    (ciou_vjp, reference_ciou_vjp),
):
    REFERENCE.implements(_op, dtypes=FLOAT32_AND_64)(_reference)
