"""What exercises NMS and batched NMS (declared in :mod:`asickernels.kernels.nms`): see
:mod:`asickernels.kernels.cases`. A new NMS argument gets its cases here (the files an
argument change touches are listed in :mod:`asickernels.kernels.nms`).

Conformance boxes sit on an integer grid so that areas and intersections are exact in
float32 and float64 alike, and IoU-vs-threshold decisions cannot differ between a float32
kernel and the float64 reference.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from asickernels.kernels.cases import (
    RAGGED_SIZES,
    Case,
    CompileShape,
    NkiEstimate,
    Size,
    Work,
    Workload,
    batched,
    checked,
    grid_boxes,
)
from asickernels.kernels.nms import batched_nms, greedy_nms, nms

# -- conformance cases -----------------------------------------------------------------------


@dataclasses.dataclass
class NmsCase:
    name: str
    boxes: np.ndarray
    scores: np.ndarray
    iou_threshold: float
    max_output_size: int
    score_threshold: float | None = None
    categories: np.ndarray | None = None
    slow: bool = False

    def kwargs(self) -> dict[str, Any]:
        return {
            "iou_threshold": self.iou_threshold,
            "max_output_size": self.max_output_size,
            "score_threshold": self.score_threshold,
        }


def _tied_scores(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    # Few distinct values, so many ties that must resolve by index.
    return (rng.integers(0, 10, shape) / 10).astype(np.float32)


def _on_grid(
    rng: np.random.Generator,
    name: str,
    shape: tuple[int, ...],
    iou_threshold: float,
    max_output_size: int,
    *,
    score_threshold: float | None = None,
    categories: int = 0,
) -> NmsCase:
    """Grid boxes, tied scores and, with ``categories``, ids below it, all of ``shape``
    (drawn in that order)."""
    boxes, scores = grid_boxes(rng, shape), _tied_scores(rng, shape)
    ids = rng.integers(0, categories, shape) if categories else None
    return NmsCase(
        name, boxes, scores, iou_threshold, max_output_size, score_threshold, categories=ids
    )


def nms_cases() -> list[NmsCase]:
    rng = np.random.default_rng(1)
    cases = [
        _on_grid(rng, f"grid_n{n}_t{threshold}", (n,), threshold, 16)
        for n in RAGGED_SIZES
        for threshold in (0.0, 0.3, 1.0)
    ]
    cases.append(_on_grid(rng, "max_out_exceeds_n", (7,), 0.5, 20))
    cases.append(_on_grid(rng, "max_out_1", (130,), 0.5, 1))
    cases.append(_on_grid(rng, "batch_2x3", (2, 3, 57), 0.4, 12))
    cases.append(_on_grid(rng, "score_threshold", (130,), 0.5, 64, score_threshold=0.5))
    scores = _tied_scores(rng, (40,))
    scores[::5] = np.nan
    scores[1] = np.inf
    scores[2] = -np.inf
    scores[3] = -0.0
    scores[4] = 0.0
    cases.append(NmsCase("nan_inf_signed_zero_scores", grid_boxes(rng, (40,)), scores, 0.3, 40))
    boxes = grid_boxes(rng, (20,))
    boxes[3] = np.nan
    boxes[7, 2] = np.inf
    cases.append(NmsCase("non_finite_boxes", boxes, _tied_scores(rng, (20,)), 0.2, 20))
    same = np.tile(np.array([[2, 2, 6, 6]], np.float32), (9, 1))
    cases.append(
        NmsCase("identical_boxes_equal_scores", same, np.full((9,), 0.5, np.float32), 0.5, 9)
    )
    zero = np.tile(np.array([[3, 3, 3, 3]], np.float32), (5, 1))
    cases.append(NmsCase("zero_area_boxes", zero, np.linspace(1, 0, 5).astype(np.float32), 0.0, 5))
    nested = np.array(
        [[0, 0, 10, 10], [1, 1, 9, 9], [2, 2, 8, 8], [3, 3, 7, 7], [4, 4, 6, 6]], np.float32
    )
    cases.append(NmsCase("nested_chain", nested, np.linspace(1, 0.5, 5).astype(np.float32), 0.5, 5))
    # IoU exactly at the threshold must not suppress (strictly greater rule): IoU = 1/2.
    half = np.array([[0, 0, 4, 2], [0, 0, 4, 1]], np.float32)
    cases.append(NmsCase("iou_equals_threshold", half, np.array([0.9, 0.8], np.float32), 0.5, 2))
    cases.append(_on_grid(rng, "categories", (130,), 0.2, 40, categories=4))
    cases.append(_on_grid(rng, "categories_batched", (2, 61), 0.2, 30, categories=3))
    cases.append(NmsCase("empty", np.zeros((0, 4), np.float32), np.zeros((0,), np.float32), 0.5, 4))
    # float64 decided in float64: IoU 0.5 + 5e-10 is 0.5 in float32 (both kept), and boxes
    # offset by 1e6 lose their fractional extents in float32.
    near = np.array([[0, 0, 1, 1], [0, 0, 0.5 + 5e-10, 1]], np.float64)
    cases.append(NmsCase("float64_iou_just_above", near, np.array([0.9, 0.8]), 0.5, 2))
    offset = rng.uniform(0, 4, (200, 2)) + 1e6
    far = np.concatenate([offset, offset + rng.uniform(0.05, 1.5, (200, 2))], axis=1)
    cases.append(NmsCase("float64_offset_1e6", far, rng.permutation(200) / 200.0, 0.3, 50))
    # Category ids beyond int32 keep their identity (0 and 2**32 are different categories);
    # int32 ids reach the kernels as they are: the extremes stay apart, equal ones together.
    same_place = np.tile(np.array([[0, 0, 4, 4]], np.float32), (5, 1))
    scores = np.linspace(1, 0.5, 5).astype(np.float32)
    wide = np.array([0, 2**32, 2**40 + 1, 2**40 + 1, -(2**62)], np.int64)
    extremes = np.array([-(2**31), 2**31 - 1, 0, 2**31 - 1, -(2**31)], np.int32)
    named: list[tuple[str, np.ndarray]] = [
        ("categories_beyond_int32", wide),
        ("categories_int32_extremes", extremes),
    ]
    for name, ids in named:
        cases.append(NmsCase(name, same_place, scores, 0.5, 5, categories=ids))
    cases.append(_on_grid(rng, "max_out_0", (7,), 0.5, 0))
    for n in (1024, 4096):
        cases.append(
            NmsCase(
                f"seed_size_n{n}",
                grid_boxes(rng, (n,), span=2000, size=120),
                rng.permutation(n).astype(np.float32),
                0.1,
                128,
                slow=n > 1024,
            )
        )
    cases.append(
        NmsCase(
            "n16384_all_outputs_slow",
            grid_boxes(rng, (16384,), span=8000, size=120),
            rng.permutation(16384).astype(np.float32),
            0.1,
            512,
            slow=True,
        )
    )
    return cases


def examples(batch: tuple[int, ...] = ()) -> dict[str, dict[str, Any]]:
    """Six boxes and scores (per ``batch`` element), a score threshold, and two categories
    (see :mod:`asickernels.kernels.cases`). Box 2 overlaps box 0 with IoU 0.43, box 1 with
    0.71; box 3 scores under the threshold."""
    boxes = [[0, 0, 10, 10], [0, 0, 10, 14], [4, 0, 14, 10], [20, 20, 30, 30]]
    boxes += [[40, 40, 50, 50], [60, 60, 70, 70]]
    nms = {
        "boxes": batched(np.array(boxes, np.float32), batch),
        "scores": batched(np.array([0.9, 0.8, 0.7, 0.15, 0.5, 0.4], np.float32), batch),
        "iou_threshold": 0.3,
        "max_output_size": 4,
        "score_threshold": 0.2,
    }
    return {
        "nms": nms,
        "batched_nms": {**nms, "idxs": batched(np.array([0, 0, 0, 0, 1, 1]), batch)},
    }


# -- check and bench workloads ---------------------------------------------------------------


def seed_style_boxes(
    rng: np.random.Generator, n: int, image: int = 1024
) -> tuple[np.ndarray, np.ndarray]:
    """The NMS article's workload: integer boxes with sides 1..image-1 clipped to the image,
    uniform scores (float32; integer coordinates keep IoU decisions exact)."""
    sides = rng.integers(1, image, (n, 2))
    corner = rng.integers(0, image - 1, (n, 2))
    boxes = np.concatenate([corner, np.clip(corner + sides, 0, image - 1)], axis=1)
    return boxes.astype(np.float32), rng.uniform(0.0, 1.0, n).astype(np.float32)


class NmsWorkload(Workload):
    op = nms
    size_syntax = "N[:max_output[:iou_threshold]] (defaults 128 outputs, threshold 0.1)"
    default_sizes: tuple[str, ...] = ("256", "1024", "4096", "16384")
    quick_cases = frozenset(
        {"grid_n130_t0.3", "nan_inf_signed_zero_scores", "iou_equals_threshold"}
    )
    quick_sizes = default_sizes
    categories = 0  # batched_nms draws this many categories

    def parse_size(self, text: str) -> Size:
        match = re.fullmatch(r"(\d+)(?::(\d+)(?::([0-9.]+))?)?", text)
        threshold = float(match[3]) if match and match[3] else 0.1
        if not match or int(match[1]) < 1 or not 0.0 <= threshold <= 1.0:
            raise ValueError(
                f"expected N[:max_output[:iou_threshold]] (e.g. 4096:128:0.1), got {text!r}"
            )
        n, max_output = int(match[1]), int(match[2] or 128)
        label = f"N={n} out={max_output} iou>{threshold:g}"
        return Size(label, {"n": n, "max_output_size": max_output, "iou_threshold": threshold})

    def work(self, size: Size) -> float:
        return float(size.params["n"] * max(size.params["max_output_size"], 1))

    def _case(
        self,
        name: str,
        boxes: np.ndarray,
        scores: np.ndarray,
        rng: np.random.Generator,
        iou_threshold: float,
        max_output_size: int,
        score_threshold: float | None = None,
    ) -> Case:
        arrays: tuple[np.ndarray, ...] = (boxes, scores)
        if self.categories:
            arrays += (rng.integers(0, self.categories, scores.shape).astype(np.int32),)
        static = {
            "iou_threshold": iou_threshold,
            "max_output_size": max_output_size,
            "score_threshold": score_threshold,
        }
        return Case(name, arrays, static)

    def bench_case(self, size: Size, rng: np.random.Generator) -> Case:
        boxes, scores = seed_style_boxes(rng, size.params["n"])
        return self._case(
            size.label,
            boxes,
            scores,
            rng,
            size.params["iou_threshold"],
            size.params["max_output_size"],
        )

    def check_cases(self, rng: np.random.Generator) -> list[Case]:
        return [
            Case(c.name, (c.boxes, c.scores), c.kwargs())
            if c.categories is None
            else Case(c.name, (c.boxes, c.scores, c.categories.astype(np.int32)), c.kwargs())
            for c in checked(nms_cases())
            if (c.categories is not None) == bool(self.categories)
        ]

    def expected(self, case: Case) -> Any:
        boxes, scores = case.arrays[0], case.arrays[1]
        categories = case.arrays[2] if len(case.arrays) > 2 else None
        batch_shape, n = scores.shape[:-1], scores.shape[-1]
        batch = math.prod(batch_shape)
        score_threshold = case.static["score_threshold"]
        indices, num_valid = greedy_nms(
            boxes.reshape(batch, n, 4),
            scores.reshape(batch, n),
            None if categories is None else categories.reshape(batch, n),
            iou_threshold=case.static["iou_threshold"],
            max_output_size=case.static["max_output_size"],
            score_threshold=-math.inf if score_threshold is None else score_threshold,
        )
        return indices.reshape((*batch_shape, -1)), num_valid.reshape(batch_shape)


class BatchedNmsWorkload(NmsWorkload):
    """Per-category NMS (``torchvision.ops.batched_nms``), 16 categories."""

    op = batched_nms
    default_sizes: tuple[str, ...] = ("256", "1024")
    quick_cases = frozenset({"categories"})
    quick_sizes = ("1024",)
    categories = 16


WORKLOADS = (NmsWorkload(), BatchedNmsWorkload())

# -- TPU compile gate, TPU and NKI estimates -------------------------------------------------


def _nms(n: int, max_output_size: int) -> CompileShape:
    """One image of ``n`` boxes, threshold 0.1 (the NMS article's)."""
    static = {"iou_threshold": 0.1, "max_output_size": max_output_size}
    return CompileShape(
        "nms",
        f"N={n} out={max_output_size}",
        "nms",
        (((n, 4), "float32"), ((n,), "float32")),
        static,
    )


COMPILE_SHAPES = (_nms(1024, 128), _nms(4096, 128), _nms(16384, 128))

# The shapes users run (issue #15), which ``asickernels estimate`` estimates: NMS over
# 1024..16384 boxes; the tiles swept.
NMS_USER_N = (1024, 2048, 4096, 8192, 16384)
NMS_TILE_SWEEP = (128, 256, 512, 1024)


def _nms_work(category_bytes: int) -> Callable[[Size], Work]:
    """Boxes (16 bytes), a score (4) and a category id (``category_bytes``) per box in, the
    kept indices and their count (int32) out; no operation count (its bound is its bytes)."""

    def work(size: Size) -> Work:
        n, kept = size.params["n"], size.params["max_output_size"]
        return Work((20 + category_bytes) * n + 4 * kept + 4)

    return work


NKI_ESTIMATES = (
    NkiEstimate("nms", "1024", "the NMS article's 1024 boxes, 128 outputs", _nms_work(0)),
    NkiEstimate("batched_nms", "1024", "the bench size, 16 categories", _nms_work(4)),
)
