"""RoIAlign and its gradient on the native CPU kernel (``csrc/roi_align.cpp``): torchvision's
CPU kernel's arithmetic and summation order, so float32 results equal
``torchvision.ops.roi_align``'s on CPU bit for bit. JAX entry points (FFI; a ``custom_vjp``
whose backward pass is the native gradient kernel) and host twins (numpy in and out).
float64 inputs are computed in float64, float32 in float32 (the op upcasts the rest)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from asickernels.backends.cpu import BACKEND, _library
from asickernels.kernels.registry import FLOAT32_AND_64

_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
# asickernels_cpu_roi_align and _vjp (csrc/roi_align.cpp): dtype code, two array pointers,
# N, C, H, W, K, pooled height and width, spatial_scale, sampling_ratio, aligned, output.
_HOST_ARGTYPES = (
    _library.INT, *[_library.POINTER] * 2, *[_library.INT64] * 7, _library.DOUBLE,
    _library.INT64, _library.INT, _library.POINTER,
)  # fmt: skip
# The statics, as a hashable tuple for jax.custom_vjp: (output_size, spatial_scale,
# sampling_ratio, aligned).
Statics = tuple[tuple[int, int], float, int, bool]


def _attributes(statics: Statics) -> dict[str, Any]:
    (height, width), scale, ratio, aligned = statics
    return {
        "pooled_height": np.int64(height),
        "pooled_width": np.int64(width),
        "spatial_scale": np.float64(scale),
        "sampling_ratio": np.int64(ratio),
        "aligned": np.int64(aligned),
    }


def ffi_call(
    kernel: str, result: jax.ShapeDtypeStruct, attributes: dict[str, Any], *arrays: Any
) -> jax.Array:
    """The FFI handler ``<kernel>_<f32|f64>`` (RoIAlign's and RoIPool's) on ``arrays``."""
    target = _library.ffi_target(f"{kernel}_{_SUFFIX[np.dtype(result.dtype)]}")
    call = jax.ffi.ffi_call(target, result, vmap_method="sequential")
    return call(*arrays, **attributes)  # type: ignore[no-any-return]


def _forward(input: jax.Array, rois: jax.Array, statics: Statics) -> jax.Array:
    result = jax.ShapeDtypeStruct((rois.shape[0], input.shape[1], *statics[0]), input.dtype)
    return ffi_call("roi_align", result, _attributes(statics), input, rois)


def _backward(
    input_shape: tuple[int, ...], rois: jax.Array, cotangent: jax.Array, statics: Statics
) -> jax.Array:
    result = jax.ShapeDtypeStruct(input_shape, cotangent.dtype)
    return ffi_call("roi_align_vjp", result, _attributes(statics), rois, cotangent)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _differentiable(input: jax.Array, rois: jax.Array, statics: Statics) -> jax.Array:
    return _forward(input, rois, statics)


def _differentiable_forward(
    input: jax.Array, rois: jax.Array, statics: Statics
) -> tuple[jax.Array, tuple[tuple[int, ...], jax.Array]]:
    return _forward(input, rois, statics), (tuple(input.shape), rois)


def _differentiable_backward(
    statics: Statics, residuals: tuple[tuple[int, ...], jax.Array], cotangent: jax.Array
) -> tuple[jax.Array, jax.Array]:
    input_shape, rois = residuals
    return _backward(input_shape, rois, cotangent, statics), jnp.zeros_like(rois)


_differentiable.defvjp(_differentiable_forward, _differentiable_backward)


def _statics(
    output_size: tuple[int, int], spatial_scale: float, sampling_ratio: int, aligned: bool
) -> Statics:
    height, width = output_size
    return (int(height), int(width)), float(spatial_scale), int(sampling_ratio), bool(aligned)


@BACKEND.implements("roi_align", dtypes=FLOAT32_AND_64)
def roi_align(
    input: jax.Array,
    rois: jax.Array,
    *,
    output_size: tuple[int, int],
    spatial_scale: float,
    sampling_ratio: int,
    aligned: bool,
) -> jax.Array:
    """``input [N, C, H, W]``, ``rois [K, 5]`` (one float dtype) -> ``[K, C, PH, PW]``;
    differentiable in ``input`` with ``jax.grad``. A RoI whose batch index names no image of
    ``input`` is an error (the kernel checks, under ``jit`` too)."""
    statics = _statics(output_size, spatial_scale, sampling_ratio, aligned)
    return _differentiable(input, rois, statics)


@BACKEND.implements("roi_align_vjp", dtypes=FLOAT32_AND_64)
def roi_align_vjp(
    rois: jax.Array,
    cotangent: jax.Array,
    *,
    input_shape: tuple[int, ...],
    output_size: tuple[int, int],
    spatial_scale: float,
    sampling_ratio: int,
    aligned: bool,
) -> jax.Array:
    """``rois [K, 5]``, ``cotangent [K, C, PH, PW]`` -> the ``input_shape`` gradient
    (scatter-added in torchvision's order: deterministic)."""
    statics = _statics(output_size, spatial_scale, sampling_ratio, aligned)
    return _backward(tuple(input_shape), rois, cotangent, statics)


# -- host twins -----------------------------------------------------------------------------


def host_arrays(*arrays: np.ndarray) -> list[np.ndarray]:
    """C-contiguous arrays of the kernel dtype (the op gives them all one float dtype)."""
    dtype = _library.float_kernel_dtype(*(a.dtype for a in arrays))
    return [np.ascontiguousarray(a, dtype) for a in arrays]


def _bind(
    entry: str,
    rois: np.ndarray,
    input_shape: tuple[int, ...],
    inputs: tuple[np.ndarray, np.ndarray],
    output: tuple[int, ...],
    output_size: tuple[int, int],
    spatial_scale: float,
    sampling_ratio: int,
    aligned: bool,
) -> _library.Bound:
    (height, width), scale, ratio, flag = _statics(
        output_size, spatial_scale, sampling_ratio, aligned
    )
    scalars = (*input_shape, rois.shape[0], height, width, scale, ratio, int(flag))
    code = (_library.FLOAT_CODES[rois.dtype],)
    function = _library.host_entry(entry, *_HOST_ARGTYPES)
    return _library.bound_entry(function, code, scalars, inputs, [(output, rois.dtype)])


def _bind_forward(
    input: np.ndarray, rois: np.ndarray, *, output_size: tuple[int, int], **statics: Any
) -> _library.Bound:
    shape = (rois.shape[0], input.shape[1], *output_size)
    return _bind(
        "roi_align", rois, input.shape, (input, rois), shape, output_size=output_size, **statics
    )


def _bind_backward(
    rois: np.ndarray, cotangent: np.ndarray, *, input_shape: tuple[int, ...], **statics: Any
) -> _library.Bound:
    shape = tuple(int(d) for d in input_shape)
    return _bind("roi_align_vjp", rois, shape, (rois, cotangent), shape, **statics)


roi_align_host = BACKEND.host_twin("roi_align")(
    _library.HostTwin(
        host_arrays,
        _bind_forward,
        """Host twin of :func:`roi_align`: numpy ``input [N, C, H, W]``, ``rois [K, 5]`` (and
    the statics as keywords) -> numpy ``[K, C, PH, PW]``.""",
    )
)
roi_align_vjp_host = BACKEND.host_twin("roi_align_vjp")(
    _library.HostTwin(
        host_arrays,
        _bind_backward,
        """Host twin of :func:`roi_align_vjp`: numpy ``rois [K, 5]``, ``cotangent
    [K, C, PH, PW]`` (and ``input_shape`` and the statics as keywords) -> numpy d_input.""",
    )
)
