"""Greedy NMS on the native CPU kernel: JAX (FFI) and host (numpy) entry points. Decisions
are made in float64 (exactly the reference's), whatever the input dtype."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from asickernels.backends.cpu import _library
from asickernels.kernels.declaration import host_empty

_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


def nms(
    boxes: jax.Array,
    scores: jax.Array,
    categories: jax.Array | None,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float,
    config: Any = None,
) -> tuple[jax.Array, jax.Array]:
    """``boxes [B, N, 4]``, ``scores [B, N]``, ``categories [B, N]`` int32 or None ->
    (``indices [B, max_output_size]`` int32 padded with -1, ``num_valid [B]`` int32)."""
    _library.check_config(config)
    _library.ffi_targets()
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
        _library.ffi_name(f"{kind}_{_SUFFIX[dtype]}"), results, vmap_method="broadcast_all"
    )
    indices, num_valid = call(
        *arrays,
        iou_threshold=np.float64(iou_threshold),
        max_output_size=np.int64(max_output_size),
        score_threshold=np.float64(score_threshold),
    )
    return indices, num_valid


def nms_host(
    boxes: np.ndarray,
    scores: np.ndarray,
    categories: np.ndarray | None,
    *,
    iou_threshold: float,
    max_output_size: int,
    score_threshold: float,
    config: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Host twin of :func:`nms`: numpy in, numpy out."""
    _library.check_config(config)
    dtype = _library.float_kernel_dtype(boxes.dtype, scores.dtype)
    boxes = np.ascontiguousarray(boxes, dtype)
    scores = np.ascontiguousarray(scores, dtype)
    if categories is not None:
        categories = np.ascontiguousarray(categories, np.int32)
    batch, n = scores.shape
    indices = host_empty((batch, max_output_size), np.int32)
    num_valid = host_empty((batch,), np.int32)
    _library.check(
        _library.library().asickernels_cpu_nms(
            _library.FLOAT_CODES[dtype],
            _library.address(boxes),
            _library.address(scores),
            _library.address(categories),
            batch,
            n,
            float(iou_threshold),
            int(max_output_size),
            float(score_threshold),
            _library.address(indices),
            _library.address(num_valid),
        )
    )
    return indices, num_valid
