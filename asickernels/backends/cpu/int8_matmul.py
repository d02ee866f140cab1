"""int8 x int8 matmul with exact int32 accumulation on the native CPU kernel (AVX-512 VNNI
where the CPU has it): JAX (FFI) and host (numpy) entry points. Dequantization multiplies
in float64 and rounds once to the output dtype (float32 for bfloat16/float16 first)."""

from __future__ import annotations

from typing import Unpack

import jax
import jax.numpy as jnp
import numpy as np

from asickernels.backends.cpu import BACKEND, _library
from asickernels.kernels.declaration import host_empty
from asickernels.kernels.int8_matmul import Int8MatmulOptions, int8_matmul_options

# asickernels_cpu_int8_matmul (csrc/int8_matmul.cpp): x, y, m, k, n, x_scale or null,
# y_scale or null, out kind (_library.OUT_KIND), out.
_HOST_ARGTYPES = (
    *[_library.POINTER] * 2, *[_library.INT64] * 3, *[_library.POINTER] * 2, _library.INT,
    _library.POINTER,
)  # fmt: skip


def _kernel_out_dtype(out_dtype: np.dtype, scaled: bool) -> np.dtype:
    """What the kernel writes: int32 unscaled; float64 for a float64 result, else float32."""
    if not scaled:
        return np.dtype(np.int32)
    return np.dtype(np.float64 if np.dtype(out_dtype) == np.float64 else np.float32)


@BACKEND.implements("int8_matmul")
def int8_matmul(
    x: jax.Array,
    y: jax.Array,
    **options: Unpack[Int8MatmulOptions],
) -> jax.Array:
    """``x [M, K]`` int8 @ ``y [K, N]`` int8 -> ``[M, N]`` int32, or ``out_dtype`` with scales."""
    x_scale, y_scale, out_dtype = int8_matmul_options(options)
    m, n = x.shape[0], y.shape[1]
    scaled = x_scale is not None
    kernel_dtype = _kernel_out_dtype(out_dtype, scaled)
    if kernel_dtype == np.float64 and jax.dtypes.canonicalize_dtype(np.float64) != np.float64:
        kernel_dtype = np.dtype(np.float32)  # float64 is off (jax_enable_x64): JAX's float
    result = jax.ShapeDtypeStruct((m, n), kernel_dtype)
    if not scaled:
        call = jax.ffi.ffi_call(
            _library.ffi_target("int8_matmul"), result, vmap_method="broadcast_all"
        )
        return call(x, y)
    suffix = "f64" if kernel_dtype == np.float64 else "f32"
    call = jax.ffi.ffi_call(
        _library.ffi_target(f"int8_matmul_scaled_{suffix}"), result, vmap_method="broadcast_all"
    )
    scales = [jnp.asarray(s).astype(jnp.float32) for s in (x_scale, y_scale)]
    return call(x, y, *scales).astype(out_dtype)


@BACKEND.host_twin("int8_matmul")
def int8_matmul_host(
    x: np.ndarray,
    y: np.ndarray,
    **options: Unpack[Int8MatmulOptions],
) -> np.ndarray:
    """Host twin of :func:`int8_matmul`: numpy in, numpy out."""
    x_scale, y_scale, out_dtype = int8_matmul_options(options)
    x = np.ascontiguousarray(x, np.int8)
    y = np.ascontiguousarray(y, np.int8)
    (m, k), n = x.shape, y.shape[1]
    scaled = x_scale is not None
    kernel_dtype = _kernel_out_dtype(out_dtype, scaled)
    scales = [
        None if s is None else np.ascontiguousarray(s, np.float32) for s in (x_scale, y_scale)
    ]
    out = host_empty((m, n), kernel_dtype)
    _library.check(
        _library.host_entry("int8_matmul", *_HOST_ARGTYPES)(
            _library.address(x),
            _library.address(y),
            m,
            k,
            n,
            *map(_library.address, scales),
            _library.OUT_KIND[kernel_dtype],
            _library.address(out),
        )
    )
    return out if not scaled else out.astype(out_dtype, copy=False)
