"""Inputs for the conformance suite: random, edge and adversarial, per op, and the box
generators they share. Every case is deterministic (fixed seeds). An op whose cases live
beside its declaration (NMS: :mod:`asickernels.kernels.nms_cases`) is not listed here.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import numpy.typing as npt

from asickernels.kernels.roi_align import RoiAlignStatics, RoiStatics

# Sizes chosen to divide by none of the block sizes (8, 128, 512) and to straddle them.
RAGGED_SIZES = (1, 7, 130, 257)


def random_boxes(
    rng: np.random.Generator, shape: tuple[int, ...], scale: float = 10.0
) -> np.ndarray:
    """float32 boxes ``shape + (4,)``: corners uniform in ``[-scale, scale)``, sides in
    ``[0, scale)`` (some nearly empty)."""
    xy = rng.uniform(-scale, scale, shape + (2,))
    wh = rng.uniform(0.0, scale, shape + (2,))
    return np.concatenate([xy, xy + wh], axis=-1).astype(np.float32)


def grid_boxes(
    rng: np.random.Generator, shape: tuple[int, ...], span: int = 40, size: int = 16
) -> np.ndarray:
    """float32 boxes ``shape + (4,)`` on the integer grid: corners in ``[0, span)``, sides
    in ``[0, size)``, so that equal boxes, shared edges and zero sizes occur."""
    xy = rng.integers(0, span, shape + (2,))
    wh = rng.integers(0, size, shape + (2,))
    return np.concatenate([xy, xy + wh], axis=-1).astype(np.float32)


@dataclasses.dataclass
class BoxPairCase:
    """Two box arrays ``[..., N, 4]`` and ``[..., M, 4]`` (N = M for the element-wise GIOU)."""

    name: str
    boxes1: np.ndarray
    boxes2: np.ndarray


def _random_pair(
    rng: np.random.Generator,
    name: str,
    shape1: tuple[int, ...],
    shape2: tuple[int, ...],
    dtype: npt.DTypeLike = np.float32,
) -> BoxPairCase:
    """Random boxes of ``shape1`` then of ``shape2`` (drawn in that order), as ``dtype``."""
    boxes1 = random_boxes(rng, shape1).astype(dtype)
    return BoxPairCase(name, boxes1, random_boxes(rng, shape2).astype(dtype))


def giou_cases() -> list[BoxPairCase]:
    """Ragged and large sizes, batches, the adversarial pairs (identical, disjoint, touching,
    nested, zero-area, huge and tiny coordinates), empty, float64 and bfloat16 boxes."""
    rng = np.random.default_rng(0)
    cases = [_random_pair(rng, f"random_{n}", (n,), (n,)) for n in RAGGED_SIZES]
    cases.append(_random_pair(rng, "random_1024x256", (1024, 256), (1024, 256)))
    cases.append(_random_pair(rng, "batch_3x5x7", (3, 5, 7), (3, 5, 7)))
    # A batch whose last dim is 4, like a box: cotangents [2, 4] must not pass for boxes.
    cases.append(_random_pair(rng, "batch_2x4", (2, 4), (2, 4)))
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
        BoxPairCase(
            "adversarial",
            np.stack([adversarial[k][0] for k in names]),
            np.stack([adversarial[k][1] for k in names]),
        )
    )
    cases.append(BoxPairCase("empty", np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32)))
    # float64 in, float64 out: boxes offset by 1e6 whose GIOU float32 cannot resolve.
    far = random_boxes(rng, (57,)).astype(np.float64) * 1e-3 + 1e6
    cases.append(BoxPairCase("float64_offset_1e6", far, far + rng.uniform(0, 1e-3, far.shape)))
    cases.append(_random_pair(rng, "bfloat16_130", (130,), (130,), ml_dtypes.bfloat16))
    return cases


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


def pairwise_cases() -> list[BoxPairCase]:
    """Boxes for the pairwise ops (``boxes1 [..., N, 4]`` against ``boxes2 [..., M, 4]``):
    random and ragged sizes, batches, N or M = 0, every pair of GIOU's adversarial boxes
    (disjoint, nested, identical, touching, zero-area points and lines, ...) and bfloat16."""
    rng = np.random.default_rng(5)
    cases = [
        _random_pair(rng, f"random_{n}x{m}", (n,), (m,))
        for n, m in ((1, 1), (7, 130), (130, 257), (257, 7))
    ]
    cases.append(_random_pair(rng, "batch_3x9x20", (3, 9), (3, 20)))
    cases.append(BoxPairCase("n_zero", np.zeros((0, 4), np.float32), random_boxes(rng, (5,))))
    cases.append(BoxPairCase("m_zero", random_boxes(rng, (5,)), np.zeros((0, 4), np.float32)))
    adversarial = next(c for c in giou_cases() if c.name == "adversarial")
    everything = np.concatenate([adversarial.boxes1, adversarial.boxes2])
    cases.append(BoxPairCase("adversarial_all_pairs", everything, everything))
    cases.append(_random_pair(rng, "bfloat16_9x130", (9,), (130,), ml_dtypes.bfloat16))
    return cases


# -- RoI pooling ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RoiCase:
    """A feature map ``input [N, C, H, W]``, ``rois [K, 5]`` and RoIAlign's statics (RoIPool
    takes ``output_size`` and ``spatial_scale``)."""

    name: str
    input: np.ndarray
    rois: np.ndarray
    output_size: tuple[int, int]
    spatial_scale: float = 1.0
    sampling_ratio: int = -1
    aligned: bool = False

    def align_statics(self) -> RoiAlignStatics:
        return RoiAlignStatics(
            output_size=self.output_size,
            spatial_scale=self.spatial_scale,
            sampling_ratio=self.sampling_ratio,
            aligned=self.aligned,
        )

    def pool_statics(self) -> RoiStatics:
        return RoiStatics(output_size=self.output_size, spatial_scale=self.spatial_scale)


def random_rois(rng: np.random.Generator, count: int, batch: int, span: float) -> np.ndarray:
    """``count`` random RoIs over ``[-0.3, 1.3] * span`` (partly off the map), then the edge
    ones: zero size at the corner and inside, reversed corners, wholly off the map, up to
    the last row and column, and a huge RoI (a large adaptive grid; its corners off the
    pixel lattice, so that no sample lies exactly on the map's border)."""
    corners = rng.uniform(-0.3 * span, 1.3 * span, (count, 4))
    boxes = np.concatenate(
        [np.minimum(corners[:, :2], corners[:, 2:]), np.maximum(corners[:, :2], corners[:, 2:])], 1
    )
    edge = [
        [0.0, 0.0, 0.0, 0.0],
        [5.0, 3.0, 5.0, 3.0],
        [6.0, 6.0, 2.0, 1.0],
        [-50.0, -50.0, -20.0, -20.0],
        [0.0, 0.0, span - 1.0, span - 1.0],
        [-2.9 * span - 0.31, -2.1 * span + 0.17, 4.1 * span + 0.23, 2.9 * span - 0.13],
    ]
    boxes = np.concatenate([boxes, edge])
    index = rng.integers(0, batch, (len(boxes), 1)).astype(np.float64)
    return np.concatenate([index, boxes], 1)


def roi_cases() -> list[RoiCase]:
    """RoIAlign's statics on float32 and float64 maps, aligned or not, adaptive and fixed
    sampling grids, whole-pixel bins, no RoIs, a one-pixel map and a transposed view;
    RoIPool takes each case's ``output_size`` and ``spatial_scale``."""
    rng = np.random.default_rng(26)
    features = rng.standard_normal((2, 3, 11, 13))
    boxes = random_rois(rng, 24, 2, 12.0)
    f32, b32 = features.astype(np.float32), boxes.astype(np.float32)
    whole_bins = [[0, 0, 0, 21, 14], [1, 0.5, 1, 21.5, 8], [0, 1, 2, 13, 13], [1, 3, 0, 10, 7]]
    return [
        RoiCase("random_f32", f32, b32, (3, 4), 0.5),
        RoiCase("random_f64", features, boxes, (3, 4), 0.5),
        RoiCase("aligned_ratio_2", f32, b32, (2, 2), 1.0, 2, True),
        RoiCase("aligned_f64", features, boxes, (5, 3), 0.75, -1, True),
        RoiCase("adaptive_ratio_0", f32, b32, (7, 7), 0.25, 0),
        RoiCase("ratio_1_scale_1", f32, b32, (1, 1), 1.0, 1),
        # RoI sides that are whole multiples of the output size: 21 / 7 must be 3 (not
        # 3.0000002, which a reciprocal gives), or the adaptive grid and the bins change.
        RoiCase("whole_bins", f32, np.array(whole_bins, np.float32), (7, 7)),
        RoiCase("no_rois", f32, np.zeros((0, 5), np.float32), (2, 2)),
        RoiCase("one_pixel_map", f32[:, :, :1, :1].copy(), b32, (2, 3), 0.1),
        # A transposed view: strides the kernels must not assume away.
        RoiCase("non_contiguous", np.swapaxes(f32, 2, 3), b32, (3, 3), 0.5, 2),
    ]
