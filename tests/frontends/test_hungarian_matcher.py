"""DETR's Hungarian matcher on asickernels (JAX: :mod:`asickernels.matcher`; PyTorch:
:mod:`asickernels.torch.matcher`) against DETR's reference matcher (SciPy on the host).
The torch tests run in the torch environment (``make test-torch-xla``) and skip elsewhere."""

from __future__ import annotations

import os

os.environ.setdefault("PJRT_DEVICE", "CPU")

import jax
import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment as scipy_lsa

from asickernels import matcher
from asickernels.kernels.linear_sum_assignment import assert_agrees

WEIGHTS = {"cost_class": 1.0, "cost_bbox": 5.0, "cost_giou": 2.0}  # DETR's defaults


def detr_problem(seed: int, batch: int = 3, queries: int = 20, classes: int = 8):
    """Random DETR outputs and targets (``(cx, cy, w, h)`` in [0, 1]), 0 to 12 targets."""
    rng = np.random.default_rng(seed)

    def boxes(*shape):
        centre = rng.uniform(0.2, 0.8, (*shape, 2))
        return np.concatenate([centre, rng.uniform(0.05, 0.4, (*shape, 2))], -1).astype(np.float32)

    outputs = {
        "pred_logits": rng.normal(size=(batch, queries, classes)).astype(np.float32),
        "pred_boxes": boxes(batch, queries),
    }
    counts = [int(c) for c in rng.integers(0, 13, batch)]
    counts[0] = 12
    targets = [
        {"labels": rng.integers(0, classes - 1, count), "boxes": boxes(count)} for count in counts
    ]
    return outputs, targets


def reference_cost(outputs, targets, cost_class, cost_bbox, cost_giou):
    """DETR's cost matrices (facebookresearch/detr, models/matcher.py: flattened batch,
    targets concatenated, then split per image), in float64 numpy."""
    from asickernels.kernels.box_iou import reference_generalized_box_iou

    logits = np.asarray(outputs["pred_logits"], np.float64)
    batch, queries = logits.shape[:2]
    prob = np.exp(logits - logits.max(-1, keepdims=True))
    prob = (prob / prob.sum(-1, keepdims=True)).reshape(batch * queries, -1)
    out_bbox = np.asarray(outputs["pred_boxes"], np.float64).reshape(batch * queries, 4)
    tgt_ids = np.concatenate([t["labels"] for t in targets]).astype(np.int64)
    tgt_bbox = np.concatenate([np.reshape(t["boxes"], (-1, 4)) for t in targets]).astype(np.float64)

    def xyxy(b):
        return np.concatenate([b[:, :2] - 0.5 * b[:, 2:], b[:, :2] + 0.5 * b[:, 2:]], -1)

    c_class = -prob[:, tgt_ids]
    c_bbox = np.abs(out_bbox[:, None, :] - tgt_bbox[None, :, :]).sum(-1)
    c_giou = -reference_generalized_box_iou(xyxy(out_bbox), xyxy(tgt_bbox))
    cost = (cost_bbox * c_bbox + cost_class * c_class + cost_giou * c_giou).reshape(
        batch, queries, -1
    )
    sizes = np.cumsum([0] + [len(t["labels"]) for t in targets])
    return [cost[b][:, sizes[b] : sizes[b + 1]] for b in range(batch)]


def reference_match(outputs, targets, **weights):
    return [scipy_lsa(c) for c in reference_cost(outputs, targets, **weights)]


def check_pairs(got, outputs, targets, weights):
    """``got`` (per image ``(i, j)``) is DETR's matching: the same pairs (random costs: the
    optimum is unique), int64, ``i`` ascending."""
    want = reference_match(outputs, targets, **weights)
    assert len(got) == len(want)
    for (gi, gj), (wi, wj) in zip(got, want, strict=True):
        gi, gj = np.asarray(gi), np.asarray(gj)
        assert gi.dtype == np.int64 and gj.dtype == np.int64
        np.testing.assert_array_equal(gi, wi)
        np.testing.assert_array_equal(gj, wj)


@pytest.mark.parametrize("backend", ["xla", "cpu"])
def test_jax_matcher_is_detrs(backend):
    outputs, targets = detr_problem(0)
    got = matcher.HungarianMatcher(**WEIGHTS, backend=backend)(outputs, targets)
    check_pairs(got, outputs, targets, WEIGHTS)


def test_jax_static_match_under_jit_equals_scipy_on_the_cost():
    outputs, targets = detr_problem(1, batch=4, queries=30)
    labels, boxes, mask = matcher.pad_targets(targets)
    match = jax.jit(lambda *a: matcher.hungarian_match(*a, **WEIGHTS, backend="xla"))
    assignment, count = match(outputs["pred_logits"], outputs["pred_boxes"], labels, boxes, mask)
    cost = matcher.matching_cost(
        outputs["pred_logits"], outputs["pred_boxes"], labels, boxes, **WEIGHTS
    )
    assert_agrees(np.asarray(cost), (assignment, count), col_mask=mask, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(count), [len(t["labels"]) for t in targets])


def test_all_zero_weights_are_refused_as_detr_refuses_them():
    with pytest.raises(ValueError, match="all costs can't be 0"):
        matcher.HungarianMatcher(0, 0, 0)


# -- PyTorch -----------------------------------------------------------------------------------


@pytest.fixture
def torch_matcher():
    pytest.importorskip("torch")
    from asickernels.torch import matcher as torch_matcher

    return torch_matcher


def _torch_inputs(outputs, targets, device="cpu"):
    import torch

    return (
        {k: torch.from_numpy(v).to(device) for k, v in outputs.items()},
        [{k: torch.from_numpy(np.asarray(v)) for k, v in t.items()} for t in targets],
    )


def test_torch_matcher_is_detrs(torch_matcher):
    outputs, targets = detr_problem(2)
    t_outputs, t_targets = _torch_inputs(outputs, targets)
    got = torch_matcher.HungarianMatcher(**WEIGHTS)(t_outputs, t_targets)
    check_pairs([(i.numpy(), j.numpy()) for i, j in got], outputs, targets, WEIGHTS)


def test_torch_matcher_on_torch_xla_without_cpu_fallbacks(torch_matcher):
    """On the torch_xla device the static-shape match is one graph: no ``aten::`` CPU
    fallback; its result is DETR's."""
    xla = pytest.importorskip("torch_xla")
    import torch_xla.debug.metrics as metrics

    outputs, targets = detr_problem(3)
    device = xla.device()
    t_outputs, _ = _torch_inputs(outputs, targets, device)
    labels, boxes, mask = matcher.pad_targets(targets)
    import torch

    metrics.clear_counters()
    assignment, count = torch_matcher.HungarianMatcher(**WEIGHTS).match_padded(
        t_outputs["pred_logits"],
        t_outputs["pred_boxes"],
        torch.from_numpy(labels).to(device),
        torch.from_numpy(boxes).to(device),
        torch.from_numpy(mask).to(device),
    )
    assignment, count = assignment.cpu().numpy(), count.cpu().numpy()
    assert not [n for n in metrics.counter_names() if n.startswith("aten::")]
    got = matcher.pairs_from_assignment(assignment)
    check_pairs(got, outputs, targets, WEIGHTS)
