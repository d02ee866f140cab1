"""Greedy non-maximum suppression with static output shapes, per image and per category:
the declarations and the float64 reference.

NMS IoU: ``inter / union`` when ``union > 0``, else 0; a box with a non-finite coordinate
has IoU 0 with every box. Greedy NMS visits eligible boxes (score not NaN and
``>= score_threshold``) by descending score, equal scores by ascending index, and keeps a
box unless its IoU with an already kept box of the same category is strictly greater than
``iou_threshold``; it stops after ``max_output_size`` boxes.

Where NMS is written, so what a change edits:

* its computation: this file (the reference and the doc), every backend's kernel (each
  module ``backends/<backend>/nms.py``: xla, cpu, pallas_tpu, nki and gpsimd; the cpu and
  gpsimd ones call the C++ of ``backends/cpu/nms.cpp`` and
  ``backends/gpsimd/csrc/nms.cpp``) and the cases that show the change
  (:mod:`asickernels.kernels.nms_cases`);
* a new argument, also: the declaration's parameters and checks here; every kernel's
  signature (each takes the checked statics as keyword arguments of the op's names) and
  the C++ a kernel hands them to (``backends/gpsimd/csrc/shape.cpp`` states the Neuron
  operator's signature); ``asickernels/torch/vision.py`` where torchvision's signature
  has it. The torch operator schema and the torch_xla kernels follow from the declaration
  at import; the torch functions and the SPMD wrappers are regenerated from it (``python
  -m asickernels.frontends.generate``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from asickernels.kernels import _checks
from asickernels.kernels.declaration import Array, Op, Plan, Spec, array, cast, static
from asickernels.kernels.registry import FLOAT32_AND_64, REFERENCE, Runner

# Indices are int32: an output position or a box index must fit.
_MAX_INT32 = 2**31 - 1


def _check_nms(
    boxes: Spec | None,
    scores: Spec | None,
    *,
    iou_threshold: object,
    max_output_size: object,
    score_threshold: object,
) -> Plan:
    boxes, scores = _checks.required(boxes, "boxes"), _checks.required(scores, "scores")
    _checks.check_boxes(boxes, "boxes", min_ndim=2)
    _checks.check_float(scores, "scores")
    if scores.shape != boxes.shape[:-1]:
        raise ValueError(
            f"scores must have shape boxes.shape[:-1] = {boxes.shape[:-1]}, got {scores.shape}"
        )
    max_outputs = _checks.static_int(max_output_size, "max_output_size", high=_MAX_INT32)
    batch, n = scores.shape[:-1], scores.shape[-1]
    if n > _MAX_INT32:
        raise ValueError(f"N = {n} boxes exceeds the int32 index range")
    int32 = np.dtype(np.int32)
    return Plan(
        _checks.float_compute_dtype(boxes, scores),
        (Spec(batch + (max_outputs,), int32), Spec(batch, int32)),
        {
            "iou_threshold": _checks.static_float(iou_threshold, "iou_threshold", 0.0, 1.0),
            "max_output_size": max_outputs,
            "score_threshold": -math.inf
            if score_threshold is None
            else _checks.static_float(score_threshold, "score_threshold"),
        },
        trivial=_checks.size(batch) == 0 or n == 0 or max_outputs == 0,
        fill=(-1, 0),
    )


def _check_batched_nms(
    boxes: Spec | None,
    scores: Spec | None,
    idxs: Spec | None,
    *,
    iou_threshold: object,
    max_output_size: object,
    score_threshold: object,
) -> Plan:
    plan = _check_nms(
        boxes,
        scores,
        iou_threshold=iou_threshold,
        max_output_size=max_output_size,
        score_threshold=score_threshold,
    )
    idxs = _checks.required(idxs, "idxs")
    assert scores is not None  # checked above
    if idxs.shape != scores.shape:
        raise ValueError(f"idxs must have the shape of scores {scores.shape}, got {idxs.shape}")
    if not np.issubdtype(idxs.dtype, np.integer):
        raise TypeError(f"idxs must be an integer array, got dtype {idxs.dtype}")
    return plan


def dense_ranks(xp: Any, ids: Array) -> Array:
    """int32 ranks of integer ids: equal ids get equal ranks, distinct ids distinct ones,
    so category identity survives over the whole int64 range (ranks < ``ids.size``)."""
    flat = ids.reshape(-1)
    return xp.searchsorted(xp.sort(flat), flat).astype(np.int32).reshape(ids.shape)


def int32_category_ids(xp: Any, ids: Array) -> Array:
    """Integer category ids as the kernels take them: int32, equal exactly when the ids are
    (the ids themselves when int32 holds them all, else their :func:`dense_ranks`)."""
    if np.can_cast(ids.dtype, np.int32):
        return cast(ids, np.int32)
    return dense_ranks(xp, ids)


def _rank_wide_ids(arrays: dict[str, Array | None]) -> dict[str, Array | None]:
    """Eager calls: 64-bit category ids become int32 dense ranks on the host, so the call
    needs no x64 mode (under a trace the ranks are computed in the graph)."""
    idxs = arrays.get("idxs")
    if idxs is None or not np.issubdtype(idxs.dtype, np.integer) or idxs.dtype.itemsize < 8:
        return arrays  # nothing to rank (validation refuses non-integer ids)
    return {**arrays, "idxs": dense_ranks(np, np.asarray(idxs))}


def _compute_nms(
    runner: Runner,
    plan: Plan,
    boxes: Array,
    scores: Array,
    idxs: Array | None = None,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float,
) -> tuple[Array, Array]:
    batch_shape = scores.shape[:-1]
    n = scores.shape[-1]
    batch = _checks.size(batch_shape)
    if plan.dtype == "float64":
        boxes, scores = cast(boxes, np.float64), cast(scores, np.float64)
    categories = None if idxs is None else int32_category_ids(runner.xp, idxs).reshape(batch, n)
    indices, num_valid = runner.kernel(nms)(
        boxes.reshape(batch, n, 4),
        scores.reshape(batch, n),
        categories,
        iou_threshold=iou_threshold,
        max_output_size=max_output_size,
        score_threshold=score_threshold,
    )
    return (
        cast(indices, np.int32).reshape(batch_shape + (max_output_size,)),
        cast(num_valid, np.int32).reshape(batch_shape),
    )


_NMS_STATICS = [
    static("iou_threshold", "float", bad=(None, "0.5", 1.5, math.nan)),
    static("max_output_size", "int", bad=(None, 2.0, True, -1)),
    static("score_threshold", "float?", None, bad=("0.1", [0.1])),
]


# -- the reference: the definition every backend is tested against -----------------------


def iou_one_to_many(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """NMS IoU (see this module's docstring) of one box ``[4]`` with ``boxes [K, 4]``, float64."""
    box = np.asarray(box, np.float64)
    boxes = np.asarray(boxes, np.float64)
    inter = np.maximum(0.0, np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]))
    inter = inter * np.maximum(
        0.0, np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1])
    )
    union = (
        (box[2] - box[0]) * (box[3] - box[1])
        + (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        - inter
    )
    finite = np.isfinite(box).all() & np.isfinite(boxes).all(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = np.where(finite & (union > 0), inter / np.where(union > 0, union, 1.0), 0.0)
    return iou


def greedy_nms(
    boxes: npt.ArrayLike,
    scores: npt.ArrayLike,
    categories: npt.ArrayLike | None,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Greedy NMS per batch element. ``boxes [B, N, 4]``, ``scores [B, N]``, ``categories
    [B, N]`` or None -> (``indices [B, max_output_size]`` int32 padded with -1, ``num_valid
    [B]`` int32)."""
    boxes = np.asarray(boxes, np.float64)
    scores = np.asarray(scores, np.float64)
    batch, n = scores.shape
    cats = np.zeros((batch, n), np.int64) if categories is None else np.asarray(categories)
    indices = np.full((batch, max_output_size), -1, np.int32)
    num_valid = np.zeros((batch,), np.int32)
    for b in range(batch):
        s = scores[b]
        eligible = ~np.isnan(s) & (s >= score_threshold)
        order = np.argsort(-s, kind="stable")
        kept: list[int] = []
        for i in order[eligible[order]]:
            if len(kept) == max_output_size:
                break
            if kept:
                same = cats[b, kept] == cats[b, i]
                if np.any(same & (iou_one_to_many(boxes[b, i], boxes[b, kept]) > iou_threshold)):
                    continue
            kept.append(int(i))
        indices[b, : len(kept)] = kept
        num_valid[b] = len(kept)
    return indices, num_valid


def _reference_nms(
    boxes: npt.ArrayLike,
    scores: npt.ArrayLike,
    idxs: npt.ArrayLike | None = None,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The float64 reference over the public signature (any batch shape)."""
    boxes, scores = np.asarray(boxes), np.asarray(scores)
    batch_shape, n = scores.shape[:-1], scores.shape[-1]
    batch = _checks.size(batch_shape)
    if batch == 0 or n == 0 or max_output_size == 0:
        return (
            np.full(batch_shape + (max_output_size,), -1, np.int32),
            np.zeros(batch_shape, np.int32),
        )
    indices, num_valid = greedy_nms(
        boxes.reshape(batch, n, 4),
        scores.reshape(batch, n),
        None if idxs is None else np.asarray(idxs).reshape(batch, n),
        iou_threshold=iou_threshold,
        max_output_size=max_output_size,
        score_threshold=-math.inf if score_threshold is None else score_threshold,
    )
    return indices.reshape(batch_shape + (max_output_size,)), num_valid.reshape(batch_shape)


_NMS_DOC = """Greedy NMS (torchvision's rule), with a static output shape.

    Boxes are visited by descending score (equal scores: lower index first); a box is
    suppressed when its IoU with an already kept box is strictly greater than
    ``iou_threshold``. Boxes with NaN scores or scores below ``score_threshold`` are never
    kept. Every leading batch element is independent. float64 boxes and scores are decided
    in float64.

    Args:
      boxes: ``[..., N, 4]`` float boxes ``(x1, y1, x2, y2)``; any N >= 0.
      scores: ``[..., N]`` float scores.
      iou_threshold: Python float in ``[0, 1]``.
      max_output_size: Python int in ``[0, 2**31 - 1]``; the output length.
      score_threshold: Python float or None (no threshold).
      backend, config: see :func:`asickernels.giou`.

    Returns:
      ``(indices, num_valid)``: ``indices [..., max_output_size]`` int32 box indices in
      selection order, padded with -1; ``num_valid [...]`` int32 count of real entries.
    """

nms = Op(
    "nms",
    [array("boxes", 2), array("scores", 1), *_NMS_STATICS],
    check=_check_nms,
    compute=_compute_nms,
    reference=_reference_nms,
    outputs=("indices", "num_valid"),
    preference=("cpu", "pallas_tpu", "gpsimd", "nki", "xla"),
    doc=_NMS_DOC,
)

batched_nms = Op(
    "batched_nms",
    [array("boxes", 2), array("scores", 1), array("idxs", 1), *_NMS_STATICS],
    check=_check_batched_nms,
    compute=_compute_nms,
    reference=_reference_nms,
    outputs=("indices", "num_valid"),
    prepare=_rank_wide_ids,
    kernel=nms,
    doc="""Per-category NMS, as ``torchvision.ops.batched_nms`` defines it: boxes only
    suppress boxes of the same category (``idxs [..., N]``, any integer dtype; ids keep
    their identity over the whole int64 range). Output as :func:`nms`: kept boxes of all
    categories in descending score order.""",
)

REFERENCE.implements(nms, dtypes=FLOAT32_AND_64)(greedy_nms)
