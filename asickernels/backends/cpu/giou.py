"""GIOU and its gradient on the native CPU kernels: JAX (FFI, ``custom_vjp``) and host
(numpy) entry points. float64 boxes are computed in float64, anything else in float32."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from asickernels.backends.cpu import _library
from asickernels.kernels.declaration import host_empty

_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}


def _giou_call(boxes1: jax.Array, boxes2: jax.Array) -> jax.Array:
    _library.ffi_targets()
    result = jax.ShapeDtypeStruct(boxes1.shape[:-1], boxes1.dtype)
    target = _library.ffi_name(f"giou_{_SUFFIX[np.dtype(boxes1.dtype)]}")
    return jax.ffi.ffi_call(target, result, vmap_method="broadcast_all")(boxes1, boxes2)


def _giou_vjp_call(
    boxes1: jax.Array, boxes2: jax.Array, cotangent: jax.Array
) -> tuple[jax.Array, jax.Array]:
    _library.ffi_targets()
    result = jax.ShapeDtypeStruct(boxes1.shape, boxes1.dtype)
    target = _library.ffi_name(f"giou_vjp_{_SUFFIX[np.dtype(boxes1.dtype)]}")
    d1, d2 = jax.ffi.ffi_call(target, (result, result), vmap_method="broadcast_all")(
        boxes1, boxes2, cotangent
    )
    return d1, d2


def _giou_vjp_first_call(boxes1: jax.Array, boxes2: jax.Array, cotangent: jax.Array) -> jax.Array:
    """The gradient with respect to ``boxes1`` alone."""
    _library.ffi_targets()
    result = jax.ShapeDtypeStruct(boxes1.shape, boxes1.dtype)
    target = _library.ffi_name(f"giou_vjp_first_{_SUFFIX[np.dtype(boxes1.dtype)]}")
    return jax.ffi.ffi_call(target, result, vmap_method="broadcast_all")(boxes1, boxes2, cotangent)


@jax.custom_vjp
def _giou(boxes1: jax.Array, boxes2: jax.Array) -> jax.Array:
    return _giou_call(boxes1, boxes2)


Residuals = tuple[jax.Array, jax.Array, bool, bool]


def _giou_forward(boxes1: Any, boxes2: Any) -> tuple[jax.Array, Residuals]:
    # symbolic_zeros: the arguments are CustomVJPPrimal, saying which are differentiated.
    residuals = (boxes1.value, boxes2.value, boxes1.perturbed, boxes2.perturbed)
    return _giou_call(boxes1.value, boxes2.value), residuals


def _giou_backward(residuals: Residuals, cotangent: Any) -> tuple[jax.Array | None, ...]:
    boxes1, boxes2, wants1, wants2 = residuals
    if isinstance(cotangent, jax.custom_derivatives.SymbolicZero):
        return None, None
    cotangent = cotangent.astype(boxes1.dtype)
    if wants1 and not wants2:  # e.g. predictions against fixed targets
        return _giou_vjp_first_call(boxes1, boxes2, cotangent), None
    return _giou_vjp_call(boxes1, boxes2, cotangent)


_giou.defvjp(_giou_forward, _giou_backward, symbolic_zeros=True)


def _jax_inputs(*arrays: Any) -> list[jax.Array]:
    dtype = _library.float_kernel_dtype(*(a.dtype for a in arrays))
    return [jnp.asarray(a).astype(dtype) for a in arrays]


def giou(boxes1: jax.Array, boxes2: jax.Array, *, config: Any = None) -> jax.Array:
    """``[P, 4]`` x2 -> ``[P]`` GIOU (float64 for float64 boxes, else float32);
    differentiable (the backward pass is the native gradient kernel)."""
    _library.check_config(config)
    return _giou(*_jax_inputs(boxes1, boxes2))


def giou_vjp(
    boxes1: jax.Array, boxes2: jax.Array, cotangent: jax.Array, *, config: Any = None
) -> tuple[jax.Array, jax.Array]:
    """``[P, 4]``, ``[P, 4]``, ``[P]`` -> gradients ``[P, 4]`` x2 of ``sum(cotangent * giou)``."""
    _library.check_config(config)
    return _giou_vjp_call(*_jax_inputs(boxes1, boxes2, cotangent))


def _host_inputs(*arrays: Any) -> list[np.ndarray]:
    dtype = _library.float_kernel_dtype(*(np.asarray(a).dtype for a in arrays))
    return [np.ascontiguousarray(a, dtype) for a in arrays]


def giou_host(boxes1: np.ndarray, boxes2: np.ndarray, *, config: Any = None) -> np.ndarray:
    """Host twin of :func:`giou`: numpy ``[P, 4]`` x2 -> numpy ``[P]``."""
    _library.check_config(config)
    a, b = _host_inputs(boxes1, boxes2)
    out = host_empty(a.shape[:-1], a.dtype)
    _library.check(
        _library.library().asickernels_cpu_giou(
            _library.FLOAT_CODES[a.dtype],
            _library.address(a),
            _library.address(b),
            a.size // 4,
            _library.address(out),
        )
    )
    return out


def giou_vjp_host(
    boxes1: np.ndarray, boxes2: np.ndarray, cotangent: np.ndarray, *, config: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """Host twin of :func:`giou_vjp`."""
    _library.check_config(config)
    a, b, g = _host_inputs(boxes1, boxes2, cotangent)
    d1, d2 = host_empty(a.shape, a.dtype), host_empty(a.shape, a.dtype)
    _library.check(
        _library.library().asickernels_cpu_giou_vjp(
            _library.FLOAT_CODES[a.dtype],
            *map(_library.address, (a, b, g)),
            a.size // 4,
            _library.address(d1),
            _library.address(d2),
        )
    )
    return d1, d2
