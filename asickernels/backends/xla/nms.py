"""Greedy NMS in ``jax.numpy``: candidates sorted by score, one kept box per step of a
``while_loop``, keep flags compacted into padded indices."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from asickernels.backends.xla import BACKEND, compute_dtype
from asickernels.kernels import public as ops
from asickernels.kernels.registry import FLOAT32_AND_64


class Candidates(NamedTuple):
    """One image's boxes in visiting order (descending score, ties by index).

    order: ``[N]`` int32 original index of each sorted position.
    boxes: ``[N, 4]`` sorted boxes (float32, or float64 for float64 inputs); non-finite boxes replaced by ``(0, 0, 0, 0)``,
      which has IoU 0 with every box, as the reference defines for them.
    eligible: ``[N]`` bool, score not NaN and ``>= score_threshold``.
    categories: ``[N]`` int32 sorted categories (zeros for plain NMS).
    """

    order: jax.Array
    boxes: jax.Array
    eligible: jax.Array
    categories: jax.Array


def _sort_candidates(
    boxes: jax.Array, scores: jax.Array, categories: jax.Array | None, score_threshold: float
) -> Candidates:
    """Sorts one image's ``boxes [N, 4]``, ``scores [N]`` for greedy NMS."""
    n = scores.shape[0]
    dtype = compute_dtype(boxes, scores)
    scores = scores.astype(dtype)
    eligible = ~jnp.isnan(scores) & (scores >= score_threshold)
    # + 0.0 folds -0.0 into 0.0: XLA's sort orders -0.0 before 0.0, the reference does not.
    key = jnp.where(eligible, -(scores + 0.0), jnp.inf)
    _, order = lax.sort((key, jnp.arange(n, dtype=jnp.int32)), num_keys=1, is_stable=True)
    sorted_boxes = boxes.astype(dtype)[order]
    finite = jnp.all(jnp.isfinite(sorted_boxes), axis=1, keepdims=True)
    cats = jnp.zeros((n,), jnp.int32) if categories is None else categories.astype(jnp.int32)
    return Candidates(order, jnp.where(finite, sorted_boxes, 0.0), eligible[order], cats[order])


def _iou_with(box: jax.Array, boxes: jax.Array) -> jax.Array:
    """NMS IoU of ``box [4]`` with ``boxes [N, 4]`` (0 where the union is not > 0)."""
    iw = jnp.maximum(jnp.minimum(box[2], boxes[:, 2]) - jnp.maximum(box[0], boxes[:, 0]), 0.0)
    ih = jnp.maximum(jnp.minimum(box[3], boxes[:, 3]) - jnp.maximum(box[1], boxes[:, 1]), 0.0)
    inter = iw * ih
    union = (
        (box[2] - box[0]) * (box[3] - box[1])
        + (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        - inter
    )
    return jnp.where(union > 0, inter / jnp.where(union > 0, union, 1.0), 0.0)


def _indices_from_keep(
    order: jax.Array, keep: jax.Array, max_output_size: int
) -> tuple[jax.Array, jax.Array]:
    """Keep flags over sorted positions -> (``[max_output_size]`` original indices in
    selection order, padded with -1; kept count, capped at ``max_output_size``)."""
    position = jnp.cumsum(keep.astype(jnp.int32)) - 1
    slot = jnp.where(keep & (position < max_output_size), position, max_output_size)
    indices = jnp.full((max_output_size + 1,), -1, jnp.int32).at[slot].set(order, mode="drop")
    count = jnp.minimum(jnp.sum(keep.astype(jnp.int32)), max_output_size)
    return indices[:max_output_size], count


def _greedy_keep(cand: Candidates, iou_threshold: float, max_output_size: int) -> jax.Array:
    """Keep flags over one image's sorted candidates: greedy NMS, one kept box per step."""

    def keep_next(
        state: tuple[jax.Array, jax.Array, jax.Array],
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        alive, keep, count = state
        first = jnp.argmax(alive)  # sorted order: the first alive box is the best remaining
        suppress = (_iou_with(cand.boxes[first], cand.boxes) > iou_threshold) & (
            cand.categories == cand.categories[first]
        )
        return (
            alive & ~suppress & (jnp.arange(alive.shape[0]) != first),
            keep.at[first].set(True),
            count + 1,
        )

    def has_more(state: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
        alive, _, count = state
        return jnp.any(alive) & (count < max_output_size)

    _, keep, _ = lax.while_loop(
        has_more, keep_next, (cand.eligible, jnp.zeros_like(cand.eligible), jnp.int32(0))
    )
    return keep


@BACKEND.implements(ops.nms, dtypes=FLOAT32_AND_64)
def nms(
    boxes: jax.Array,
    scores: jax.Array,
    categories: jax.Array | None,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float,
) -> tuple[jax.Array, jax.Array]:
    """``[B, N, 4]``, ``[B, N]`` -> (``[B, max_output_size]`` int32, ``[B]`` int32)."""

    def one(b: jax.Array, s: jax.Array, c: jax.Array | None) -> tuple[jax.Array, jax.Array]:
        cand = _sort_candidates(b, s, c, score_threshold)
        keep = _greedy_keep(cand, iou_threshold, max_output_size)
        return _indices_from_keep(cand.order, keep, max_output_size)

    if categories is None:
        return jax.vmap(lambda b, s: one(b, s, None))(boxes, scores)
    return jax.vmap(one)(boxes, scores, categories)
