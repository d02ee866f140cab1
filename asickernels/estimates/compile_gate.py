"""``asickernels compile``: the TPU compile gate. Every Pallas kernel of ours, at its benchmark
shapes, compiled for real TPU generations with libtpu on this machine
(:func:`asickernels.simulate.tpu_compile.lower_for_tpu`): a kernel that compiles has passed
Mosaic and the TPU backend for real (block shapes, dtypes, layouts, VMEM capacity). Reports
each outcome, the VMEM its blocks take and its HBM footprint.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from asickernels.kernels.case_tables import COMPILE_SHAPES
from asickernels.kernels.cases import CompileShape
from asickernels.simulate.tpu_compile import (
    TOPOLOGIES,
    ArgSpec,
    Built,
    libtpu_status,
    lower_for_tpu,
)
from asickernels.tpu_generations import LIBTPU_INSTALL

if TYPE_CHECKING:
    import jax

GATE_GENERATIONS = ("v5e", "v6e", "v5p")


@dataclasses.dataclass(frozen=True)
class KernelShape:
    """One kernel at one shape: ``build()`` returns ``(function, [(shape, dtype), ...])``."""

    kernel: str
    shape: str
    build: Callable[[], Built]


@dataclasses.dataclass(frozen=True)
class CompileResult:
    kernel: str
    shape: str
    generation: str
    ok: bool
    seconds: float
    error: str = ""
    vmem_bytes: int | None = None  # the largest kernel's blocks + scratch (from its BlockSpecs)
    vmem_limit_bytes: int | None = None  # the scoped-VMEM limit asked of Mosaic (None: default)
    hbm_bytes: int | None = None  # arguments + outputs + temporaries, from the compiler

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def build(shape: CompileShape) -> Built:
    """The public op ``shape.op`` on the Pallas backend at ``shape``'s arrays (passed by the
    op's array parameter names, in order) and statics, or the gradient of its sum with
    respect to the arrays ``shape.gradient`` names."""
    import jax

    import asickernels

    op = getattr(asickernels, shape.op)
    names = op.array_names[: len(shape.args)]

    def forward(*arrays: jax.Array) -> Any:
        given = dict(zip(names, arrays, strict=True))
        return op(**given, **shape.static, backend="pallas_tpu")

    if not shape.gradient:
        return forward, list(shape.args)
    return jax.grad(lambda *a: forward(*a).sum(), argnums=shape.gradient), list(shape.args)


def _giou(backward: bool, pairs: int, dtype: str) -> Built:
    gradient = (0, 1) if backward else ()
    return build(CompileShape("", "", "giou", (((pairs, 4), dtype),) * 2, gradient=gradient))


def _nms(n: int, max_output_size: int) -> Built:
    static = {"iou_threshold": 0.1, "max_output_size": max_output_size}
    return build(CompileShape("", "", "nms", (((n, 4), "float32"), ((n,), "float32")), static))


def _matmul(m: int, k: int, n: int, scaled: bool) -> Built:
    args: list[ArgSpec] = [((m, k), "int8"), ((k, n), "int8")]
    scales: list[ArgSpec] = [((m,), "float32"), ((n,), "float32")] if scaled else []
    return build(CompileShape("", "", "int8_matmul", tuple(args + scales)))


def _box_metric(op: str, backward: bool, *shapes: tuple[int, ...]) -> Built:
    """``asickernels.<op>`` (box_iou, generalized_box_iou, diou, ciou) on Pallas, or its
    gradient."""
    args = tuple((shape, "float32") for shape in shapes)
    return build(CompileShape("", "", op, args, gradient=(0, 1) if backward else ()))


def _roi_align(
    backward: bool, features: tuple[int, int, int, int], rois: int, output_size: int
) -> Built:
    """``asickernels.roi_align`` on Pallas (adaptive sampling, FPN-like scale), or its
    gradient."""
    static = {"output_size": output_size, "spatial_scale": 0.25, "sampling_ratio": -1}
    args = ((features, "float32"), ((rois, 5), "float32"))
    return build(CompileShape("", "", "roi_align", args, static, gradient=(0,) if backward else ()))


# Every Pallas kernel at its benchmark shapes (declared with each op's cases:
# ``COMPILE_SHAPES`` in ``asickernels/kernels/<op>_cases.py``).
BENCHMARK_SHAPES: tuple[KernelShape, ...] = tuple(
    KernelShape(shape.kernel, shape.shape, functools.partial(build, shape))
    for shape in COMPILE_SHAPES
)


# In the tpu_custom_call backend config a raised scoped-VMEM limit reads
# \22scoped_memory_configs\22: [{\22memory_space\22:1, \22offset\22: 0, \22size\22: N}] (\22 is ").
_VMEM_LIMIT = re.compile(
    r"scoped_memory_configs\\22: \[\{\\22memory_space\\22: ?1, \\22offset\\22: ?\d+, \\22size\\22: ?(\d+)"
)


def compile_one(target: KernelShape, generation: str) -> CompileResult:
    """Compiles ``target`` for ``generation``; a compiler error is a result, not a raise."""
    start = time.perf_counter()
    from asickernels.backends.pallas_tpu import lowering

    try:
        fn, specs = target.build()
        with lowering.record_vmem() as vmem_requests:
            lowered = lower_for_tpu(fn, specs, generation)
        compiled = lowered.compile()
    except Exception as error:
        message = str(error).strip().splitlines()
        return CompileResult(
            target.kernel,
            target.shape,
            generation,
            False,
            time.perf_counter() - start,
            error=" ".join(message[:3])[:500],
        )
    limits = [int(v) for v in _VMEM_LIMIT.findall(lowered.as_text())]
    memory = compiled.memory_analysis()
    hbm = None
    if memory is not None:
        hbm = (
            memory.argument_size_in_bytes + memory.output_size_in_bytes + memory.temp_size_in_bytes
        )
    return CompileResult(
        target.kernel,
        target.shape,
        generation,
        True,
        time.perf_counter() - start,
        vmem_bytes=max(vmem_requests, default=None),
        vmem_limit_bytes=max(limits) if limits else None,
        hbm_bytes=hbm,
    )


def compile_all(
    generations: Iterable[str] = GATE_GENERATIONS,
    kernels: Iterable[str] | None = None,
    targets: Sequence[KernelShape] = BENCHMARK_SHAPES,
) -> list[CompileResult]:
    wanted = None if kernels is None else set(kernels)
    return [
        compile_one(target, generation)
        for generation in generations
        for target in targets
        if wanted is None or target.kernel in wanted
    ]


def format_table(results: Sequence[CompileResult]) -> str:
    from asickernels.benchmarking.report import text_table

    def mib(value: int | None, default: str = "") -> str:
        return default if value is None else f"{value / 2**20:.2f} MiB"

    headers = ("kernel", "shape", "gen", "result", "VMEM blocks", "VMEM limit", "HBM", "note")
    rows = [
        [
            r.kernel,
            r.shape,
            r.generation,
            "compiled" if r.ok else "FAILED",
            mib(r.vmem_bytes),
            mib(r.vmem_limit_bytes, "default") if r.ok else "",
            mib(r.hbm_bytes),
            r.error or f"{r.seconds:.1f}s",
        ]
        for r in results
    ]
    return text_table(headers, rows, right={4, 5, 6})


def _run_cli(args: argparse.Namespace) -> int:
    import json

    missing = libtpu_status()
    if missing:
        print(f"cannot compile for TPU here: {missing}", file=sys.stderr)
        return 2
    results = compile_all(args.generation or GATE_GENERATIONS, args.kernel)
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([r.as_dict() for r in results], handle, indent=1)
    return 0 if all(r.ok for r in results) else 1


# `asickernels compile --help`, printed as written (lines of at most 78 characters).
COMPILE_DESCRIPTION = """\
Compile every Pallas kernel, at the shapes `asickernels bench` times on a TPU,
for real TPU generations with libtpu, the TPU compiler, on this machine: no TPU
needed. A kernel that compiles has passed the TPU compiler's checks of block
shapes, dtypes, layouts and VMEM capacity.

Prints, per kernel, shape and generation, whether it compiled (or the
compiler's error), the VMEM its blocks take and its HBM footprint. Exits 1 if
any kernel fails to compile, 2 without libtpu."""


def register_cli(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``asickernels compile``."""
    kernels = sorted({t.kernel for t in BENCHMARK_SHAPES})
    parser = subparsers.add_parser(
        "compile",
        help="compile every Pallas kernel for real TPUs with libtpu (no TPU needed)",
        description=COMPILE_DESCRIPTION,
        epilog=f"Needs libtpu: {LIBTPU_INSTALL}.\nMore: docs/tpu-compile-and-estimates.md.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--generation",
        action="append",
        choices=sorted(TOPOLOGIES),
        help=f"TPU generation (repeatable; default: {', '.join(GATE_GENERATIONS)})",
    )
    parser.add_argument(
        "--kernel",
        action="append",
        choices=kernels,
        metavar="KERNEL",
        help=f"only this kernel (repeatable; default: all): {', '.join(kernels)}",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.set_defaults(handler=_run_cli)
