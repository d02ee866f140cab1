"""Greedy NMS as an NKI kernel: the whole sequential selection runs on chip.

One image's N boxes are laid out partition-major on ``rows = ceil(N / columns)`` partitions
of ``columns = ceil(N / 128)`` boxes each (box ``i`` at ``(i // columns, i % columns)``), so
N = 16384 takes 128 x 128 slots and a few KiB of SBUF per partition. Each step of the
selection picks the best remaining box with no sort:

1. the highest live score (a free-axis max on the Vector engine, then a max across
   partitions on GpSimd);
2. among live boxes with that score, the lowest index, as the highest ``N - index``
   (the same two reductions), which gives the reference's tie rule;
3. that box's coordinates, area and category, gathered with a one-hot mask and summed
   across partitions, then copied onto every partition by a matmul with a row of ones
   (Tensor engine);
4. its IoU with every box, suppressing the live boxes of its category with IoU > threshold.

The loop runs ``min(max_output_size, N)`` static steps; a step that finds no live box
records nothing. Non-finite boxes become ``(0, 0, 0, 0)``, whose IoU with any box is 0, as
the reference defines for them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from asickernels.backends.nki import BACKEND
from asickernels.backends.nki.sdk import float_input, nisa, nki, nl, run
from asickernels.kernels import public as ops

PMAX = 128
# Boxes per image the kernel takes: 512 columns of state per partition stay well inside
# NeuronCore-v2's SBUF, and indices stay exact in float32.
MAX_BOXES = PMAX * 512
# Output slots staged on chip before each store to HBM.
OUTPUT_BLOCK = 512


def _load_partition_major(dst: Any, src: Any, count: int, columns: int) -> None:
    """DMAs ``src [count, ...]`` (HBM) into ``dst [rows, columns, ...]`` with element ``i``
    at ``(i // columns, i % columns)``; a last, partial row gets the remainder."""
    full_rows, remainder = divmod(count, columns)
    trailing = tuple(src.shape[1:])
    if full_rows:
        nisa.dma_copy(
            dst=dst[0:full_rows],
            src=src[0 : full_rows * columns].reshape((full_rows, columns, *trailing)),
        )
    if remainder:
        nisa.dma_copy(
            dst=dst[full_rows : full_rows + 1, 0:remainder],
            src=src[full_rows * columns : count].reshape((1, remainder, *trailing)),
        )


def _on_all_partitions(row: Any, ones: Any) -> Any:
    """``row [1, F]`` copied onto every partition: ``ones[1, P].T @ row`` -> PSUM ``[P, F]``
    (exact: one product with 1.0 per element)."""
    out = nl.ndarray((ones.shape[1], row.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=out, stationary=ones, moving=row, accumulate=False)
    return out


def _with_column(plane: Any, op: Any, column: Any) -> Any:
    """``op(plane, column)`` with the ``[P, 1]`` ``column`` broadcast along the free axis."""
    out = nl.ndarray(plane.shape, dtype=nl.float32)
    nisa.tensor_scalar(out, plane, op, column)
    return out


def _max_over_all(tile: Any, ones: Any) -> tuple[Any, Any]:
    """The maximum of ``tile [P, C]``: as ``[1, 1]`` in SBUF and on every partition."""
    per_partition = nl.max(tile, axis=1, keepdims=True)
    best = nl.ndarray((1, 1), dtype=nl.float32)
    nisa.tensor_partition_reduce(dst=best, op=nl.maximum, data=per_partition)
    return best, _on_all_partitions(best, ones)


def _select_next(
    alive: Any, score: Any, rank: Any, ones: Any, feature: Any, iou_threshold: float
) -> tuple[Any, Any]:
    """One greedy step over ``[P, C]`` tiles: keeps the best live box and suppresses the
    live boxes of its category overlapping it by IoU > ``iou_threshold``.

    Returns ``(alive, rank)``: the live flags after the step and the kept box's rank
    ``[1, 1]`` (N - index; 0 when no box was live).
    """
    # 1-2. Highest live score, then among those the highest rank (lowest index).
    live_score = nl.where(alive, score, -np.inf)
    _, top = _max_over_all(live_score, ones)
    is_top = nl.multiply(_with_column(live_score, nl.equal, top), alive)
    best_rank, best_rank_everywhere = _max_over_all(nl.where(is_top, rank, 0.0), ones)
    chosen = _with_column(rank, nl.equal, best_rank_everywhere)

    # 3. Its features (x1, y1, x2, y2, area[, category]) on every partition.
    features = feature.shape[2]
    by_feature = feature.permute((0, 2, 1))  # [P, features, C]: sum over the boxes
    mask = chosen.expand_dim(1).broadcast(1, features)
    partial = nl.sum(nl.where(mask, by_feature, 0.0), axis=2)
    box = nl.ndarray((1, features), dtype=nl.float32)
    nisa.tensor_partition_reduce(dst=box, op=nl.add, data=partial)
    box = _on_all_partitions(box, ones)

    # 4. IoU with every box (0 where the union is not positive); remove the box itself and
    # the boxes it suppresses.
    x1, y1, x2, y2, area = (feature[:, :, k] for k in range(5))
    inter_w = nl.subtract(
        _with_column(x2, nl.minimum, box[:, 2:3]), _with_column(x1, nl.maximum, box[:, 0:1])
    )
    inter_h = nl.subtract(
        _with_column(y2, nl.minimum, box[:, 3:4]), _with_column(y1, nl.maximum, box[:, 1:2])
    )
    inter = nl.multiply(nl.maximum(inter_w, 0.0), nl.maximum(inter_h, 0.0))
    union = nl.subtract(_with_column(area, nl.add, box[:, 4:5]), inter)
    positive = nl.greater(union, 0.0)
    iou = nl.divide(inter, nl.where(positive, union, 1.0))
    suppress = nl.multiply(nl.greater(iou, iou_threshold), positive)
    if features == 6:
        suppress = nl.multiply(suppress, _with_column(feature[:, :, 5], nl.equal, box[:, 5:6]))
    alive = nl.greater(alive, nl.maximum(suppress, chosen))  # alive and not removed (0/1)
    return alive, best_rank


@nki.jit
def nms_kernel(
    boxes: Any,
    scores: Any,
    categories: Any,
    iou_threshold: float,
    score_threshold: float,
    steps: int,
) -> Any:
    """Greedy NMS of every image.

    Args:
      boxes: ``[B, N, 4]`` float32/bfloat16/float16 (HBM).
      scores: ``[B, N]`` same dtypes.
      categories: ``[B, N]`` float32 category ids (integers below 2**24), or None.
      iou_threshold: float32; a box is suppressed by IoU strictly greater.
      score_threshold: float32; boxes with lower (or NaN) scores are never kept.
      steps: ``min(max_output_size, N)``.

    Returns:
      ``(indices [B, steps] int32`` padded with -1, ``num_valid [B, 1] int32)``.
    """
    batch, n = scores.shape
    columns = math.ceil(n / PMAX)
    rows = math.ceil(n / columns)
    features = 5 if categories is None else 6  # x1, y1, x2, y2, area[, category]
    indices = nl.ndarray((batch, steps), dtype=nl.int32, buffer=nl.shared_hbm)
    num_valid = nl.ndarray((batch, 1), dtype=nl.int32, buffer=nl.shared_hbm)

    # rank = N - index: the highest rank is the lowest index; padding slots get rank <= 0.
    rank = nl.ndarray((rows, columns), dtype=nl.float32)
    nisa.iota(rank, [[-1, columns]], offset=n, channel_multiplier=-columns)
    real = nl.greater(rank, 0.0)
    ones = nl.ndarray((1, rows), dtype=nl.float32)
    nisa.memset(ones, 1.0)

    for b in range(batch):
        raw = nl.ndarray((rows, columns, 4), dtype=nl.float32)
        nisa.memset(raw, 0.0)
        _load_partition_major(raw, boxes[b], n, columns)
        score = nl.ndarray((rows, columns), dtype=nl.float32)
        nisa.memset(score, 0.0)
        _load_partition_major(score, scores[b], n, columns)

        # Per box: x1, y1, x2, y2 (0 for a box with a non-finite coordinate), area, category.
        feature = nl.ndarray((rows, columns, features), dtype=nl.float32)
        nisa.memset(feature, 0.0)
        finite = nl.equal(nl.sum(nl.multiply(raw, 0.0), axis=2), 0.0, dtype=nl.uint8)
        nisa.tensor_copy_predicated(
            dst=feature[:, :, 0:4], src=raw, predicate=finite.expand_dim(2).broadcast(2, 4)
        )
        width = nl.subtract(feature[:, :, 2], feature[:, :, 0])
        height = nl.subtract(feature[:, :, 3], feature[:, :, 1])
        nisa.tensor_tensor(dst=feature[:, :, 4], data1=width, data2=height, op=nl.multiply)
        if categories is not None:
            _load_partition_major(feature[:, :, 5], categories[b], n, columns)

        alive = nl.multiply(real, nl.greater_equal(score, score_threshold))  # NaN: never
        count = nl.ndarray((1, 1), dtype=nl.float32)
        nisa.memset(count, 0.0)
        for block_start in range(0, steps, OUTPUT_BLOCK):
            block = min(OUTPUT_BLOCK, steps - block_start)
            picked = nl.ndarray((1, block), dtype=nl.float32)
            nisa.memset(picked, -1.0)
            for slot in range(block):
                alive, best_rank = _select_next(alive, score, rank, ones, feature, iou_threshold)
                # Record index = N - rank when a box was found (rank > 0).
                found = nl.greater(best_rank, 0.0, dtype=nl.uint8)
                index = nl.ndarray((1, 1), dtype=nl.float32)
                nisa.tensor_scalar(index, best_rank, nl.subtract, float(n), reverse0=True)
                nisa.tensor_copy_predicated(
                    dst=picked[:, slot : slot + 1], src=index, predicate=found
                )
                nisa.tensor_tensor(dst=count, data1=count, data2=found, op=nl.add)
            nl.store(
                indices[b : b + 1, block_start : block_start + block],
                nl.copy(picked, dtype=nl.int32),
            )
        nl.store(num_valid[b : b + 1, :], nl.copy(count, dtype=nl.int32))
    return indices, num_valid


def _float32_at_least(value: float) -> np.float32:
    """The smallest float32 >= ``value``: ``score >= it`` in float32 decides exactly as
    ``score >= value`` in float64 for float32 scores."""
    rounded = np.float32(value)
    if float(rounded) < value:
        rounded = np.nextafter(rounded, np.float32(np.inf))
    return rounded


@BACKEND.implements(ops.nms)
def nms(
    boxes: np.ndarray,
    scores: np.ndarray,
    categories: np.ndarray | None,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``[B, N, 4]``, ``[B, N]`` -> (``[B, max_output_size]`` int32, ``[B]`` int32)."""
    batch, n = scores.shape
    if n > MAX_BOXES:
        raise ValueError(f"the nki NMS kernel takes N <= {MAX_BOXES} boxes per image, got {n}")
    category_ids = None
    if categories is not None:
        # Dense ids per image (0, 1, ... < N): equal exactly when the categories are, and
        # exact in float32.
        category_ids = np.stack(
            [np.unique(row, return_inverse=True)[1].reshape(n) for row in categories]
        ).astype(np.float32)
    steps = min(max_output_size, n)
    picked, num_valid = run(
        nms_kernel,
        float_input(boxes),
        float_input(scores),
        category_ids,
        iou_threshold=np.float32(iou_threshold),
        score_threshold=_float32_at_least(score_threshold),
        steps=steps,
    )
    indices = np.full((batch, max_output_size), -1, np.int32)
    indices[:, :steps] = picked
    return indices, num_valid.reshape(batch)
