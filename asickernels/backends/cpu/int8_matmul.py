"""int8 x int8 matmul with exact int32 accumulation on the native CPU kernel
(``int8_matmul.cpp``; AVX-512 VNNI where the CPU has it), one function for JAX arrays (XLA's
FFI) and numpy arrays (the host). Dequantization multiplies in float64 and rounds once to the
output dtype (float32 for bfloat16/float16 first)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import numpy.typing as npt

from asickernels.backends.cpu import BACKEND, _library
from asickernels.kernels import public as ops
from asickernels.kernels.declaration import Array, cast


@BACKEND.implements(ops.int8_matmul)
@BACKEND.host_twin(ops.int8_matmul)
def int8_matmul(
    x: Array,
    y: Array,
    *,
    x_scale: Array | None,
    y_scale: Array | None,
    out_dtype: npt.DTypeLike,
) -> Any:
    """``x [M, K]`` int8 @ ``y [K, N]`` int8 -> ``[M, N]`` int32, or ``out_dtype`` with
    scales (``x_scale [M]``, ``y_scale [N]``, both or neither)."""
    arrays = [_library.convert(x, np.int8), _library.convert(y, np.int8)]
    shape = (x.shape[0], y.shape[1])
    if x_scale is None or y_scale is None:
        return _library.call("int8_matmul", arrays, [(shape, np.int32)])
    # What the kernel writes: float64 for a float64 result, else float32; float32 where
    # JAX's float64 is off (jax_enable_x64), as JAX's own float is.
    wide = np.dtype(out_dtype) == np.float64
    if wide and not _library.on_host(*arrays):
        wide = jax.dtypes.canonicalize_dtype(np.float64) == np.float64
    scales = [_library.convert(s, np.float32) for s in (x_scale, y_scale)]
    kernel_dtype = np.float64 if wide else np.float32
    out = _library.call("int8_matmul_scaled", [*arrays, *scales], [(shape, kernel_dtype)])
    return cast(out, out_dtype)
