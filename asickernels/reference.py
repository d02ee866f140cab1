"""The numerical reference: the one written definition of every op's semantics.

Plain numpy in float64, written for clarity rather than speed. Every backend is tested
against these functions, and they are the ``"reference"`` backend (:data:`BACKEND`). The
signatures follow the implementation conventions in :mod:`asickernels.kernels.registry`.

Definitions
-----------
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

NMS: :mod:`asickernels.kernels.nms` (its reference is written beside its declaration).

int8 matmul: the exact integer product; with scales, ``acc * x_scale[:, None] *
y_scale[None, :]`` rounded once to ``out_dtype``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from asickernels.kernels.registry import FLOAT32_AND_64, Availability, Backend

GIOU_EPS = 1e-7

BACKEND = Backend(
    name="reference",
    array_kind="numpy",
    probe=lambda: Availability("native", "numpy, float64"),
    package=__name__,
)

Array = np.ndarray


def _planes(boxes: npt.ArrayLike) -> tuple[Array, Array, Array, Array]:
    b = np.asarray(boxes).astype(np.float64)
    return b[..., 0], b[..., 1], b[..., 2], b[..., 3]


@BACKEND.implements("giou", dtypes=FLOAT32_AND_64)
def giou(boxes1: npt.ArrayLike, boxes2: npt.ArrayLike) -> Array:
    """GIOU of paired boxes ``[..., 4]`` -> ``[...]`` float64."""
    x1, y1, x2, y2 = _planes(boxes1)
    u1, v1, u2, v2 = _planes(boxes2)
    inter = np.maximum(0.0, np.minimum(x2, u2) - np.maximum(x1, u1)) * np.maximum(
        0.0, np.minimum(y2, v2) - np.maximum(y1, v1)
    )
    union = (x2 - x1) * (y2 - y1) + (u2 - u1) * (v2 - v1) - inter
    hull = (np.maximum(x2, u2) - np.minimum(x1, u1)) * (np.maximum(y2, v2) - np.minimum(y1, v1))
    return inter / (union + GIOU_EPS) - (hull - union) / (hull + GIOU_EPS)


@BACKEND.implements("giou_vjp", dtypes=FLOAT32_AND_64)
def giou_vjp(
    boxes1: npt.ArrayLike, boxes2: npt.ArrayLike, cotangent: npt.ArrayLike
) -> tuple[Array, Array]:
    """Gradient of ``sum(cotangent * giou(boxes1, boxes2))`` w.r.t. both box arrays (float64)."""
    x1, y1, x2, y2 = _planes(boxes1)
    u1, v1, u2, v2 = _planes(boxes2)
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


def giou_loss(
    preds: npt.ArrayLike,
    targets: npt.ArrayLike,
    *,
    mask: npt.ArrayLike | None = None,
    reduction: str = "mean",
) -> Array:
    """``1 - giou`` over valid boxes (``mask`` True); padding contributes exactly 0.

    ``"mean"`` divides by the number of valid boxes and is 0 when there are none.
    """
    return _masked_loss(giou(preds, targets), mask, reduction)


@BACKEND.implements("int8_matmul")
def int8_matmul(
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    *,
    x_scale: npt.ArrayLike | None = None,
    y_scale: npt.ArrayLike | None = None,
    out_dtype: npt.DTypeLike = np.int32,
) -> Array:
    """Exact ``x [M, K] @ y [K, N]`` (int8) as int32, or dequantized to ``out_dtype``."""
    acc = np.asarray(x).astype(np.int64) @ np.asarray(y).astype(np.int64)
    if x_scale is None:
        return acc.astype(np.int32)
    scaled = (
        acc.astype(np.float64)
        * np.asarray(x_scale, np.float64)[:, None]
        * np.asarray(y_scale, np.float64)[None, :]
    )
    return scaled.astype(out_dtype)


# Pairwise IoU/GIOU and paired DIoU/CIoU -------------------------------------------------------
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

    def __init__(self, value: npt.ArrayLike, tangent: Array | None = None) -> None:
        self.value = np.asarray(value, np.float64)
        self.tangent = tangent

    def _scaled(self, scale: npt.ArrayLike) -> Array | None:
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


def _sum(a: Array | None, b: Array | None) -> Array | None:
    if a is None or b is None:
        return a if b is None else b
    return a + b


def _select(condition: Array, a: _Dual, b: _Dual) -> _Dual:
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


def _box_metric(
    metric: str, boxes1: npt.ArrayLike, boxes2: npt.ArrayLike, with_tangents: bool
) -> _Dual:
    """``metric`` of paired (broadcast) boxes ``[..., 4]`` as a :class:`_Dual` ``[...]``."""
    planes = np.broadcast_arrays(*_planes(boxes1), *_planes(boxes2))
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


def pairwise(metric: str, boxes1: npt.ArrayLike, boxes2: npt.ArrayLike) -> Array:
    """``metric`` (one of :data:`METRICS`) of every pair: ``[..., N, 4]`` x ``[..., M, 4]``
    -> ``[..., N, M]`` float64."""
    b1 = np.asarray(boxes1, np.float64)[..., :, None, :]
    b2 = np.asarray(boxes2, np.float64)[..., None, :, :]
    return _box_metric(metric, b1, b2, False).value


@BACKEND.implements("box_iou", dtypes=FLOAT32_AND_64)
def box_iou(boxes1: npt.ArrayLike, boxes2: npt.ArrayLike) -> Array:
    """Pairwise IoU ``[..., N, 4]`` x ``[..., M, 4]`` -> ``[..., N, M]`` float64."""
    return pairwise("iou", boxes1, boxes2)


@BACKEND.implements("generalized_box_iou", dtypes=FLOAT32_AND_64)
def generalized_box_iou(boxes1: npt.ArrayLike, boxes2: npt.ArrayLike) -> Array:
    """Pairwise GIOU ``[..., N, 4]`` x ``[..., M, 4]`` -> ``[..., N, M]`` float64."""
    return pairwise("giou", boxes1, boxes2)


@BACKEND.implements("diou", dtypes=FLOAT32_AND_64)
def diou(boxes1: npt.ArrayLike, boxes2: npt.ArrayLike) -> Array:
    """DIoU of paired boxes ``[..., 4]`` -> ``[...]`` float64."""
    return _box_metric("diou", boxes1, boxes2, False).value


@BACKEND.implements("ciou", dtypes=FLOAT32_AND_64)
def ciou(boxes1: npt.ArrayLike, boxes2: npt.ArrayLike) -> Array:
    """CIoU of paired boxes ``[..., 4]`` -> ``[...]`` float64."""
    return _box_metric("ciou", boxes1, boxes2, False).value


def metric_vjp(
    metric: str, boxes1: npt.ArrayLike, boxes2: npt.ArrayLike, cotangent: npt.ArrayLike
) -> tuple[Array, Array]:
    """Gradient of ``sum(cotangent * metric(boxes1, boxes2))`` for paired boxes ``[..., 4]``
    (``alpha`` constant for CIoU): ``(d_boxes1, d_boxes2)`` float64 ``[..., 4]``."""
    result = _box_metric(metric, boxes1, boxes2, True)
    assert result.tangent is not None
    grad = np.asarray(cotangent, np.float64)[..., None] * result.tangent
    return grad[..., :4], grad[..., 4:]


@BACKEND.implements("diou_vjp", dtypes=FLOAT32_AND_64)
def diou_vjp(
    boxes1: npt.ArrayLike, boxes2: npt.ArrayLike, cotangent: npt.ArrayLike
) -> tuple[Array, Array]:
    return metric_vjp("diou", boxes1, boxes2, cotangent)


@BACKEND.implements("ciou_vjp", dtypes=FLOAT32_AND_64)
def ciou_vjp(
    boxes1: npt.ArrayLike, boxes2: npt.ArrayLike, cotangent: npt.ArrayLike
) -> tuple[Array, Array]:
    return metric_vjp("ciou", boxes1, boxes2, cotangent)


def _masked_loss(metric: Array, mask: npt.ArrayLike | None, reduction: str) -> Array:
    """``1 - metric`` where ``mask`` is True (0 elsewhere), reduced; "mean" over the valid
    boxes, 0 when there are none."""
    loss = 1.0 - metric
    valid = np.ones(loss.shape, bool) if mask is None else np.asarray(mask, bool)
    loss = np.where(valid, loss, 0.0)
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "sum":
        return np.asarray(total)
    count = valid.sum()
    return np.asarray(total / count if count else 0.0)


def diou_loss(
    preds: npt.ArrayLike,
    targets: npt.ArrayLike,
    *,
    mask: npt.ArrayLike | None = None,
    reduction: str = "mean",
) -> Array:
    """``1 - diou`` over valid boxes, reduced as :func:`giou_loss` does."""
    with np.errstate(all="ignore"):  # padding may hold NaN; it is masked out
        return _masked_loss(diou(preds, targets), mask, reduction)


def ciou_loss(
    preds: npt.ArrayLike,
    targets: npt.ArrayLike,
    *,
    mask: npt.ArrayLike | None = None,
    reduction: str = "mean",
) -> Array:
    """``1 - ciou`` over valid boxes, reduced as :func:`giou_loss` does."""
    with np.errstate(all="ignore"):
        return _masked_loss(ciou(preds, targets), mask, reduction)
