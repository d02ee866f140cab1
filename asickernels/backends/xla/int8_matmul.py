"""int8 matmul as XLA's int8 dot with an int32 result (the peer every kernel is timed against)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from asickernels.backends.xla import BACKEND
from asickernels.kernels import public as ops


def dequantize(
    acc: jax.Array, x_scale: jax.Array, y_scale: jax.Array, out_dtype: np.dtype
) -> jax.Array:
    """``acc [M, N]`` int32 -> ``acc * x_scale[:, None] * y_scale[None, :]`` in float32, cast once."""
    return (acc.astype(jnp.float32) * x_scale[:, None] * y_scale[None, :]).astype(out_dtype)


@BACKEND.implements(ops.int8_matmul)
def int8_matmul(
    x: jax.Array,
    y: jax.Array,
    *,
    x_scale: jax.Array | None,
    y_scale: jax.Array | None,
    out_dtype: np.dtype,
) -> jax.Array:
    acc = lax.dot_general(x, y, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)
    if x_scale is None or y_scale is None:
        return acc
    return dequantize(acc, x_scale, y_scale, out_dtype)
