"""What exercises linear sum assignment, beside its declaration
(:mod:`asickernels.kernels.linear_sum_assignment`): its conformance cases, which every
backend runs against SciPy (random, degenerate and adversarial cost matrices); its
``check``/``bench`` workload (DETR's matching sizes; ``benchmarks/linear_sum_assignment/
bench.py`` times DETR's whole matcher against SciPy); the TPU compile gate's DETR shape (see
:mod:`asickernels.kernels.cases`). It has no NKI estimate.

``unique`` marks cases whose optimum is unique (continuous random costs, almost surely,
with gaps far above the rounding of the dtype): there the assignment must be SciPy's;
elsewhere (ties) only the total cost must equal SciPy's.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

import numpy as np

from asickernels.kernels import linear_sum_assignment as lsa
from asickernels.kernels.cases import (
    Canonical,
    Case,
    Comparison,
    CompileShape,
    NkiEstimate,
    Size,
    Workload,
    checked,
)

# DETR's matching: a batch of 64 images, 100 queries x 100 padded targets.
COMPILE_SHAPES = (
    CompileShape(
        "linear_sum_assignment",
        "64x100x100",
        "linear_sum_assignment",
        (((64, 100, 100), "float32"), ((64, 100), "bool"), ((64, 100), "bool")),
    ),
)
NKI_ESTIMATES: tuple[NkiEstimate, ...] = ()


@dataclasses.dataclass
class LsaCase:
    name: str
    cost: np.ndarray
    row_mask: np.ndarray | None = None
    col_mask: np.ndarray | None = None
    unique: bool = False
    slow: bool = False

    def kwargs(self) -> dict[str, Any]:
        return {"row_mask": self.row_mask, "col_mask": self.col_mask}


def _masks(rng: np.random.Generator, shape: tuple[int, ...], keep: float) -> np.ndarray:
    return rng.uniform(size=shape) < keep


def lsa_cases() -> list[LsaCase]:
    rng = np.random.default_rng(33)
    cases = []
    shapes = ((1, 1), (2, 2), (5, 5), (17, 17), (3, 7), (7, 3), (100, 20), (20, 100))
    for (n, m), dtype in zip(shapes, [np.float32, np.float64] * 4, strict=True):
        cost = rng.uniform(0, 1, (n, m)).astype(dtype)
        cases.append(LsaCase(f"random_{n}x{m}_{dtype.__name__}", cost, unique=True))
    cases.append(LsaCase("detr_100x100_f32", rng.uniform(-3, 3, (100, 100)).astype(np.float32),
                         unique=True))  # fmt: skip
    cases.append(LsaCase("batch_2x3_f64", rng.normal(size=(2, 3, 9, 6)), unique=True))
    # DETR's shapes: 100 queries, up to 30 targets per image, padded targets masked (their
    # padding holds NaN: it must be ignored).
    cost = rng.uniform(0, 5, (4, 100, 30)).astype(np.float32)
    targets = np.array([30, 7, 1, 0])
    col_mask = np.arange(30)[None, :] < targets[:, None]
    cost[~np.broadcast_to(col_mask[:, None, :], cost.shape)] = np.nan
    cases.append(LsaCase("detr_masked_targets", cost, col_mask=col_mask, unique=True))
    cost = rng.uniform(0, 1, (3, 12, 10))
    cases.append(
        LsaCase(
            "masked_rows_and_columns",
            cost,
            row_mask=_masks(rng, (3, 12), 0.6),
            col_mask=_masks(rng, (3, 10), 0.6),
            unique=True,
        )
    )
    # Degenerate.
    cases.append(LsaCase("all_equal_6x6", np.full((6, 6), 2.5)))
    cases.append(LsaCase("all_equal_4x9_f32", np.full((4, 9), -1.0, np.float32)))
    cases.append(LsaCase("one_row", rng.uniform(size=(1, 9)), unique=True))
    cases.append(LsaCase("one_column", rng.uniform(size=(9, 1)), unique=True))
    cases.append(LsaCase("zero_rows", np.zeros((0, 5))))
    cases.append(LsaCase("zero_columns", np.zeros((5, 0), np.float32)))
    cases.append(LsaCase("empty_batch", np.zeros((0, 3, 3), np.float32)))
    cases.append(
        LsaCase(
            "every_row_masked",
            rng.uniform(size=(2, 4, 4)),
            row_mask=np.array([[False] * 4, [True, False, True, False]]),
        )
    )
    cases.append(
        LsaCase("every_column_masked", rng.uniform(size=(4, 4)), col_mask=np.zeros(4, bool))
    )
    # Adversarial.
    magnitude = 10.0 ** rng.uniform(-8, 8, (12, 12))
    cases.append(LsaCase("dynamic_range_1e16_f64", magnitude * rng.choice([-1, 1], (12, 12)),
                         unique=True))  # fmt: skip
    cases.append(
        LsaCase("dynamic_range_1e8_f32", (10.0 ** rng.uniform(-4, 4, (12, 12))).astype(np.float32))
    )
    cases.append(LsaCase("ties_small_integers", rng.integers(0, 3, (2, 15, 15)).astype(np.float64)))
    cases.append(LsaCase("ties_rectangular_f32", rng.integers(0, 2, (11, 5)).astype(np.float32)))
    cases.append(LsaCase("ties_rectangular_wide", rng.integers(0, 2, (5, 11)).astype(np.float64)))
    # Near-ties: costs 1 + a few ulps apart, in each dtype's own resolution.
    for dtype in (np.float32, np.float64):
        eps = np.finfo(dtype).eps
        near = (1 + rng.integers(0, 4, (9, 9)) * eps).astype(dtype)
        cases.append(LsaCase(f"near_ties_{dtype.__name__}", near))
    # Integers whose sums stay exact in float32: float32 kernels must be exactly optimal.
    cases.append(
        LsaCase("large_integers_f32", rng.integers(-(2**16), 2**16, (30, 30)).astype(np.float32))
    )
    cases.append(LsaCase("negative_costs", -rng.uniform(0, 100, (8, 13)), unique=True))
    # Forbidden pairs (+inf) that leave a feasible assignment.
    forbidden = rng.uniform(size=(10, 10))
    forbidden[rng.uniform(size=(10, 10)) < 0.5] = np.inf
    forbidden[np.arange(10), rng.permutation(10)] = rng.uniform(size=10)
    cases.append(LsaCase("forbidden_pairs_feasible", forbidden, unique=True))
    # Lower-triangular costs: the greedy choice is wrong, only augmenting paths find the
    # optimum (cost i + j, plus a large penalty above the anti-diagonal).
    i, j = np.indices((16, 16))
    cases.append(LsaCase("anti_greedy", np.where(i + j < 15, 1000.0, (i * j) % 7 + 0.0)))
    cases.append(LsaCase("large_square_f64", rng.uniform(size=(300, 300)), unique=True, slow=True))
    return cases


def examples(batch: tuple[int, ...] = ()) -> dict[str, dict[str, Any]]:
    """4 x 3 costs (per ``batch`` element) with both masks, each masking one out (see
    :mod:`asickernels.kernels.cases`)."""
    cost = np.random.default_rng(24).uniform(size=(*batch, 4, 3)).astype(np.float32)
    row_mask, col_mask = np.ones((*batch, 4), bool), np.ones((*batch, 3), bool)
    row_mask[..., 1] = col_mask[..., 2] = False
    return {"linear_sum_assignment": {"cost": cost, "row_mask": row_mask, "col_mask": col_mask}}


class LsaWorkload(Workload):
    """``linear_sum_assignment`` on ``[..., N, M]`` costs and the case's masks (keyword
    arguments): sizes ``BxNxM`` (DETR's: 100 queries x up to 100 targets, each image's
    targets a random count, the rest masked by ``col_mask``). A result agrees when
    :func:`~asickernels.kernels.linear_sum_assignment.compare` says so: SciPy's number of
    matches and total cost (within the rounding of the cost's dtype), and SciPy's
    assignment where the optimum is unique; ``max_error`` counts the images that do not."""

    op = lsa.linear_sum_assignment
    size_syntax = "BxNxM costs"
    default_sizes: tuple[str, ...] = ("2x100x20", "64x100x100")
    quick_cases = frozenset({"random_3x7_float32", "detr_masked_targets"})
    quick_sizes = ("2x100x20",)

    def parse_size(self, text: str) -> Size:
        match = re.fullmatch(r"(\d+)x(\d+)x(\d+)", text)
        if not match or min(int(g) for g in match.groups()) < 1:
            raise ValueError(f"expected BxNxM costs (e.g. 64x100x100), got {text!r}")
        b, n, m = (int(g) for g in match.groups())
        return Size(f"{b}x{n}x{m} costs", {"b": b, "n": n, "m": m})

    def work(self, size: Size) -> float:
        return float(size.params["b"] * max(size.params["n"], size.params["m"]) ** 3)

    def bench_case(self, size: Size, rng: np.random.Generator) -> Case:
        b, n, m = (size.params[k] for k in ("b", "n", "m"))
        cost = rng.uniform(0, 5, (b, n, m)).astype(np.float32)
        targets = rng.integers(1, m + 1, b)
        col_mask = np.arange(m)[None, :] < targets[:, None]
        return Case(size.label, (cost,), {"col_mask": col_mask})

    def check_cases(self, rng: np.random.Generator) -> list[Case]:
        return [Case(c.name, (c.cost,), _given(c.kwargs())) for c in checked(lsa_cases())]

    def expected(self, case: Case) -> Any:
        """The case itself: :meth:`compare` measures a result against SciPy on it."""
        return case

    def compare(self, got: Canonical, expected: Any) -> Comparison:
        cost = expected.arrays[0]
        batch, (n, m) = cost.shape[:-2], cost.shape[-2:]
        rows = expected.static.get("row_mask", np.ones(batch + (n,), bool))
        cols = expected.static.get("col_mask", np.ones(batch + (m,), bool))
        unique = expected.name in _unique_cases() or expected.name.endswith(" costs")
        dtype = np.float64 if cost.dtype == np.float64 else np.float32  # (decided in)
        images = int(np.prod(batch, dtype=np.int64))
        assignment = np.asarray(got[0]).reshape(images, n)
        count = np.asarray(got[1]).reshape(images)
        flat = cost.reshape(images, n, m), rows.reshape(images, n), cols.reshape(images, m)
        errors = [
            lsa.compare(c, (a, k), row_mask=r, col_mask=v, dtype=dtype, unique=unique).error
            for c, r, v, a, k in zip(*flat, assignment, count, strict=True)
        ]
        wrong = [error for error in errors if error]
        compared = "matches, total cost" + (", assignment" if unique else "")
        return Comparison(float(len(wrong)), 0.0, not wrong, wrong[0] if wrong else compared)


def _given(masks: dict[str, Any]) -> dict[str, Any]:
    """The masks a case gives (the op's keyword arguments; None ones left out)."""
    return {name: mask for name, mask in masks.items() if mask is not None}


@functools.cache
def _unique_cases() -> frozenset[str]:
    """The conformance cases whose optimum is unique (their assignment must be SciPy's)."""
    return frozenset(case.name for case in lsa_cases() if case.unique)


WORKLOADS = (LsaWorkload(),)
