"""Backward kernels by automatic differentiation, for JAX backends whose forward kernel JAX
can differentiate (a plain ``jax.numpy`` body, or a Pallas kernel with its ``custom_vjp``)."""

from __future__ import annotations

import importlib
from typing import Any

import jax


def giou_vjp(
    boxes1: jax.Array,
    boxes2: jax.Array,
    cotangent: jax.Array,
    *,
    forward: str,
    config: Any = None,
    **bound: Any,
) -> tuple[jax.Array, jax.Array]:
    """The ``giou_vjp`` kernel of the GIOU kernel at ``forward`` (``"module:function"``,
    called with ``bound`` keyword arguments): ``[P, 4]`` x2, ``[P]`` -> ``[P, 4]`` x2."""
    module_name, _, function_name = forward.partition(":")
    giou = getattr(importlib.import_module(module_name), function_name)
    out, pullback = jax.vjp(lambda a, b: giou(a, b, config=config, **bound), boxes1, boxes2)
    return pullback(cotangent.astype(out.dtype))
