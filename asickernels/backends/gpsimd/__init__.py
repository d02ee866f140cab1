"""GpSimd custom C++ operators for AWS Neuron (NeuronCore-v2: trn1, inf2).

The kernels (``csrc/``) are written against the device API and run on all 8 GpSimd cores.
On a Neuron host they are built with ``torch_neuronx.xla_impl.custom_op``
(:func:`build_neuron_library`); elsewhere the same sources are built with g++ through the
host shim (:mod:`asickernels.simulate.gpsimd`), which runs each core as a thread and checks
the device's rules. Host numpy arrays in and out.
"""

from __future__ import annotations

import shlex

from asickernels.backends.gpsimd import _library
from asickernels.backends.gpsimd._library import build_neuron_library
from asickernels.kernels.registry import Availability, Backend
from asickernels.simulate import gpsimd as shim


def _probe() -> Availability:
    reason = _library.neuron_unavailable_reason()
    if reason is None:
        return Availability("native", "GpSimd custom C++ operators via torch-neuronx")
    cxx = shim.compiler()
    if cxx is not None:
        return Availability(
            "simulated",
            f"host build with {shlex.join(cxx)} through the GpSimd shim, 8 cores as threads ({reason})",
        )
    return Availability(
        "missing",
        f"no C++ compiler for the GpSimd host shim ({shim.no_compiler_reason()}), and {reason}",
        install_hint="install g++ (or set $CXX); on trn1/inf2 install torch-neuronx and "
        "aws-neuronx-gpsimd-customop-lib",
    )


BACKEND = Backend(
    name="gpsimd",
    array_kind="numpy",
    probe=_probe,
    platforms=("neuron",),
    counters=_library.host_counters,
    package=__name__,
)

__all__ = ["BACKEND", "build_neuron_library"]
