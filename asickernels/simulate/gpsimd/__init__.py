"""Host shim for GpSimd custom C++ operators (AWS Neuron, NeuronCore-v2).

The headers in ``include/`` implement the device API subset that asickernels' kernels use
(``<torch/torch.h>``: tensors, TCM accessors, ``tcm_malloc``/``tcm_free``;
``<neuron/neuron-utils.hpp>``: ``get_cpu_id``, ``get_cpu_count``, ``get_dst_tensor``;
``"torchneuron/register.h"``: ``NEURON_LIBRARY``), so the unchanged device sources compile
with the system C++ compiler. ``runtime.cpp`` runs a kernel once per simulated core (8
threads) and turns every device-rule violation into an error message: tensor copies out of
bounds or of the wrong dtype, more than the 16 KB TCM pool per core, TCM buffers never
freed, cores writing overlapping output ranges, output elements no core writes.

:func:`load` builds sources plus the runtime into a shared library cached by content hash
(under ``$XDG_CACHE_HOME/asickernels`` or ``~/.cache/asickernels``) and loads it with ctypes;
:func:`call` invokes one of its entry points and raises :class:`ShimError` on a violation.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

_HERE = Path(__file__).parent
INCLUDE_DIR = _HERE / "include"
RUNTIME_SOURCE = _HERE / "runtime.cpp"
CORE_COUNT = 8
TCM_POOL_BYTES = 16 * 1024

# C++14 because the device toolchain is libc++ 10 in C++14 mode: newer code fails here too.
_COMMON_FLAGS = ("-std=c++14", "-fPIC", "-shared", "-pthread", "-Wall", "-Wextra")
# Any finding aborts the process (UBSan would otherwise print and continue).
_SANITIZER_FLAGS = (
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
)
_BUILD_TIMEOUT_SECONDS = 600
_ERROR_BUFFER_BYTES = 16 * 1024
_STATS = ("active_cores", "tcm_peak_bytes", "bytes_to_tcm", "bytes_from_tcm")

_loaded: dict[Path, ctypes.CDLL] = {}
_lock = threading.Lock()


class ShimError(RuntimeError):
    """A kernel broke a GpSimd device rule under the shim, or the host build failed."""


def compiler() -> str | None:
    """Path of the C++ compiler: ``$CXX`` if set, else ``g++``; None when not found."""
    return shutil.which(os.environ.get("CXX") or "g++")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "asickernels"


@functools.cache
def _compiler_version(cxx: str) -> str:
    return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout


@functools.cache
def _optimize_flags(cxx: str) -> tuple[str, ...]:
    """``-O3``, plus ``-march=native`` where the compiler takes it: the library is built on
    the machine that runs it (the cache key includes :func:`_host_cpu`)."""
    probe = subprocess.run(
        [cxx, "-march=native", "-x", "c++", "-E", "-o", os.devnull, "-"],
        input="", capture_output=True, text=True, check=False,
    )  # fmt: skip
    return ("-O3", "-march=native") if probe.returncode == 0 else ("-O3",)


@functools.cache
def _host_cpu() -> str:
    """What ``-march=native`` depends on: the CPU model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(sorted({line for line in lines if line.startswith(wanted)}))


def sanitizer_preload() -> str:
    """The ``LD_PRELOAD`` value a Python process needs to load a sanitized build: the
    compiler's ASan runtime, which must come first, and libstdc++, whose ``__cxa_throw``
    ASan intercepts (without it, the first C++ exception in any extension module aborts)."""
    cxx = _require_compiler()
    paths = []
    for name in ("libasan.so", "libstdc++.so"):
        result = subprocess.run(
            [cxx, f"-print-file-name={name}"], capture_output=True, text=True, check=False
        )
        paths.append(result.stdout.strip())
    return " ".join(paths)


def _require_compiler() -> str:
    cxx = compiler()
    if cxx is None:
        raise ShimError("no C++ compiler for the GpSimd host shim: install g++ or set $CXX")
    return cxx


def _flags(cxx: str, sanitize: bool) -> tuple[str, ...]:
    return _COMMON_FLAGS + (_SANITIZER_FLAGS if sanitize else _optimize_flags(cxx))


def source_digest(paths: Sequence[Path], *extra: str) -> str:
    """A short hash of the files' names and contents and of ``extra`` strings."""
    digest = hashlib.sha256()
    for part in extra:
        digest.update(part.encode() + b"\0")
    for path in paths:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:20]


def _cache_key(cxx: str, flags: Sequence[str], sources: Sequence[Path]) -> str:
    headers = sorted(INCLUDE_DIR.rglob("*.h*"))
    return source_digest([*sources, *headers], cxx, _compiler_version(cxx), _host_cpu(), *flags)


def _with_runtime(sources: Sequence[Path]) -> list[Path]:
    return [*map(Path, sources), RUNTIME_SOURCE]


def cached_path(sources: Sequence[Path], *, sanitize: bool = False) -> Path:
    """Where :func:`build` puts (or finds) the library of ``sources``."""
    cxx = _require_compiler()
    key = _cache_key(cxx, _flags(cxx, sanitize), _with_runtime(sources))
    return cache_dir() / f"gpsimd-{key}{'-sanitized' if sanitize else ''}.so"


def build(sources: Sequence[Path], *, sanitize: bool = False) -> Path:
    """Compiles ``sources`` with the shim runtime into a cached shared library; returns its
    path. Safe when several processes build at once: each compiles to a temporary file and
    atomically renames it into place."""
    target = cached_path(sources, sanitize=sanitize)
    if target.exists():
        return target
    cxx = _require_compiler()
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f"{target.stem}.", suffix=".tmp", dir=target.parent)
    os.close(handle)
    command = [cxx, *_flags(cxx, sanitize), "-I", str(INCLUDE_DIR)]
    command += [*map(str, _with_runtime(sources)), "-o", temporary]
    try:
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_SECONDS
            )
        except subprocess.TimeoutExpired:
            raise ShimError(
                f"building the GpSimd host library timed out: {' '.join(command)}"
            ) from None
        if result.returncode != 0:
            raise ShimError(
                f"building the GpSimd host library failed:\n$ {' '.join(command)}\n"
                f"{result.stderr[-8000:]}"
            )
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return target


def load(sources: Sequence[Path], *, sanitize: bool = False) -> ctypes.CDLL:
    """Builds (or reuses) and loads the library of ``sources``; loaded once per process.

    A sanitized build (AddressSanitizer + UBSan) can only be loaded by a process started with
    ``LD_PRELOAD`` = :func:`sanitizer_preload`; loading it otherwise would abort Python, so
    this raises :class:`ShimError` instead.
    """
    if sanitize and "libasan" not in os.environ.get("LD_PRELOAD", ""):
        raise ShimError(
            "a sanitized GpSimd build needs the ASan runtime preloaded: run Python with "
            f"LD_PRELOAD='{sanitizer_preload()}' ASAN_OPTIONS=detect_leaks=0"
        )
    with _lock:
        path = build(sources, sanitize=sanitize)
        if path not in _loaded:
            library = ctypes.CDLL(str(path))
            library.asickernels_shim_last_run_stats.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
            library.asickernels_shim_last_run_stats.restype = None
            library.asickernels_shim_sanitized.restype = ctypes.c_int
            if bool(library.asickernels_shim_sanitized()) != sanitize:
                raise ShimError(f"{path} is not the {'sanitized' if sanitize else 'plain'} build")
            _loaded[path] = library
        return _loaded[path]


def call(entry_point: Callable[..., int], *args: Any) -> None:
    """Calls an entry point ``int f(..., char* error, size_t error_size)`` of a shim library;
    raises :class:`ShimError` with its message when it reports a failure."""
    error = ctypes.create_string_buffer(_ERROR_BUFFER_BYTES)
    if entry_point(*args, error, ctypes.sizeof(error)) != 0:
        raise ShimError(error.value.decode(errors="replace"))


def last_run_stats(library: ctypes.CDLL) -> dict[str, float]:
    """Counters of the library's most recent successful kernel run: cores that wrote
    output, peak TCM bytes on one core, bytes copied tensor -> TCM and TCM -> tensor."""
    values = (ctypes.c_uint64 * len(_STATS))()
    library.asickernels_shim_last_run_stats(values)
    return {name: float(value) for name, value in zip(_STATS, values, strict=True)}


ERROR_ARGTYPES: list[Any] = [ctypes.c_char_p, ctypes.c_size_t]
"""The trailing ``argtypes`` of every entry point that :func:`call` invokes."""
