"""Greedy NMS on the native CPU kernel: JAX (FFI) and host (numpy) entry points. Decisions
are made in float64 (exactly the reference's), whatever the input dtype."""

from __future__ import annotations

from typing import Unpack

import jax
import jax.numpy as jnp
import numpy as np

from asickernels.backends.cpu import BACKEND, _library
from asickernels.kernels.nms import NmsStatics, nms_statics
from asickernels.kernels.registry import FLOAT32_AND_64

# asickernels_cpu_nms (csrc/nms.cpp): dtype code, boxes, scores, categories or null, batch,
# n, iou_threshold, max_output_size, score_threshold, indices, num_valid.
_HOST_ARGTYPES = (
    _library.INT, *[_library.POINTER] * 3, _library.INT64, _library.INT64, _library.DOUBLE,
    _library.INT64, _library.DOUBLE, *[_library.POINTER] * 2,
)  # fmt: skip


@BACKEND.implements("nms", dtypes=FLOAT32_AND_64)
def nms(
    boxes: jax.Array,
    scores: jax.Array,
    categories: jax.Array | None,
    **statics: Unpack[NmsStatics],
) -> tuple[jax.Array, jax.Array]:
    """``boxes [B, N, 4]``, ``scores [B, N]``, ``categories [B, N]`` int32 or None ->
    (``indices [B, max_output_size]`` int32 padded with -1, ``num_valid [B]`` int32)."""
    iou_threshold, max_output_size, score_threshold = nms_statics(statics)
    dtype = _library.float_kernel_dtype(boxes.dtype, scores.dtype)
    arrays = [jnp.asarray(boxes).astype(dtype), jnp.asarray(scores).astype(dtype)]
    kind = "nms"
    if categories is not None:
        arrays.append(jnp.asarray(categories).astype(jnp.int32))
        kind = "batched_nms"
    batch_shape = tuple(scores.shape[:-1])
    results = (
        jax.ShapeDtypeStruct(batch_shape + (max_output_size,), jnp.int32),
        jax.ShapeDtypeStruct(batch_shape, jnp.int32),
    )
    call = jax.ffi.ffi_call(
        _library.ffi_target(f"{kind}_{_library.FLOAT_SUFFIX[dtype]}"),
        results,
        vmap_method="broadcast_all",
    )
    indices, num_valid = call(
        *arrays,
        iou_threshold=np.float64(iou_threshold),
        max_output_size=np.int64(max_output_size),
        score_threshold=np.float64(score_threshold),
    )
    return indices, num_valid


@BACKEND.host_twin("nms")
def nms_host(
    boxes: np.ndarray,
    scores: np.ndarray,
    categories: np.ndarray | None,
    **statics: Unpack[NmsStatics],
) -> tuple[np.ndarray, np.ndarray]:
    """Host twin of :func:`nms`: numpy in, numpy out (no copies of inputs that are already
    C-contiguous and of the kernel dtype)."""
    iou_threshold, max_output_size, score_threshold = nms_statics(statics)
    boxes, scores = _library.float_host_arrays(boxes, scores)
    if categories is not None:
        categories = np.ascontiguousarray(categories, np.int32)
    batch, n = scores.shape
    trailing = (batch, n, float(iou_threshold), int(max_output_size), float(score_threshold))
    outputs = [((batch, max_output_size), np.dtype(np.int32)), ((batch,), np.dtype(np.int32))]
    return _library.run_entry(  # type: ignore[no-any-return]
        _library.host_entry("nms", *_HOST_ARGTYPES),
        (_library.FLOAT_CODES[boxes.dtype],),
        (boxes, scores, categories),
        trailing,
        outputs,
    )
