"""DETR's Hungarian matcher in JAX, on :func:`asickernels.linear_sum_assignment`: no host
round trip to SciPy, static shapes (targets padded, with a mask), jit-able.

The matching cost is DETR's (``facebookresearch/detr``, ``models/matcher.py``): for query
``q`` and target ``t`` of one image, ::

    cost = cost_bbox * |box_q - box_t|_1 - cost_class * softmax(logits_q)[label_t]
           - cost_giou * generalized_box_iou(xyxy(box_q), xyxy(box_t))

with boxes ``(cx, cy, w, h)`` (DETR's normalized format) and the GIoU through
:func:`asickernels.generalized_box_iou`. The PyTorch drop-in is
:class:`asickernels.torch.matcher.HungarianMatcher`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

import asickernels


def box_cxcywh_to_xyxy(boxes: ArrayLike) -> jax.Array:
    """``(cx, cy, w, h)`` -> ``(x1, y1, x2, y2)``, on the last axis."""
    cx, cy, w, h = jnp.moveaxis(jnp.asarray(boxes), -1, 0)
    return jnp.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], axis=-1)


def matching_cost(
    pred_logits: ArrayLike,
    pred_boxes: ArrayLike,
    target_labels: ArrayLike,
    target_boxes: ArrayLike,
    *,
    cost_class: float = 1.0,
    cost_bbox: float = 1.0,
    cost_giou: float = 1.0,
    backend: str | None = None,
) -> jax.Array:
    """DETR's matching cost ``[B, Q, T]`` (see the module docstring).

    Args:
      pred_logits: ``[B, Q, C]`` class logits (DETR's ``C`` includes "no object").
      pred_boxes: ``[B, Q, 4]`` predicted ``(cx, cy, w, h)``.
      target_labels: ``[B, T]`` integer class ids in ``[0, C)`` (padding: any valid id).
      target_boxes: ``[B, T, 4]`` target ``(cx, cy, w, h)``.
      cost_class, cost_bbox, cost_giou: the weights.
      backend: the backend of :func:`asickernels.generalized_box_iou`.
    """
    logits = jnp.asarray(pred_logits)
    boxes, targets = jnp.asarray(pred_boxes), jnp.asarray(target_boxes)
    labels = jnp.asarray(target_labels).astype(jnp.int32)
    prob = jax.nn.softmax(logits, axis=-1)
    class_cost = -jnp.take_along_axis(prob, labels[:, None, :], axis=-1)  # [B, Q, T]
    l1 = jnp.sum(jnp.abs(boxes[:, :, None, :] - targets[:, None, :, :]), axis=-1)
    giou = asickernels.generalized_box_iou(
        box_cxcywh_to_xyxy(boxes), box_cxcywh_to_xyxy(targets), backend=backend
    )
    return cost_bbox * l1 + cost_class * class_cost + cost_giou * -giou


def hungarian_match(
    pred_logits: ArrayLike,
    pred_boxes: ArrayLike,
    target_labels: ArrayLike,
    target_boxes: ArrayLike,
    target_mask: ArrayLike | None = None,
    *,
    cost_class: float = 1.0,
    cost_bbox: float = 1.0,
    cost_giou: float = 1.0,
    backend: str | None = None,
) -> tuple[jax.Array, jax.Array]:
    """DETR's matching with static shapes: :func:`matching_cost`, then
    :func:`asickernels.linear_sum_assignment` with the padded targets masked out.

    Args:
      target_mask: ``[B, T]`` bool, False for padded targets (None: all are real).
      backend: the backend of both ops (None: the selection policy's).
      the rest: as :func:`matching_cost`.

    Returns:
      ``(assignment [B, Q], num_assigned [B])`` int32: the target matched to each query, or
      -1; DETR's ``(index_i, index_j)`` of image ``b`` are ``i = nonzero(assignment[b] >= 0)``
      and ``j = assignment[b, i]``.
    """
    cost = matching_cost(
        pred_logits,
        pred_boxes,
        target_labels,
        target_boxes,
        cost_class=cost_class,
        cost_bbox=cost_bbox,
        cost_giou=cost_giou,
        backend=backend,
    )
    mask = None if target_mask is None else jnp.asarray(target_mask).astype(bool)
    return asickernels.linear_sum_assignment(cost, col_mask=mask, backend=backend)  # type: ignore[no-any-return]


def pad_targets(
    targets: Sequence[Mapping[str, Any]], dtype: Any = np.float32
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DETR's per-image targets (``{"labels": [T_i], "boxes": [T_i, 4]}``) as padded host
    arrays ``(labels [B, T], boxes [B, T, 4], mask [B, T])`` with ``T = max T_i`` (at least
    1, so that shapes stay non-empty)."""
    width = max([len(t["labels"]) for t in targets] + [1])
    labels = np.zeros((len(targets), width), np.int32)
    boxes = np.zeros((len(targets), width, 4), dtype)
    mask = np.zeros((len(targets), width), bool)
    for b, target in enumerate(targets):
        count = len(target["labels"])
        labels[b, :count] = np.asarray(target["labels"])
        boxes[b, :count] = np.asarray(target["boxes"])
        mask[b, :count] = True
    return labels, boxes, mask


def pairs_from_assignment(assignment: ArrayLike) -> list[tuple[np.ndarray, np.ndarray]]:
    """``assignment [B, Q]`` -> DETR's list of ``(index_i, index_j)`` int64 arrays, ``i``
    ascending (as SciPy returns them)."""
    rows = np.asarray(assignment)
    pairs = []
    for row in rows:
        i = np.flatnonzero(row >= 0).astype(np.int64)
        pairs.append((i, row[i].astype(np.int64)))
    return pairs


class HungarianMatcher:
    """DETR's ``HungarianMatcher`` for JAX arrays: ``matcher(outputs, targets)`` with
    ``outputs = {"pred_logits": [B, Q, C], "pred_boxes": [B, Q, 4]}`` and ``targets`` a list
    of ``{"labels": [T_i], "boxes": [T_i, 4]}`` returns DETR's list of ``(index_i,
    index_j)`` int64 numpy arrays. :func:`hungarian_match` is the static-shape variant
    (no host round trip, usable under ``jit``)."""

    def __init__(
        self,
        cost_class: float = 1.0,
        cost_bbox: float = 1.0,
        cost_giou: float = 1.0,
        *,
        backend: str | None = None,
    ) -> None:
        if cost_class == 0 and cost_bbox == 0 and cost_giou == 0:
            raise ValueError("all costs can't be 0")  # DETR's check
        self.cost_class, self.cost_bbox, self.cost_giou = cost_class, cost_bbox, cost_giou
        self.backend = backend

    def __call__(
        self, outputs: Mapping[str, ArrayLike], targets: Sequence[Mapping[str, Any]]
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        labels, boxes, mask = pad_targets(targets, jnp.asarray(outputs["pred_boxes"]).dtype)
        assignment, _ = hungarian_match(
            outputs["pred_logits"],
            outputs["pred_boxes"],
            labels,
            boxes,
            mask,
            cost_class=self.cost_class,
            cost_bbox=self.cost_bbox,
            cost_giou=self.cost_giou,
            backend=self.backend,
        )
        return pairs_from_assignment(assignment)
