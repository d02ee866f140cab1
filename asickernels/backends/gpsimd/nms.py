"""Greedy NMS through the GpSimd kernel (``csrc/nms.cpp``): one image per core at a time."""

from __future__ import annotations

import numpy as np

from asickernels.backends.gpsimd import BACKEND, _library
from asickernels.kernels import public as ops

# float32 represents every integer up to 2**24 exactly.
_MAX_EXACT_RANKS = 2**24


def _scores_as_float32(scores: np.ndarray, score_threshold: float) -> tuple[np.ndarray, float]:
    """Scores the float32 kernel ranks and thresholds exactly as the float64 reference does.

    float16/bfloat16/float32 scores convert exactly. float64 scores that float32 would
    round together (turning an order into a tie) are replaced by their rank among all
    distinct scores, and the threshold by the rank of the first score >= it.
    """
    converted = scores.astype(np.float32)
    if scores.dtype != np.float64 or np.array_equal(converted, scores, equal_nan=True):
        return np.ascontiguousarray(converted), score_threshold
    valid = ~np.isnan(scores)
    distinct, ranks = np.unique(scores[valid], return_inverse=True)
    if distinct.size > _MAX_EXACT_RANKS:
        raise ValueError(
            f"gpsimd nms: {distinct.size} distinct float64 scores that float32 cannot order "
            f"exactly (at most {_MAX_EXACT_RANKS}); pass float32 scores"
        )
    ranked = np.full(scores.shape, np.nan, np.float32)
    ranked[valid] = ranks
    return ranked, float(np.searchsorted(distinct, score_threshold, side="left"))


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
    """``boxes [B, N, 4]``, ``scores [B, N]``, ``categories [B, N]`` int32 or None ->
    (``indices [B, max_output_size]`` int32 padded with -1, ``num_valid [B]`` int32).
    Boxes are computed in float32."""
    batch, n = scores.shape
    boxes32 = np.ascontiguousarray(boxes, dtype=np.float32)
    scores32, threshold = _scores_as_float32(np.asarray(scores), score_threshold)
    cats = (
        np.zeros((batch, n), np.int32)
        if categories is None
        else np.ascontiguousarray(categories, dtype=np.int32)
    )
    # Scalars go to the device as doubles, the only scalar dtype custom operators take;
    # max_output_size is an integer, exact in a double.
    scalars = (float(iou_threshold), float(max_output_size), float(threshold))
    if _library.on_neuron():
        out = _library.run_on_neuron("nms", boxes32, scores32, cats, *scalars)
    else:
        out = _library.host_library().nms(boxes32, scores32, cats, *scalars)
    return np.ascontiguousarray(out[:, 1:]), np.ascontiguousarray(out[:, 0])
