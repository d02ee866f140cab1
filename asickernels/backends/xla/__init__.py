"""Plain ``jax.numpy`` implementations: jit-able everywhere, and the XLA baseline."""

from __future__ import annotations

from asickernels.kernels.registry import Availability, Backend


def _probe() -> Availability:
    import jax

    return Availability("native", f"XLA on {jax.default_backend()}")


BACKEND = Backend(
    name="xla", array_kind="jax", probe=_probe, platforms=("*",), embeddable=True, package=__name__
)
