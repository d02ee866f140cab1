"""What exercises the IoU matrices and DIoU/CIoU (declared in :mod:`asickernels.kernels.box_iou`):
see :mod:`asickernels.kernels.cases`. DIoU and CIoU run GIOU's paired-box cases."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from asickernels.kernels.box_iou import box_iou, ciou, diou, generalized_box_iou
from asickernels.kernels.cases import (
    Case,
    CompileShape,
    NkiEstimate,
    Size,
    Work,
    Workload,
    bench_boxes,
    paired_work,
    random_boxes,
)
from asickernels.kernels.declaration import Op
from asickernels.kernels.giou_cases import (
    SEED_PAIRS,
    SEED_PAIRS_WHY,
    BoxPairCase,
    GiouWorkload,
    giou_cases,
    paired,
    random_pair,
)
from asickernels.kernels.giou_cases import (
    examples as giou_examples,
)

# -- conformance cases -----------------------------------------------------------------------


def pairwise_cases() -> list[BoxPairCase]:
    """Boxes for the pairwise ops (``boxes1 [..., N, 4]`` against ``boxes2 [..., M, 4]``):
    random and ragged sizes, batches, N or M = 0, every pair of GIOU's adversarial boxes
    (disjoint, nested, identical, touching, zero-area points and lines, ...) and bfloat16."""
    rng = np.random.default_rng(5)
    cases = [
        random_pair(rng, f"random_{n}x{m}", (n,), (m,))
        for n, m in ((1, 1), (7, 130), (130, 257), (257, 7))
    ]
    cases.append(random_pair(rng, "batch_3x9x20", (3, 9), (3, 20)))
    cases.append(BoxPairCase("n_zero", np.zeros((0, 4), np.float32), random_boxes(rng, (5,))))
    cases.append(BoxPairCase("m_zero", random_boxes(rng, (5,)), np.zeros((0, 4), np.float32)))
    adversarial = next(c for c in giou_cases() if c.name == "adversarial")
    everything = np.concatenate([adversarial.boxes1, adversarial.boxes2])
    cases.append(BoxPairCase("adversarial_all_pairs", everything, everything))
    cases.append(random_pair(rng, "bfloat16_9x130", (9,), (130,), ml_dtypes.bfloat16))
    return cases


def examples(batch: tuple[int, ...] = ()) -> dict[str, dict[str, Any]]:
    """The IoU matrices on 3 boxes against 6 (per ``batch`` element); DIoU and CIoU, their
    gradients and losses on GIOU's arguments (see :mod:`asickernels.kernels.cases`)."""
    rng = np.random.default_rng(21)
    pairwise = {"boxes1": random_boxes(rng, (*batch, 3)), "boxes2": random_boxes(rng, (*batch, 6))}
    giou = giou_examples(batch)
    return {
        "box_iou": pairwise,
        "generalized_box_iou": pairwise,
        **{
            f"{metric}{form}": giou[f"giou{form}"]
            for metric in ("diou", "ciou")
            for form in ("", "_vjp", "_loss")
        },
    }


# -- check and bench workloads ---------------------------------------------------------------


class BoxMetricWorkload(GiouWorkload):
    """DIoU or CIoU of paired boxes, at GIOU's sizes and on GIOU's cases."""

    def __init__(self, op: Op) -> None:
        self.op = op


class PairwiseWorkload(Workload):
    """An IoU matrix (``box_iou``, ``generalized_box_iou``): ``[N, 4]`` x ``[M, 4]`` ->
    ``[N, M]``; sizes ``NxM`` (DETR's matching: 300 queries x 100 targets)."""

    size_syntax = "NxM boxes"
    default_sizes: tuple[str, ...] = ("300x100", "1024x1024")
    quick_cases = frozenset({"random_7x130", "adversarial_all_pairs"})
    quick_sizes = default_sizes

    def __init__(self, op: Op) -> None:
        self.op = op

    def parse_size(self, text: str) -> Size:
        match = re.fullmatch(r"(\d+)x(\d+)", text)
        if not match or int(match[1]) < 1 or int(match[2]) < 1:
            raise ValueError(f"expected NxM boxes (e.g. 300x100), got {text!r}")
        n, m = int(match[1]), int(match[2])
        return Size(f"{n}x{m} boxes", {"n": n, "m": m})

    def work(self, size: Size) -> float:
        return float(size.params["n"] * size.params["m"])

    def bench_case(self, size: Size, rng: np.random.Generator) -> Case:
        n, m = size.params["n"], size.params["m"]
        return Case(size.label, (bench_boxes(rng, (n,)), bench_boxes(rng, (m,))))

    def check_cases(self, rng: np.random.Generator) -> list[Case]:
        return [Case(c.name, (c.boxes1, c.boxes2)) for c in pairwise_cases()]


WORKLOADS = (
    PairwiseWorkload(box_iou),
    PairwiseWorkload(generalized_box_iou),
    BoxMetricWorkload(diou),
    BoxMetricWorkload(ciou),
)

# -- TPU compile gate and NKI estimates ------------------------------------------------------

# DETR-style matching: 8 images x 300 queries x 100 targets.
_DETR = (((8, 300, 4), "float32"), ((8, 100, 4), "float32"))
_SQUARE = (((1024, 4), "float32"), ((1024, 4), "float32"))
COMPILE_SHAPES = (
    CompileShape("box_iou_pairwise", "8x300x100", "box_iou", _DETR),
    CompileShape("giou_pairwise", "8x300x100", "generalized_box_iou", _DETR),
    CompileShape("giou_pairwise", "1024x1024", "generalized_box_iou", _SQUARE),
    CompileShape("diou_forward", "1024x256 pairs", "diou", paired(SEED_PAIRS)),
    CompileShape("ciou_forward", "1024x256 pairs", "ciou", paired(SEED_PAIRS)),
    CompileShape("ciou_backward", "1024x256 pairs", "ciou", paired(SEED_PAIRS), gradient=(0, 1)),
)

# Operations per box pair (each min/max/add/sub/mul/div once, as GIOU's 28: intersection 9,
# areas 6, union 2, IoU's division 1, hull 7, (hull - union) / hull 2, difference 1). Pairwise
# kernels need each box's area once per box, so only the per-pair part counts there.
PAIRWISE_IOU_OPS_PER_PAIR = 12  # intersection 9, union 2, division 1
PAIRWISE_GIOU_OPS_PER_PAIR = 22  # + hull 7, (hull - union) / hull 2, difference 1
DIOU_OPS_PER_PAIR = 40  # IoU 18, hull sides 6, centre distance 11, diagonal 3, ratio 2
CIOU_OPS_PER_PAIR = 50  # + aspect term 5 (arctan not counted), alpha 3, alpha * v 2


def _pairwise(ops_per_pair: int) -> Callable[[Size], Work]:
    """``[N, 4]`` x ``[M, 4]`` float32 in, ``[N, M]`` float32 out."""

    def work(size: Size) -> Work:
        n, m = size.params["n"], size.params["m"]
        return Work(16 * (n + m) + 4 * n * m, n * m * ops_per_pair)

    return work


NKI_ESTIMATES = (
    NkiEstimate("diou", "1024x256", SEED_PAIRS_WHY, paired_work(DIOU_OPS_PER_PAIR)),
    NkiEstimate("ciou", "1024x256", SEED_PAIRS_WHY, paired_work(CIOU_OPS_PER_PAIR)),
    NkiEstimate(
        "box_iou", "1024x1024", "the largest bench size", _pairwise(PAIRWISE_IOU_OPS_PER_PAIR)
    ),
    NkiEstimate(
        "generalized_box_iou",
        "1024x1024",
        "the largest bench size",
        _pairwise(PAIRWISE_GIOU_OPS_PER_PAIR),
    ),
)
