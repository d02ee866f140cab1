"""int8 x int8 matmul with exact int32 accumulation, optional dequantization scales, and
symmetric int8 quantization."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from asickernels.kernels import _checks, registry

# The largest K for which any int8 x int8 dot product fits in int32: |sum| <= K * 128 * 128.
INT8_MATMUL_MAX_K = (2**31 - 1) // (128 * 128)
_OUT_DTYPES = (np.dtype(np.int32),) + _checks.FLOAT_DTYPES


def int8_matmul(
    x: Any,
    y: Any,
    *,
    x_scale: Any = None,
    y_scale: Any = None,
    out_dtype: Any = None,
    backend: str | None = None,
    config: Any = None,
) -> jax.Array:
    """``x @ y`` for int8 ``x [M, K]`` and ``y [K, N]``, accumulated exactly in int32.

    Args:
      x_scale: None, a scalar, or ``[M]`` per-row scales of ``x``.
      y_scale: None, a scalar, or ``[N]`` per-column scales of ``y``.
      out_dtype: without scales, None or int32 gives the exact int32 product; a float dtype
        (or any scale) gives ``acc * x_scale[:, None] * y_scale[None, :]`` in ``out_dtype``
        (default float32), computed in float32.
      backend, config: see :func:`asickernels.giou`.

    Returns:
      ``[M, N]`` int32, or ``out_dtype``.

    Raises:
      ValueError: for an int32 result with ``K > INT8_MATMUL_MAX_K`` (131071), where the
        int32 sum could overflow. With scales, larger K is split into exact int32 chunks
        whose dequantized partial products are summed in float32.
    """
    x = _checks.as_array(x, "x")
    y = _checks.as_array(y, "y")
    for name, array in (("x", x), ("y", y)):
        if array.dtype != np.int8:
            raise TypeError(f"{name} must be int8, got dtype {array.dtype}")
        if array.ndim != 2:
            raise ValueError(f"{name} must be 2-D, got shape {tuple(array.shape)}")
    (m, k), (k2, n) = x.shape, y.shape
    if k != k2:
        raise ValueError(
            f"x [M, K] and y [K, N] disagree on K: {tuple(x.shape)} @ {tuple(y.shape)}"
        )
    scaled = (
        x_scale is not None
        or y_scale is not None
        or (out_dtype is not None and np.dtype(out_dtype) != np.int32)
    )
    out = (
        np.dtype(out_dtype)
        if out_dtype is not None
        else np.dtype(np.float32 if scaled else np.int32)
    )
    if out not in _OUT_DTYPES or (scaled and out == np.int32):
        raise TypeError(
            f"out_dtype must be int32 (unscaled) or a float dtype, got {out}"
            + (" with scales" if scaled and out == np.int32 else "")
        )
    x_scale = _scale(x_scale, m, "x_scale", "M") if scaled else None
    y_scale = _scale(y_scale, n, "y_scale", "N") if scaled else None
    if not scaled and k > INT8_MATMUL_MAX_K:
        raise ValueError(
            f"K = {k} exceeds {INT8_MATMUL_MAX_K}, beyond which an int32 accumulator can "
            "overflow; pass scales (or a float out_dtype) to have K split into exact chunks"
        )
    chosen = registry.resolve("int8_matmul", backend, [x, y])
    if m == 0 or n == 0 or k == 0:
        return jnp.zeros((m, n), out)
    impl = registry.implementation("int8_matmul", chosen.name)
    x, y, x_scale, y_scale = registry.to_backend_arrays(chosen, [x, y, x_scale, y_scale])
    if k <= INT8_MATMUL_MAX_K:
        result = impl(x, y, x_scale=x_scale, y_scale=y_scale, out_dtype=out, config=config)
        return registry.to_jax(result, out)
    total = None
    for start in range(0, k, INT8_MATMUL_MAX_K):
        stop = min(start + INT8_MATMUL_MAX_K, k)
        part = impl(
            x[:, start:stop],
            y[start:stop],
            x_scale=x_scale,
            y_scale=y_scale,
            out_dtype=np.dtype(np.float32),
            config=config,
        )
        part = registry.to_jax(part, np.float32)
        total = part if total is None else total + part
    return registry.to_jax(total, out)


def _scale(scale: Any, length: int, name: str, dim: str) -> Any:
    """A ``[length]`` float32 scale from None (ones), a scalar, or a ``[length]`` array."""
    if scale is None:
        return np.ones((length,), np.float32)
    scale = _checks.as_array(scale, name)
    _checks.check_float(scale, name)
    if scale.ndim == 0:
        return jnp.broadcast_to(scale.astype(jnp.float32), (length,))
    if tuple(scale.shape) != (length,):
        raise ValueError(
            f"{name} must be a scalar or have shape [{dim}] = ({length},), got {tuple(scale.shape)}"
        )
    return scale.astype(np.float32)


def quantize_int8(x: Any, axis: int | None = None) -> tuple[jax.Array, jax.Array]:
    """Symmetric int8 quantization.

    Args:
      x: float array of finite values (a non-finite value makes its channel's result
        meaningless; it is not checked, so that this works under ``jit``).
      axis: the channel axis that keeps its own scale (``0`` for per-row scales of an
        ``[M, K]`` matrix, ``1`` for per-column scales of a ``[K, N]`` one); None for one
        scale for the whole tensor.

    Returns:
      ``(q, scale)``: ``q`` int8 of ``x``'s shape in ``[-127, 127]``, ``scale`` float32
      ``[x.shape[axis]]`` (or ``()``) with ``x ~= q * scale`` along ``axis``;
      ``scale = max|x| / 127`` over the other axes (1 where that maximum is 0), and
      ``q = round_half_even(x / scale)``. Feed the scales to :func:`int8_matmul`.
    """
    x = _checks.as_array(x, "x")
    _checks.check_float(x, "x")
    if axis is not None:
        axis = _checks.static_int(axis, "axis", low=-x.ndim)
        if axis >= x.ndim:
            raise ValueError(f"axis {axis} is out of range for an array of rank {x.ndim}")
        axis %= x.ndim
    values = jnp.asarray(x).astype(jnp.float32)
    reduce_axes = tuple(i for i in range(values.ndim) if i != axis)
    amax = jnp.max(jnp.abs(values), axis=reduce_axes, initial=0.0)
    # amax / 127 underflows to 0 in float32 for amax below ~1.5e-36: keep it a normal float.
    scale = jnp.where(amax > 0, jnp.maximum(amax / 127.0, jnp.finfo(jnp.float32).tiny), 1.0)
    broadcast = scale if axis is None else jnp.expand_dims(scale, reduce_axes)
    q = jnp.clip(jnp.round(values / broadcast), -127, 127).astype(jnp.int8)
    return q, scale.astype(jnp.float32)
