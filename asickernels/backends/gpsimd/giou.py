"""GIOU through the GpSimd kernel (``csrc/giou.cpp``)."""

from __future__ import annotations

import numpy as np

from asickernels.backends.gpsimd import BACKEND, _library
from asickernels.kernels import public as ops


@BACKEND.implements(ops.giou)
def giou(boxes1: np.ndarray, boxes2: np.ndarray) -> np.ndarray:
    """``boxes1, boxes2 [P, 4]`` (any float dtype, computed in float32) -> ``[P]`` float32."""
    a = np.ascontiguousarray(boxes1, dtype=np.float32)
    b = np.ascontiguousarray(boxes2, dtype=np.float32)
    if _library.on_neuron():
        return _library.run_on_neuron("giou", a, b)
    return _library.host_library().giou(a, b)
