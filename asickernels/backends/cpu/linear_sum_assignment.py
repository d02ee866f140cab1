"""Linear sum assignment on the native CPU kernel (``linear_sum_assignment.cpp``: SciPy's
algorithm and tie rules, in double for every input dtype), one function for JAX arrays (XLA's
FFI) and numpy arrays (the host)."""

from __future__ import annotations

from typing import Any

import numpy as np

from asickernels.backends.cpu import BACKEND, _library
from asickernels.kernels import public as ops
from asickernels.kernels.declaration import Array
from asickernels.kernels.registry import FLOAT32_AND_64


@BACKEND.implements(ops.linear_sum_assignment, dtypes=FLOAT32_AND_64)
@BACKEND.host_twin(ops.linear_sum_assignment)
def linear_sum_assignment(cost: Array, row_mask: Array, col_mask: Array) -> Any:
    """``cost [B, N, M]``, masks ``[B, N]``, ``[B, M]`` -> (``assignment [B, N]``,
    ``num_assigned [B]``) int32; see :mod:`asickernels.kernels.linear_sum_assignment`."""
    batch, n = row_mask.shape
    arrays = [
        *_library.float_arrays(cost),
        *(_library.convert(m, np.bool_) for m in (row_mask, col_mask)),
    ]
    return _library.call(
        "linear_sum_assignment", arrays, [((batch, n), np.int32), ((batch,), np.int32)]
    )
