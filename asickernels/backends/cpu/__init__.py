"""Native CPU kernels: C++ (``csrc/``) compiled when the package is built, once per
instruction-set level (x86-64 baseline, AVX2, AVX-512 with VNNI: an AVX-512 VNNI int8
microkernel, portable loops below it), the best level the CPU has chosen at load time.

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
        if _library.built_library() is None:  # a source checkout, not built
            hint = "`pip install -e .` in the clone (builds the C++ kernels with a C++ compiler)"
        else:  # the wheel's library does not load here
            hint = (
                "the wheel's library needs Linux with glibc >= 2.28: reinstall asickernels "
                "(pip install --force-reinstall ...); in a clone, `pip install -e .` rebuilds it"
            )
        return Availability("missing", reason, install_hint=hint)
    level = _library.isa_level()
    return Availability(
        "native", f"C++ kernels, {level} level (int8: {_library.int8_matmul_path()})"
    )


BACKEND = Backend(name="cpu", array_kind="jax", probe=_probe, platforms=("cpu",), package=__name__)

__all__ = ["BACKEND"]
