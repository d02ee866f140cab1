"""What exercises GIOU, its gradient and its loss (declared in :mod:`asickernels.kernels.giou`),
and the paired-box cases DIoU and CIoU share: see :mod:`asickernels.kernels.cases`."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt

from asickernels.kernels import giou as giou_ops
from asickernels.kernels.cases import (
    RAGGED_SIZES,
    Case,
    CompileShape,
    NkiEstimate,
    Size,
    Workload,
    batched,
    bench_boxes,
    checked,
    jittered,
    paired_work,
    pairs_size,
    random_boxes,
)
from asickernels.kernels.declaration import Op
from asickernels.simulate.tpu_estimate.roofline import GIOU_OPS_PER_PAIR

# -- conformance cases -----------------------------------------------------------------------


@dataclasses.dataclass
class BoxPairCase:
    """Two box arrays ``[..., N, 4]`` and ``[..., M, 4]`` (N = M for the element-wise ops)."""

    name: str
    boxes1: np.ndarray
    boxes2: np.ndarray


def random_pair(
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
    cases = [random_pair(rng, f"random_{n}", (n,), (n,)) for n in RAGGED_SIZES]
    cases.append(random_pair(rng, "random_1024x256", (1024, 256), (1024, 256)))
    cases.append(random_pair(rng, "batch_3x5x7", (3, 5, 7), (3, 5, 7)))
    # A batch whose last dim is 4, like a box: cotangents [2, 4] must not pass for boxes.
    cases.append(random_pair(rng, "batch_2x4", (2, 4), (2, 4)))
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
    cases.append(random_pair(rng, "bfloat16_130", (130,), (130,), ml_dtypes.bfloat16))
    return cases


def examples(batch: tuple[int, ...] = ()) -> dict[str, dict[str, Any]]:
    """Five box pairs (per ``batch`` element), a cotangent, and the loss's mask and reduction
    off their defaults (see :mod:`asickernels.kernels.cases`)."""
    rng = np.random.default_rng(20)
    boxes1, boxes2 = random_boxes(rng, (*batch, 5)), random_boxes(rng, (*batch, 5))
    cotangent = rng.normal(size=(*batch, 5)).astype(np.float32)
    mask = batched(np.array([True, False, True, True, False]), batch)
    return {
        "giou": {"boxes1": boxes1, "boxes2": boxes2},
        "giou_vjp": {"boxes1": boxes1, "boxes2": boxes2, "cotangent": cotangent},
        "giou_loss": {"preds": boxes1, "targets": boxes2, "mask": mask, "reduction": "sum"},
    }


# -- check and bench workloads ---------------------------------------------------------------


class GiouWorkload(Workload):
    op: Op = giou_ops.giou
    size_syntax = "P or AxB box pairs"
    default_sizes: tuple[str, ...] = ("64x64", "1024x256")
    quick_cases = frozenset({"random_130", "adversarial"})
    quick_sizes = default_sizes

    def parse_size(self, text: str) -> Size:
        return pairs_size(text)

    def work(self, size: Size) -> float:
        return float(math.prod(size.params["shape"]))

    def bench_case(self, size: Size, rng: np.random.Generator) -> Case:
        boxes = bench_boxes(rng, tuple(size.params["shape"]))
        return Case(size.label, (boxes, jittered(rng, boxes)))

    def check_cases(self, rng: np.random.Generator) -> list[Case]:
        return [Case(c.name, (c.boxes1, c.boxes2)) for c in checked(giou_cases())]


class GiouVjpWorkload(GiouWorkload):
    """The GIOU backward pass: gradients of ``sum(cotangent * giou)``, at GIOU's sizes."""

    op = giou_ops.giou_vjp

    def _with_cotangent(
        self, name: str, a: np.ndarray, b: np.ndarray, rng: np.random.Generator
    ) -> Case:
        cotangent = rng.normal(size=a.shape[:-1]).astype(np.float32)
        return Case(name, (a, b, cotangent))

    def bench_case(self, size: Size, rng: np.random.Generator) -> Case:
        boxes = bench_boxes(rng, tuple(size.params["shape"]))
        return self._with_cotangent(size.label, boxes, jittered(rng, boxes), rng)

    def check_cases(self, rng: np.random.Generator) -> list[Case]:
        return [
            self._with_cotangent(c.name, c.boxes1, c.boxes2, rng)
            for c in checked(giou_cases())
            if c.boxes1.dtype != ml_dtypes.bfloat16
        ]


WORKLOADS = (GiouWorkload(), GiouVjpWorkload())

# -- TPU compile gate and NKI estimates ------------------------------------------------------

SEED_PAIRS = 1024 * 256  # the GIOU article's 262,144 pairs


def paired(pairs: int, dtype: str = "float32") -> tuple[tuple[tuple[int, ...], str], ...]:
    """Two ``[pairs, 4]`` box arrays of ``dtype``."""
    return (((pairs, 4), dtype),) * 2


COMPILE_SHAPES = (
    CompileShape("giou_forward", "1024x256 pairs f32", "giou", paired(SEED_PAIRS)),
    CompileShape("giou_forward", "1024x256 pairs bf16", "giou", paired(SEED_PAIRS, "bfloat16")),
    CompileShape(
        "giou_backward", "1024x256 pairs f32", "giou", paired(SEED_PAIRS), gradient=(0, 1)
    ),
    # The shapes users run (issue #15): GIOU over 10^6 pairs.
    CompileShape("giou_forward", "10^6 pairs f32", "giou", paired(10**6)),
    CompileShape("giou_backward", "10^6 pairs f32", "giou", paired(10**6), gradient=(0, 1)),
)

# The shapes users run (issue #15), which ``asickernels estimate`` estimates: GIOU forward
# and gradient over 10^4..10^6 pairs.
GIOU_USER_PAIRS = (10_000, 100_000, 1_000_000)

SEED_PAIRS_WHY = "the GIOU article's 262,144 pairs"
NKI_ESTIMATES = (
    NkiEstimate("giou", "1024x256", SEED_PAIRS_WHY, paired_work(GIOU_OPS_PER_PAIR)),
    # the gradient reads the boxes and a cotangent, writes both box gradients; its
    # operations counted as the forward's (at least those)
    NkiEstimate(
        "giou_vjp",
        "1024x256",
        SEED_PAIRS_WHY,
        paired_work(GIOU_OPS_PER_PAIR, in_bytes=36, out_bytes=32),
    ),
)
