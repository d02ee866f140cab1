"""Static-shape post-processing for object detectors, in JAX.

The steps torchvision's detection models run after their heads (score thresholds, per-level
top-k, removal of small boxes, per-class NMS, ``detections_per_img``) written with fixed
shapes: a boolean mask marks the real candidates instead of indexing them out, and results
are padded to a fixed length with a count. So they trace under ``jax.jit`` and run inside
one XLA program with no host round trip; :mod:`asickernels.torch.detection` runs the very
same functions inside torch_xla's graph (``call_jax``) and on CPU tensors.

Every function is batched over a leading image axis ``B``. Box decoding is the model's own
(torchvision's box coders on the torch side): these functions only select.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from asickernels.kernels._checks import as_array, check_boxes, check_float, static_float, static_int
from asickernels.kernels.nms import batched_nms

Array = jax.Array | np.ndarray


def top_candidates(scores: Array, *, k: int, score_threshold: float) -> tuple[jax.Array, jax.Array]:
    """The ``k`` best scores above ``score_threshold`` per image, as torchvision's
    RetinaNet and FCOS take them per feature level (``scores > threshold``, then ``topk``).

    Args:
      scores: ``[B, N]`` float scores; NaN counts as below every threshold.
      k: static int in ``[0, N]``.
      score_threshold: static float; a score must be strictly greater.

    Returns:
      ``(indices, valid)``: ``indices [B, k]`` int32 positions in ``scores``, best first;
      ``valid [B, k]`` bool, False where fewer than ``k`` scores pass (those positions are
      padding: some other index, which the caller must ignore).

    Raises:
      TypeError: ``scores`` is not a float array, ``k`` not an int or ``score_threshold``
        not a number (None included).
      ValueError: ``scores`` is not 2-D, ``k`` is outside ``[0, N]`` or the threshold NaN.
    """
    scores = as_array(scores, "scores")
    check_float(scores, "scores")
    if scores.ndim != 2:
        raise ValueError(f"scores must have shape [B, N], got {tuple(scores.shape)}")
    k = static_int(k, "k", 0, scores.shape[-1])
    score_threshold = static_float(score_threshold, "score_threshold")
    passing = scores > score_threshold
    masked = jnp.where(passing, scores, -jnp.inf)
    _, indices = lax.top_k(masked, k)
    return indices.astype(jnp.int32), jnp.take_along_axis(passing, indices, axis=-1)


def large_enough(boxes: Array, min_size: float) -> Array:
    """``[..., 4]`` float boxes -> ``[...]`` bool: width and height both ``>= min_size``
    (torchvision's ``remove_small_boxes``, as a mask).

    Raises:
      TypeError: ``boxes`` is not a float array or ``min_size`` not a number.
      ValueError: ``boxes`` is not ``[..., 4]`` or ``min_size`` is NaN.
    """
    boxes = as_array(boxes, "boxes")
    check_boxes(boxes, "boxes")
    min_size = static_float(min_size, "min_size")
    width = boxes[..., 2] - boxes[..., 0]
    height = boxes[..., 3] - boxes[..., 1]
    return (width >= min_size) & (height >= min_size)


def select_detections(
    boxes: Array,
    scores: Array,
    labels: Array,
    valid: Array,
    *,
    iou_threshold: float,
    max_detections: int,
    min_size: float | None = None,
    backend: str | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Per-image, per-class greedy NMS over the valid candidates, keeping the first
    ``max_detections`` (torchvision's ``batched_nms(...)[:detections_per_img]``).

    Args:
      boxes: ``[B, N, 4]`` float boxes ``(x1, y1, x2, y2)``.
      scores: ``[B, N]`` float scores.
      labels: ``[B, N]`` int32 classes; boxes of different classes never suppress each other.
      valid: ``[B, N]`` bool, the real candidates (the others are never kept).
      iou_threshold: static float in ``[0, 1]``.
      max_detections: static int, the output length ``D``.
      min_size: static float or None: candidates narrower or lower than it are dropped
        first (:func:`large_enough`).
      backend: the NMS backend (see :func:`asickernels.batched_nms`).

    Returns:
      ``(boxes [B, D, 4], scores [B, D], labels [B, D], count [B])``: the kept candidates in
      decreasing score order (equal scores: lower position first), the inputs' values
      exactly; past ``count`` (int32) boxes and scores are 0 and labels -1.

    Raises:
      TypeError: an array argument is not an array of its kind (float boxes and scores,
        integer labels, bool valid), or a static one not a number (None included, but for
        ``min_size`` and ``backend``).
      ValueError: the shapes disagree with ``boxes [B, N, 4]``, ``iou_threshold`` is
        outside ``[0, 1]`` or ``max_detections`` negative; an unknown ``backend``.
    """
    boxes = as_array(boxes, "boxes")
    check_boxes(boxes, "boxes")
    if boxes.ndim != 3:
        raise ValueError(f"boxes must have shape [B, N, 4], got {tuple(boxes.shape)}")
    scores, labels, valid = (
        _candidate_array(value, name, kind, boxes.shape[:2])
        for value, name, kind in (
            (scores, "scores", "f"),
            (labels, "labels", "iu"),
            (valid, "valid", "b"),
        )
    )
    max_detections = static_int(max_detections, "max_detections")
    if min_size is not None:
        valid = valid & large_enough(boxes, min_size)
    # NaN scores are never kept (asickernels.nms's contract): the mask as a score.
    masked = jnp.where(valid, scores, jnp.nan)
    indices, count = batched_nms(
        boxes,
        masked,
        labels,
        iou_threshold=iou_threshold,
        max_output_size=max_detections,
        backend=backend,
    )
    return (
        _gather_padded(boxes, indices, 0),
        _gather_padded(scores, indices, 0),
        _gather_padded(labels, indices, -1),
        count,
    )


def _candidate_array(value: object, name: str, kinds: str, shape: tuple[int, ...]) -> Array:
    """``value`` as a ``[B, N]`` array whose dtype kind is one of ``kinds`` (numpy's letters)."""
    array = as_array(value, name)
    if np.dtype(array.dtype).kind not in kinds:
        raise TypeError(f"{name} has dtype {array.dtype}, which is not one of kinds {kinds!r}")
    if tuple(array.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape [B, N] = {shape} (as boxes), got {array.shape}")
    return array


def _gather_padded(values: Array, indices: jax.Array, fill: int) -> jax.Array:
    """``values [B, N, ...]`` at ``indices [B, D]`` (-1 is padding: ``fill``) -> ``[B, D, ...]``."""
    expand = (slice(None), slice(None)) + (None,) * (values.ndim - 2)
    taken = jnp.take_along_axis(values, jnp.maximum(indices, 0)[expand], axis=1)
    return jnp.where((indices >= 0)[expand], taken, jnp.asarray(fill, values.dtype))
