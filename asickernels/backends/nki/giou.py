"""GIOU of paired boxes and its gradient as NKI kernels.

Layout: the P pairs are split into a body of ``128 * (P // 128)`` pairs, viewed as
``[128, P // 128, 4]`` (partition ``p`` holds consecutive pairs, so every DMA row is
contiguous) and cut into tiles of at most :data:`MAX_COLUMNS` pairs per partition, and a
remainder of ``P % 128`` pairs, one per partition. All math is float32 on the Vector
engine; bfloat16 and float16 boxes are widened by the loading DMA.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from asickernels.backends.nki import BACKEND
from asickernels.backends.nki.sdk import float_input, nisa, nki, nl, run
from asickernels.kernels import public as ops
from asickernels.kernels.giou import GIOU_EPS

PMAX = 128
# Pairs per partition in one tile: the backward kernel's live float32 temporaries then peak
# at 132 KiB of SBUF per partition (the simulator's count), inside NeuronCore-v2's 192 KiB.
MAX_COLUMNS = 512


def pair_tiles(tensor: Any) -> list[Any]:
    """Views ``[rows, columns, ...]`` of the HBM tensor ``[P, ...]`` covering its pairs in
    the layout of the module docstring; equal-length tensors give aligned lists."""
    pairs = tensor.shape[0]
    trailing = tuple(tensor.shape[1:])
    columns, remainder = divmod(pairs, PMAX)
    views = []
    if columns:
        body = tensor[0 : PMAX * columns].reshape((PMAX, columns, *trailing))
        for start in range(0, columns, MAX_COLUMNS):
            views.append(body[:, start : min(start + MAX_COLUMNS, columns)])
    if remainder:
        views.append(tensor[PMAX * columns : pairs].reshape((remainder, 1, *trailing)))
    return views


def _planes(boxes: Any) -> tuple[Any, Any, Any, Any]:
    """x1, y1, x2, y2 of an on-chip ``[rows, columns, 4]`` tile (strided views)."""
    return boxes[:, :, 0], boxes[:, :, 1], boxes[:, :, 2], boxes[:, :, 3]


@nki.jit
def giou_kernel(boxes1: Any, boxes2: Any) -> Any:
    """``boxes1, boxes2 [P, 4]`` (float32/bfloat16/float16, HBM) -> ``[P]`` float32 GIOU."""
    out = nl.ndarray((boxes1.shape[0],), dtype=nl.float32, buffer=nl.shared_hbm)
    for src1, src2, dst in zip(
        pair_tiles(boxes1), pair_tiles(boxes2), pair_tiles(out), strict=True
    ):
        x1, y1, x2, y2 = _planes(nl.load(src1, dtype=nl.float32))
        u1, v1, u2, v2 = _planes(nl.load(src2, dtype=nl.float32))
        inter_w = nl.maximum(nl.subtract(nl.minimum(x2, u2), nl.maximum(x1, u1)), 0.0)
        inter_h = nl.maximum(nl.subtract(nl.minimum(y2, v2), nl.maximum(y1, v1)), 0.0)
        inter = nl.multiply(inter_w, inter_h)
        area1 = nl.multiply(nl.subtract(x2, x1), nl.subtract(y2, y1))
        area2 = nl.multiply(nl.subtract(u2, u1), nl.subtract(v2, v1))
        union = nl.subtract(nl.add(area1, area2), inter)
        hull_w = nl.subtract(nl.maximum(x2, u2), nl.minimum(x1, u1))
        hull_h = nl.subtract(nl.maximum(y2, v2), nl.minimum(y1, v1))
        hull = nl.multiply(hull_w, hull_h)
        iou = nl.divide(inter, nl.add(union, GIOU_EPS))
        penalty = nl.divide(nl.subtract(hull, union), nl.add(hull, GIOU_EPS))
        nl.store(dst, nl.subtract(iou, penalty))
    return out


@nki.jit
def giou_vjp_kernel(boxes1: Any, boxes2: Any, cotangent: Any) -> Any:
    """Gradient of ``sum(cotangent * giou(boxes1, boxes2))``: ``boxes [P, 4]``,
    ``cotangent [P]`` float32 -> ``(d_boxes1, d_boxes2)`` float32 ``[P, 4]``, with the
    reference's tie rules (a max/min tie goes to ``boxes1``; a clamp ``max(0, w)`` passes
    the gradient only where ``w > 0``)."""
    pairs = boxes1.shape[0]
    d_out1 = nl.ndarray((pairs, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    d_out2 = nl.ndarray((pairs, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    tiles = zip(
        pair_tiles(boxes1),
        pair_tiles(boxes2),
        pair_tiles(cotangent),
        pair_tiles(d_out1),
        pair_tiles(d_out2),
        strict=True,
    )
    for src1, src2, src_g, dst1, dst2 in tiles:
        x1, y1, x2, y2 = _planes(nl.load(src1, dtype=nl.float32))
        u1, v1, u2, v2 = _planes(nl.load(src2, dtype=nl.float32))
        g = nl.load(src_g, dtype=nl.float32)
        # Forward, remembering which box each edge of the intersection and hull came from.
        left1, right1 = nl.greater_equal(x1, u1), nl.less_equal(x2, u2)
        top1, bottom1 = nl.greater_equal(y1, v1), nl.less_equal(y2, v2)
        inter_w = nl.subtract(nl.where(right1, x2, u2), nl.where(left1, x1, u1))
        inter_h = nl.subtract(nl.where(bottom1, y2, v2), nl.where(top1, y1, v1))
        inter_w_pos, inter_h_pos = nl.greater(inter_w, 0.0), nl.greater(inter_h, 0.0)
        inter_w, inter_h = nl.maximum(inter_w, 0.0), nl.maximum(inter_h, 0.0)
        inter = nl.multiply(inter_w, inter_h)
        w1, h1 = nl.subtract(x2, x1), nl.subtract(y2, y1)
        w2, h2 = nl.subtract(u2, u1), nl.subtract(v2, v1)
        union = nl.subtract(nl.add(nl.multiply(w1, h1), nl.multiply(w2, h2)), inter)
        hull_left1, hull_right1 = nl.less_equal(x1, u1), nl.greater_equal(x2, u2)
        hull_top1, hull_bottom1 = nl.less_equal(y1, v1), nl.greater_equal(y2, v2)
        hull_w = nl.subtract(nl.where(hull_right1, x2, u2), nl.where(hull_left1, x1, u1))
        hull_h = nl.subtract(nl.where(hull_bottom1, y2, v2), nl.where(hull_top1, y1, v1))
        hull = nl.multiply(hull_w, hull_h)
        # Backward through giou = inter / (union + eps) - (hull - union) / (hull + eps).
        union_eps, hull_eps = nl.add(union, GIOU_EPS), nl.add(hull, GIOU_EPS)
        g_over_union = nl.divide(g, union_eps)
        d_union = nl.subtract(
            nl.divide(g, hull_eps), nl.divide(nl.multiply(g_over_union, inter), union_eps)
        )
        d_inter = nl.subtract(g_over_union, d_union)
        d_hull = nl.divide(
            nl.multiply(nl.multiply(g, -1.0), union_eps), nl.multiply(hull_eps, hull_eps)
        )
        d_inter_w = nl.where(inter_w_pos, nl.multiply(d_inter, inter_h), 0.0)
        d_inter_h = nl.where(inter_h_pos, nl.multiply(d_inter, inter_w), 0.0)
        d_hull_w, d_hull_h = nl.multiply(d_hull, hull_h), nl.multiply(d_hull, hull_w)
        # Coordinate k of each box: sign * (area term + intersection edge + hull edge), each
        # edge term going to the box that edge came from.
        coordinates = (
            (0, -1.0, h1, h2, d_inter_w, left1, d_hull_w, hull_left1),
            (1, -1.0, w1, w2, d_inter_h, top1, d_hull_h, hull_top1),
            (2, 1.0, h1, h2, d_inter_w, right1, d_hull_w, hull_right1),
            (3, 1.0, w1, w2, d_inter_h, bottom1, d_hull_h, hull_bottom1),
        )
        d1 = nl.ndarray(dst1.shape, dtype=nl.float32)
        d2 = nl.ndarray(dst2.shape, dtype=nl.float32)
        for k, sign, side1, side2, d_edge, edge_from1, d_hull_edge, hull_from1 in coordinates:
            for d, side, first in ((d1, side1, True), (d2, side2, False)):
                edges = nl.add(
                    _owned(edge_from1, d_edge, first), _owned(hull_from1, d_hull_edge, first)
                )
                total = nl.add(nl.multiply(d_union, side), edges)
                nisa.tensor_scalar(dst=d[:, :, k], data=total, op0=nl.multiply, operand0=sign)
        nl.store(dst1, d1)
        nl.store(dst2, d2)
    return d_out1, d_out2


def _owned(from1: Any, gradient: Any, first: bool) -> Any:
    """``gradient`` where the edge belongs to this box (``from1``, a 0/1 tile, says it came
    from ``boxes1``), else 0."""
    return nl.where(from1, gradient, 0.0) if first else nl.where(from1, 0.0, gradient)


@BACKEND.implements(ops.giou)
def giou(boxes1: np.ndarray, boxes2: np.ndarray) -> np.ndarray:
    """``[P, 4]`` x2 -> ``[P]`` float32."""
    result: np.ndarray = run(giou_kernel, float_input(boxes1), float_input(boxes2))
    return result


@BACKEND.implements(ops.giou_vjp)
def giou_vjp(
    boxes1: np.ndarray, boxes2: np.ndarray, cotangent: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``[P, 4]`` x2, ``[P]`` -> ``(d_boxes1, d_boxes2)`` float32 ``[P, 4]``."""
    d1, d2 = run(giou_vjp_kernel, float_input(boxes1), float_input(boxes2), float_input(cotangent))
    return d1, d2
