"""RoI pooling cases for the conformance suite: feature maps and RoIs, random, edge and
adversarial, with the statics of each; RoIAlign takes them all, RoIPool its two."""

from __future__ import annotations

import dataclasses

import numpy as np

from asickernels.kernels.roi_align import RoiAlignStatics, RoiStatics


@dataclasses.dataclass(frozen=True)
class RoiCase:
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


def rois(rng: np.random.Generator, count: int, batch: int, span: float) -> np.ndarray:
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
    rng = np.random.default_rng(26)
    features = rng.standard_normal((2, 3, 11, 13))
    boxes = rois(rng, 24, 2, 12.0)
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
