"""The native CPU library: loading it, and calling a kernel's XLA FFI handler, the kernel's
one binding (:func:`call`): through XLA (``jax.ffi.ffi_call``) for JAX arrays and traced
values, or here on the host for numpy arrays, the handler decoding and checking both calls
alike (``csrc/binding.cpp``).

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
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from asickernels import _native_build
from asickernels.kernels.declaration import Array
from asickernels.kernels.eager import host_empty

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
#: The kernels' instruction-set levels, lowest first (``csrc/dispatch.cpp``).
ISA_LEVELS = ("baseline", "avx2", "avx512")


class NativeCpuError(RuntimeError):
    """A native CPU kernel refused its call or failed (out of memory), or the library is
    missing."""


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
        library()
    except (OSError, NativeCpuError) as error:
        return f"the native CPU library does not load: {error}"
    return None


def sanitizer_preload() -> str:
    return _native_build.sanitizer_preload(_native_build.require_compiler("sanitizer preload"))


def sanitized_library_path() -> Path:
    """Builds (or finds in the cache) the sanitized library for this JAX's FFI headers."""
    include = Path(jax.ffi.include_dir())
    sources = sorted([*_HERE.glob("*.cpp"), *_CSRC.glob("*.cpp")])
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
    lib.asickernels_cpu_use_isa_level.argtypes = [ctypes.c_int]
    lib.asickernels_cpu_set_max_threads.argtypes = [ctypes.c_int]
    lib.asickernels_cpu_call.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.asickernels_cpu_call_error.restype = ctypes.c_char_p
    lib.asickernels_cpu_element_type.argtypes = [ctypes.c_char_p]
    if bool(lib.asickernels_cpu_sanitized()) != sanitize:
        raise NativeCpuError(f"{lib._name} is not the {'sanitized' if sanitize else 'plain'} build")
    lib.asickernels_cpu_set_max_threads(os.cpu_count() or 1)
    return lib


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
def ffi_target(kernel: str) -> str:
    """The XLA FFI target of ``kernel``'s handler ``asickernels_cpu_ffi_<kernel>`` (defined
    in its op's ``.cpp``), registered with XLA on first use in the process."""
    target = _FFI_PREFIX + kernel
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(_handler(kernel)), platform="cpu")
    return target


@functools.cache
def _handler(kernel: str) -> Any:
    return getattr(library(), _FFI_PREFIX + kernel)


@functools.cache
def _handler_address(kernel: str) -> int:
    return ctypes.cast(_handler(kernel), ctypes.c_void_p).value or 0


#: A kernel's static argument as it reaches its handler: a float64, int64 or bool scalar,
#: a string, or a 1-D int64 array (from a tuple or list of ints).
Attribute = np.float64 | np.int64 | np.bool_ | str | np.ndarray


def attribute(name: str, value: object) -> Attribute:
    """``value`` as the handler's attribute ``name`` takes it: Python and numpy floats as
    float64, integers as int64, bools as bool (the C++ field's type must match: the handler
    refuses any other), strings, and tuples or lists of ints as int64 arrays."""
    if isinstance(value, (bool, np.bool_)):
        return np.bool_(value)
    if isinstance(value, (int, np.integer)):
        return np.int64(value)
    if isinstance(value, (float, np.floating)):
        return np.float64(value)
    if isinstance(value, str):
        return value
    if isinstance(value, (tuple, list)) and all(isinstance(v, (int, np.integer)) for v in value):
        return np.asarray(value, np.int64)
    raise TypeError(f"{name}: a native kernel takes no attribute of type {type(value).__name__}")


def call(
    kernel: str,
    arrays: Sequence[Array],
    results: Sequence[tuple[tuple[int, ...], npt.DTypeLike]],
    *,
    vmap_method: str = "broadcast_all",
    **attributes: object,
) -> Any:
    """Runs ``kernel``'s XLA FFI handler on ``arrays`` with ``attributes`` (its statics, by
    the names of its attributes struct's fields; see :func:`attribute`) and returns new
    arrays of the ``results`` (shape, dtype): one array, or a tuple when there are several.

    Numpy arrays (all of them) run on the host and give numpy arrays; anything else (JAX
    arrays, traced values) runs through ``jax.ffi.ffi_call`` (under ``jit``; ``vmap_method``
    says how ``vmap`` batches it). The handler checks the call either way: array count,
    element types and shapes, attribute names and types.

    Raises:
      NativeCpuError: on the host, the handler refused the call or ran out of memory
        (under XLA the same error is XLA's).
    """
    if on_host(*arrays):
        return _call_on_host(kernel, arrays, results, attributes)  # type: ignore[arg-type]
    statics = {name: attribute(name, value) for name, value in attributes.items()}
    shapes = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in results]
    outputs = jax.ffi.ffi_call(ffi_target(kernel), shapes, vmap_method=vmap_method)(
        *arrays, **statics
    )
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def on_host(*arrays: Array | None) -> bool:
    """Whether every array given is a numpy array (a call :func:`call` runs on the host)."""
    return all(type(a) is np.ndarray for a in arrays if a is not None)


def convert(array: Array, dtype: npt.DTypeLike) -> Array:
    """``array`` as ``dtype``: a C-contiguous numpy array for a numpy one (copied only where
    it is not already one), else a JAX array."""
    if type(array) is np.ndarray:
        return np.ascontiguousarray(array, dtype)
    return jnp.asarray(array).astype(np.dtype(dtype))


_FLOAT32, _FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)


def float_kernel_dtype(*dtypes: npt.DTypeLike) -> np.dtype:
    """float64 if any input is float64, else float32 (bfloat16/float16 are upcast)."""
    return _FLOAT64 if any(np.dtype(d) == _FLOAT64 for d in dtypes) else _FLOAT32


def float_arrays(*arrays: Array) -> list[Array]:
    """The arrays as one kernel float dtype (:func:`float_kernel_dtype` of theirs), each
    :func:`convert`-ed: a float kernel's inputs."""
    dtype = float_kernel_dtype(*(a.dtype for a in arrays))
    return [convert(a, dtype) for a in arrays]


# -- The host path: a call frame packed for asickernels_cpu_call (csrc/binding.cpp) ------------

_SCALAR, _STRING, _ARRAY = 3, 4, 1  # XLA_FFI_AttrType


@functools.cache
def _element_type(dtype: np.dtype) -> int:
    """XLA's element type number of a numpy dtype (the library's table)."""
    code = int(library().asickernels_cpu_element_type(dtype.name.encode()))
    if code < 0:
        raise TypeError(f"native CPU kernels take no {dtype} arrays")
    return code


@functools.lru_cache(maxsize=1024)
def _name(text: str) -> tuple[bytes, int, int]:
    """``text`` encoded, with its address and length: an attribute's name or string value
    (the kernels' own, a few), kept alive by this cache while a call uses it."""
    encoded = text.encode()
    return encoded, ctypes.cast(ctypes.c_char_p(encoded), ctypes.c_void_p).value or 0, len(encoded)


# How an attribute value of each Python type is packed after its name's address and length:
# its kind, its element type's name ("": none) and the value's layout (None: an int array,
# its length then its values, inline).
_PACKING: dict[type, tuple[int, str, str | None]] = {
    float: (_SCALAR, "float64", "d"),
    int: (_SCALAR, "int64", "q"),
    bool: (_SCALAR, "bool", "?7x"),  # its one byte first in the word
    str: (_STRING, "", "2q"),  # address, length
    tuple: (_ARRAY, "int64", None),
    list: (_ARRAY, "int64", None),
}

# Per attribute, sorted by name (as handlers look them up): its index in the call, its words
# before the value, the value's layout; and the layout of them all (None with an int array).
_Plan = tuple[tuple[tuple[int, tuple[int, ...], str | None], ...], str | None]


@functools.lru_cache(maxsize=1024)
def _attribute_plan(names: tuple[str, ...], kinds: tuple[type, ...]) -> _Plan:
    """How attributes of these names (in call order) and Python types are packed."""
    plan = []
    for i in sorted(range(len(names)), key=names.__getitem__):
        kind, element, value_layout = _PACKING[kinds[i]]
        head: tuple[int, ...] = (*_name(names[i])[1:], kind)
        if element:
            head += (_element_type(np.dtype(element)),)
        plan.append((i, head, value_layout))
    layouts = [f"{len(head)}q{value_layout}" for _, head, value_layout in plan if value_layout]
    return tuple(plan), "".join(layouts) if len(layouts) == len(plan) else None


def _host_value(name: str, value: object) -> object:
    """``value`` as a Python float, int, bool, str or tuple of ints (:func:`attribute`)."""
    kind = type(value)
    if kind in (tuple, list):
        if all(type(v) is int for v in value):  # type: ignore[attr-defined]
            return value
    elif kind in _PACKING:
        return value
    converted = attribute(name, value)
    return converted if isinstance(converted, str) else converted.tolist()


def _address(array: np.ndarray) -> int:
    """The data address of a C-contiguous array (through the buffer protocol where it is
    writable: a third of the cost of ``__array_interface__``)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))  # type: ignore[arg-type]
    except (TypeError, ValueError, BufferError):  # read-only, empty, or no buffer format
        return array.__array_interface__["data"][0]  # type: ignore[no-any-return]


def _call_on_host(
    kernel: str,
    arrays: Sequence[np.ndarray],
    results: Sequence[tuple[tuple[int, ...], npt.DTypeLike]],
    attributes: dict[str, object],
) -> Any:
    arrays = [np.ascontiguousarray(a) for a in arrays]
    outputs = [host_empty(shape, dtype) for shape, dtype in results]
    words: list[Any] = [len(arrays), len(outputs), len(attributes)]
    for array in (*arrays, *outputs):
        words += (_element_type(array.dtype), _address(array), array.ndim, *array.shape)
    values = [_host_value(name, value) for name, value in attributes.items()]
    plan, attribute_layout = _attribute_plan(tuple(attributes), tuple(map(type, values)))
    layout = f"={len(words)}q"  # native order, no padding
    pieces: list[str] | None = [] if attribute_layout is None else None
    for i, head, value_layout in plan:
        words += head
        value: Any = values[i]
        if value_layout is None:  # an int array: its length, then its values
            words += (len(value), *value)
            value_layout = f"{1 + len(value)}q"
        elif value_layout == "2q":  # a string: its address and length
            words += _name(value)[1:]
        else:
            words.append(value)
        if pieces is not None:
            pieces.append(f"{len(head)}q{value_layout}")
    layout += "".join(pieces) if pieces is not None else attribute_layout or ""
    lib = library()
    if lib.asickernels_cpu_call(_handler_address(kernel), struct.pack(layout, *words)) != 0:
        message = lib.asickernels_cpu_call_error().decode()  # XLA's, were it XLA's call
        raise NativeCpuError(message if message.startswith(kernel) else f"{kernel}: {message}")
    return outputs[0] if len(outputs) == 1 else tuple(outputs)
