"""Pallas kernels for TPUs (Mosaic). Compiled on a TPU; elsewhere run in Pallas interpret
mode (``"pallas_tpu"``) or TPU interpret mode with race detection (``"pallas_tpu_interpret"``)."""

from __future__ import annotations

import importlib.util

from asickernels.kernels.registry import Availability, Backend
from asickernels.tpu_generations import LIBTPU_INSTALL


def _probe_compiled() -> Availability:
    import jax

    platform = jax.default_backend()
    if platform == "tpu":
        return Availability("native", f"compiled by Mosaic for {jax.devices()[0].device_kind}")
    has_libtpu = importlib.util.find_spec("libtpu") is not None
    return Availability(
        "simulated",
        f"no TPU ({platform}): Pallas interpret mode; `asickernels compile` still compiles "
        "for TPU with libtpu",
        None if has_libtpu else f"{LIBTPU_INSTALL}, for the compile gate",
    )


def _probe_interpret() -> Availability:
    return Availability(
        "simulated", "TPU interpret mode (pltpu.InterpretParams): DMAs, semaphores, race detection"
    )


BACKEND = Backend(
    name="pallas_tpu",
    array_kind="jax",
    probe=_probe_compiled,
    platforms=("tpu",),
    embeddable=True,
    package=__name__,
)


def _traceable() -> bool:
    from asickernels.backends.pallas_tpu import lowering

    return lowering.tpu_interpret_traceable()


INTERPRET_BACKEND = Backend(
    name="pallas_tpu_interpret",
    array_kind="jax",
    probe=_probe_interpret,
    traceable=_traceable,
    kernels_of="pallas_tpu",
    kernel_kwargs={"mode": "tpu_interpret"},
)
