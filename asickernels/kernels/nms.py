"""Greedy non-maximum suppression with static output shapes, per image and per category."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from asickernels.kernels import _checks, registry


def nms(
    boxes: Any,
    scores: Any,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    backend: str | None = None,
    config: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """Greedy NMS (torchvision's rule), with a static output shape.

    Boxes are visited by descending score (equal scores: lower index first); a box is
    suppressed when its IoU with an already kept box is strictly greater than
    ``iou_threshold``. Boxes with NaN scores or scores below ``score_threshold`` are never
    kept. Every leading batch element is independent.

    Args:
      boxes: ``[..., N, 4]`` float boxes ``(x1, y1, x2, y2)``; any N >= 0.
      scores: ``[..., N]`` float scores.
      iou_threshold: Python float in ``[0, 1]``.
      max_output_size: Python int >= 0; the output length.
      score_threshold: Python float or None (no threshold).
      backend, config: see :func:`asickernels.giou`.

    Returns:
      ``(indices, num_valid)``: ``indices [..., max_output_size]`` int32 box indices in
      selection order, padded with -1; ``num_valid [...]`` int32 count of real entries.
    """
    return _nms(
        boxes, scores, None, iou_threshold, max_output_size, score_threshold, backend, config
    )


def batched_nms(
    boxes: Any,
    scores: Any,
    idxs: Any,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
    backend: str | None = None,
    config: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """Per-category NMS, as ``torchvision.ops.batched_nms`` defines it: boxes only suppress
    boxes of the same category (``idxs [..., N]``, integer). Output as :func:`nms`: kept
    boxes of all categories in descending score order."""
    return _nms(
        boxes, scores, idxs, iou_threshold, max_output_size, score_threshold, backend, config
    )


def _nms(
    boxes: Any,
    scores: Any,
    categories: Any,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None,
    backend: str | None,
    config: Any,
) -> tuple[jax.Array, jax.Array]:
    boxes = _checks.as_array(boxes, "boxes")
    scores = _checks.as_array(scores, "scores")
    _checks.check_boxes(boxes, "boxes", min_ndim=2)
    _checks.check_float(scores, "scores")
    if tuple(scores.shape) != tuple(boxes.shape[:-1]):
        raise ValueError(
            f"scores must have shape boxes.shape[:-1] = {tuple(boxes.shape[:-1])}, "
            f"got {tuple(scores.shape)}"
        )
    if categories is not None:
        categories = _checks.as_array(categories, "idxs")
        if tuple(categories.shape) != tuple(scores.shape):
            raise ValueError(
                f"idxs must have the shape of scores {tuple(scores.shape)}, "
                f"got {tuple(categories.shape)}"
            )
        if not np.issubdtype(categories.dtype, np.integer):
            raise TypeError(f"idxs must be an integer array, got dtype {categories.dtype}")
    iou_threshold = _checks.static_float(iou_threshold, "iou_threshold", 0.0, 1.0)
    max_output_size = _checks.static_int(max_output_size, "max_output_size")
    threshold = (
        -math.inf
        if score_threshold is None
        else _checks.static_float(score_threshold, "score_threshold")
    )

    batch_shape = tuple(scores.shape[:-1])
    n = scores.shape[-1]
    batch = _checks.size(batch_shape)
    chosen = registry.resolve("nms", backend, [boxes, scores])
    if batch == 0 or n == 0 or max_output_size == 0:
        return (
            jnp.full(batch_shape + (max_output_size,), -1, jnp.int32),
            jnp.zeros(batch_shape, jnp.int32),
        )
    boxes, scores, categories = registry.to_backend_arrays(chosen, [boxes, scores, categories])
    if categories is not None:
        categories = categories.reshape(batch, n).astype(np.int32)
    indices, num_valid = registry.implementation("nms", chosen.name)(
        boxes.reshape(batch, n, 4),
        scores.reshape(batch, n),
        categories,
        iou_threshold=iou_threshold,
        max_output_size=max_output_size,
        score_threshold=threshold,
        config=config,
    )
    return (
        registry.to_jax(indices, jnp.int32, batch_shape + (max_output_size,)),
        registry.to_jax(num_valid, jnp.int32, batch_shape),
    )
