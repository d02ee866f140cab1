"""The native CPU library: loading it, calling an op's host entry point through ctypes
(host path) and registering an op's XLA FFI handler (JAX path). Each op's module names the
symbols it calls and declares their ctypes argument types (:func:`host_entry`,
:func:`ffi_target`); ``csrc/kernels.h`` describes the C++ side.

The library (``_kernels*.so`` beside this file) is built with the package (``setup.py``:
a wheel carries it; an editable install builds it in place), so nothing is compiled at run
time. The AddressSanitizer + UBSan build of the same sources, for tests, is compiled on
demand (``SANITIZE_ENV``).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from asickernels import _native_build
from asickernels.kernels.declaration import host_empty

_HERE = Path(__file__).parent
_CSRC = _HERE / "csrc"
# "1" selects the AddressSanitizer + UBSan build (one instruction-set level, compiled here);
# the process needs LD_PRELOAD set to sanitizer_preload() (see tests/backends/cpu/test_cpu_backend.py).
SANITIZE_ENV = "ASICKERNELS_CPU_SANITIZE"
# The sanitized build's flags; setup.py has the release build's.
_SANITIZE_FLAGS = (
    "-std=c++17", "-fPIC", "-shared", "-pthread", "-Wall", "-Wextra", "-ffp-contract=off",
    "-DNDEBUG",
)  # fmt: skip

_FFI_PREFIX = "asickernels_cpu_ffi_"
_ERRORS = {1: "unsupported dtype or metric code", 2: "out of memory"}
#: The kernels' instruction-set levels, lowest first (``csrc/dispatch.cpp``).
ISA_LEVELS = ("baseline", "avx2", "avx512")

FLOAT_CODES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1}
#: The suffix of an FFI handler's name per float dtype (``nms_f32``).
FLOAT_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}
OUT_KIND = {np.dtype(np.int32): 0, np.dtype(np.float32): 1, np.dtype(np.float64): 2}


class NativeCpuError(RuntimeError):
    """A native CPU kernel failed (out of memory), or the library is missing."""


def built_library() -> Path | None:
    """The library built with the package, None when there is none (a source checkout
    that was not built: ``pip install -e .``)."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = _HERE / f"_kernels{suffix}"
        if path.is_file():
            return path
    return None


def unavailable_reason() -> str | None:
    """None when the library is here and loads, else why not (loads it: no compilation)."""
    if os.environ.get(SANITIZE_ENV) == "1":
        if not _CSRC.is_dir():
            return f"{SANITIZE_ENV}=1 builds from the C++ sources of a source checkout"
        if _native_build.compiler() is None:
            return f"{SANITIZE_ENV}=1 needs a C++ compiler: {_native_build.no_compiler_reason()}"
        return None
    if built_library() is None:
        return (
            f"the native CPU library is not built in {_HERE} (a source checkout: "
            "run `pip install -e .` to build it)"
        )
    try:
        import jax.ffi  # noqa: F401

        library()
    except (ImportError, OSError, NativeCpuError) as error:
        return f"the native CPU library does not load: {error}"
    return None


def sanitizer_preload() -> str:
    return _native_build.sanitizer_preload(_native_build.require_compiler("sanitizer preload"))


def sanitized_library_path() -> Path:
    """Builds (or finds in the cache) the sanitized library for this JAX's FFI headers."""
    import jax

    include = Path(jax.ffi.include_dir())
    sources = sorted(_CSRC.glob("*.cpp"))
    headers = sorted(_CSRC.glob("*.h"))
    try:
        return _native_build.build(
            "cpu-kernels",
            sources,
            flags=_SANITIZE_FLAGS,
            headers=(*headers, *sorted((include / "xla" / "ffi" / "api").glob("*.h"))),
            include_dirs=(include,),
            sanitize=True,
        )
    except _native_build.NativeBuildError as error:
        raise NativeCpuError(str(error)) from None


#: ctypes argument types of the host entry points: C ``int``, ``int64_t``, ``double`` and a
#: pointer (an array's data, or null).
INT, INT64, DOUBLE, POINTER = ctypes.c_int, ctypes.c_int64, ctypes.c_double, ctypes.c_void_p


@functools.cache
def library() -> ctypes.CDLL:
    """The loaded library, its thread count set to the CPU count."""
    sanitize = os.environ.get(SANITIZE_ENV) == "1"
    if sanitize and "libasan" not in os.environ.get("LD_PRELOAD", ""):
        raise NativeCpuError(
            "the sanitized native CPU build needs the ASan runtime preloaded: run Python with "
            f"LD_PRELOAD='{sanitizer_preload()}' ASAN_OPTIONS=detect_leaks=0"
        )
    path = sanitized_library_path() if sanitize else built_library()
    if path is None:
        raise NativeCpuError(str(unavailable_reason()))
    lib = ctypes.CDLL(str(path))
    lib.asickernels_cpu_int8_matmul_path.restype = ctypes.c_char_p
    lib.asickernels_cpu_use_isa_level.argtypes = [INT]
    lib.asickernels_cpu_set_max_threads.argtypes = [INT]
    if bool(lib.asickernels_cpu_sanitized()) != sanitize:
        raise NativeCpuError(f"{lib._name} is not the {'sanitized' if sanitize else 'plain'} build")
    lib.asickernels_cpu_set_max_threads(os.cpu_count() or 1)
    return lib


def check(status: int) -> None:
    """Raises for a non-zero status of a host entry point."""
    if status != 0:
        raise NativeCpuError(f"native CPU kernel failed: {_ERRORS.get(status, status)}")


def int8_matmul_path() -> str:
    """``"avx512-vnni"`` or ``"portable"``: the int8 microkernel that runs here."""
    return str(library().asickernels_cpu_int8_matmul_path().decode())


def isa_level() -> str:
    """The instruction-set level the kernels run (one of :data:`ISA_LEVELS`): the best this
    CPU has, unless lowered with :func:`use_isa_level`."""
    return ISA_LEVELS[library().asickernels_cpu_isa_level()]


def best_isa_level() -> str:
    """The best instruction-set level of this build that this CPU runs."""
    return ISA_LEVELS[library().asickernels_cpu_best_isa_level()]


def use_isa_level(level: str) -> str:
    """Runs the kernels at ``level`` (one of :data:`ISA_LEVELS`), or at the best this CPU
    has if that is lower, from now on; returns the level in effect. For tests: every level
    computes the same results."""
    if level not in ISA_LEVELS:
        raise ValueError(f"level must be one of {ISA_LEVELS}, got {level!r}")
    return ISA_LEVELS[library().asickernels_cpu_use_isa_level(ISA_LEVELS.index(level))]


@functools.cache
def host_entry(name: str, *argtypes: Any) -> Any:
    """The host entry point ``asickernels_cpu_<name>`` (defined in its op's ``csrc`` file),
    taking ``argtypes`` and returning a status for :func:`check`."""
    function = getattr(library(), f"asickernels_cpu_{name}")
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function


@functools.cache
def ffi_target(name: str) -> str:
    """The XLA FFI target of the handler ``asickernels_cpu_ffi_<name>`` (defined in its op's
    ``csrc`` file), registered with XLA on first use in the process."""
    import jax

    target = _FFI_PREFIX + name
    handler = getattr(library(), target)
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(handler), platform="cpu")
    return target


def address(array: np.ndarray | None) -> int | None:
    """The data pointer of a C-contiguous array (None for None, or for an array that is not
    C-contiguous): the zero-copy hand-over."""
    if array is None or not array.flags.c_contiguous:
        return None
    return array.__array_interface__["data"][0]  # type: ignore[no-any-return]


_FLOAT32, _FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)


def float_kernel_dtype(*dtypes: np.dtype) -> np.dtype:
    """float64 if any input is float64, else float32 (bfloat16/float16 are upcast)."""
    return _FLOAT64 if any(d == _FLOAT64 for d in dtypes) else _FLOAT32


def float_host_arrays(*arrays: np.ndarray) -> list[np.ndarray]:
    """The arrays as C-contiguous arrays of one kernel dtype (:func:`float_kernel_dtype` of
    theirs), copied only where they are not already: a float kernel's host inputs."""
    dtype = float_kernel_dtype(*(np.asarray(a).dtype for a in arrays))
    return [np.ascontiguousarray(a, dtype) for a in arrays]


def run_entry(
    entry: Any,
    leading: tuple[Any, ...],
    inputs: Sequence[np.ndarray | None],
    trailing: tuple[Any, ...],
    outputs: Sequence[tuple[tuple[int, ...], np.dtype]],
) -> Any:
    """Runs host entry point ``entry(*leading, *input pointers, *trailing, *output pointers)``
    (a :func:`host_entry`) on ``inputs`` (C-contiguous arrays of the kernel's dtypes; None
    passes a null pointer) and returns new output arrays of ``outputs`` (shape, dtype) pairs,
    a tuple when there are several. A failure status raises (see :func:`check`)."""
    outs = tuple(host_empty(shape, dtype) for shape, dtype in outputs)
    check(entry(*leading, *map(address, inputs), *trailing, *map(address, outs)))
    return outs[0] if len(outs) == 1 else outs
