"""asickernels: GIOU, NMS and int8 matmul kernels for TPUs (Pallas) and AWS Neuron
(NKI, GpSimd), with CPU simulation paths and one shared numerical reference."""

from __future__ import annotations

from asickernels import backends as _backends  # noqa: F401  (fills the registry)
from asickernels.kernels.int8_matmul import INT8_MATMUL_MAX_K
from asickernels.kernels.public import *  # noqa: F403  (every op: asickernels.giou, ...)
from asickernels.kernels.public import OPS
from asickernels.kernels.registry import Availability, BackendUnavailableError


def available_backends() -> dict[str, Availability]:
    """Every registered backend and how it runs here: ``native``, ``simulated`` or
    ``missing`` (with the reason and an install hint)."""
    from asickernels.kernels import registry

    return {name: registry.availability(name) for name in registry.backend_names()}


__all__ = [
    "INT8_MATMUL_MAX_K",
    "OPS",
    "Availability",
    "BackendUnavailableError",
    "available_backends",
    *(op.name for op in OPS),
]
__version__ = "0.1.0"
