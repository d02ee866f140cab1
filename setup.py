"""Builds the ``cpu`` backend's native library (``asickernels/backends/cpu``) into the wheel,
so that installing asickernels needs no compiler and nothing is compiled at run time.

Each op's source (``backends/cpu/<op>.cpp``, beside its Python module) is compiled once per
instruction-set level, each into its own namespace (``csrc/kernels.h``): on x86-64 the
compiler's baseline, x86-64-v3 (AVX2) and x86-64-v4 with AVX-512 VNNI; the baseline compile
also holds the op's XLA FFI handlers, which run the best level the CPU has
(``csrc/dispatch.cpp``). Elsewhere, the baseline only. What the ops share (``csrc/*.cpp``) is
compiled once. The XLA FFI headers come from the jax installed in the build environment
(``jax.ffi.include_dir()``). The library is loaded with ctypes, not imported: it uses no
Python API, hence the ``abi3`` tag (one wheel for every CPython >= 3.11).

Built with the platform's compiler, the library needs the glibc and libstdc++ it was built
against (Debian 12's g++: glibc 2.34, ``GLIBCXX_3.4.30``). The release wheel (``make dist``,
``.ci/dist``) is built with zig instead (``$ASICKERNELS_ZIG``, a command running zig, such as
``python -m ziglang`` of PyPI's ``ziglang``): it targets glibc :data:`ZIG_GLIBC` and links
LLVM's libc++ statically, so the library needs no libstdc++ and no glibc newer than 2.28.
``auditwheel repair`` then tags the wheel with the oldest manylinux policy whose glibc has
every symbol the library uses: ``manylinux_2_24`` with today's sources (``.ci/dist``
refuses a tag newer than ``manylinux_2_28``). Same sources and flags
(:meth:`BuildLevels.zig_level_flags`), the same bits at every level, the same speed
(``benchmarks/wheel_toolchains.py``).
"""

from __future__ import annotations

import os
import platform
import shlex
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CPU = Path("asickernels/backends/cpu")
# Compiled once, at the baseline: what the ops share.
COMMON_SOURCES = tuple(sorted(str(p) for p in (CPU / "csrc").glob("*.cpp")))
# Each op's source, compiled once per level.
OP_SOURCES = tuple(sorted(str(p) for p in CPU.glob("*.cpp")))
X86_LEVELS = {
    "baseline": (),
    "avx2": ("-march=x86-64-v3",),
    "avx512": ("-march=x86-64-v4", "-mavx512vnni"),
}
# FMA contraction off: NMS must round exactly as the float64 reference does, and every level
# must compute the same bits. -g0 and -fno-wrapv override Python's own CFLAGS.
FLAGS = (
    "-std=c++17", "-O3", "-pthread", "-Wall", "-Wextra", "-ffp-contract=off", "-g0",
    "-fno-wrapv",
)  # fmt: skip

#: A command running zig (``python -m ziglang``); unset: the compiler setuptools picks ($CXX).
ZIG_ENV = "ASICKERNELS_ZIG"
#: The oldest glibc the zig build runs on: RHEL 8, Amazon Linux 2023 and Ubuntu 20.04 have it.
ZIG_GLIBC = "2.28"


def levels() -> dict[str, tuple[str, ...]]:
    if platform.machine().lower() in ("x86_64", "amd64"):
        return X86_LEVELS
    return {"baseline": ()}


class BuildLevels(build_ext):
    """Compiles OP_SOURCES once per level into the extension's objects, the baseline's with
    the entry points."""

    def build_extension(self, ext: Extension) -> None:
        import jax

        zig = os.environ.get(ZIG_ENV)
        if zig:
            self.use_zig(shlex.split(zig))
        # -isystem: third-party headers, whose warnings are not ours.
        ext.extra_compile_args = [*FLAGS, "-isystem", jax.ffi.include_dir()]
        all_levels = levels()
        x86_levels = [("ASICKERNELS_CPU_X86_LEVELS", "1")] if len(all_levels) > 1 else []
        ext.define_macros = x86_levels
        ext.extra_objects = []
        for level, flags in all_levels.items():
            entry_points = [("ASICKERNELS_CPU_ENTRY_POINTS", "1")] if level == "baseline" else []
            if zig:
                flags = self.zig_level_flags(flags)
            ext.extra_objects += self.compiler.compile(
                list(OP_SOURCES),
                output_dir=str(Path(self.build_temp) / level),
                macros=[*x86_levels, ("ASICKERNELS_CPU_ISA", level), *entry_points],
                extra_postargs=[*ext.extra_compile_args, *flags],
                depends=ext.depends,
            )
        super().build_extension(ext)

    @staticmethod
    def zig_level_flags(flags: tuple[str, ...]) -> tuple[str, ...]:
        """A level's flags as zig takes them: it names CPUs as LLVM does (x86_64_v4, not
        x86-64-v4); and at x86-64-v4, where clang prefers 256-bit vectors and GCC uses
        512-bit ones, 512 bits (else CIoU ran 1.45x and GIOU 1.14x slower than g++'s)."""
        flags = tuple(flag.replace("x86-64-v", "x86_64_v") for flag in flags)
        if "-march=x86_64_v4" in flags:
            flags += ("-mprefer-vector-width=512",)
        return flags

    def use_zig(self, zig: list[str]) -> None:
        """Compiles and links with ``zig c++`` for glibc :data:`ZIG_GLIBC` instead of the
        compiler setuptools found, keeping that compiler's flags."""
        cxx = [*zig, "c++", "-target", f"{platform.machine().lower()}-linux-gnu.{ZIG_GLIBC}"]
        # linker_exe_cxx is the compiler's own words ("g++", "ccache g++"); the others start
        # with them (usually) and go on with flags, which are kept.
        own = self.compiler.linker_exe_cxx
        for name in ("compiler_cxx", "compiler_so_cxx", "linker_so_cxx", "linker_exe_cxx"):
            command = getattr(self.compiler, name)
            flags = command[len(own) :] if command[: len(own)] == own else command[1:]
            self.compiler.set_executable(name, [*cxx, *flags])
        # zig's static libc++ comes with its debug information: 7 of the library's 8 MB.
        self.compiler.linker_so_cxx.append("-Wl,--strip-debug")


setup(
    ext_modules=[
        Extension(
            "asickernels.backends.cpu._kernels",
            sources=list(COMMON_SOURCES),
            depends=[str(path) for path in sorted((CPU / "csrc").glob("*.h"))],
            extra_link_args=["-pthread"],
            language="c++",
            py_limited_api=True,
        )
    ],
    cmdclass={"build_ext": BuildLevels},
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
