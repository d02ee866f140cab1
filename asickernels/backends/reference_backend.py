"""The numpy float64 reference (:mod:`asickernels.reference`) as a backend."""

from __future__ import annotations

from asickernels.kernels.registry import Availability, Backend

BACKEND = Backend(
    name="reference",
    array_kind="numpy",
    probe=lambda: Availability("native", "numpy, float64"),
    description="the numerical reference: numpy in float64, the definition of every op",
)
