"""Input checks shared by the op declarations: they run on shapes, dtypes and Python scalars
only (a :class:`~asickernels.kernels.declaration.Spec` or an array), before any kernel runs."""

from __future__ import annotations

import math
import numbers
import operator
from typing import Protocol, SupportsIndex, TypeVar

import jax
import ml_dtypes
import numpy as np

FLOAT_DTYPES = (
    np.dtype(np.float16),
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(np.float32),
    np.dtype(np.float64),
)


class Shaped(Protocol):
    """What the checks read of an array argument: a :class:`~asickernels.kernels.declaration.Spec`,
    a numpy array or a JAX array (traced or not)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype: ...


SpecT = TypeVar("SpecT")


def as_array(value: object, name: str) -> np.ndarray | jax.Array:
    """``value`` as something with ``.shape`` and ``.dtype`` (JAX arrays and tracers are
    kept as they are, so no device transfer or tracing happens here)."""
    if type(value) is np.ndarray or isinstance(value, (jax.Array, np.ndarray)):
        return value
    if hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "__array__"):
        return np.asarray(value)
    try:
        return np.asarray(value)
    except Exception as error:
        raise TypeError(f"{name} must be an array, got {type(value).__name__}") from error


def required(spec: SpecT | None, name: str) -> SpecT:
    """``spec``, the spec of a required array ``name``, which must not be None.

    Raises:
      TypeError: it is None.
    """
    if spec is None:
        raise TypeError(f"{name} must be an array, got None")
    return spec


def check_float(array: Shaped, name: str) -> None:
    if np.dtype(array.dtype) not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be a floating array (float32, bfloat16, float16 or float64), "
            f"got dtype {array.dtype}"
        )


def check_boxes(array: Shaped, name: str, min_ndim: int = 1) -> None:
    check_float(array, name)
    if len(array.shape) < min_ndim or array.shape[-1:] != (4,):
        raise ValueError(
            f"{name} must have shape [..., 4] (x1, y1, x2, y2)"
            + (f" with at least {min_ndim} dims" if min_ndim > 1 else "")
            + f", got {tuple(array.shape)}"
        )


def float_compute_dtype(*arrays: Shaped | None) -> str:
    """The compute dtype of float inputs: float64 if any is float64, else float32."""
    return "float64" if any(a is not None and a.dtype == np.float64 for a in arrays) else "float32"


def static_float(value: object, name: str, low: float = -math.inf, high: float = math.inf) -> float:
    """A Python number in ``[low, high]`` (not NaN): thresholds are static, not traced."""
    if isinstance(value, jax.core.Tracer):
        raise TypeError(f"{name} must be a static Python number, not a traced value")
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.ndarray, np.generic)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    number = float(value)
    if math.isnan(number) or not low <= number <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {number}")
    return number


def static_int(value: object, name: str, low: int = 0, high: int | None = None) -> int:
    if isinstance(value, (bool, jax.core.Tracer)):
        raise TypeError(f"{name} must be a static Python int, got {value!r}")
    try:
        if not isinstance(value, SupportsIndex):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if number < low or (high is not None and number > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {number}")
    return number


def size(shape: tuple[int, ...]) -> int:
    return math.prod(shape)
