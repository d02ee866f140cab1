"""Builds C++ sources into a shared library cached by content, on the machine that runs it.

The cache key covers the sources and headers, the compiler and its version, the flags, and
the CPU model and feature flags (builds use ``-march=native`` where the compiler takes it),
so a changed file, compiler or machine gets a fresh build and an unchanged one is reused.
Libraries live under ``$XDG_CACHE_HOME/asickernels`` (else ``~/.cache/asickernels``).
Several processes may build at once: each compiles to a temporary file and renames it into
place atomically.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

BUILD_TIMEOUT_SECONDS = 600
# Any finding aborts the process (UBSan would otherwise print and continue).
SANITIZER_FLAGS = (
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
)


class NativeBuildError(RuntimeError):
    """No C++ compiler, or the build failed (the message has the command and its output)."""


def compiler() -> str | None:
    """Path of the C++ compiler: ``$CXX`` if set, else ``g++``; None when not found."""
    return shutil.which(os.environ.get("CXX") or "g++")


def require_compiler(what: str) -> str:
    cxx = compiler()
    if cxx is None:
        raise NativeBuildError(f"no C++ compiler to build {what}: install g++ or set $CXX")
    return cxx


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "asickernels"


@functools.cache
def compiler_version(cxx: str) -> str:
    return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout


@functools.cache
def optimize_flags(cxx: str) -> tuple[str, ...]:
    """``-O3``, plus ``-march=native`` where the compiler takes it."""
    probe = subprocess.run(
        [cxx, "-march=native", "-x", "c++", "-E", "-o", os.devnull, "-"],
        input="", capture_output=True, text=True, check=False,
    )  # fmt: skip
    return ("-O3", "-march=native") if probe.returncode == 0 else ("-O3",)


@functools.cache
def host_cpu() -> str:
    """What ``-march=native`` depends on: the CPU model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(sorted({line for line in lines if line.startswith(wanted)}))


def sanitizer_preload(cxx: str) -> str:
    """The ``LD_PRELOAD`` a Python process needs to load a sanitized build: the compiler's
    ASan runtime, which must come first, and libstdc++, whose ``__cxa_throw`` ASan
    intercepts (without it, the first C++ exception in any extension module aborts)."""
    paths = []
    for name in ("libasan.so", "libstdc++.so"):
        result = subprocess.run(
            [cxx, f"-print-file-name={name}"], capture_output=True, text=True, check=False
        )
        paths.append(result.stdout.strip())
    return " ".join(paths)


def source_digest(paths: Sequence[Path], *extra: str) -> str:
    """A short hash of the files' names and contents and of ``extra`` strings."""
    digest = hashlib.sha256()
    for part in extra:
        digest.update(part.encode() + b"\0")
    for path in paths:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:20]


def build(
    name: str,
    sources: Sequence[Path],
    *,
    flags: Sequence[str],
    headers: Sequence[Path] = (),
    include_dirs: Sequence[Path] = (),
    sanitize: bool = False,
) -> Path:
    """Compiles ``sources`` into ``<cache>/<name>-<key>[-sanitized].so`` unless it exists;
    returns its path.

    Args:
      flags: language and warning flags; optimization flags are added here (``-O3
        -march=native``, or the sanitizer flags when ``sanitize``).
      headers: files the sources include, hashed into the key.
      include_dirs: passed as ``-isystem`` (third-party headers: their warnings are not ours).
    """
    cxx = require_compiler(name)
    all_flags = (*flags, *(SANITIZER_FLAGS if sanitize else optimize_flags(cxx)))
    files = sorted({*map(Path, sources), *map(Path, headers)})
    key = source_digest(files, cxx, compiler_version(cxx), host_cpu(), *all_flags)
    target = cache_dir() / f"{name}-{key}{'-sanitized' if sanitize else ''}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f"{target.stem}.", suffix=".tmp", dir=target.parent)
    os.close(handle)
    command = [cxx, *all_flags]
    for directory in include_dirs:
        command += ["-isystem", str(directory)]
    command += [*map(str, sources), "-o", temporary]
    try:
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_SECONDS
            )
        except subprocess.TimeoutExpired:
            raise NativeBuildError(f"building {name} timed out: {' '.join(command)}") from None
        if result.returncode != 0:
            raise NativeBuildError(
                f"building {name} failed:\n$ {' '.join(command)}\n{result.stderr[-8000:]}"
            )
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return target
