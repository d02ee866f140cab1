"""Pairwise IoU/GIOU and paired DIoU/CIoU as NKI kernels (float32 on the Vector engine).

Pairwise (``[B, N, 4]`` x ``[B, M, 4]`` -> ``[B, N, M]``): output tiles of up to 128 boxes of
``boxes1`` on the partitions by up to 512 boxes of ``boxes2`` on the free axis. A ``boxes1``
coordinate is a ``[rows, 1]`` column broadcast along the free axis; a ``boxes2`` coordinate
is a ``[1, columns]`` row of the transposed boxes, copied onto every partition by a matmul
with a row of ones (exact: one product with 1.0 per element; one PSUM bank per plane).

Paired (``[P, 4]`` x2 -> ``[P]``): GIOU's layout (:func:`asickernels.backends.nki.giou.pair_tiles`).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from asickernels.backends.nki import BACKEND
from asickernels.backends.nki.giou import PMAX, pair_tiles
from asickernels.backends.nki.sdk import float_input, nisa, nki, nl, run
from asickernels.kernels import public as ops
from asickernels.kernels.giou import GIOU_EPS

# Boxes of boxes2 per tile: one 2 KiB PSUM bank of float32 per broadcast plane.
MAX_COLUMNS = 512


def _metric(metric: str, *planes: Any) -> Any:
    """``metric`` ("iou", "giou", "diou", "ciou") of same-shaped on-chip coordinate planes
    ``x1, y1, x2, y2, u1, v1, u2, v2`` (the reference's formulas)."""
    x1, y1, x2, y2, u1, v1, u2, v2 = planes
    inter_w = nl.maximum(nl.subtract(nl.minimum(x2, u2), nl.maximum(x1, u1)), 0.0)
    inter_h = nl.maximum(nl.subtract(nl.minimum(y2, v2), nl.maximum(y1, v1)), 0.0)
    inter = nl.multiply(inter_w, inter_h)
    w1, h1 = nl.subtract(x2, x1), nl.subtract(y2, y1)
    w2, h2 = nl.subtract(u2, u1), nl.subtract(v2, v1)
    union = nl.subtract(nl.add(nl.multiply(w1, h1), nl.multiply(w2, h2)), inter)
    iou = nl.divide(inter, nl.add(union, GIOU_EPS))
    if metric == "iou":
        return iou
    hull_w = nl.subtract(nl.maximum(x2, u2), nl.minimum(x1, u1))
    hull_h = nl.subtract(nl.maximum(y2, v2), nl.minimum(y1, v1))
    if metric == "giou":
        hull = nl.multiply(hull_w, hull_h)
        return nl.subtract(iou, nl.divide(nl.subtract(hull, union), nl.add(hull, GIOU_EPS)))
    dx = nl.multiply(nl.subtract(nl.add(x1, x2), nl.add(u1, u2)), 0.5)
    dy = nl.multiply(nl.subtract(nl.add(y1, y2), nl.add(v1, v2)), 0.5)
    rho2 = nl.add(nl.multiply(dx, dx), nl.multiply(dy, dy))
    diagonal = nl.add(nl.add(nl.multiply(hull_w, hull_w), nl.multiply(hull_h, hull_h)), GIOU_EPS)
    diou = nl.subtract(iou, nl.divide(rho2, diagonal))
    if metric == "diou":
        return diou
    angle = nl.subtract(
        nl.arctan(nl.divide(w2, nl.add(h2, GIOU_EPS))),
        nl.arctan(nl.divide(w1, nl.add(h1, GIOU_EPS))),
    )
    v = nl.multiply(nl.multiply(angle, angle), 4.0 / math.pi**2)
    alpha = nl.divide(v, nl.add(nl.subtract(nl.add(v, GIOU_EPS), iou), 1.0))
    return nl.subtract(diou, nl.multiply(alpha, v))


@nki.jit
def pairwise_kernel(boxes1: Any, planes2: Any, metric: str) -> Any:
    """``boxes1 [B, N, 4]``, ``planes2 [B, 4, M]`` (boxes2 transposed; float32/bfloat16/
    float16, HBM) -> ``[B, N, M]`` float32 ``metric`` ("iou" or "giou") of every pair."""
    batch, n, _ = boxes1.shape
    m = planes2.shape[2]
    out = nl.ndarray((batch, n, m), dtype=nl.float32, buffer=nl.shared_hbm)
    ones = nl.ndarray((1, PMAX), dtype=nl.float32)
    nisa.memset(ones, 1.0)
    for b in range(batch):
        for n0 in range(0, n, PMAX):
            rows = min(PMAX, n - n0)
            tile1 = nl.load(boxes1[b, n0 : n0 + rows, :], dtype=nl.float32)
            for m0 in range(0, m, MAX_COLUMNS):
                columns = min(MAX_COLUMNS, m - m0)
                tile2 = nl.load(planes2[b, :, m0 : m0 + columns], dtype=nl.float32)
                firsts = [nl.broadcast_to(tile1[:, k : k + 1], (rows, columns)) for k in range(4)]
                seconds = []
                for k in range(4):
                    plane = nl.ndarray((rows, columns), dtype=nl.float32, buffer=nl.psum)
                    nisa.nc_matmul(
                        dst=plane, stationary=ones[:, 0:rows], moving=tile2[k : k + 1, :]
                    )
                    seconds.append(nl.copy(plane, dtype=nl.float32))
                value = _metric(metric, *firsts, *seconds)
                nl.store(out[b, n0 : n0 + rows, m0 : m0 + columns], value)
    return out


@nki.jit
def paired_kernel(boxes1: Any, boxes2: Any, metric: str) -> Any:
    """``boxes1, boxes2 [P, 4]`` (float32/bfloat16/float16, HBM) -> ``[P]`` float32
    ``metric`` ("diou" or "ciou") of each pair."""
    out = nl.ndarray((boxes1.shape[0],), dtype=nl.float32, buffer=nl.shared_hbm)
    for src1, src2, dst in zip(
        pair_tiles(boxes1), pair_tiles(boxes2), pair_tiles(out), strict=True
    ):
        tile1 = nl.load(src1, dtype=nl.float32)
        tile2 = nl.load(src2, dtype=nl.float32)
        planes = [tile[:, :, k] for tile in (tile1, tile2) for k in range(4)]
        nl.store(dst, _metric(metric, *planes))
    return out


def _pairwise(metric: str, boxes1: np.ndarray, boxes2: np.ndarray) -> np.ndarray:
    """``[B, N, 4]`` x ``[B, M, 4]`` -> ``[B, N, M]`` float32."""
    planes2 = np.ascontiguousarray(np.swapaxes(float_input(boxes2), 1, 2))
    result: np.ndarray = run(pairwise_kernel, float_input(boxes1), planes2, metric)
    return result


def _paired(metric: str, boxes1: np.ndarray, boxes2: np.ndarray) -> np.ndarray:
    """``[P, 4]`` x2 -> ``[P]`` float32."""
    result: np.ndarray = run(paired_kernel, float_input(boxes1), float_input(boxes2), metric)
    return result


box_iou = BACKEND.implements(ops.box_iou)(functools.partial(_pairwise, "iou"))
generalized_box_iou = BACKEND.implements(ops.generalized_box_iou)(
    functools.partial(_pairwise, "giou")
)
diou = BACKEND.implements(ops.diou)(functools.partial(_paired, "diou"))
ciou = BACKEND.implements(ops.ciou)(functools.partial(_paired, "ciou"))
