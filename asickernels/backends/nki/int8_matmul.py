"""Exact int8 x int8 matmul as an NKI kernel, although the Tensor Engine has no int8.

int8 values are exact in bfloat16, and a float32 PSUM accumulation of their products is
exact while every partial sum stays within 2**24: with |product| <= 2**14, any
:data:`EXACT_K` = 1024 terms qualify. So K is cut into chunks of at most 1024, each chunk
accumulated in PSUM by matmuls over 128-row slices of K, and the chunks summed in int32 on
GpSimd (exact integer math). Output tiles are ``[<=128, <=512]`` (the stationary free size
and one PSUM bank); scales are applied in float32 and the result rounded once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from asickernels.backends.nki import BACKEND
from asickernels.backends.nki.sdk import FLOAT_DTYPES, nisa, nki, nl, run
from asickernels.kernels import public as ops

PMAX = 128
MAX_N = 512
EXACT_K = 1024
_KERNEL_OUT_DTYPES = (np.dtype(np.int32), *FLOAT_DTYPES)


def _exact_product(x: Any, y: Any, rows: slice, cols: slice) -> Any:
    """``x[rows] @ y[:, cols]`` as an int32 SBUF tile ``[rows, cols]`` (exact)."""
    m_tile, n_tile = rows.stop - rows.start, cols.stop - cols.start
    k = x.shape[1]
    total = nl.ndarray((m_tile, n_tile), dtype=nl.int32)
    for chunk_start in range(0, k, EXACT_K):
        chunk = nl.ndarray((m_tile, n_tile), dtype=nl.float32, buffer=nl.psum)
        for k0 in range(chunk_start, min(chunk_start + EXACT_K, k), PMAX):
            k1 = min(k0 + PMAX, k)
            # The stationary operand is x's tile transposed: K on the partition axis.
            x_t = nl.load(x[rows, k0:k1].permute((1, 0)), dtype=nl.bfloat16)
            y_t = nl.load(y[k0:k1, cols], dtype=nl.bfloat16)
            nisa.nc_matmul(dst=chunk, stationary=x_t, moving=y_t, accumulate=k0 > chunk_start)
        if chunk_start == 0:
            nisa.tensor_copy(dst=total, src=chunk)  # float32 -> int32, exact below 2**24
        else:
            nisa.tensor_tensor(
                dst=total,
                data1=total,
                data2=nl.copy(chunk, dtype=nl.int32),
                op=nl.add,
                engine=nisa.engine.gpsimd,
            )
    return total


@nki.jit
def int8_matmul_kernel(x: Any, y: Any, x_scale: Any, y_scale: Any, out_dtype: Any) -> Any:
    """``x [M, K]`` int8, ``y [K, N]`` int8 -> ``[M, N]`` ``out_dtype``: the exact int32
    product, or with ``x_scale [M]``, ``y_scale [N]`` float32 (both or neither)
    ``acc * x_scale[:, None] * y_scale[None, :]`` computed in float32."""
    m, n = x.shape[0], y.shape[1]
    out = nl.ndarray((m, n), dtype=out_dtype, buffer=nl.shared_hbm)
    for m0 in range(0, m, PMAX):
        rows = slice(m0, min(m0 + PMAX, m))
        m_tile = rows.stop - rows.start
        if x_scale is not None:
            row_scale = nl.load(x_scale[rows].reshape((m_tile, 1)))
        for n0 in range(0, n, MAX_N):
            cols = slice(n0, min(n0 + MAX_N, n))
            product = _exact_product(x, y, rows, cols)
            if x_scale is None:
                nl.store(out[rows, cols], product)
                continue
            n_tile = cols.stop - cols.start
            col_scale = nl.load(y_scale[cols].reshape((1, n_tile)).broadcast(0, m_tile))
            scaled = nl.ndarray((m_tile, n_tile), dtype=nl.float32)
            nisa.tensor_scalar(scaled, product, nl.multiply, row_scale)
            nl.store(out[rows, cols], nl.multiply(scaled, col_scale, dtype=out_dtype))
    return out


@BACKEND.implements(ops.int8_matmul)
def int8_matmul(
    x: np.ndarray,
    y: np.ndarray,
    *,
    x_scale: np.ndarray | None,
    y_scale: np.ndarray | None,
    out_dtype: np.dtype,
) -> np.ndarray:
    """``x [M, K]`` int8 @ ``y [K, N]`` int8 -> ``[M, N]`` (see the module docstring)."""
    out_dtype = np.dtype(out_dtype)
    # float64 (not an NKI dtype) leaves the kernel as float32: the op computes in float32.
    kernel_dtype = out_dtype if out_dtype in _KERNEL_OUT_DTYPES else np.dtype(np.float32)
    result: np.ndarray = run(int8_matmul_kernel, x, y, x_scale, y_scale, out_dtype=kernel_dtype)
    return result.astype(out_dtype, copy=False)
