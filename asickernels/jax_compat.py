"""jax APIs that changed between the versions we support and that both the kernel layer and
the simulators use: chosen once, here, below both (so that neither imports the other for
it). Pallas's own home is :mod:`asickernels.pallas_home`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jax


def single_device_sharding(device: jax.Device) -> jax.sharding.Sharding:
    """The sharding that places an array on ``device``: ``make_single_device_sharding`` where
    jax has it (jax 0.12.1 deprecates constructing ``SingleDeviceSharding``), else the class."""
    import jax

    make = getattr(jax.sharding, "make_single_device_sharding", None)
    return make(device) if make is not None else jax.sharding.SingleDeviceSharding(device)
