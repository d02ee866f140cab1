"""Builds C++ sources into a shared library cached by content, on the machine that runs it:
what is compiled at run time (GpSimd operators through the host shim, sanitizer builds for
tests; the ``cpu`` backend's library comes built with the package).

The cache key covers the sources and headers, the compiler and its version, the flags, and
the CPU model and feature flags (builds use ``-march=native`` where the compiler takes it),
so a changed file, compiler or machine gets a fresh build and an unchanged one is reused.
Libraries live under ``$ASICKERNELS_CACHE_DIR``, else ``$XDG_CACHE_HOME/asickernels`` (else
``~/.cache/asickernels``); where that cannot be written, in a private temporary folder for
the process, with a warning. Several processes may build at once: each compiles to a
temporary file and renames it into place atomically.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

BUILD_TIMEOUT_SECONDS = 600
CACHE_ENV = "ASICKERNELS_CACHE_DIR"
#: Looked for in this order on PATH when ``$CXX`` (a command: ``ccache g++`` too) is not set.
COMPILERS = ("g++", "c++", "clang++")
# What a working compiler must get through: the C++17 standard library.
_PROBE_SOURCE = "#include <vector>\nint main() { return std::vector<int>(1).front(); }\n"
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


class NativeBuildWarning(RuntimeWarning):
    """A compiler that does not work, or a cache folder that cannot be written."""


def compiler() -> tuple[str, ...] | None:
    """The command of a working C++ compiler: ``$CXX`` if set, split as a shell would (so
    ``ccache g++`` is a compiler behind its launcher), else the first of :data:`COMPILERS`
    on PATH that works; None when there is none (:func:`no_compiler_reason` says why). A
    compiler that is found but fails a one-line C++17 build is skipped with one
    :class:`NativeBuildWarning`."""
    return _search()[0]


def no_compiler_reason() -> str:
    """Why :func:`compiler` finds none, and what to do ("" when it finds one)."""
    return _search()[1]


def _search() -> tuple[tuple[str, ...] | None, str]:
    """(the compiler command, "") or (None, why there is none)."""
    explicit = os.environ.get("CXX")
    if not explicit:
        for name in COMPILERS:
            path = shutil.which(name)
            if path is not None and _problem((path,)) is None:
                return (path,), ""
        return None, f"none of {', '.join(COMPILERS)} on PATH works: install g++, or set $CXX"
    command, problem = _command(explicit)
    if command is not None:
        problem = _problem(command) or ""
        if not problem:
            return command, ""
    return None, f"$CXX={explicit!r} {problem}: fix or unset $CXX"


def _command(text: str) -> tuple[tuple[str, ...] | None, str]:
    """(the words of a command, its first found on PATH, "") or (None, why it is none)."""
    try:
        words = shlex.split(text)
    except ValueError as error:
        return None, f"does not parse as a command ({error})"
    if not words:
        return None, "is blank"
    path = shutil.which(words[0])
    if path is None:
        return None, f"names {words[0]!r}, which is not an executable on PATH"
    return (path, *words[1:]), ""


@functools.cache
def _problem(cxx: tuple[str, ...]) -> str | None:
    """None when ``cxx`` compiles a C++17 program using the standard library, else what
    failed (checked once per process; a failure warns)."""
    try:
        result = subprocess.run(
            [*cxx, "-std=c++17", "-x", "c++", "-fsyntax-only", "-"],
            input=_PROBE_SOURCE, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as error:
        problem = str(error)
    else:
        if result.returncode == 0:
            return None
        output = (result.stderr or result.stdout).strip()[-500:]
        problem = f"exit {result.returncode}: {output}" if output else f"exit {result.returncode}"
    problem = f"fails to compile a C++17 program ({problem})"
    warnings.warn(
        f"the C++ compiler {shlex.join(cxx)} {problem}, so it is not used",
        NativeBuildWarning,
        stacklevel=4,  # the caller of compiler() or require_compiler()
    )
    return problem


def require_compiler(what: str, error: type[Exception] = NativeBuildError) -> tuple[str, ...]:
    """:func:`compiler`, or ``error`` saying why there is none."""
    cxx, problem = _search()
    if cxx is None:
        raise error(f"no working C++ compiler to build {what}: {problem}")
    return cxx


def cache_dir() -> Path:
    """The folder builds are cached in (created): ``$ASICKERNELS_CACHE_DIR``, else the XDG
    cache's ``asickernels``; where that cannot be created or written, a private temporary
    folder for this process (with one :class:`NativeBuildWarning`)."""
    try:
        configured = os.environ.get(CACHE_ENV)
        if configured:
            wanted = Path(configured)
        else:
            base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
            wanted = Path(base) / "asickernels"
        wanted.mkdir(parents=True, exist_ok=True)
        if os.access(wanted, os.W_OK | os.X_OK):
            return wanted
        problem = f"{wanted} is not writable"
    except (OSError, RuntimeError) as error:  # RuntimeError: no home directory
        problem = str(error)
    return _temporary_cache(problem)


@functools.cache
def _temporary_cache(problem: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="asickernels-cache-"))
    warnings.warn(
        f"no writable build cache ({problem}): building in {folder} for this process only; "
        f"set {CACHE_ENV} to a writable folder to keep builds",
        NativeBuildWarning,
        stacklevel=3,
    )
    return folder


@functools.cache
def compiler_version(cxx: tuple[str, ...]) -> str:
    return subprocess.run([*cxx, "--version"], capture_output=True, text=True, check=False).stdout


@functools.cache
def optimize_flags(cxx: tuple[str, ...]) -> tuple[str, ...]:
    """``-O3``, plus ``-march=native`` where the compiler takes it."""
    probe = subprocess.run(
        [*cxx, "-march=native", "-x", "c++", "-E", "-o", os.devnull, "-"],
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


def sanitizer_preload(cxx: tuple[str, ...]) -> str:
    """The ``LD_PRELOAD`` a Python process needs to load a sanitized build: the compiler's
    ASan runtime, which must come first, and libstdc++, whose ``__cxa_throw`` ASan
    intercepts (without it, the first C++ exception in any extension module aborts)."""
    paths = []
    for name in ("libasan.so", "libstdc++.so"):
        result = subprocess.run(
            [*cxx, f"-print-file-name={name}"], capture_output=True, text=True, check=False
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
    key = source_digest(files, *cxx, compiler_version(cxx), host_cpu(), *all_flags)
    target = cache_dir() / f"{name}-{key}{'-sanitized' if sanitize else ''}.so"
    command = [*cxx, *all_flags]
    for directory in include_dirs:
        command += ["-isystem", str(directory)]
    command += [*map(str, sources), "-o"]
    return build_atomically(target, lambda output: run_compiler([*command, output], name))


def run_compiler(
    command: Sequence[str], what: str, error: type[Exception] = NativeBuildError
) -> None:
    """Runs a compiler ``command`` building ``what``.

    Raises:
      error: it failed (the message has the command and the compiler's output) or took
        longer than :data:`BUILD_TIMEOUT_SECONDS`.
    """
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_SECONDS
        )
    except subprocess.TimeoutExpired:
        raise error(f"building {what} timed out: {' '.join(command)}") from None
    if result.returncode != 0:
        raise error(f"building {what} failed:\n$ {' '.join(command)}\n{result.stderr[-8000:]}")


def build_atomically(target: Path, build: Callable[[str], None]) -> Path:
    """``target``, built by ``build(temporary_path)`` unless it exists, the result renamed
    into place: safe when several processes build the same target at once."""
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f"{target.stem}.", suffix=".tmp", dir=target.parent)
    os.close(handle)
    try:
        build(temporary)
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return target
