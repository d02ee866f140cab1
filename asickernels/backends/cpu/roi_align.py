"""RoIAlign and its gradient on the native CPU kernel (``csrc/roi_align.cpp``): torchvision's
CPU kernel's arithmetic and summation order, so float32 results equal
``torchvision.ops.roi_align``'s on CPU bit for bit; float64 inputs are computed in float64.
Each kernel has a JAX entry point (an XLA FFI call) and a host twin (numpy in and out), one
C++ kernel. A RoI whose batch index names no image of ``input`` is an error, under ``jit``
too. Also how RoIPool's entry points (the same C++ file) are called: :func:`native`,
:func:`run_host`, :func:`pooled_shape`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Unpack

import jax
import numpy as np

from asickernels.backends.cpu import BACKEND, _library
from asickernels.kernels.registry import FLOAT32_AND_64
from asickernels.kernels.roi_align import RoiAlignStatics, RoiStatics


def native(
    kernel: str,
    shape: tuple[int, ...],
    arrays: Sequence[jax.Array],
    *,
    output_size: tuple[int, int],
    spatial_scale: float,
    **flags: int,
) -> jax.Array:
    """The FFI handler ``<kernel>_<f32|f64>`` on ``arrays`` (one float dtype) -> a ``shape``
    array of their dtype; the statics are its attributes (``output_size`` as
    ``pooled_height`` and ``pooled_width``, ``flags`` as int64)."""
    dtype = np.dtype(arrays[0].dtype)
    target = _library.ffi_target(f"{kernel}_{_library.FLOAT_SUFFIX[dtype]}")
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(shape, dtype), vmap_method="sequential")
    height, width = output_size
    return call(  # type: ignore[no-any-return]
        *arrays,
        pooled_height=np.int64(height),
        pooled_width=np.int64(width),
        spatial_scale=np.float64(spatial_scale),
        **{name: np.int64(value) for name, value in flags.items()},
    )


def run_host(
    entry: str,
    arrays: Sequence[np.ndarray],
    features: tuple[int, ...],
    rois: int,
    output: tuple[int, ...],
    output_size: tuple[int, int],
    spatial_scale: float,
    *flags: int,
) -> np.ndarray:
    """Runs host entry ``asickernels_cpu_<entry>`` on ``arrays`` (converted by
    :func:`_library.float_host_arrays`) of a call on ``features [N, C, H, W]`` (the input's, or the
    gradient's shape) and ``rois`` RoIs -> a new ``output`` array; ``flags`` are its
    trailing int64 arguments."""
    arrays = _library.float_host_arrays(*arrays)
    argtypes = (
        _library.INT, *[_library.POINTER] * len(arrays), *[_library.INT64] * 7, _library.DOUBLE,
        *[_library.INT64] * len(flags), _library.POINTER,
    )  # fmt: skip
    scalars = (*features, rois, *output_size, float(spatial_scale), *flags)
    dtype = arrays[0].dtype
    function = _library.host_entry(entry, *argtypes)
    code = (_library.FLOAT_CODES[dtype],)
    return _library.run_entry(function, code, arrays, scalars, [(output, dtype)])  # type: ignore[no-any-return]


def pooled_shape(
    input: np.ndarray | jax.Array, rois: np.ndarray | jax.Array, statics: RoiStatics
) -> tuple[int, ...]:
    """A RoI pooling kernel's output shape: ``[K, C, PH, PW]``."""
    return (rois.shape[0], input.shape[1], *statics["output_size"])


def _host_statics(statics: RoiAlignStatics) -> tuple[tuple[int, int], float, int, int]:
    """The statics in the order of the host entries' arguments."""
    return (
        statics["output_size"],
        statics["spatial_scale"],
        statics["sampling_ratio"],
        int(statics["aligned"]),
    )


@BACKEND.implements("roi_align", dtypes=FLOAT32_AND_64)
def roi_align(input: jax.Array, rois: jax.Array, **statics: Unpack[RoiAlignStatics]) -> jax.Array:
    """``input [N, C, H, W]``, ``rois [K, 5]`` (float32 or float64) -> ``[K, C, PH, PW]``."""
    return native("roi_align", pooled_shape(input, rois, statics), (input, rois), **statics)


@BACKEND.implements("roi_align_vjp", dtypes=FLOAT32_AND_64)
def roi_align_vjp(
    rois: jax.Array,
    cotangent: jax.Array,
    *,
    input_shape: tuple[int, ...],
    **statics: Unpack[RoiAlignStatics],
) -> jax.Array:
    """``rois [K, 5]``, ``cotangent [K, C, PH, PW]`` -> the ``input_shape`` gradient
    ``[N, C, H, W]``, added in torchvision's order (deterministic)."""
    return native("roi_align_vjp", tuple(input_shape), (rois, cotangent), **statics)


@BACKEND.host_twin("roi_align")
def roi_align_host(
    input: np.ndarray, rois: np.ndarray, **statics: Unpack[RoiAlignStatics]
) -> np.ndarray:
    """Host twin of :func:`roi_align`: numpy ``input [N, C, H, W]``, ``rois [K, 5]`` (and
    the statics as keywords) -> numpy ``[K, C, PH, PW]``."""
    output = pooled_shape(input, rois, statics)
    arrays = (input, rois)
    return run_host("roi_align", arrays, input.shape, len(rois), output, *_host_statics(statics))


@BACKEND.host_twin("roi_align_vjp")
def roi_align_vjp_host(
    rois: np.ndarray,
    cotangent: np.ndarray,
    *,
    input_shape: tuple[int, ...],
    **statics: Unpack[RoiAlignStatics],
) -> np.ndarray:
    """Host twin of :func:`roi_align_vjp`: numpy ``rois [K, 5]``, ``cotangent
    [K, C, PH, PW]`` (and ``input_shape`` and the statics as keywords) -> numpy
    ``[N, C, H, W]``."""
    shape = tuple(int(d) for d in input_shape)
    arrays = (rois, cotangent)
    return run_host("roi_align_vjp", arrays, shape, len(rois), shape, *_host_statics(statics))
