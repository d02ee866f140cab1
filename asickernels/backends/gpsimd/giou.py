"""GIOU through the GpSimd kernel (``csrc/giou.cpp``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from asickernels.backends.gpsimd import _library
from asickernels.simulate import gpsimd as shim


def giou(boxes1: np.ndarray, boxes2: np.ndarray, *, config: Any = None) -> np.ndarray:
    """``boxes1, boxes2 [P, 4]`` (any float dtype, computed in float32) -> ``[P]`` float32."""
    _library.check_config(config)
    a = np.ascontiguousarray(boxes1, dtype=np.float32)
    b = np.ascontiguousarray(boxes2, dtype=np.float32)
    if _library.on_neuron():
        return _library.run_on_neuron("giou", a, b)
    out = np.empty(a.shape[0], np.float32)
    shim.call(_library.host_library().asickernels_gpsimd_giou, a, b, a.shape[0], out)
    return out
