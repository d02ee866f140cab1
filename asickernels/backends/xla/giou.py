"""GIOU in ``jax.numpy``; :func:`giou_from_planes` is also the body of the Pallas kernels."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from asickernels.backends.xla import BACKEND, compute_dtype
from asickernels.kernels import public as ops
from asickernels.kernels.giou import GIOU_EPS
from asickernels.kernels.registry import FLOAT32_AND_64


def giou_from_planes(
    x1: jax.Array,
    y1: jax.Array,
    x2: jax.Array,
    y2: jax.Array,
    u1: jax.Array,
    v1: jax.Array,
    u2: jax.Array,
    v2: jax.Array,
) -> jax.Array:
    """GIOU from coordinate planes (any equal shapes, float32 or float64).

    Written with ``where`` rather than ``maximum``/``minimum`` so that autodiff follows the
    reference's tie rule (the gradient goes to the first box) instead of splitting it.
    """
    iw = jnp.where(x2 <= u2, x2, u2) - jnp.where(x1 >= u1, x1, u1)
    ih = jnp.where(y2 <= v2, y2, v2) - jnp.where(y1 >= v1, y1, v1)
    inter = jnp.where(iw > 0, iw, 0.0) * jnp.where(ih > 0, ih, 0.0)
    union = (x2 - x1) * (y2 - y1) + (u2 - u1) * (v2 - v1) - inter
    cw = jnp.where(x2 >= u2, x2, u2) - jnp.where(x1 <= u1, x1, u1)
    ch = jnp.where(y2 >= v2, y2, v2) - jnp.where(y1 <= v1, y1, v1)
    hull = cw * ch
    return inter / (union + GIOU_EPS) - (hull - union) / (hull + GIOU_EPS)


@BACKEND.implements(ops.giou, dtypes=FLOAT32_AND_64, vjp=ops.giou_vjp)
def giou(boxes1: jax.Array, boxes2: jax.Array) -> jax.Array:
    """``[P, 4]`` x2 -> ``[P]`` float32 (float64 for float64 boxes)."""
    dtype = compute_dtype(boxes1, boxes2)
    a, b = boxes1.astype(dtype), boxes2.astype(dtype)
    return giou_from_planes(*(a[:, i] for i in range(4)), *(b[:, i] for i in range(4)))
