"""RoIAlign and its gradient on the native CPU kernel (``roi_align.cpp``): torchvision's CPU
kernel's arithmetic and summation order, so float32 results equal
``torchvision.ops.roi_align``'s on CPU bit for bit; float64 inputs are computed in float64.
Each kernel is one function for JAX arrays (XLA's FFI) and numpy arrays (the host). A RoI
whose batch index names no image of ``input`` is an error, under ``jit`` too. Also how
RoIPool's kernels (the same C++ file) are called: :func:`pooled`."""

from __future__ import annotations

from typing import Any

from asickernels.backends.cpu import BACKEND, _library
from asickernels.kernels import public as ops
from asickernels.kernels.declaration import Array
from asickernels.kernels.registry import FLOAT32_AND_64


def pooled(kernel: str, arrays: tuple[Array, ...], shape: tuple[int, ...], **statics: Any) -> Any:
    """The RoI pooling kernel ``kernel`` on ``arrays`` (converted to one float dtype) -> a
    ``shape`` array of that dtype; the statics are its attributes, by name."""
    arrays = tuple(_library.float_arrays(*arrays))
    result = (tuple(shape), arrays[0].dtype)
    return _library.call(kernel, arrays, [result], vmap_method="sequential", **statics)


@BACKEND.implements(ops.roi_align, dtypes=FLOAT32_AND_64)
@BACKEND.host_twin(ops.roi_align)
def roi_align(
    input: Array,
    rois: Array,
    *,
    output_size: tuple[int, int],
    spatial_scale: float,
    sampling_ratio: int,
    aligned: bool,
) -> Any:
    """``input [N, C, H, W]``, ``rois [K, 5]`` (float32 or float64) -> ``[K, C, PH, PW]``."""
    shape = (rois.shape[0], input.shape[1], *output_size)
    return pooled(
        "roi_align",
        (input, rois),
        shape,
        output_size=output_size,
        spatial_scale=spatial_scale,
        sampling_ratio=sampling_ratio,
        aligned=aligned,
    )


@BACKEND.implements(ops.roi_align_vjp, dtypes=FLOAT32_AND_64)
@BACKEND.host_twin(ops.roi_align_vjp)
def roi_align_vjp(
    input: Array,
    rois: Array,
    cotangent: Array,
    *,
    output_size: tuple[int, int],
    spatial_scale: float,
    sampling_ratio: int,
    aligned: bool,
) -> Any:
    """``input [N, C, H, W]`` (its shape only), ``rois [K, 5]``, ``cotangent [K, C, PH,
    PW]`` -> the gradient ``[N, C, H, W]``, added in torchvision's order (deterministic)."""
    return pooled(
        "roi_align_vjp",
        (rois, cotangent),
        tuple(int(d) for d in input.shape),
        output_size=output_size,
        spatial_scale=spatial_scale,
        sampling_ratio=sampling_ratio,
        aligned=aligned,
    )
