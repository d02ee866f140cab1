"""What exercises the int8 matmul (declared in :mod:`asickernels.kernels.int8_matmul`): see
:mod:`asickernels.kernels.cases`."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt

from asickernels.kernels import oracle
from asickernels.kernels.cases import (
    ArgSpec,
    Canonical,
    Case,
    Comparison,
    CompileShape,
    NkiEstimate,
    Size,
    Work,
    Workload,
    checked,
)
from asickernels.kernels.int8_matmul import INT8_MATMUL_MAX_K, int8_matmul, reference_int8_matmul

# -- conformance cases -----------------------------------------------------------------------


@dataclasses.dataclass
class MatmulCase:
    """int8 ``x [M, K]`` and ``y [K, N]``, per-row and per-column scales (arrays, scalars
    or None) and the result's dtype (None: int32, or float32 when scaled)."""

    name: str
    x: np.ndarray
    y: np.ndarray
    x_scale: np.ndarray | np.float32 | None = None
    y_scale: np.ndarray | np.float32 | None = None
    out_dtype: npt.DTypeLike | None = None
    slow: bool = False

    def kwargs(self) -> dict[str, object]:
        return {"x_scale": self.x_scale, "y_scale": self.y_scale, "out_dtype": self.out_dtype}


def random_int8(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return rng.integers(-128, 128, shape, dtype=np.int8)


def matmul_cases() -> list[MatmulCase]:
    rng = np.random.default_rng(2)
    cases = [MatmulCase("1x1x1", random_int8(rng, (1, 1)), random_int8(rng, (1, 1)))]
    for m, k, n in ((7, 130, 257), (130, 257, 7), (257, 7, 130), (64, 512, 128), (520, 1030, 260)):
        cases.append(MatmulCase(f"{m}x{k}x{n}", random_int8(rng, (m, k)), random_int8(rng, (k, n))))
    extreme = np.full((9, 4100), -128, np.int8)
    cases.append(MatmulCase("all_minus_128", extreme, extreme.T.copy()))
    x, y = random_int8(rng, (33, 300)), random_int8(rng, (300, 65))
    rows = rng.uniform(0.001, 0.1, 33).astype(np.float32)
    cols = rng.uniform(0.001, 0.1, 65).astype(np.float32)
    cases.append(MatmulCase("scales_rows_cols", x, y, rows, cols))
    cases.append(MatmulCase("scale_rows_only", x, y, x_scale=rows))
    cases.append(MatmulCase("scalar_scales", x, y, np.float32(0.02), np.float32(0.5)))
    cases.append(MatmulCase("scales_bfloat16_out", x, y, rows, cols, out_dtype=ml_dtypes.bfloat16))
    cases.append(MatmulCase("float_out_no_scales", x, y, out_dtype=np.float32))
    near = np.full((8, 131071), -128, np.int8)
    cases.append(MatmulCase("k_at_overflow_bound", near, near.T.copy(), slow=True))
    cases.append(
        MatmulCase(
            "k_beyond_bound_scaled",
            np.full((2, 131080), 127, np.int8),
            np.full((131080, 3), -128, np.int8),
            np.float32(1.0),
            np.float32(1.0),
            slow=True,
        )
    )
    return cases


def examples(batch: tuple[int, ...] = ()) -> dict[str, dict[str, Any]]:
    """The matmul with both scales and ``out_dtype`` (no batch dims: ``x [8, 7]``, so that M
    splits 8 ways); the quantization along axis 1 (see :mod:`asickernels.kernels.cases`)."""
    rng = np.random.default_rng(22)
    matmul = {
        "x": random_int8(rng, (8, 7)),
        "y": random_int8(rng, (7, 2)),
        "x_scale": rng.uniform(0.5, 2, 8).astype(np.float32),
        "y_scale": rng.uniform(0.5, 2, 2).astype(np.float32),
        "out_dtype": np.float32,
    }
    quantize = {"x": rng.normal(size=(*batch, 4, 6)).astype(np.float32), "axis": 1}
    return {"int8_matmul": matmul, "quantize_int8": quantize}


# -- check and bench workloads ---------------------------------------------------------------

# Beyond this many multiply-adds the whole-output float64 check costs more than the kernel:
# compare a sample of rows instead (every element of those rows, exactly).
_FULL_CHECK_MACS = 2048**3
_SAMPLED_ROWS = 128


class Int8MatmulWorkload(Workload):
    op = int8_matmul
    size_syntax = "S (S x S x S) or MxKxN"
    default_sizes: tuple[str, ...] = ("256", "512", "1024", "2048", "4096", "8192")
    quick_cases = frozenset({"7x130x257", "scales_rows_cols"})
    quick_sizes = default_sizes[:4]

    def parse_size(self, text: str) -> Size:
        match = re.fullmatch(r"(\d+)(?:x(\d+)x(\d+))?", text)
        if not match:
            raise ValueError(f"expected S or MxKxN (e.g. 1024 or 512x4096x256), got {text!r}")
        m, k, n = (
            (int(match[1]),) * 3 if not match[2] else (int(match[1]), int(match[2]), int(match[3]))
        )
        if min(m, k, n) < 1 or k > INT8_MATMUL_MAX_K:
            raise ValueError(f"M, K, N must be >= 1 and K <= {INT8_MATMUL_MAX_K}, got {text!r}")
        label = f"{m}^3" if m == k == n else f"{m}x{k}x{n}"
        return Size(label, {"m": m, "k": k, "n": n})

    def work(self, size: Size) -> float:
        return float(size.params["m"] * size.params["k"] * size.params["n"])

    def bench_case(self, size: Size, rng: np.random.Generator) -> Case:
        m, k, n = size.params["m"], size.params["k"], size.params["n"]
        return Case(size.label, (random_int8(rng, (m, k)), random_int8(rng, (k, n))))

    def check_cases(self, rng: np.random.Generator) -> list[Case]:
        return [
            Case(c.name, (c.x, c.y), {k: v for k, v in c.kwargs().items() if v is not None})
            for c in checked(matmul_cases())
        ]

    def expected(self, case: Case) -> tuple[np.ndarray | None, np.ndarray, np.dtype | None]:
        """``(rows, want, out_dtype)``: the sampled rows (None: all), their float64 or exact
        int32 product, and the result's dtype for scaled products (None: int32)."""
        x, y = case.arrays
        rows = None
        if x.shape[0] * x.shape[1] * y.shape[1] > _FULL_CHECK_MACS:
            rows = np.unique(np.random.default_rng(0).integers(0, x.shape[0], _SAMPLED_ROWS))
        scaled = any(
            case.static.get(key) is not None for key in ("x_scale", "y_scale", "out_dtype")
        )
        if not scaled:
            want = reference_int8_matmul(x if rows is None else x[rows], y)
            return rows, want, None
        m, n = x.shape[0], y.shape[1]
        scales = [
            np.broadcast_to(np.float32(1) if scale is None else scale, (size,))
            for scale, size in ((case.static.get("x_scale"), m), (case.static.get("y_scale"), n))
        ]
        if rows is not None:
            x, scales[0] = x[rows], scales[0][rows]
        want = reference_int8_matmul(
            x, y, x_scale=scales[0], y_scale=scales[1], out_dtype=np.float64
        )
        return rows, want, np.dtype(case.static.get("out_dtype") or np.float32)

    def compare(
        self, got: Canonical, expected: tuple[np.ndarray | None, np.ndarray, np.dtype | None]
    ) -> Comparison:
        if not isinstance(got, np.ndarray):
            raise TypeError(f"int8_matmul has one output, got {type(got).__name__}")
        rows, want, out_dtype = expected
        sample = got if rows is None else got[rows]
        checked = "all" if rows is None else f"{len(rows)} sampled rows of {got.shape[0]}"
        if out_dtype is None:
            error = float(np.max(np.abs(sample.astype(np.float64) - want), initial=0.0))
            return Comparison(error, 0.0, error == 0.0, checked)
        relative = np.abs(sample.astype(np.float64) - want) / np.maximum(np.abs(want), 1e-30)
        error = float(np.max(relative, initial=0.0))
        tolerance = oracle.tolerance(self.op, out_dtype).rtol
        return Comparison(error, tolerance, error <= tolerance, checked)


WORKLOADS = (Int8MatmulWorkload(),)

# -- TPU compile gate and NKI estimates ------------------------------------------------------


def _matmul(kernel_shape: str, m: int, k: int, n: int, scaled: bool = False) -> CompileShape:
    """``[m, k] @ [k, n]`` int8, with float32 per-row and per-column scales if ``scaled``."""
    args: list[ArgSpec] = [((m, k), "int8"), ((k, n), "int8")]
    if scaled:
        args += [((m,), "float32"), ((n,), "float32")]
    return CompileShape("int8_matmul", kernel_shape, "int8_matmul", tuple(args))


COMPILE_SHAPES = (
    _matmul("512^3", 512, 512, 512),
    _matmul("2048^3 scaled", 2048, 2048, 2048, scaled=True),
    _matmul("8192^3", 8192, 8192, 8192),
    _matmul("1000x3000x700 ragged", 1000, 3000, 700),
    # The shapes users run (issue #15): decode and prefill W8A8.
    _matmul("1x4096x14336", 1, 4096, 14336),
    _matmul("8x14336x4096 scaled", 8, 14336, 4096, scaled=True),
)

# The shapes users run (issue #15), which ``asickernels estimate`` estimates: W8A8 decode
# and prefill matmuls, M x (K, N).
INT8_USER_M = (1, 8, 32, 128, 512, 2048)
INT8_USER_KN = ((4096, 4096), (4096, 14336), (14336, 4096), (8192, 8192))


def _int8_matmul_work(size: Size) -> Work:
    """``[M, K] @ [K, N]`` int8 -> int32 on TensorE (bf16 matmuls: int8 is exact in bf16)."""
    m, k, n = size.params["m"], size.params["k"], size.params["n"]
    return Work(m * k + k * n + 4 * m * n, 2.0 * m * n * k, "tensor")


NKI_ESTIMATES = (
    NkiEstimate(
        "int8_matmul",
        "512",
        "a bench size; simulating its transposing loads takes ~1.5 s per generation at "
        "1024^3, ~10 s at 2048^3",
        _int8_matmul_work,
    ),
)
