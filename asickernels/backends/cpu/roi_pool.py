"""RoIPool and its gradient on the native CPU kernel (``csrc/roi_align.cpp``, RoI pooling):
torchvision's CPU kernel's bins and argmax rule, so results equal
``torchvision.ops.roi_pool``'s on CPU bit for bit. JAX entry points (FFI; a ``custom_vjp``
whose backward pass is the native gradient kernel, which finds the argmaxes again) and host
twins (numpy in and out). float64 inputs are computed in float64, float32 in float32."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from asickernels.backends.cpu import BACKEND, _library
from asickernels.backends.cpu.roi_align import ffi_call, host_arrays
from asickernels.kernels.registry import FLOAT32_AND_64

# asickernels_cpu_roi_pool (csrc/roi_align.cpp): dtype code, input and rois pointers (and the
# cotangent's for _vjp), N, C, H, W, K, pooled height and width, spatial_scale, output.
_SCALARS = (*[_library.INT64] * 7, _library.DOUBLE, _library.POINTER)


def _attributes(output_size: tuple[int, int], spatial_scale: float) -> dict[str, Any]:
    return {
        "pooled_height": np.int64(output_size[0]),
        "pooled_width": np.int64(output_size[1]),
        "spatial_scale": np.float64(spatial_scale),
    }


def _backward(
    input: jax.Array,
    rois: jax.Array,
    cotangent: jax.Array,
    output_size: tuple[int, int],
    spatial_scale: float,
) -> jax.Array:
    result = jax.ShapeDtypeStruct(input.shape, input.dtype)
    attributes = _attributes(output_size, spatial_scale)
    return ffi_call("roi_pool_vjp", result, attributes, input, rois, cotangent)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _differentiable(
    input: jax.Array, rois: jax.Array, output_size: tuple[int, int], spatial_scale: float
) -> jax.Array:
    result = jax.ShapeDtypeStruct((rois.shape[0], input.shape[1], *output_size), input.dtype)
    attributes = _attributes(output_size, spatial_scale)
    return ffi_call("roi_pool", result, attributes, input, rois)


def _differentiable_forward(
    input: jax.Array, rois: jax.Array, output_size: tuple[int, int], spatial_scale: float
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _differentiable(input, rois, output_size, spatial_scale), (input, rois)


def _differentiable_backward(
    output_size: tuple[int, int],
    spatial_scale: float,
    residuals: tuple[jax.Array, jax.Array],
    cotangent: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    input, rois = residuals
    grad = _backward(input, rois, cotangent, output_size, spatial_scale)
    return grad, jnp.zeros_like(rois)


_differentiable.defvjp(_differentiable_forward, _differentiable_backward)


@BACKEND.implements("roi_pool", dtypes=FLOAT32_AND_64)
def roi_pool(
    input: jax.Array,
    rois: jax.Array,
    *,
    output_size: tuple[int, int],
    spatial_scale: float,
) -> jax.Array:
    """``input [N, C, H, W]``, ``rois [K, 5]`` (one float dtype) -> ``[K, C, PH, PW]``;
    differentiable in ``input`` with ``jax.grad``. A RoI whose batch index names no image of
    ``input`` is an error (the kernel checks, under ``jit`` too)."""
    return _differentiable(input, rois, output_size, float(spatial_scale))


@BACKEND.implements("roi_pool_vjp", dtypes=FLOAT32_AND_64)
def roi_pool_vjp(
    input: jax.Array,
    rois: jax.Array,
    cotangent: jax.Array,
    *,
    output_size: tuple[int, int],
    spatial_scale: float,
) -> jax.Array:
    """``input [N, C, H, W]``, ``rois [K, 5]``, ``cotangent [K, C, PH, PW]`` -> the gradient
    in ``input`` (added at each bin's argmax in torchvision's order: deterministic)."""
    return _backward(input, rois, cotangent, output_size, float(spatial_scale))


def _bind(
    entry: str,
    input: np.ndarray,
    rois: np.ndarray,
    cotangent: np.ndarray | None,
    output: tuple[int, ...],
    output_size: tuple[int, int],
    spatial_scale: float,
) -> _library.Bound:
    height, width = output_size
    scalars = (*input.shape, rois.shape[0], height, width, float(spatial_scale))
    code = (_library.FLOAT_CODES[rois.dtype],)
    inputs = (input, rois) if cotangent is None else (input, rois, cotangent)
    function = _library.host_entry(
        entry, _library.INT, *[_library.POINTER] * len(inputs), *_SCALARS
    )
    return _library.bound_entry(function, code, scalars, inputs, [(output, rois.dtype)])


def _bind_forward(input: np.ndarray, rois: np.ndarray, **statics: Any) -> _library.Bound:
    output = (rois.shape[0], input.shape[1], *statics["output_size"])
    return _bind("roi_pool", input, rois, None, output, **statics)


def _bind_backward(
    input: np.ndarray, rois: np.ndarray, cotangent: np.ndarray, **statics: Any
) -> _library.Bound:
    return _bind("roi_pool_vjp", input, rois, cotangent, input.shape, **statics)


roi_pool_host = BACKEND.host_twin("roi_pool")(
    _library.HostTwin(
        host_arrays,
        _bind_forward,
        """Host twin of :func:`roi_pool`: numpy ``input [N, C, H, W]``, ``rois [K, 5]`` (and
    the statics as keywords) -> numpy ``[K, C, PH, PW]``.""",
    )
)
roi_pool_vjp_host = BACKEND.host_twin("roi_pool_vjp")(
    _library.HostTwin(
        host_arrays,
        _bind_backward,
        """Host twin of :func:`roi_pool_vjp`: numpy ``input``, ``rois``, ``cotangent`` (and
    the statics as keywords) -> numpy d_input ``[N, C, H, W]``.""",
    )
)
