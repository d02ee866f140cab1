"""Pallas (``pl``) and its TPU part (``pltpu``), from their public home ``jax.pallas`` where the
installed jax has it (0.12.1 and newer), else from ``jax.experimental.pallas``: the one
place that chooses, below both the backends and the simulators (so that neither imports the
other for it). The same objects either way (jax 0.12.1 re-exports them there)."""

from __future__ import annotations

try:
    from jax import pallas as pl
    from jax.pallas import tpu as pltpu
except ImportError:  # jax < 0.12.1
    from jax.experimental import pallas as pl  # type: ignore[no-redef]
    from jax.experimental.pallas import tpu as pltpu  # type: ignore[no-redef]

__all__ = ["pl", "pltpu"]
