"""Tuned Pallas block sizes, as data: only tables whose entries differ from the kernel's
config defaults (the other kernels run their defaults on every generation).

``INT8_MATMUL``: per TPU generation, ``(largest M of the class, (block_m, block_n,
block_k))`` in order; the last class has no bound (None). Chosen with compiler-schedule
estimates (``asickernels estimate --tune`` at 8192^3 and 2048^3 for large M; the users'
shapes of benchmarks/results/tpu_estimates.md for small M): larger K blocks amortise the
accumulator traffic; with M small the weights stream, and a whole-M block is never padded.
Each entry compiles with the real TPU compiler (tests/backends/pallas_tpu/test_tpu_compile.py).
"""

from __future__ import annotations

INT8_MATMUL: dict[str, tuple[tuple[int | None, tuple[int, int, int]], ...]] = {
    "v5e": (
        (2048, (1024, 1024, 2048)),
        (None, (1024, 1024, 8192)),
    ),
    "v5p": (
        (128, (1024, 1024, 2048)),
        (None, (1024, 1024, 8192)),
    ),
    "v6e": (
        (128, (1024, 2048, 2048)),
        (2048, (2048, 1024, 4096)),
        (None, (2048, 1024, 8192)),
    ),
}
