"""Native CPU kernels: C++ (``<op>.cpp`` beside each op's module) compiled when the package
is built, once per instruction-set level (x86-64 baseline, AVX2, AVX-512 with VNNI: an
AVX-512 VNNI int8 microkernel, portable loops below it), the best level the CPU has chosen
at load time.

Each kernel has one binding, its XLA FFI handler (typed C++ arguments, results and
attributes), and one Python function: JAX arrays run it through XLA (``jit``, ``vmap``,
``grad``), numpy arrays (eager calls, CPU torch tensors) on the host, zero-copy
(:func:`asickernels.backends.cpu._library.call`). float32 and float64 are computed in their
own precision (NMS decides in float64 always).
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
