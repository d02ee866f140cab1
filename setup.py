"""Builds the ``cpu`` backend's native library (``asickernels/backends/cpu/csrc``) into the
wheel, so that installing asickernels needs no compiler and nothing is compiled at run time.

The kernel sources are compiled once per instruction-set level, each into its own namespace
(``csrc/kernels.h``): on x86-64 the compiler's baseline, x86-64-v3 (AVX2) and x86-64-v4 with
AVX-512 VNNI; ``csrc/dispatch.cpp`` runs the best level the CPU has. Elsewhere, the baseline
only. The XLA FFI headers come from the jax installed in the build environment
(``jax.ffi.include_dir()``). The library is loaded with ctypes, not imported: it uses no
Python API, hence the ``abi3`` tag (one wheel for every CPython >= 3.11).
"""

from __future__ import annotations

import platform
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CSRC = Path("asickernels/backends/cpu/csrc")
# Compiled once per level (the rest once, at the baseline).
LEVEL_SOURCES = ("box_iou.cpp", "int8_matmul.cpp", "nms.cpp")
COMMON_SOURCES = ("dispatch.cpp", "host_api.cpp", "parallel.cpp", "roi_align.cpp", "xla_ffi.cpp")
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


def levels() -> dict[str, tuple[str, ...]]:
    if platform.machine().lower() in ("x86_64", "amd64"):
        return X86_LEVELS
    return {"baseline": ()}


class BuildLevels(build_ext):
    """Compiles LEVEL_SOURCES once per level into the extension's objects."""

    def build_extension(self, ext: Extension) -> None:
        import jax

        # -isystem: third-party headers, whose warnings are not ours.
        ext.extra_compile_args = [*FLAGS, "-isystem", jax.ffi.include_dir()]
        all_levels = levels()
        if len(all_levels) > 1:
            ext.define_macros = [("ASICKERNELS_CPU_X86_LEVELS", "1")]
        ext.extra_objects = []
        for level, flags in all_levels.items():
            ext.extra_objects += self.compiler.compile(
                [str(CSRC / name) for name in LEVEL_SOURCES],
                output_dir=str(Path(self.build_temp) / level),
                macros=[("ASICKERNELS_CPU_ISA", level)],
                extra_postargs=[*FLAGS, *flags],
                depends=ext.depends,
            )
        super().build_extension(ext)


setup(
    ext_modules=[
        Extension(
            "asickernels.backends.cpu._kernels",
            sources=[str(CSRC / name) for name in COMMON_SOURCES],
            depends=[str(path) for path in sorted([*CSRC.glob("*.h"), *CSRC.glob("*.inc")])],
            extra_link_args=["-pthread"],
            language="c++",
            py_limited_api=True,
        )
    ],
    cmdclass={"build_ext": BuildLevels},
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
