"""Native CPU kernels: C++ (``csrc/``) built with the system compiler at first use
(``-O3 -march=native``: an AVX-512 VNNI int8 microkernel where the CPU has it, portable
loops elsewhere) and cached by content.

Each kernel has two entry points over the same compiled library: a JAX implementation
through XLA's FFI (works under ``jit``, ``vmap`` and ``grad``) and a host twin taking and
returning numpy arrays through ctypes (zero-copy), for eager calls and CPU torch tensors.
float32 and float64 are computed in their own precision (NMS decides in float64 always).
"""

from __future__ import annotations

from asickernels.backends.cpu import _library
from asickernels.kernels.registry import Availability, Backend


def _probe() -> Availability:
    reason = _library.unavailable_reason()
    if reason is not None:
        return Availability(
            "missing", reason, install_hint="install g++ (or set $CXX to a C++17 compiler)"
        )
    return Availability("native", f"C++ kernels built with {_library.compiler_name()}")


BACKEND = Backend(
    name="cpu",
    array_kind="jax",
    probe=_probe,
    description="native C++ CPU kernels through XLA's FFI (and numpy for eager host calls)",
    platforms=("cpu",),
    package=__name__,
)

__all__ = ["BACKEND"]
