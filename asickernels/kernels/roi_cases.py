"""What exercises RoIAlign and RoIPool (declared in :mod:`asickernels.kernels.roi_align` and
:mod:`asickernels.kernels.roi_pool`), which share their cases: see
:mod:`asickernels.kernels.cases`."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from asickernels.kernels.cases import Case, CompileShape, Size, Workload
from asickernels.kernels.declaration import Op
from asickernels.kernels.roi_align import roi_align
from asickernels.kernels.roi_pool import roi_pool

# -- conformance cases -----------------------------------------------------------------------


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

    def align_statics(self) -> dict[str, Any]:
        """RoIAlign's static arguments, by name."""
        return {
            "output_size": self.output_size,
            "spatial_scale": self.spatial_scale,
            "sampling_ratio": self.sampling_ratio,
            "aligned": self.aligned,
        }

    def pool_statics(self) -> dict[str, Any]:
        """RoIPool's static arguments, by name."""
        return {"output_size": self.output_size, "spatial_scale": self.spatial_scale}


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


def nonfinite_rois(rois: np.ndarray) -> np.ndarray:
    """``rois`` and, after them, 12 copies of their first RoIs, each with one corner
    coordinate NaN, +inf or -inf (every column): such a RoI pools to 0 on every backend."""
    bad = rois[:12].copy()
    for i, row in enumerate(bad):
        row[1 + i % 4] = (np.nan, np.inf, -np.inf)[i // 4]
    return np.concatenate([rois, bad])


def roi_cases() -> list[RoiCase]:
    """RoIAlign's statics on float32 and float64 maps, aligned or not, adaptive and fixed
    sampling grids, whole-pixel bins, no RoIs, a one-pixel map, a transposed view and RoIs
    with NaN or infinite corners;
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
        RoiCase("nonfinite_corners", f32, nonfinite_rois(b32), (3, 4), 0.5),
        RoiCase("nonfinite_aligned_ratio_2", f32, nonfinite_rois(b32), (2, 2), 1.0, 2, True),
    ]


def examples(batch: tuple[int, ...] = ()) -> dict[str, dict[str, Any]]:
    """Two RoIs on two images, every optional argument off its default, and the gradients'
    cotangents (no batch dims: a RoI names its image by index; see
    :mod:`asickernels.kernels.cases`)."""
    rng = np.random.default_rng(23)
    align = {
        "input": rng.normal(size=(2, 3, 9, 11)).astype(np.float32),
        "rois": np.array([[0, 1.5, 0.5, 7.0, 6.0], [1, 0.0, 2.0, 9.5, 8.5]], np.float32),
        "output_size": (2, 4),
        "spatial_scale": 0.75,
        "sampling_ratio": 2,
        "aligned": True,
    }
    pool = {key: align[key] for key in ("input", "rois", "output_size", "spatial_scale")}
    cotangent = rng.normal(size=(2, 3, 2, 4)).astype(np.float32)
    return {
        "roi_align": align,
        "roi_align_vjp": {**align, "cotangent": cotangent},
        "roi_pool": pool,
        "roi_pool_vjp": {**pool, "cotangent": cotangent},
    }


# -- check and bench workloads ---------------------------------------------------------------

# Detection's RoI heads (Faster/Mask R-CNN): a stride-16 map of an 800 x 1088 image.
_ROI_MAP = (2, 256, 50, 68)
_ROI_STRIDE = 16


class RoiPoolingWorkload(Workload):
    """RoIAlign or RoIPool of ``K`` RoIs on a feature map ``[N, C, H, W]`` (by default
    2x256x50x68, stride 16) into 7x7 bins, RoIAlign as detection runs it
    (``sampling_ratio=2, aligned=True``); sizes ``K[:NxCxHxW]``. RoIs are proposals in
    image coordinates (sides 16 to 512 pixels, clipped to the image), sorted by image as
    torchvision's poolers pass them."""

    size_syntax = "K[:NxCxHxW] RoIs on a feature map (default 2x256x50x68), 7x7 bins"
    quick_cases = frozenset({"random_f32"})

    def __init__(
        self,
        op: Op,
        statics_of: Callable[[RoiCase], Mapping[str, object]],
        bench_statics: dict[str, Any],
        default_sizes: tuple[str, ...],
        quick_sizes: tuple[str, ...],
    ) -> None:
        self.op = op
        self.statics_of = statics_of  # a conformance case's statics for this op
        self.bench_statics = bench_statics
        self.default_sizes = default_sizes
        self.quick_sizes = quick_sizes

    def parse_size(self, text: str) -> Size:
        match = re.fullmatch(r"(\d+)(?::(\d+)x(\d+)x(\d+)x(\d+))?", text)
        shape = tuple(int(side) for side in match.groups()[1:]) if match and match[2] else _ROI_MAP
        if not match or int(match[1]) < 1 or min(shape) < 1:
            raise ValueError(f"expected K[:NxCxHxW] (e.g. 1000:2x256x50x68), got {text!r}")
        k = int(match[1])
        return Size(f"K={k} {'x'.join(map(str, shape))}", {"k": k, "input_shape": list(shape)})

    def work(self, size: Size) -> float:
        return float(size.params["k"] * size.params["input_shape"][1])

    def bench_case(self, size: Size, rng: np.random.Generator) -> Case:
        n, channels, height, width = size.params["input_shape"]
        k = size.params["k"]
        image = np.array([width, height], np.float64) * _ROI_STRIDE
        corner = rng.uniform(0.0, image, (k, 2))
        far = np.minimum(corner + rng.uniform(16.0, 512.0, (k, 2)), image - 1)
        index = np.sort(rng.integers(0, n, (k, 1)), axis=0)
        rois = np.concatenate([index, corner, far], axis=1).astype(np.float32)
        features = rng.standard_normal((n, channels, height, width), np.float32)
        return Case(size.label, (features, rois), dict(self.bench_statics))

    def check_cases(self, rng: np.random.Generator) -> list[Case]:
        return [Case(c.name, (c.input, c.rois), dict(self.statics_of(c))) for c in roi_cases()]


WORKLOADS = (
    # K=8: the size the simulators (nki, TPU interpret mode) are timed at; larger sizes are
    # skipped for them by extrapolation.
    RoiPoolingWorkload(
        roi_align,
        RoiCase.align_statics,
        {
            "output_size": (7, 7),
            "spatial_scale": 1 / _ROI_STRIDE,
            "sampling_ratio": 2,
            "aligned": True,
        },
        ("8", "100", "1000"),
        ("8", "100"),
    ),
    RoiPoolingWorkload(
        roi_pool,
        RoiCase.pool_statics,
        {"output_size": (7, 7), "spatial_scale": 1 / _ROI_STRIDE},
        ("100", "1000"),
        ("100",),
    ),
)

# -- TPU compile gate ------------------------------------------------------------------------

# Faster R-CNN's box head on an FPN level of an 800 x 1344 image: 2 x 512 RoIs, adaptive
# sampling, FPN-like scale.
_FPN_LEVEL = (((2, 256, 200, 336), "float32"), ((1024, 5), "float32"))
_FPN_STATICS = {"output_size": 7, "spatial_scale": 0.25, "sampling_ratio": -1}
COMPILE_SHAPES = (
    CompileShape(
        "roi_align_forward", "2x256x200x336 K=1024", "roi_align", _FPN_LEVEL, _FPN_STATICS
    ),
    CompileShape(
        "roi_align_backward",
        "2x256x200x336 K=1024",
        "roi_align",
        _FPN_LEVEL,
        _FPN_STATICS,
        gradient=(0,),
    ),
)
NKI_ESTIMATES = ()
