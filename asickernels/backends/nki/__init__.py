"""NKI kernels for AWS Trainium/Inferentia NeuronCores, run on the device when there is one
and otherwise in a strict CPU simulator (:mod:`asickernels.simulate.nki`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from asickernels.kernels.registry import Availability, Backend

if TYPE_CHECKING:
    from asickernels.benchmarking.timing import Timing
    from asickernels.kernels.cases import Case


def _probe() -> Availability:
    from asickernels.backends.nki import sdk

    if not sdk.USING_SDK:
        return Availability(
            "simulated",
            "asickernels' strict NKI simulator (numpy): the Neuron SDK is not installed",
            "install neuronx-cc from AWS's pip index (pip.repos.neuron.amazonaws.com) on a "
            "Trainium/Inferentia instance to run on the device",
        )
    if sdk.has_device():
        return Availability("native", f"Neuron SDK {sdk.nki.__name__} on a NeuronCore device")
    return Availability(
        "simulated", f"the Neuron SDK's simulator ({sdk.nki.__name__}.simulate): no Neuron device"
    )


def _counters() -> dict[str, float]:
    from asickernels.backends.nki import sdk

    return sdk.last_counters()


def _device_timer(op: str, case: Case, warmup: int, iters: int) -> Timing:
    from asickernels.benchmarking import device

    return device.time_nki_op(op, case, warmup, iters)


BACKEND = Backend(
    name="nki",
    array_kind="numpy",
    probe=_probe,
    platforms=("neuron",),
    counters=_counters,
    device_timer=_device_timer,
    package=__name__,
)
