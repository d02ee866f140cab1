"""Host shim for GpSimd custom C++ operators (AWS Neuron, NeuronCore-v2): run a Neuron
custom operator on a laptop, unchanged.

:func:`load` mirrors ``torch_neuronx.xla_impl.custom_op.load(name, compute_srcs, shape_srcs,
build_directory, multicore)``: it builds the same kernel and shape sources with the system
C++ compiler against the headers in ``include/`` (the documented device API:
``<torch/torch.h>``, ``<neuron/neuron-utils.hpp>``, ``"torchneuron/register.h"``) and returns
a :class:`CustomOpLibrary` whose attributes are the ops ``m.def`` registered, callable with
numpy arrays or CPU torch tensors. Each call runs the shape function, then the kernel on one
simulated core (``multicore=False``) or on all 8 (threads), and raises :class:`ShimError`
listing **every** device rule the run broke (see README "Simulate your own GpSimd operator").

Rules are from aws-neuron-sdk ``neuron-customops/`` (custom-c++-operators-devguide.rst,
custom-ops-ref-guide.rst) at revision 81ce03a.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from asickernels._native_build import (
    SANITIZER_FLAGS,
    build_atomically,
    cache_dir,
    compiler,
    compiler_version,
    host_cpu,
    no_compiler_reason,
    optimize_flags,
    require_compiler,
    run_compiler,
    source_digest,
)
from asickernels._native_build import sanitizer_preload as _sanitizer_preload

__all__ = [
    "CORE_COUNT",
    "TCM_POOL_BYTES",
    "CustomOp",
    "CustomOpLibrary",
    "ShimError",
    "cache_dir",
    "compiler",
    "load",
    "no_compiler_reason",
    "sanitizer_preload",
    "source_digest",
]

_HERE = Path(__file__).parent
INCLUDE_DIR = _HERE / "include"
RUNTIME_SOURCE = _HERE / "runtime.cpp"
CORE_COUNT = 8
TCM_POOL_BYTES = 16 * 1024
# custom-c++-operators-devguide "Performance Guidance": "the maximum supported stack size is
# 400KB" (set with extra_cflags=['-DSTACK_SIZE=N']).
MAX_STACK_SIZE = 400 * 1024
# custom-c++-operators-devguide: 'The library file name should not be "builtin" as it is a
# reserved keyword.'
RESERVED_NAMES = frozenset({"builtin"})
MAX_DIMS = 8

# C++14 because the device toolchain is libc++ 10 in C++14 mode: newer code fails here too.
# -fno-builtin-printf keeps printf calls as calls, and -Bsymbolic binds them to the shim's
# printf (core 0 only) instead of the C library's. -fstack-clash-protection touches every
# page of a large stack frame as it is allocated, so that the stack rule (runtime.cpp, "the
# kernel's stack") sees a frame's full depth even where the kernel writes only part of it.
_COMMON_FLAGS = (
    "-std=c++14",
    "-fPIC",
    "-pthread",
    "-Wall",
    "-Wextra",
    "-fno-builtin-printf",
    "-fstack-clash-protection",
)
_LINK_FLAGS = ("-shared", "-Wl,-Bsymbolic")
_TEXT_BUFFER_BYTES = 64 * 1024
_STATS = (
    "active_cores",
    "tcm_peak_bytes",
    "bytes_to_tcm",
    "bytes_from_tcm",
    "failed_tcm_mallocs",
    "stack_peak_bytes",
)

# c10::ScalarType codes (include/torch/torch.h) of the dtypes the device supports. kLong
# (int64) is not among them: the reference guide dropped it (commit 65d5aaa4, "unable to
# support 64-bit custom ops").
_DTYPE_CODES: dict[str, int] = {
    "uint8": 0,
    "int8": 1,
    "int16": 2,
    "int32": 3,
    "float16": 5,
    "float32": 6,
    "bfloat16": 7,
}
_SUPPORTED = "float32, bfloat16, float16, int32, int16, int8, uint8"

_lock = threading.Lock()


class ShimError(RuntimeError):
    """A kernel broke a GpSimd device rule under the shim, or the library cannot be built."""


def sanitizer_preload() -> str:
    """The ``LD_PRELOAD`` value a Python process needs to load a sanitized build."""
    return _sanitizer_preload(_require_compiler())


def _require_compiler() -> tuple[str, ...]:
    return require_compiler("the GpSimd host shim", ShimError)


def _runtime_object(cxx: tuple[str, ...], flags: Sequence[str]) -> Path:
    headers = sorted(INCLUDE_DIR.rglob("*.h*"))
    key = source_digest([RUNTIME_SOURCE, *headers], *cxx, compiler_version(cxx), host_cpu(), *flags)
    command = [*cxx, *flags, "-I", str(INCLUDE_DIR), "-c", str(RUNTIME_SOURCE), "-o"]
    return build_atomically(
        cache_dir() / f"gpsimd-runtime-{key}.o",
        lambda out: run_compiler([*command, out], "the GpSimd shim runtime", ShimError),
    )


# Parameter types a kernel may be declared with in the generated glue: the documented ones
# and the arithmetic types, so that an `int64_t` or `float` parameter is reported clearly.
_ARITHMETIC = (
    "bool", "char", "signed char", "unsigned char", "short", "unsigned short", "int",
    "unsigned int", "long", "unsigned long", "long long", "unsigned long long", "float",
    "double", "long double",
)  # fmt: skip
_DECLARABLE = {
    f"{base}{suffix}"
    for base in ("torch::Tensor", "c10::Scalar", *_ARITHMETIC)
    for suffix in ("", " const&", "&")
}
_DEFINED_FUNCTION = re.compile(r"^[0-9a-fA-F]+ T ([A-Za-z_]\w*)\((.*)\)$")


def _split_parameters(text: str) -> list[str]:
    parameters, depth, current = [], 0, ""
    for char in text:
        depth += (char in "<(") - (char in ">)")
        if char == "," and depth == 0:
            parameters.append(current.strip())
            current = ""
        else:
            current += char
    return [*parameters, current.strip()] if current.strip() else parameters


def _kernel_candidates(objects: Sequence[Path]) -> list[tuple[str, list[str]]]:
    """Global functions the compute objects define, with parameter types the glue can
    declare: ``(name, [type, ...])``."""
    result = subprocess.run(
        ["nm", "--defined-only", "-g", "-C", *map(str, objects)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise ShimError(f"nm could not list the kernel functions: {result.stderr[-2000:]}")
    candidates = []
    for line in result.stdout.splitlines():
        match = _DEFINED_FUNCTION.match(line.strip())
        if match is None:
            continue
        parameters = _split_parameters(match.group(2))
        if all(p in _DECLARABLE for p in parameters):
            candidates.append((match.group(1), parameters))
    return candidates


def _glue_source(candidates: Sequence[tuple[str, list[str]]]) -> str:
    """Declares and registers every kernel candidate, so ops find their kernel by name (the
    toolchain matches ``m.def``'s kernel name the same way)."""
    lines = [
        '#include "asickernels_shim/ops.hpp"',
        "#ifdef STACK_SIZE",
        "static const int asickernels_shim_stack = "
        "::asickernels_shim::declare_stack_size(STACK_SIZE);",
        "#endif",
        "",
    ]
    for index, (name, parameters) in enumerate(candidates):
        signature = f"{name}({', '.join(parameters)})"
        lines += [
            f"torch::Tensor {signature};",
            f"static const int asickernels_shim_kernel_{index} = "
            f'::asickernels_shim::register_kernel_function("{name}", "{signature}", &{name});',
        ]
    return "\n".join(lines) + "\n"


def _stack_size(extra_cflags: Sequence[str]) -> int | None:
    for flag in extra_cflags:
        match = re.fullmatch(r"-DSTACK_SIZE=(\S+)", flag)
        if match:
            try:
                return int(match.group(1), 0)
            except ValueError:
                raise ValueError(f"{flag}: STACK_SIZE must be a number of bytes") from None
    return None


def _build_library(
    name: str,
    compute_srcs: Sequence[Path],
    shape_srcs: Sequence[Path],
    extra_cflags: Sequence[str],
    sanitize: bool,
    verbose: bool,
) -> Path:
    cxx = _require_compiler()
    flags = [*_COMMON_FLAGS, *(SANITIZER_FLAGS if sanitize else optimize_flags(cxx))]
    headers = sorted(INCLUDE_DIR.rglob("*.h*"))
    key = source_digest(
        [*compute_srcs, *shape_srcs, RUNTIME_SOURCE, *headers],
        name, *cxx, compiler_version(cxx), host_cpu(), *flags, *extra_cflags,
        *map(str, compute_srcs), "|", *map(str, shape_srcs),
    )  # fmt: skip
    target = cache_dir() / f"gpsimd-{key}{'-sanitized' if sanitize else ''}" / f"lib{name}.so"
    if target.exists():
        return target
    runtime = _runtime_object(cxx, flags)
    includes = ["-I", str(INCLUDE_DIR)]

    def build(output: str) -> None:
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            objects = []
            for index, source in enumerate(compute_srcs):
                obj = Path(scratch) / f"compute{index}.o"
                run_compiler(
                    [*cxx, *flags, *extra_cflags, *includes, "-c", str(source), "-o", str(obj)],
                    f"compute source {source}",
                    ShimError,
                )
                objects.append(obj)
            glue = Path(scratch) / "kernels_glue.cpp"
            glue.write_text(_glue_source(_kernel_candidates(objects)))
            command = [*cxx, *flags, *_LINK_FLAGS, *extra_cflags, *includes, *map(str, objects)]
            command += [*map(str, shape_srcs), str(glue), str(runtime), "-o", output]
            if verbose:
                print("$", " ".join(command), file=sys.stderr)
            run_compiler(command, f"the GpSimd library {name!r}", ShimError)

    return build_atomically(target, build)


def _text(function: Any) -> str:
    buffer = ctypes.create_string_buffer(_TEXT_BUFFER_BYTES)
    length = function(buffer, ctypes.sizeof(buffer))
    if length >= ctypes.sizeof(buffer):
        buffer = ctypes.create_string_buffer(length + 1)
        function(buffer, ctypes.sizeof(buffer))
    return buffer.value.decode(errors="replace")


class _ArgumentSpec(ctypes.Structure):
    """One operator argument (``ArgumentSpec`` in runtime.cpp)."""

    _fields_ = [
        ("is_tensor", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("sizes", ctypes.c_int64 * MAX_DIMS),
        ("data", ctypes.c_void_p),
        ("number", ctypes.c_double),
    ]


def _numpy_dtype(code: int) -> np.dtype:
    name = next(n for n, c in _DTYPE_CODES.items() if c == code)
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _is_torch_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _from_torch(tensor: Any) -> np.ndarray:
    """A CPU torch tensor's data as numpy (torch is imported only when one is passed)."""
    import torch

    if tensor.device.type != "cpu":
        raise TypeError(f"pass CPU tensors (got one on {tensor.device})")
    tensor = tensor.detach().contiguous()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _to_torch(array: np.ndarray) -> Any:
    import torch

    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


class CustomOp:
    """One operator of a :class:`CustomOpLibrary`: ``op(*args)`` with tensors as numpy
    arrays or CPU torch tensors and numbers where the kernel takes ``double`` or
    ``torch::Scalar``; returns numpy, or torch when any input was a torch tensor."""

    def __init__(self, library: CustomOpLibrary, name: str, kinds: str) -> None:
        self.library = library
        self.name = name
        self.kinds = kinds  # one letter per parameter: T tensor, D double, S torch::Scalar

    def __repr__(self) -> str:
        return f"<GpSimd op {self.library.namespace}.{self.name}({len(self.kinds)} args)>"

    def _specs(self, args: Sequence[Any]) -> tuple[Any, list[np.ndarray], bool]:
        if len(args) != len(self.kinds):
            raise TypeError(f"{self.name}() takes {len(self.kinds)} arguments, got {len(args)}")
        specs = (_ArgumentSpec * max(len(args), 1))()
        arrays, any_torch = [], False
        for index, (value, kind) in enumerate(zip(args, self.kinds, strict=True)):
            spec = specs[index]
            if kind != "T":
                if isinstance(value, (bool, np.bool_)) or not isinstance(
                    value, (int, float, np.integer, np.floating)
                ):
                    raise TypeError(f"{self.name}() argument {index + 1} must be a number")
                spec.number = float(value)  # double is the only scalar dtype on the device
                continue
            any_torch = any_torch or _is_torch_tensor(value)
            array = np.ascontiguousarray(_from_torch(value) if _is_torch_tensor(value) else value)
            code = _DTYPE_CODES.get(array.dtype.name)
            if code is None:
                raise TypeError(
                    f"{self.name}() argument {index + 1} has dtype {array.dtype}, which GpSimd "
                    f"custom operators do not support (64-bit tensors such as int64 are not "
                    f"supported by the custom operator toolchain); supported: {_SUPPORTED}"
                )
            if array.ndim > MAX_DIMS:
                raise ValueError(f"{self.name}() argument {index + 1} has {array.ndim} > 8 dims")
            spec.is_tensor, spec.dtype, spec.ndim = 1, code, array.ndim
            spec.sizes[: array.ndim] = array.shape
            spec.data = array.ctypes.data
            arrays.append(array)
        return specs, arrays, any_torch

    def output_spec(self, *args: Any) -> tuple[tuple[int, ...], np.dtype]:
        """(shape, dtype) of the output the shape function declares for ``args``."""
        specs, _, _ = self._specs(args)
        return self._output_spec(specs, len(args))

    def _output_spec(self, specs: Any, count: int) -> tuple[tuple[int, ...], np.dtype]:
        dtype, ndim = ctypes.c_int32(), ctypes.c_int32()
        sizes = (ctypes.c_int64 * MAX_DIMS)()
        self.library._call(
            "asickernels_shim_output_spec", self.name.encode(), specs, count,
            ctypes.byref(dtype), ctypes.byref(ndim), sizes,
        )  # fmt: skip
        return tuple(sizes[: ndim.value]), _numpy_dtype(dtype.value)

    def __call__(self, *args: Any) -> Any:
        specs, _arrays, any_torch = self._specs(args)  # _arrays keeps the buffers alive
        shape, dtype = self._output_spec(specs, len(args))
        out = np.empty(shape, dtype)
        try:
            self.library._call(
                "asickernels_shim_run", self.name.encode(), int(self.library.multicore), specs,
                len(args), out.ctypes.data_as(ctypes.c_void_p),
            )  # fmt: skip
        finally:  # the runtime prints what the kernel printed, whatever the outcome
            self.library._emit_stdout()
        return _to_torch(out) if any_torch else out


class CustomOpLibrary:
    """A loaded GpSimd operator library: one attribute per registered op (a
    :class:`CustomOp`), like ``torch.ops.<namespace>``."""

    def __init__(self, path: Path, multicore: bool) -> None:
        self.path = path
        self.multicore = multicore
        self._cdll = ctypes.CDLL(str(path))
        self._cdll.asickernels_shim_last_run_stats.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
        self._cdll.asickernels_shim_last_run_stats.restype = None
        for text_function in ("library_problems", "describe", "last_stdout"):
            function = getattr(self._cdll, f"asickernels_shim_{text_function}")
            function.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
            function.restype = ctypes.c_size_t
        problems = _text(self._cdll.asickernels_shim_library_problems)
        if problems:
            raise ShimError(f"{path.name} cannot be built for the device:\n{problems}")
        self.ops: dict[str, CustomOp] = {}
        self.namespace = ""
        for line in _text(self._cdll.asickernels_shim_describe).splitlines():
            namespace, op, kinds = (line.split("\t") + [""])[:3]
            self.namespace = namespace
            self.ops[op] = CustomOp(self, op, kinds)
        self.last_stdout = ""

    def __getattr__(self, name: str) -> CustomOp:
        ops = self.__dict__.get("ops", {})
        if name in ops:
            return ops[name]
        raise AttributeError(f"library {self.__dict__.get('namespace')!r} has no op {name!r}")

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *self.ops]

    def _call(self, function: str, *args: Any) -> None:
        error = ctypes.create_string_buffer(_TEXT_BUFFER_BYTES)
        if getattr(self._cdll, function)(*args, error, ctypes.sizeof(error)) != 0:
            op = args[0].decode()
            raise ShimError(f"{self.namespace}.{op}: {error.value.decode(errors='replace')}")

    def _emit_stdout(self) -> None:
        """Keeps what the kernel printed, and prints it as the Neuron runtime would: only when
        ``NEURON_RT_GPSIMD_STDOUT_QUEUE_SIZE_BYTES`` is a power of two <= 131072 (then only
        its last that-many bytes: the queue overwrites the oldest data) and
        ``NEURON_RT_LOG_LEVEL`` is at least INFO (custom-ops-ref-guide "printf()")."""
        self.last_stdout = _text(self._cdll.asickernels_shim_last_stdout)
        queue = os.environ.get("NEURON_RT_GPSIMD_STDOUT_QUEUE_SIZE_BYTES", "0")
        if not queue.isdigit() or int(queue) > 131072 or int(queue) & (int(queue) - 1):
            raise ValueError(
                "NEURON_RT_GPSIMD_STDOUT_QUEUE_SIZE_BYTES must be 0 or a power of two <= 131072,"
                f" got {queue!r}"
            )
        level = os.environ.get("NEURON_RT_LOG_LEVEL", "ERROR").upper()
        if int(queue) and level in ("INFO", "DEBUG", "TRACE") and self.last_stdout:
            sys.stdout.write("Printing stdout from GPSIMD:\n" + self.last_stdout[-int(queue) :])

    def stats(self) -> dict[str, float]:
        """Counters of the library's most recent successful run: cores that wrote output,
        peak TCM bytes on one core, bytes copied tensor -> TCM and TCM -> tensor, failed
        ``tcm_malloc`` calls, peak stack bytes of the kernel on one core (host build; 0 in
        sanitized builds)."""
        values = (ctypes.c_uint64 * len(_STATS))()
        self._cdll.asickernels_shim_last_run_stats(values)
        return {name: float(value) for name, value in zip(_STATS, values, strict=True)}

    @property
    def sanitized(self) -> bool:
        return bool(self._cdll.asickernels_shim_sanitized())


def load(
    name: str,
    compute_srcs: Sequence[str | os.PathLike[str]],
    shape_srcs: Sequence[str | os.PathLike[str]],
    build_directory: str | os.PathLike[str] | None = None,
    multicore: bool = False,
    verbose: bool = False,
    extra_cflags: Sequence[str] = (),
    *,
    sanitize: bool = False,
) -> CustomOpLibrary:
    """Builds and loads a GpSimd custom operator library for the host, like
    ``torch_neuronx.xla_impl.custom_op.load``: ``lib<name>.so`` from ``compute_srcs`` (the
    kernel functions) and ``shape_srcs`` (shape functions and ``NEURON_LIBRARY``), written to
    ``build_directory`` when given (built once per content in the cache either way).
    ``multicore=True`` runs every op on the 8 GpSimd cores. ``sanitize=True`` builds with
    AddressSanitizer + UBSan; the process then needs ``LD_PRELOAD`` =
    :func:`sanitizer_preload`. Raises :class:`ShimError` when the sources do not build or
    break a registration rule, ValueError for a reserved name or too large ``STACK_SIZE``.
    """
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_]\w*", name):
        raise ValueError(f"library name must be an identifier, got {name!r}")
    if name in RESERVED_NAMES:
        raise ValueError(f'the library file name should not be "{name}": it is a reserved keyword')
    stack_size = _stack_size(extra_cflags)
    if stack_size is not None and not 0 < stack_size <= MAX_STACK_SIZE:
        raise ValueError(
            f"-DSTACK_SIZE={stack_size}: the maximum supported stack size is 400KB "
            f"({MAX_STACK_SIZE} bytes)"
        )
    if sanitize and "libasan" not in os.environ.get("LD_PRELOAD", ""):
        raise ShimError(
            "a sanitized GpSimd build needs the ASan runtime preloaded: run Python with "
            f"LD_PRELOAD='{sanitizer_preload()}' ASAN_OPTIONS=detect_leaks=0"
        )
    compute = [Path(p).resolve() for p in compute_srcs]
    shape = [Path(p).resolve() for p in shape_srcs]
    for path in (*compute, *shape):
        if not path.is_file():
            raise FileNotFoundError(f"no source file {path}")
    with _lock:
        path = _build_library(name, compute, shape, list(extra_cflags), sanitize, verbose)
        library = _loaded_library(path, multicore)
    if build_directory is not None:
        Path(build_directory).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, Path(build_directory) / f"lib{name}.so")
    return library


@functools.cache
def _loaded_library(path: Path, multicore: bool) -> CustomOpLibrary:
    return CustomOpLibrary(path, multicore)
