"""Greedy NMS on the native CPU kernel (``nms.cpp``): one function for JAX arrays (XLA's FFI)
and numpy arrays (the host). Decisions are made in float64 (exactly the reference's),
whatever the input dtype."""

from __future__ import annotations

from typing import Any

import numpy as np

from asickernels.backends.cpu import BACKEND, _library
from asickernels.kernels import public as ops
from asickernels.kernels.declaration import Array
from asickernels.kernels.registry import FLOAT32_AND_64


@BACKEND.implements(ops.nms, dtypes=FLOAT32_AND_64)
@BACKEND.host_twin(ops.nms)
def nms(
    boxes: Array,
    scores: Array,
    categories: Array | None,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float,
) -> Any:
    """``boxes [B, N, 4]``, ``scores [B, N]``, ``categories [B, N]`` int32 or None ->
    (``indices [B, max_output_size]`` int32 padded with -1, ``num_valid [B]`` int32)."""
    arrays = _library.float_arrays(boxes, scores)
    if categories is not None:
        arrays.append(_library.convert(categories, np.int32))
    batch = tuple(scores.shape[:-1])
    return _library.call(
        "nms" if categories is None else "batched_nms",
        arrays,
        [((*batch, max_output_size), np.int32), (batch, np.int32)],
        iou_threshold=iou_threshold,
        max_output_size=max_output_size,
        score_threshold=score_threshold,
    )
