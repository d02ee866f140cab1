"""RoIPool and its gradient on the native CPU kernel (``roi_align.cpp``, RoI pooling):
torchvision's CPU kernel's bins and argmax rule, so results equal
``torchvision.ops.roi_pool``'s on CPU bit for bit; float64 inputs are computed in float64.
Each kernel is one function for JAX arrays (XLA's FFI) and numpy arrays (the host). A RoI
whose batch index names no image of ``input`` is an error, under ``jit`` too."""

from __future__ import annotations

from typing import Any

from asickernels.backends.cpu import BACKEND
from asickernels.backends.cpu.roi_align import pooled
from asickernels.kernels import public as ops
from asickernels.kernels.declaration import Array
from asickernels.kernels.registry import FLOAT32_AND_64


@BACKEND.implements(ops.roi_pool, dtypes=FLOAT32_AND_64)
@BACKEND.host_twin(ops.roi_pool)
def roi_pool(
    input: Array, rois: Array, *, output_size: tuple[int, int], spatial_scale: float
) -> Any:
    """``input [N, C, H, W]``, ``rois [K, 5]`` (float32 or float64) -> ``[K, C, PH, PW]``."""
    shape = (rois.shape[0], input.shape[1], *output_size)
    return pooled(
        "roi_pool", (input, rois), shape, output_size=output_size, spatial_scale=spatial_scale
    )


@BACKEND.implements(ops.roi_pool_vjp, dtypes=FLOAT32_AND_64)
@BACKEND.host_twin(ops.roi_pool_vjp)
def roi_pool_vjp(
    input: Array,
    rois: Array,
    cotangent: Array,
    *,
    output_size: tuple[int, int],
    spatial_scale: float,
) -> Any:
    """``input [N, C, H, W]``, ``rois [K, 5]``, ``cotangent [K, C, PH, PW]`` -> the gradient
    in ``input``: each bin's cotangent added at its argmax (found again), in torchvision's
    order (deterministic)."""
    arrays = (input, rois, cotangent)
    return pooled(
        "roi_pool_vjp", arrays, input.shape, output_size=output_size, spatial_scale=spatial_scale
    )
