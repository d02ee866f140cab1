"""Plain ``jax.numpy`` implementations: jit-able everywhere, and the XLA baseline."""

from __future__ import annotations

from typing import TYPE_CHECKING

from asickernels.kernels.registry import Availability, Backend

if TYPE_CHECKING:
    import jax
    import numpy as np


def _probe() -> Availability:
    import jax

    return Availability("native", f"XLA on {jax.default_backend()}")


BACKEND = Backend(
    name="xla", array_kind="jax", probe=_probe, platforms=("*",), embeddable=True, package=__name__
)


def compute_dtype(*arrays: jax.Array) -> np.dtype:
    """The dtype the float kernels compute in: float32 for narrower floats, float64 kept
    (decided in float64 under x64)."""
    import jax.numpy as jnp

    return jnp.result_type(jnp.float32, *(a.dtype for a in arrays))
