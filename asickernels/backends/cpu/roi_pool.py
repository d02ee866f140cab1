"""RoIPool and its gradient on the native CPU kernel (``csrc/roi_align.cpp``, RoI pooling):
torchvision's CPU kernel's bins and argmax rule, so results equal
``torchvision.ops.roi_pool``'s on CPU bit for bit; float64 inputs are computed in float64.
Each kernel has a JAX entry point (an XLA FFI call) and a host twin (numpy in and out), one
C++ kernel. A RoI whose batch index names no image of ``input`` is an error, under ``jit``
too."""

from __future__ import annotations

from typing import Unpack

import jax
import numpy as np

from asickernels.backends.cpu import BACKEND
from asickernels.backends.cpu.roi_align import native, pooled_shape, run_host
from asickernels.kernels.registry import FLOAT32_AND_64
from asickernels.kernels.roi_align import RoiStatics


@BACKEND.implements("roi_pool", dtypes=FLOAT32_AND_64)
def roi_pool(input: jax.Array, rois: jax.Array, **statics: Unpack[RoiStatics]) -> jax.Array:
    """``input [N, C, H, W]``, ``rois [K, 5]`` (float32 or float64) -> ``[K, C, PH, PW]``."""
    return native("roi_pool", pooled_shape(input, rois, statics), (input, rois), **statics)


@BACKEND.implements("roi_pool_vjp", dtypes=FLOAT32_AND_64)
def roi_pool_vjp(
    input: jax.Array, rois: jax.Array, cotangent: jax.Array, **statics: Unpack[RoiStatics]
) -> jax.Array:
    """``input [N, C, H, W]``, ``rois [K, 5]``, ``cotangent [K, C, PH, PW]`` -> the gradient
    in ``input``: each bin's cotangent added at its argmax (found again), in torchvision's
    order (deterministic)."""
    return native("roi_pool_vjp", input.shape, (input, rois, cotangent), **statics)


@BACKEND.host_twin("roi_pool")
def roi_pool_host(input: np.ndarray, rois: np.ndarray, **statics: Unpack[RoiStatics]) -> np.ndarray:
    """Host twin of :func:`roi_pool`: numpy ``input [N, C, H, W]``, ``rois [K, 5]`` (and
    the statics as keywords) -> numpy ``[K, C, PH, PW]``."""
    output = pooled_shape(input, rois, statics)
    scalars = (statics["output_size"], statics["spatial_scale"])
    return run_host("roi_pool", (input, rois), input.shape, len(rois), output, *scalars)


@BACKEND.host_twin("roi_pool_vjp")
def roi_pool_vjp_host(
    input: np.ndarray, rois: np.ndarray, cotangent: np.ndarray, **statics: Unpack[RoiStatics]
) -> np.ndarray:
    """Host twin of :func:`roi_pool_vjp`: numpy ``input``, ``rois``, ``cotangent`` (and
    the statics as keywords) -> numpy ``[N, C, H, W]``."""
    arrays, scalars = (input, rois, cotangent), (statics["output_size"], statics["spatial_scale"])
    return run_host("roi_pool_vjp", arrays, input.shape, len(rois), input.shape, *scalars)
