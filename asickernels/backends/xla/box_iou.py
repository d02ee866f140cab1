"""Pairwise IoU/GIOU and paired DIoU/CIoU in ``jax.numpy``; :func:`metric_from_planes` is
also the body of the Pallas kernels (:mod:`asickernels.backends.pallas_tpu.box_iou`)."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from asickernels.backends.xla import BACKEND, compute_dtype
from asickernels.backends.xla.giou import giou_from_planes
from asickernels.kernels import public as ops
from asickernels.kernels.giou import GIOU_EPS
from asickernels.kernels.registry import FLOAT32_AND_64

EPS = GIOU_EPS


def _hi(a: jax.Array, b: jax.Array) -> jax.Array:
    # ``where`` rather than ``maximum``: autodiff gives a tie to ``a`` (the boxes1 side), as
    # the reference does, instead of splitting it.
    return jnp.where(a >= b, a, b)


def _lo(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.where(a <= b, a, b)


def _atan(z: jax.Array) -> jax.Array:
    """atan(z): float64 by ``jnp.arctan``; float32 by Cephes' ``atanf`` (range reduction to
    ``|x| <= tan(pi / 8)``, then an odd polynomial; absolute error 1.4e-7), which
    vectorizes where XLA's CPU ``atan`` is a scalar call, and which Mosaic
    lowers (it has no rule for ``atan``)."""
    if z.dtype == jnp.float64:
        return jnp.arctan(z)
    a = jnp.abs(z)
    big = a > 2.414213562373095  # tan(3 pi / 8)
    mid = a > 0.4142135623730950  # tan(pi / 8)
    x = jnp.where(big, -1.0 / jnp.where(big, a, 1.0), jnp.where(mid, (a - 1.0) / (a + 1.0), a))
    offset = jnp.where(big, math.pi / 2, jnp.where(mid, math.pi / 4, 0.0))
    s = x * x
    poly = ((8.05374449538e-2 * s - 1.38776856032e-1) * s + 1.99777106478e-1) * s - 3.33329491539e-1
    return jnp.sign(z) * (offset + poly * s * x + x)


def metric_from_planes(metric: str, *planes: jax.Array) -> jax.Array:
    """``metric`` ("iou", "giou", "diou", "ciou") from the coordinate planes ``x1, y1, x2,
    y2`` of boxes1 and ``u1, v1, u2, v2`` of boxes2 (broadcastable shapes, float32 or
    float64), with the reference's formulas and gradient rules (CIoU's ``alpha`` is a
    constant for gradients)."""
    if metric == "giou":
        return giou_from_planes(*planes)
    x1, y1, x2, y2, u1, v1, u2, v2 = planes
    iw = _lo(x2, u2) - _hi(x1, u1)
    ih = _lo(y2, v2) - _hi(y1, v1)
    inter = jnp.where(iw > 0, iw, 0.0) * jnp.where(ih > 0, ih, 0.0)
    union = (x2 - x1) * (y2 - y1) + (u2 - u1) * (v2 - v1) - inter
    iou = inter / (union + EPS)
    if metric == "iou":
        return iou
    hull_w = _hi(x2, u2) - _lo(x1, u1)
    hull_h = _hi(y2, v2) - _lo(y1, v1)
    dx = (x1 + x2 - u1 - u2) * 0.5
    dy = (y1 + y2 - v1 - v2) * 0.5
    diou = iou - (dx * dx + dy * dy) / (hull_w * hull_w + hull_h * hull_h + EPS)
    if metric == "diou":
        return diou
    angle = _atan((u2 - u1) / (v2 - v1 + EPS)) - _atan((x2 - x1) / (y2 - y1 + EPS))
    v = angle * angle * (4.0 / math.pi**2)
    alpha = jax.lax.stop_gradient(v / (1.0 - iou + v + EPS))
    return diou - alpha * v


def _planes(boxes: jax.Array, dtype: np.dtype) -> list[jax.Array]:
    boxes = boxes.astype(dtype)
    return [boxes[..., i] for i in range(4)]


def pairwise(metric: str, boxes1: jax.Array, boxes2: jax.Array) -> jax.Array:
    """``[B, N, 4]`` x ``[B, M, 4]`` -> ``[B, N, M]`` float32 (float64 for float64 boxes)."""
    dtype = compute_dtype(boxes1, boxes2)
    rows = [p[:, :, None] for p in _planes(boxes1, dtype)]
    columns = [p[:, None, :] for p in _planes(boxes2, dtype)]
    return metric_from_planes(metric, *rows, *columns)


def paired(metric: str, boxes1: jax.Array, boxes2: jax.Array) -> jax.Array:
    """``[P, 4]`` x2 -> ``[P]`` float32 (float64 for float64 boxes)."""
    dtype = compute_dtype(boxes1, boxes2)
    return metric_from_planes(metric, *_planes(boxes1, dtype), *_planes(boxes2, dtype))


box_iou = BACKEND.implements(ops.box_iou, dtypes=FLOAT32_AND_64)(functools.partial(pairwise, "iou"))
generalized_box_iou = BACKEND.implements(ops.generalized_box_iou, dtypes=FLOAT32_AND_64)(
    functools.partial(pairwise, "giou")
)
diou = BACKEND.implements(ops.diou, dtypes=FLOAT32_AND_64, vjp=ops.diou_vjp)(
    functools.partial(paired, "diou")
)
ciou = BACKEND.implements(ops.ciou, dtypes=FLOAT32_AND_64, vjp=ops.ciou_vjp)(
    functools.partial(paired, "ciou")
)
