"""Linear sum assignment on the native CPU kernel (``csrc/linear_sum_assignment.cpp``:
SciPy's algorithm and tie rules, in double for every input dtype): JAX (FFI) and host
(numpy) entry points."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from asickernels.backends.cpu import BACKEND, _library
from asickernels.kernels.registry import FLOAT32_AND_64

# asickernels_cpu_linear_sum_assignment: dtype code, cost, row_mask, col_mask, batch, n, m,
# assignment, num_assigned.
_HOST_ARGTYPES = (
    _library.INT, *[_library.POINTER] * 3, *[_library.INT64] * 3, *[_library.POINTER] * 2,
)  # fmt: skip


def _outputs(batch: int, n: int) -> list[tuple[tuple[int, ...], np.dtype]]:
    return [((batch, n), np.dtype(np.int32)), ((batch,), np.dtype(np.int32))]


@BACKEND.implements("linear_sum_assignment", dtypes=FLOAT32_AND_64)
def linear_sum_assignment(
    cost: jax.Array, row_mask: jax.Array, col_mask: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``cost [B, N, M]``, masks ``[B, N]``, ``[B, M]`` -> (``assignment [B, N]``,
    ``num_assigned [B]``) int32; see :mod:`asickernels.kernels.linear_sum_assignment`."""
    dtype = _library.float_kernel_dtype(cost.dtype)
    batch, n = row_mask.shape
    results = tuple(jax.ShapeDtypeStruct(s, d) for s, d in _outputs(batch, n))
    call = jax.ffi.ffi_call(
        _library.ffi_target(f"linear_sum_assignment_{_library.FLOAT_SUFFIX[dtype]}"),
        results,
        vmap_method="broadcast_all",
    )
    assignment, count = call(
        jnp.asarray(cost).astype(dtype),
        jnp.asarray(row_mask).astype(bool),
        jnp.asarray(col_mask).astype(bool),
    )
    return assignment, count


@BACKEND.host_twin("linear_sum_assignment")
def linear_sum_assignment_host(
    cost: np.ndarray, row_mask: np.ndarray, col_mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Host twin of :func:`linear_sum_assignment`: numpy in, numpy out (no copy of a
    C-contiguous float32/float64 cost)."""
    (cost,) = _library.float_host_arrays(cost)
    row_mask = np.ascontiguousarray(row_mask, np.bool_)
    col_mask = np.ascontiguousarray(col_mask, np.bool_)
    batch, n, m = cost.shape
    return _library.run_entry(  # type: ignore[no-any-return]
        _library.host_entry("linear_sum_assignment", *_HOST_ARGTYPES),
        (_library.FLOAT_CODES[cost.dtype],),
        (cost, row_mask, col_mask),
        (batch, n, m),
        _outputs(batch, n),
    )
