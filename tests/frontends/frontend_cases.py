"""For the frontend tests: arguments for every op that exercise every parameter (a
frontend function called with them must return what the JAX op returns), and the
signature an SPMD wrapper must have."""

from __future__ import annotations

import inspect

import numpy as np

import asickernels
from asickernels.frontends import sharded_ops
from asickernels.kernels.cases import random_boxes

# Every op has SPMD wrappers but those without a partition rule: quantize_int8, whose scale
# spans the whole array, and roi_align, roi_pool (a RoI names its image by index).
SHARDED_OPS = sharded_ops()
assert {op.name for op in asickernels.OPS} - {op.name for op in SHARDED_OPS} == {
    "quantize_int8",
    "roi_align",
    "roi_align_vjp",
    "roi_pool",
    "roi_pool_vjp",
}


def every_argument(name: str, batch: tuple[int, ...] = ()) -> dict:
    """Valid arguments by name for op ``name`` with leading ``batch`` dims, every optional
    one given and set off its default, with distinct shapes and values so that an
    argument passed to the wrong parameter shows. ``int8_matmul`` has no batch dims
    (``x [8, 7]``, so that M splits 8 ways)."""
    rng = np.random.default_rng(20)

    def tiled(array: np.ndarray) -> np.ndarray:
        return np.broadcast_to(array, batch + array.shape).copy()

    boxes1, boxes2 = random_boxes(rng, (*batch, 5)), random_boxes(rng, (*batch, 5))
    pairs = {"boxes1": boxes1, "boxes2": boxes2}
    gradient = {**pairs, "cotangent": rng.normal(size=(*batch, 5)).astype(np.float32)}
    loss = {
        "preds": boxes1,
        "targets": boxes2,
        "mask": tiled(np.array([True, False, True, True, False])),
        "reduction": "sum",
    }
    # Box 2 overlaps box 0 with IoU 0.43, box 1 with 0.71; box 3 scores under the threshold.
    boxes = [[0, 0, 10, 10], [0, 0, 10, 14], [4, 0, 14, 10], [20, 20, 30, 30], [40, 40, 50, 50]]
    detections = {
        "boxes": tiled(np.array([*boxes, [60, 60, 70, 70]], np.float32)),
        "scores": tiled(np.array([0.9, 0.8, 0.7, 0.15, 0.5, 0.4], np.float32)),
        "iou_threshold": 0.3,
        "max_output_size": 4,
        "score_threshold": 0.2,
    }
    pairwise = {
        "boxes1": random_boxes(rng, (*batch, 3)),
        "boxes2": random_boxes(rng, (*batch, 6)),
    }
    roi = {  # two RoIs on two images; every optional argument off its default
        "input": rng.normal(size=(2, 3, 9, 11)).astype(np.float32),
        "rois": np.array([[0, 1.5, 0.5, 7.0, 6.0], [1, 0.0, 2.0, 9.5, 8.5]], np.float32),
        "output_size": (2, 4),
        "spatial_scale": 0.75,
        "sampling_ratio": 2,
        "aligned": True,
    }
    pool = {key: roi[key] for key in ("input", "rois", "output_size", "spatial_scale")}
    return {
        "giou": pairs,
        "diou": pairs,
        "ciou": pairs,
        "giou_vjp": gradient,
        "diou_vjp": gradient,
        "ciou_vjp": gradient,
        "giou_loss": loss,
        "diou_loss": loss,
        "ciou_loss": loss,
        "nms": detections,
        "batched_nms": {**detections, "idxs": tiled(np.array([0, 0, 0, 0, 1, 1]))},
        "int8_matmul": {
            "x": rng.integers(-128, 128, (8, 7), dtype=np.int8),
            "y": rng.integers(-128, 128, (7, 2), dtype=np.int8),
            "x_scale": rng.uniform(0.5, 2, 8).astype(np.float32),
            "y_scale": rng.uniform(0.5, 2, 2).astype(np.float32),
            "out_dtype": np.float32,
        },
        "quantize_int8": {"x": rng.normal(size=(*batch, 4, 6)).astype(np.float32), "axis": 1},
        "box_iou": pairwise,
        "generalized_box_iou": pairwise,
        "roi_align": roi,
        "roi_align_vjp": {**roi, "cotangent": rng.normal(size=(2, 3, 2, 4)).astype(np.float32)},
        "roi_pool": pool,
        "roi_pool_vjp": {**pool, "cotangent": rng.normal(size=(2, 3, 2, 4)).astype(np.float32)},
        "linear_sum_assignment": {
            "cost": rng.uniform(size=(*batch, 4, 3)).astype(np.float32),
            "row_mask": tiled(np.array([True, False, True, True])),
            "col_mask": tiled(np.array([True, True, False])),
        },
    }[name]


def parameters(signature: inspect.Signature) -> list[tuple]:
    """What a caller sees of a signature: names, kinds and defaults (not annotations)."""
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


REQUIRED = inspect.Parameter.empty
PARTITION_PARAMETERS = {  # the parameters each partition rule adds, with their defaults
    "batch": (("batch_spec", REQUIRED),),
    "loss": (("batch_spec", REQUIRED),),
    "matmul": (("m_axis", None), ("k_axis", None), ("n_axis", None)),
}


def sharded_signature(op, signature: inspect.Signature) -> list[tuple]:
    """A frontend's signature of ``op`` (names, kinds, defaults) with ``mesh`` and the
    partition parameters before its trailing ``backend`` (and ``config``)."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    added = [("mesh", keyword, REQUIRED)] + [
        (name, keyword, default) for name, default in PARTITION_PARAMETERS[op.partition]
    ]
    own = parameters(signature)
    trailing = [p for p in own if p[0] in ("backend", "config")]
    return [p for p in own if p not in trailing] + added + trailing
