"""Backward kernels by automatic differentiation, for JAX backends whose forward kernel JAX
can differentiate (a plain ``jax.numpy`` body, or a Pallas kernel with its ``custom_vjp``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax


def paired_vjp(forward: Callable[..., jax.Array]) -> Callable[..., tuple[jax.Array, jax.Array]]:
    """The vjp kernel (``giou_vjp``, ``diou_vjp``, ...) of the paired-box kernel
    ``forward`` (``[P, 4]`` x2 -> ``[P]``): ``[P, 4]`` x2, ``[P]`` -> ``[P, 4]`` x2. Keyword
    arguments (``config``, a backend's ``kernel_kwargs``) go to ``forward``."""

    def vjp(
        boxes1: jax.Array, boxes2: jax.Array, cotangent: jax.Array, **kwargs: Any
    ) -> tuple[jax.Array, jax.Array]:
        """Gradients ``[P, 4]`` x2 of ``sum(cotangent * forward(boxes1, boxes2))``."""
        out, pullback = jax.vjp(lambda a, b: forward(a, b, **kwargs), boxes1, boxes2)
        return pullback(cotangent.astype(out.dtype))

    return vjp
