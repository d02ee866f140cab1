"""Backward kernels by automatic differentiation, for JAX backends whose forward kernel JAX
can differentiate (a plain ``jax.numpy`` body, or a Pallas kernel with its ``custom_vjp``)."""

from __future__ import annotations

import importlib
from typing import Any

import jax


def paired_vjp(
    boxes1: jax.Array,
    boxes2: jax.Array,
    cotangent: jax.Array,
    *,
    forward: str,
    config: Any = None,
    **bound: Any,
) -> tuple[jax.Array, jax.Array]:
    """The vjp kernel (``giou_vjp``, ``diou_vjp``, ...) of the paired-box kernel at
    ``forward`` (``"module:function"``, called with ``bound`` keyword arguments):
    ``[P, 4]`` x2, ``[P]`` -> ``[P, 4]`` x2."""
    module_name, _, function_name = forward.partition(":")
    metric = getattr(importlib.import_module(module_name), function_name)
    out, pullback = jax.vjp(lambda a, b: metric(a, b, config=config, **bound), boxes1, boxes2)
    return pullback(cotangent.astype(out.dtype))
