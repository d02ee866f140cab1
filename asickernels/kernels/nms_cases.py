"""What exercises NMS, beside its declaration (:mod:`asickernels.kernels.nms`): its
conformance cases (every backend runs them against the reference), its ``check``/``bench``
workloads (registered in :data:`asickernels.benchmarking.workloads.OPS`) and its TPU estimate
cases (``asickernels estimate``). The machinery these plug into is generic: a new NMS
argument gets its cases here (the files an argument change touches are listed in
:mod:`asickernels.kernels.nms`).

Conformance boxes sit on an integer grid so that areas and intersections are exact in
float32 and float64 alike, and IoU-vs-threshold decisions cannot differ between a float32
kernel and the float64 reference.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any

import numpy as np

from asickernels.benchmarking import workloads
from asickernels.kernels.nms import greedy_nms
from asickernels.simulate.tpu_estimate import cases as estimate_cases
from asickernels.simulate.tpu_estimate import roofline
from asickernels.simulate.tpu_estimate import seed_kernels as seeds
from asickernels.simulate.tpu_estimate.estimate import EstimateTarget
from asickernels.testing.cases import RAGGED_SIZES, grid_boxes

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


class NmsOp(workloads.Op):
    name = "nms"
    registry_op = "nms"
    size_syntax = "N[:max_output[:iou_threshold]] (defaults 128 outputs, threshold 0.1)"
    default_sizes: tuple[str, ...] = ("256", "1024", "4096", "16384")
    error_unit = "mismatches"
    quick_cases = frozenset(
        {"grid_n130_t0.3", "nan_inf_signed_zero_scores", "iou_equals_threshold"}
    )
    quick_sizes = default_sizes
    categories = 0  # batched_nms draws this many categories

    def parse_size(self, text: str) -> workloads.Size:
        match = re.fullmatch(r"(\d+)(?::(\d+)(?::([0-9.]+))?)?", text)
        threshold = float(match[3]) if match and match[3] else 0.1
        if not match or int(match[1]) < 1 or not 0.0 <= threshold <= 1.0:
            raise ValueError(
                f"expected N[:max_output[:iou_threshold]] (e.g. 4096:128:0.1), got {text!r}"
            )
        n, max_output = int(match[1]), int(match[2] or 128)
        label = f"N={n} out={max_output} iou>{threshold:g}"
        return workloads.Size(
            label, {"n": n, "max_output_size": max_output, "iou_threshold": threshold}
        )

    def work(self, size: workloads.Size) -> float:
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
    ) -> workloads.Case:
        arrays: tuple[np.ndarray, ...] = (boxes, scores)
        if self.categories:
            arrays += (rng.integers(0, self.categories, scores.shape).astype(np.int32),)
        static = {
            "iou_threshold": iou_threshold,
            "max_output_size": max_output_size,
            "score_threshold": score_threshold,
        }
        return workloads.Case(name, arrays, static)

    def bench_case(self, size: workloads.Size, rng: np.random.Generator) -> workloads.Case:
        boxes, scores = seed_style_boxes(rng, size.params["n"])
        return self._case(
            size.label,
            boxes,
            scores,
            rng,
            size.params["iou_threshold"],
            size.params["max_output_size"],
        )

    def check_cases(self, rng: np.random.Generator) -> list[workloads.Case]:
        return [
            workloads.Case(c.name, (c.boxes, c.scores), c.kwargs())
            if c.categories is None
            else workloads.Case(
                c.name, (c.boxes, c.scores, c.categories.astype(np.int32)), c.kwargs()
            )
            for c in workloads.checked(nms_cases())
            if (c.categories is not None) == bool(self.categories)
        ]

    def expected(self, case: workloads.Case) -> Any:
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

    def compare(self, got: workloads.Canonical, expected: Any) -> workloads.Comparison:
        return workloads.oracle_comparison(self.name, got, expected)


class BatchedNmsOp(NmsOp):
    """Per-category NMS (``torchvision.ops.batched_nms``), 16 categories."""

    name = "batched_nms"
    default_sizes: tuple[str, ...] = ("256", "1024")
    quick_cases = frozenset({"categories"})
    quick_sizes = ("1024",)
    categories = 16


workloads.register(NmsOp(), BatchedNmsOp())


# -- TPU estimate cases ----------------------------------------------------------------------

# The shapes users run (issue #15): NMS over 1024..16384 boxes; the tiles swept.
NMS_USER_N = (1024, 2048, 4096, 8192, 16384)
NMS_TILE_SWEEP = (128, 256, 512, 1024)


def nms_builder(
    n: int, max_output_size: int, iou_threshold: float, tile: int = 0, backend: str = "pallas_tpu"
) -> estimate_cases.Built:
    """NMS on ``backend`` on one image of ``n`` boxes (ours with this tile, when given)."""
    import asickernels
    from asickernels.backends.pallas_tpu.nms import NmsConfig

    config = NmsConfig(tile) if tile else None

    def function(boxes: Any, scores: Any) -> Any:
        return asickernels.nms(
            boxes,
            scores,
            iou_threshold=iou_threshold,
            max_output_size=max_output_size,
            backend=backend,
            config=config,
        )

    return function, [((n, 4), "float32"), ((n,), "float32")]


# Loop numbers (preorder in the kernel's schedule) of the tiled NMS kernel's loops whose
# exit the walk cannot compute: #0 over tiles, #1 over the earlier tiles (t trips for tile t;
# its bound is carried through the data-dependent loop), #2 the fixed-point passes. The
# one-hot gather's loop over column chunks has a static trip count, so the walk counts it;
# when it has more than one trip it is a loop of its own, numbered before the cross loop.
NMS_PROGRAM = "nms_tiled"


def nms_schedule_trips(trips: Any, gather_loop: bool) -> tuple[tuple[int, Any], ...]:
    """:class:`~asickernels.backends.pallas_tpu.nms.LoopTrips` -> the walk's
    ``(loop number, trips)`` pairs for the kernel's program."""
    shift = 1 if gather_loop else 0
    return (
        (0, trips.tiles),
        (1 + shift, trips.cross[1:] or (1,)),  # entered for tiles 1, 2, ...
        (2 + shift, trips.passes),
    )


def _seed_nms_kept(n: int, max_output_size: int) -> int:
    """How many boxes greedy NMS keeps on the seed-style random boxes (capped)."""
    boxes, scores = seeds.seed_nms_inputs(n)
    _, count = greedy_nms(
        boxes[None], scores[None], None, iou_threshold=seeds.SEED_NMS_IOU_THRESHOLD,
        max_output_size=max_output_size, score_threshold=float("-inf"),
    )  # fmt: skip
    return int(count[0])


def _nms_workload(n: int, max_output_size: int, **extra: Any) -> dict[str, Any]:
    return {
        "n": n,
        "max_output_size": max_output_size,
        "iou_threshold": seeds.SEED_NMS_IOU_THRESHOLD,
        **extra,
    }


@functools.cache
def nms_case(
    tile: int, n: int = seeds.SEED_NMS_BOXES, max_output_size: int = seeds.SEED_NMS_OUTPUTS
) -> EstimateTarget:
    """Our NMS on random boxes as the seed draws them, with the loop trips that data
    produces (from the kernel's own model, :func:`~asickernels.backends.pallas_tpu.nms.
    loop_trips`)."""
    from asickernels.backends.pallas_tpu import nms

    boxes, scores = seeds.seed_nms_inputs(n)
    kernel_trips = nms.loop_trips(
        boxes,
        scores,
        tile=tile,
        iou_threshold=seeds.SEED_NMS_IOU_THRESHOLD,
        max_output_size=max_output_size,
    )
    clamped = min(tile, -(-n // 128) * 128)
    padded = -(-n // clamped) * clamped
    gather_loop = padded // nms.gather_chunk(padded, clamped) > 1
    trips = {NMS_PROGRAM: nms_schedule_trips(kernel_trips, gather_loop)}
    return estimate_cases.make_case(
        f"NMS N={n} out={max_output_size} tile={tile}, pallas_tpu",
        f"{__name__}:nms_builder",
        _nms_workload(n, max_output_size, tile=tile),
        trips,
        op="nms",
        impl="pallas_tpu",
        shape=f"N={n} out={max_output_size}",
        work=roofline.nms(n, max_output_size),
    )


# The XLA NMS (backends/xla/nms.py) selects one box per trip of its while loop, the only
# loop of the top-level program whose exit the walk cannot compute.
XLA_NMS_LOOP = 0


@functools.cache
def nms_xla_case(n: int, max_output_size: int = seeds.SEED_NMS_OUTPUTS) -> EstimateTarget:
    """Plain XLA NMS (``backend="xla"``) on the same boxes, one loop trip per kept box."""
    kept = _seed_nms_kept(n, max_output_size)
    return estimate_cases.make_case(
        f"NMS N={n} out={max_output_size}, xla",
        f"{__name__}:nms_builder",
        _nms_workload(n, max_output_size, backend="xla"),
        {"TLP": ((XLA_NMS_LOOP, max(kept, 1)),)},
        op="nms",
        impl="xla",
        shape=f"N={n} out={max_output_size}",
        work=roofline.nms(n, max_output_size),
    )


def default_nms_tile() -> int:
    """The NMS kernel's default tile (every generation runs it)."""
    from asickernels.backends.pallas_tpu.nms import NmsConfig

    return NmsConfig().tile
