"""Inputs for the conformance suite: random, edge and adversarial, per op.

Every case is deterministic (fixed seeds). NMS boxes sit on an integer grid so that areas
and intersections are exact in float32 and float64 alike, and IoU-vs-threshold decisions
cannot differ between a float32 kernel and the float64 reference.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_dtypes
import numpy as np

# Sizes chosen to divide by none of the block sizes (8, 128, 512) and to straddle them.
RAGGED_SIZES = (1, 7, 130, 257)


def random_boxes(
    rng: np.random.Generator, shape: tuple[int, ...], scale: float = 10.0
) -> np.ndarray:
    xy = rng.uniform(-scale, scale, shape + (2,))
    wh = rng.uniform(0.0, scale, shape + (2,))
    return np.concatenate([xy, xy + wh], axis=-1).astype(np.float32)


def grid_boxes(
    rng: np.random.Generator, shape: tuple[int, ...], span: int = 40, size: int = 16
) -> np.ndarray:
    xy = rng.integers(0, span, shape + (2,))
    wh = rng.integers(0, size, shape + (2,))
    return np.concatenate([xy, xy + wh], axis=-1).astype(np.float32)


@dataclasses.dataclass
class GiouCase:
    name: str
    boxes1: np.ndarray
    boxes2: np.ndarray


def giou_cases() -> list[GiouCase]:
    rng = np.random.default_rng(0)
    cases = [
        GiouCase(f"random_{n}", random_boxes(rng, (n,)), random_boxes(rng, (n,)))
        for n in RAGGED_SIZES
    ]
    cases.append(
        GiouCase("random_1024x256", random_boxes(rng, (1024, 256)), random_boxes(rng, (1024, 256)))
    )
    cases.append(
        GiouCase("batch_3x5x7", random_boxes(rng, (3, 5, 7)), random_boxes(rng, (3, 5, 7)))
    )
    # A batch whose last dim is 4, like a box: cotangents [2, 4] must not pass for boxes.
    cases.append(GiouCase("batch_2x4", random_boxes(rng, (2, 4)), random_boxes(rng, (2, 4))))
    base = np.array([0.0, 0.0, 4.0, 4.0], np.float32)
    adversarial = {
        "identical": (base, base),
        "disjoint": (base, np.array([10, 10, 12, 12], np.float32)),
        "disjoint_x_only": (base, np.array([5, 0, 9, 4], np.float32)),
        "touching_edge": (base, np.array([4, 0, 8, 4], np.float32)),
        "nested": (base, np.array([1, 1, 2, 2], np.float32)),
        "containing": (np.array([1, 1, 2, 2], np.float32), base),
        "zero_area_point": (np.array([1, 1, 1, 1], np.float32), np.array([1, 1, 1, 1], np.float32)),
        "zero_area_line": (np.array([0, 1, 4, 1], np.float32), base),
        "point_vs_point": (np.array([0, 0, 0, 0], np.float32), np.array([3, 3, 3, 3], np.float32)),
        "shared_corner": (base, np.array([4, 4, 6, 6], np.float32)),
        "large_coords": (base * 2500 + 1e4, (base + 1) * 2500 + 1e4),
        "tiny_boxes": (base * 1e-3, (base + 0.5) * 1e-3),
    }
    names = list(adversarial)
    cases.append(
        GiouCase(
            "adversarial",
            np.stack([adversarial[k][0] for k in names]),
            np.stack([adversarial[k][1] for k in names]),
        )
    )
    cases.append(GiouCase("empty", np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32)))
    # float64 in, float64 out: boxes offset by 1e6 whose GIOU float32 cannot resolve.
    far = random_boxes(rng, (57,)).astype(np.float64) * 1e-3 + 1e6
    cases.append(GiouCase("float64_offset_1e6", far, far + rng.uniform(0, 1e-3, far.shape)))
    bf16 = ml_dtypes.bfloat16
    cases.append(
        GiouCase(
            "bfloat16_130",
            random_boxes(rng, (130,)).astype(bf16),
            random_boxes(rng, (130,)).astype(bf16),
        )
    )
    return cases


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


def nms_cases() -> list[NmsCase]:
    rng = np.random.default_rng(1)
    cases = []
    for n in RAGGED_SIZES:
        for threshold in (0.0, 0.3, 1.0):
            cases.append(
                NmsCase(
                    f"grid_n{n}_t{threshold}",
                    grid_boxes(rng, (n,)),
                    _tied_scores(rng, (n,)),
                    threshold,
                    16,
                )
            )
    cases.append(
        NmsCase("max_out_exceeds_n", grid_boxes(rng, (7,)), _tied_scores(rng, (7,)), 0.5, 20)
    )
    cases.append(NmsCase("max_out_1", grid_boxes(rng, (130,)), _tied_scores(rng, (130,)), 0.5, 1))
    cases.append(
        NmsCase("batch_2x3", grid_boxes(rng, (2, 3, 57)), _tied_scores(rng, (2, 3, 57)), 0.4, 12)
    )
    cases.append(
        NmsCase(
            "score_threshold",
            grid_boxes(rng, (130,)),
            _tied_scores(rng, (130,)),
            0.5,
            64,
            score_threshold=0.5,
        )
    )
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
    cases.append(
        NmsCase(
            "categories",
            grid_boxes(rng, (130,)),
            _tied_scores(rng, (130,)),
            0.2,
            40,
            categories=rng.integers(0, 4, (130,)),
        )
    )
    cases.append(
        NmsCase(
            "categories_batched",
            grid_boxes(rng, (2, 61)),
            _tied_scores(rng, (2, 61)),
            0.2,
            30,
            categories=rng.integers(0, 3, (2, 61)),
        )
    )
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
    cases.append(NmsCase("max_out_0", grid_boxes(rng, (7,)), _tied_scores(rng, (7,)), 0.5, 0))
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


@dataclasses.dataclass
class MatmulCase:
    name: str
    x: np.ndarray
    y: np.ndarray
    x_scale: Any = None
    y_scale: Any = None
    out_dtype: Any = None
    slow: bool = False

    def kwargs(self) -> dict[str, Any]:
        return {"x_scale": self.x_scale, "y_scale": self.y_scale, "out_dtype": self.out_dtype}


def _int8(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return rng.integers(-128, 128, shape, dtype=np.int8)


def matmul_cases() -> list[MatmulCase]:
    rng = np.random.default_rng(2)
    cases = [MatmulCase("1x1x1", _int8(rng, (1, 1)), _int8(rng, (1, 1)))]
    for m, k, n in ((7, 130, 257), (130, 257, 7), (257, 7, 130), (64, 512, 128), (520, 1030, 260)):
        cases.append(MatmulCase(f"{m}x{k}x{n}", _int8(rng, (m, k)), _int8(rng, (k, n))))
    extreme = np.full((9, 4100), -128, np.int8)
    cases.append(MatmulCase("all_minus_128", extreme, extreme.T.copy()))
    x, y = _int8(rng, (33, 300)), _int8(rng, (300, 65))
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


@dataclasses.dataclass
class PairwiseCase:
    """Boxes for the pairwise ops: ``boxes1 [..., N, 4]`` against ``boxes2 [..., M, 4]``."""

    name: str
    boxes1: np.ndarray
    boxes2: np.ndarray


def pairwise_cases() -> list[PairwiseCase]:
    """Random and ragged sizes, batches, N or M = 0, and every pair of GIOU's adversarial
    boxes (disjoint, nested, identical, touching, zero-area points and lines, ...)."""
    rng = np.random.default_rng(5)
    cases = [
        PairwiseCase(f"random_{n}x{m}", random_boxes(rng, (n,)), random_boxes(rng, (m,)))
        for n, m in ((1, 1), (7, 130), (130, 257), (257, 7))
    ]
    cases.append(
        PairwiseCase("batch_3x9x20", random_boxes(rng, (3, 9)), random_boxes(rng, (3, 20)))
    )
    cases.append(PairwiseCase("n_zero", np.zeros((0, 4), np.float32), random_boxes(rng, (5,))))
    cases.append(PairwiseCase("m_zero", random_boxes(rng, (5,)), np.zeros((0, 4), np.float32)))
    adversarial = next(c for c in giou_cases() if c.name == "adversarial")
    everything = np.concatenate([adversarial.boxes1, adversarial.boxes2])
    cases.append(PairwiseCase("adversarial_all_pairs", everything, everything))
    bf16 = ml_dtypes.bfloat16
    cases.append(
        PairwiseCase(
            "bfloat16_9x130",
            random_boxes(rng, (9,)).astype(bf16),
            random_boxes(rng, (130,)).astype(bf16),
        )
    )
    return cases
