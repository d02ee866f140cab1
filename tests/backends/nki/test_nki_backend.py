"""The "nki" backend beyond the conformance suite: how it reports itself, its cost counters,
its limits, and property checks of its kernels against the reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asickernels
from asickernels.backends.nki import giou as nki_giou
from asickernels.backends.nki import nms as nki_nms
from asickernels.backends.nki import sdk
from asickernels.kernels import oracle, registry
from asickernels.kernels.cases import grid_boxes, random_boxes
from asickernels.kernels.giou import reference_giou, reference_giou_vjp
from asickernels.kernels.nms import greedy_nms

# Counters and the "simulated" report come from asickernels' simulator, not the Neuron SDK.
our_simulator = pytest.mark.skipif(sdk.USING_SDK, reason="the Neuron SDK runs the kernels here")


@our_simulator
def test_reports_simulated_without_the_sdk():
    status = registry.availability("nki")
    assert status.mode == "simulated" and "simulator" in status.detail
    assert "nki" in registry.backends_for(asickernels.giou_vjp)


@our_simulator
def test_counters_report_the_last_kernel_run(rng):
    # 300 pairs: a [128, 2] body tile and a [44, 1] remainder tile.
    boxes1, boxes2 = random_boxes(rng, (300,)), random_boxes(rng, (300,))
    asickernels.giou(boxes1, boxes2, backend="nki")
    counters = registry.backend("nki").counters()
    assert counters["vector_instructions"] == 2 * 30  # 30 element-wise instructions a tile
    assert counters["tensor_instructions"] == counters["gpsimd_instructions"] == 0
    assert counters["dma_transfers"] == 2 * 3
    assert counters["hbm_to_sbuf_bytes"] == boxes1.nbytes + boxes2.nbytes
    assert counters["sbuf_to_hbm_bytes"] == 300 * 4


def test_rejects_a_tuning_config():
    boxes = np.zeros((3, 4), np.float32)
    with pytest.raises(TypeError, match="config=None"):
        asickernels.giou(boxes, boxes, backend="nki", config={"block": 8})


def test_nms_rejects_more_boxes_than_it_holds():
    n = nki_nms.MAX_BOXES + 1
    with pytest.raises(ValueError, match=f"N <= {nki_nms.MAX_BOXES}"):
        asickernels.nms(
            np.zeros((n, 4), np.float32),
            np.zeros(n, np.float32),
            iou_threshold=0.5,
            max_output_size=1,
            backend="nki",
        )


@our_simulator
def test_nms_16384_boxes_fit_sbuf(rng):
    n = 16384
    boxes = grid_boxes(rng, (n,), span=8000, size=120)
    asickernels.nms(
        boxes,
        rng.permutation(n).astype(np.float32),
        iou_threshold=0.1,
        max_output_size=1,
        backend="nki",
    )
    counters = registry.backend("nki").counters()
    assert counters["peak_sbuf_bytes_per_partition"] < 32 * 1024
    assert counters["peak_psum_banks"] <= 3


def test_nms_categories_far_apart_in_float32(rng):
    """Category ids that float32 cannot tell apart still never suppress each other."""
    boxes = np.tile(np.array([[0, 0, 4, 4]], np.float32), (6, 1))
    scores = np.linspace(1, 0.5, 6).astype(np.float32)
    idxs = np.array([2**30, 2**30 + 1, 2**30 + 2, -(2**30), 2**30 + 1, 7])
    got, count = asickernels.batched_nms(
        boxes, scores, idxs, iou_threshold=0.5, max_output_size=6, backend="nki"
    )
    np.testing.assert_array_equal(np.asarray(got), [0, 1, 2, 3, 5, -1])
    assert int(count) == 5


def test_nms_refuses_float64(rng):
    """NeuronCores have no float64: asked for by name, the NKI backend refuses float64 boxes
    rather than deciding them in float32."""
    boxes = grid_boxes(rng, (2, 90))
    with pytest.raises(TypeError, match="float64"):
        asickernels.nms(
            boxes.astype(np.float64), np.ones((2, 90)), iou_threshold=0.3, max_output_size=4,
            backend="nki",
        )  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_nms_other_input_dtypes(rng, dtype):
    boxes = grid_boxes(rng, (2, 90)).astype(dtype)
    scores = (rng.integers(0, 10, (2, 90)) / 8).astype(dtype)
    got = asickernels.nms(boxes, scores, iou_threshold=0.3, max_output_size=40, backend="nki")
    want = greedy_nms(
        boxes, scores, None, iou_threshold=0.3, max_output_size=40, score_threshold=-np.inf
    )
    np.testing.assert_array_equal(np.asarray(got[0]), want[0])
    np.testing.assert_array_equal(np.asarray(got[1]), want[1])


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    batch=st.integers(1, 3),
    n=st.integers(1, 300),
    iou_threshold=st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0]),
    max_output_size=st.integers(1, 40),
    score_threshold=st.sampled_from([-np.inf, 0.3, 0.7]),
    with_categories=st.booleans(),
)
def test_nms_matches_reference(
    seed, batch, n, iou_threshold, max_output_size, score_threshold, with_categories
):
    rng = np.random.default_rng(seed)
    boxes = grid_boxes(rng, (batch, n))
    scores = (rng.integers(0, 8, (batch, n)) / 8).astype(np.float32)  # many ties
    scores[rng.uniform(size=scores.shape) < 0.05] = np.nan
    categories = rng.integers(0, 3, (batch, n)).astype(np.int32) if with_categories else None
    kwargs = {
        "iou_threshold": iou_threshold,
        "max_output_size": max_output_size,
        "score_threshold": score_threshold,
    }
    got = nki_nms.nms(boxes, scores, categories, **kwargs)
    want = greedy_nms(boxes, scores, categories, **kwargs)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), pairs=st.integers(1, 700))
def test_giou_and_gradient_match_reference(seed, pairs):
    rng = np.random.default_rng(seed)
    boxes1, boxes2 = random_boxes(rng, (pairs,)), random_boxes(rng, (pairs,))
    # Boxes 2 moved to share box 1's left edge (every 3rd pair) or bottom edge (every 5th)
    # exercise the gradient's tie rules.
    width, height = boxes2[:, 2] - boxes2[:, 0], boxes2[:, 3] - boxes2[:, 1]
    boxes2[::3, 0] = boxes1[::3, 0]
    boxes2[::3, 2] = boxes2[::3, 0] + width[::3]
    boxes2[::5, 3] = boxes1[::5, 3]
    boxes2[::5, 1] = boxes2[::5, 3] - height[::5]
    cotangent = rng.normal(size=pairs).astype(np.float32)
    np.testing.assert_allclose(
        nki_giou.giou(boxes1, boxes2), reference_giou(boxes1, boxes2), atol=2e-5, rtol=0
    )
    got = nki_giou.giou_vjp(boxes1, boxes2, cotangent)
    want = reference_giou_vjp(boxes1, boxes2, cotangent)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)


@our_simulator
def test_roi_align_tiles_maps_beyond_128_pixels(rng):
    """A 130 x 140 map takes two row and two column tiles: per RoI and channel the Tensor
    engine contracts every (image, row tile, column tile) and then each column tile."""
    features = rng.standard_normal((2, 2, 130, 140)).astype(np.float32)
    rois = np.array(
        [
            [0, 3.5, 100.2, 138.7, 129.0],
            [1, 120.1, 2.3, 139.9, 20.6],
            [1, -5.0, -5.0, 150.0, 140.0],
        ],
        np.float32,
    )
    statics = {"output_size": (3, 4), "spatial_scale": 1.0, "sampling_ratio": 2, "aligned": True}
    got = asickernels.roi_align(features, rois, backend="nki", **statics)
    want = oracle.expected(asickernels.roi_align, {"input": features, "rois": rois}, statics)
    oracle.assert_agrees(asickernels.roi_align, got, want)
    counters = registry.backend("nki").counters()
    assert counters["tensor_instructions"] == 3 * 2 * (2 * 2 * 2 + 2)
    # The gradient: per image, row tile (one column tile of <= 512 pixels), RoI and
    # channel, two products.
    cotangent = rng.standard_normal((3, 2, 3, 4)).astype(np.float32)
    grad = asickernels.roi_align_vjp(features, rois, cotangent, backend="nki", **statics)
    arrays = {"input": features, "rois": rois, "cotangent": cotangent}
    oracle.assert_agrees(
        asickernels.roi_align_vjp, grad, oracle.expected(asickernels.roi_align_vjp, arrays, statics)
    )
    counters = registry.backend("nki").counters()
    assert counters["tensor_instructions"] == 2 * 2 * 3 * 2 * 2


def test_roi_align_refuses_more_bins_than_its_tiles_hold():
    features, rois = np.zeros((1, 1, 4, 4), np.float32), np.zeros((1, 5), np.float32)
    with pytest.raises(ValueError, match=r"output_size up to \(128, 512\)"):
        asickernels.roi_align(features, rois, (129, 2), backend="nki")
    cotangent = np.zeros((1, 1, 2, 129), np.float32)
    with pytest.raises(ValueError, match=r"output_size up to \(128, 128\)"):
        asickernels.roi_align_vjp(features, rois, cotangent, (2, 129), backend="nki")


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    height=st.integers(1, 9),
    width=st.integers(1, 9),
    ratio=st.integers(-1, 2),
    aligned=st.booleans(),
)
def test_roi_align_and_gradient_on_random_maps_match_reference(seed, height, width, ratio, aligned):
    rng = np.random.default_rng(seed)
    features = rng.standard_normal((2, 2, height, width)).astype(np.float32)
    span = float(max(height, width))
    boxes = rng.uniform(-0.5 * span, 1.5 * span, (4, 4))  # reversed ones included
    rois = np.concatenate([rng.integers(0, 2, (4, 1)), boxes], 1).astype(np.float32)
    statics = {
        "output_size": (2, 3),
        "spatial_scale": 0.75,
        "sampling_ratio": ratio,
        "aligned": aligned,
    }
    got = asickernels.roi_align(features, rois, backend="nki", **statics)
    arrays = {"input": features, "rois": rois}
    oracle.assert_agrees(
        asickernels.roi_align, got, oracle.expected(asickernels.roi_align, arrays, statics)
    )
    arrays["cotangent"] = rng.standard_normal((4, 2, 2, 3)).astype(np.float32)
    grad = asickernels.roi_align_vjp(**arrays, backend="nki", **statics)
    oracle.assert_agrees(
        asickernels.roi_align_vjp, grad, oracle.expected(asickernels.roi_align_vjp, arrays, statics)
    )
