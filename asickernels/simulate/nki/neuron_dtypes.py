"""``neuron_dtypes``: the Neuron SDK's host-side dtype library (it ships inside the Neuron
compiler, not on PyPI), with the names AWS's NKI kernel library imports
(aws-neuron/nki-library@d2ad3a5: test/utils/mx_utils.py, test/integration/nkilib/utils/,
src/nkilib_src/nkilib/core/utils/mx_torch_common.py): numpy arrays cast into and out of the
NKI dtypes, the 4x-packed MX types included.

The dtypes are the simulator's (:data:`~asickernels.simulate.nki.tensor.DTYPES`), so an array
made here is what a kernel argument of that dtype holds. Packed MX values follow the layout
:func:`~asickernels.simulate.nki.isa.nc_matmul_mx` reads: four consecutive values of the last
axis in one element, the first in the lowest bits (fp4: two per byte, low nibble first).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from asickernels.simulate.nki import alu
from asickernels.simulate.nki.tensor import DTYPES, PACKED_X4, dtype_name, is_float, is_packed

__all__ = [
    *("bfloat16", "float8_e4m3", "float8_e4m3fn", "float8_e5m2", "tfloat32"),  # element types
    *("float4_e2m1fn_x4", "float8_e4m3fn_x4", "float8_e5m2_x4"),  # 4x-packed MX types
    *("finfo", "is_float_type", "sizeinbytes", "static_cast"),
]

bfloat16 = DTYPES["bfloat16"].type
float8_e4m3 = DTYPES["float8_e4m3"].type
float8_e4m3fn = DTYPES["float8_e4m3fn"].type
float8_e5m2 = DTYPES["float8_e5m2"].type
tfloat32 = DTYPES["tfloat32"]
float8_e5m2_x4 = DTYPES["float8_e5m2_x4"]
float8_e4m3fn_x4 = DTYPES["float8_e4m3fn_x4"]
float4_e2m1fn_x4 = DTYPES["float4_e2m1fn_x4"]


def _resolve(dtype: Any) -> np.dtype[Any]:
    """``dtype`` (a numpy or ml_dtypes type, an ``nl`` dtype, or its name) as a numpy dtype;
    the packed and tagged NKI types by name."""
    name = dtype if isinstance(dtype, str) else dtype_name(np.dtype(dtype))
    return DTYPES.get(name) or np.dtype(dtype)


def sizeinbytes(dtype: Any) -> int:
    """Bytes per element of ``dtype`` (a packed x4 type: its four values together)."""
    return _resolve(dtype).itemsize


def is_float_type(dtype: Any) -> bool:
    """Whether ``dtype`` is a floating-point type (numpy's, bfloat16, the fp8 formats)."""
    resolved = _resolve(dtype)
    return resolved.kind == "f" or is_float(resolved)


def finfo(dtype: Any) -> Any:
    """Machine limits of a floating-point ``dtype`` (``ml_dtypes.finfo``; ``.dtype`` is the
    numpy dtype)."""
    return ml_dtypes.finfo(_resolve(dtype))


def static_cast(array: Any, dtype: Any) -> np.ndarray:
    """``array`` converted to ``dtype`` element by element, as C++'s ``static_cast`` does:
    floats round to nearest even (tfloat32: float32 with a 10-bit mantissa), integers and
    bools convert as numpy's ``astype`` (truncating, wrapping). Into a packed x4 type, each 4 consecutive values of the last axis become one element
    (the last axis shrinks 4x, each value rounded to the element format); out of one, they
    expand back (the last axis grows 4x)."""
    values = np.asarray(array)
    target = _resolve(dtype)
    if is_packed(values.dtype):
        unpacked = unpack_x4(values)
        return unpacked if target == np.float32 else static_cast(unpacked, target)
    if is_packed(target):
        return pack_x4(values, target)
    if target.kind in "biu":
        return values.astype(target)
    return alu.cast(values, target)


def pack_x4(values: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """``values [..., 4F]`` as the packed x4 ``dtype`` ``[..., F]``."""
    element, nbytes = PACKED_X4[dtype_name(dtype)]
    if values.ndim == 0 or values.shape[-1] % 4:
        raise ValueError(f"packing into {dtype_name(dtype)} needs a last axis of 4k values")
    shape = (*values.shape[:-1], values.shape[-1] // 4)
    codes = np.ascontiguousarray(values.astype(np.float32).astype(element)).view(np.uint8)
    if nbytes == 2:  # fp4: two values per byte, the first in the low nibble
        low, high = codes[..., 0::2] & 0xF, codes[..., 1::2] & 0xF
        codes = (low | (high << 4)).astype(np.uint8)
    return np.ascontiguousarray(codes).view(dtype).reshape(shape)


def unpack_x4(packed: np.ndarray) -> np.ndarray:
    """A packed x4 array ``[..., F]`` as float32 ``[..., 4F]``."""
    element, nbytes = PACKED_X4[dtype_name(packed.dtype)]
    raw = np.ascontiguousarray(packed).view(np.uint8).reshape(*packed.shape, nbytes)
    if nbytes == 2:
        raw = np.stack([raw & 0xF, raw >> 4], axis=-1)
    return raw.view(element).astype(np.float32).reshape(*packed.shape[:-1], -1)
