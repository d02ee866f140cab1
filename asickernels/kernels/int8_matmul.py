"""int8 x int8 matmul with exact int32 accumulation, optional dequantization scales, and
symmetric int8 quantization: the declarations and their float64 references.

int8 matmul's reference: the exact integer product; with scales, ``acc * x_scale[:, None] *
y_scale[None, :]`` rounded once to ``out_dtype``.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from asickernels.kernels import _checks
from asickernels.kernels.declaration import Array, Op, Plan, Spec, array, cast, static
from asickernels.kernels.registry import REFERENCE, Runner

# The largest K for which any int8 x int8 dot product fits in int32: |sum| <= K * 128 * 128.
INT8_MATMUL_MAX_K = (2**31 - 1) // (128 * 128)
_OUT_DTYPES = (np.dtype(np.int32),) + _checks.FLOAT_DTYPES


def _check_scale(spec: Spec | None, length: int, name: str, dim: str) -> None:
    if spec is None:
        return
    _checks.check_float(spec, name)
    if spec.shape not in ((), (length,)):
        raise ValueError(
            f"{name} must be a scalar or have shape [{dim}] = ({length},), got {spec.shape}"
        )


def _check_int8_matmul(
    x: Spec | None,
    y: Spec | None,
    x_scale: Spec | None,
    y_scale: Spec | None,
    *,
    out_dtype: object,
) -> Plan:
    x, y = _checks.required(x, "x"), _checks.required(y, "y")
    for name, spec in (("x", x), ("y", y)):
        if spec.dtype != np.int8:
            raise TypeError(f"{name} must be int8, got dtype {spec.dtype}")
        if len(spec.shape) != 2:
            raise ValueError(f"{name} must be 2-D, got shape {spec.shape}")
    (m, k), (k2, n) = x.shape, y.shape
    if k != k2:
        raise ValueError(f"x [M, K] and y [K, N] disagree on K: {x.shape} @ {y.shape}")
    try:
        requested = None if out_dtype is None else np.dtype(out_dtype)  # type: ignore[call-overload]
    except TypeError:  # np.dtype refuses what is not a dtype
        raise TypeError(f"out_dtype must be a dtype, got {out_dtype!r}") from None
    scaled = x_scale is not None or y_scale is not None or requested not in (None, np.int32)
    out = requested or np.dtype(np.float32 if scaled else np.int32)
    if out not in _OUT_DTYPES or (scaled and out == np.int32):
        raise TypeError(
            f"out_dtype must be int32 (unscaled) or a float dtype, got {out}"
            + (" with scales" if scaled and out == np.int32 else "")
        )
    _check_scale(x_scale, m, "x_scale", "M")
    _check_scale(y_scale, n, "y_scale", "N")
    if not scaled and k > INT8_MATMUL_MAX_K:
        raise ValueError(
            f"K = {k} exceeds {INT8_MATMUL_MAX_K}, beyond which an int32 accumulator can "
            "overflow; pass scales (or a float out_dtype) to have K split into exact chunks"
        )
    return Plan(
        None,
        Spec((m, n), out),
        {"out_dtype": out},
        trivial=m == 0 or n == 0 or k == 0,
    )


def _scale_vector(xp: Any, scale: Array | None, length: int) -> Array:
    """A float32 ``[length]`` scale from None (ones), a scalar or a ``[length]`` array."""
    if scale is None:
        return xp.ones((length,), np.float32)
    return xp.broadcast_to(scale.astype(np.float32), (length,))


def _compute_int8_matmul(
    runner: Runner,
    plan: Plan,
    x: Array,
    y: Array,
    x_scale: Array | None,
    y_scale: Array | None,
    *,
    out_dtype: np.dtype,
) -> Array:
    """An int32 ``out_dtype`` is the exact product (the check allows it only unscaled)."""
    kernel = runner.kernel(int8_matmul)
    (m, k), n = x.shape, y.shape[1]
    if out_dtype == np.int32:
        return kernel(x, y, x_scale=None, y_scale=None, out_dtype=out_dtype)
    xs, ys = _scale_vector(runner.xp, x_scale, m), _scale_vector(runner.xp, y_scale, n)
    if k <= INT8_MATMUL_MAX_K:
        return cast(kernel(x, y, x_scale=xs, y_scale=ys, out_dtype=out_dtype), out_dtype)
    # Exact int32 chunks of K, their dequantized partial products summed in float32.
    total: Any = None
    for start in range(0, k, INT8_MATMUL_MAX_K):
        stop = min(start + INT8_MATMUL_MAX_K, k)
        part = kernel(
            x[:, start:stop], y[start:stop], x_scale=xs, y_scale=ys, out_dtype=np.dtype(np.float32)
        ).astype(np.float32)
        total = part if total is None else total + part
    return total.astype(out_dtype)


def reference_int8_matmul(
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    *,
    x_scale: npt.ArrayLike | None = None,
    y_scale: npt.ArrayLike | None = None,
    out_dtype: npt.DTypeLike = np.int32,
) -> np.ndarray:
    """Exact ``x [M, K] @ y [K, N]`` (int8) as int32, or dequantized to ``out_dtype``."""
    acc = np.asarray(x).astype(np.int64) @ np.asarray(y).astype(np.int64)
    if x_scale is None:
        return acc.astype(np.int32)
    scaled = (
        acc.astype(np.float64)
        * np.asarray(x_scale, np.float64)[:, None]
        * np.asarray(y_scale, np.float64)[None, :]
    )
    return scaled.astype(out_dtype)


def _reference_int8_matmul(
    x: npt.ArrayLike,
    y: npt.ArrayLike,
    *,
    x_scale: npt.ArrayLike | None = None,
    y_scale: npt.ArrayLike | None = None,
    out_dtype: npt.DTypeLike | None = None,
) -> np.ndarray:
    m, n = np.shape(x)[0], np.shape(y)[1]
    scaled = x_scale is not None or y_scale is not None or out_dtype not in (None, np.int32)
    if not scaled:
        return reference_int8_matmul(x, y)
    xs = np.broadcast_to(np.float64(1) if x_scale is None else np.asarray(x_scale), (m,))
    ys = np.broadcast_to(np.float64(1) if y_scale is None else np.asarray(y_scale), (n,))
    return reference_int8_matmul(x, y, x_scale=xs, y_scale=ys, out_dtype=np.float64)


int8_matmul = Op(
    "int8_matmul",
    [
        array("x", 2),
        array("y", 2),
        array("x_scale", optional=True),
        array("y_scale", optional=True),
        static("out_dtype", "ScalarType?", None, bad=("nonsense", np.int8, object())),
    ],
    check=_check_int8_matmul,
    compute=_compute_int8_matmul,
    reference=_reference_int8_matmul,
    partition="matmul",
    preference=("cpu", "pallas_tpu", "nki", "xla"),
    compute_dtypes=(None,),
    doc="""``x @ y`` for int8 ``x [M, K]`` and ``y [K, N]``, accumulated exactly in int32.

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
    """,
)

REFERENCE.implements(int8_matmul)(reference_int8_matmul)


# quantize_int8 ------------------------------------------------------------------------------


def _check_quantize(x: Spec | None, axis: object) -> Plan:
    x = _checks.required(x, "x")
    _checks.check_float(x, "x")
    ndim = len(x.shape)
    if axis is not None:
        axis = _checks.static_int(axis, "axis", low=-ndim)
        if axis >= ndim:
            raise ValueError(f"axis {axis} is out of range for an array of rank {ndim}")
        axis %= ndim
    scale_shape = () if axis is None else (x.shape[axis],)
    return Plan(
        None,
        (Spec(x.shape, np.dtype(np.int8)), Spec(scale_shape, np.dtype(np.float32))),
        {"axis": axis},
    )


def _check_quantize_values(x: Array, **_: Array | None) -> None:
    if not np.all(np.isfinite(np.asarray(x))):
        raise ValueError("quantize_int8: x holds NaN or infinite values, which have no int8 scale")


def _compute_quantize(
    runner: Runner, plan: Plan, x: Array, axis: int | None
) -> tuple[Array, Array]:
    values = jnp.asarray(x).astype(jnp.float32)
    reduce_axes = tuple(i for i in range(values.ndim) if i != axis)
    amax = jnp.max(jnp.abs(values), axis=reduce_axes, initial=0.0)
    # amax / 127 underflows to 0 in float32 for amax below ~1.5e-36: keep it a normal float.
    scale = jnp.where(amax > 0, jnp.maximum(amax / 127.0, jnp.finfo(jnp.float32).tiny), 1.0)
    # Under jit values cannot be refused: a channel with NaN or inf gets a NaN scale, so
    # anything dequantized with it is NaN rather than silently wrong.
    finite = jnp.all(jnp.isfinite(values), axis=reduce_axes)
    scale = jnp.where(finite, scale, jnp.nan)
    broadcast = scale if axis is None else jnp.expand_dims(scale, reduce_axes)
    q = jnp.clip(jnp.round(jnp.where(jnp.isfinite(values), values, 0.0) / broadcast), -127, 127)
    return jnp.where(jnp.isnan(q), 0, q).astype(jnp.int8), scale.astype(jnp.float32)


def _reference_quantize(x: npt.ArrayLike, axis: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    values = np.asarray(x, np.float64)
    if axis is not None:
        axis %= values.ndim
    reduce_axes = tuple(i for i in range(values.ndim) if i != axis)
    amax = np.max(np.abs(values), axis=reduce_axes, initial=0.0)
    scale = np.where(amax > 0, np.maximum(amax / 127.0, np.finfo(np.float32).tiny), 1.0)
    broadcast = scale if axis is None else np.expand_dims(scale, reduce_axes)
    q = np.clip(np.round(values / broadcast), -127, 127).astype(np.int8)
    return q, scale.astype(np.float32)


quantize_int8 = Op(
    "quantize_int8",
    [array("x", 0), static("axis", "int?", None, positional=True, bad=("0", 1.0, 7))],
    check=_check_quantize,
    compute=_compute_quantize,
    reference=_reference_quantize,
    check_values=_check_quantize_values,
    outputs=("q", "scale"),
    partition="none",  # the scale spans the whole array (or a whole channel): no SPMD rule
    doc="""Symmetric int8 quantization.

    Args:
      x: float array of finite values. Eagerly, NaN or inf raises ``ValueError``; under
        ``jit`` (where values cannot be checked) such a channel gets a NaN scale.
      axis: the channel axis that keeps its own scale (``0`` for per-row scales of an
        ``[M, K]`` matrix, ``1`` for per-column scales of a ``[K, N]`` one); None for one
        scale for the whole tensor.

    Returns:
      ``(q, scale)``: ``q`` int8 of ``x``'s shape in ``[-127, 127]``, ``scale`` float32
      ``[x.shape[axis]]`` (or ``()``) with ``x ~= q * scale`` along ``axis``;
      ``scale = max|x| / 127`` over the other axes (1 where that maximum is 0), and
      ``q = round_half_even(x / scale)``. Feed the scales to :func:`int8_matmul`.
    """,
)
